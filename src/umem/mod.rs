//! umem, the libumem-style allocator; layers land one at a time.
//!
//! ```text
//! GlobalAlloc / C malloc (global) -> sizeclass -> cache -> cpu_cache (per-CPU magazines) -> depot -> slab -> region/vmem -> os
//!                                    large (sizes above the largest class) -> vmem -> os
//! ```
//!
//! The layers, bottom up, as `DESIGN.md` lays them out: [`os`] (the kernel: `mmap`,
//! `madvise`, fault injection for tests), [`vmem`] arenas, [`region`] (2 MiB regions
//! counted by Refcache), [`slab`] (slab caches with pointer lookup), the per-CPU
//! magazine layer ([`cpu_cache`], with the depot), the object cache that joins them
//! ([`cache`]: [`ObjectCache`] with constructors and destructors, [`TypedCache`], destroy,
//! reaping), the size-class table ([`sizeclass`]), the large-allocation heap
//! ([`large`]: page-granular blocks on vmem, kept for reuse and released by decay), and
//! on top [`global`]: [`Umem`], the process's allocator (`GlobalAlloc`, `allocator_api2`,
//! and the C family that the `LD_PRELOAD` library exports).
//!
//! # Glossary
//!
//! - **region**: 2 MiB of memory from the kernel, 2 MiB-aligned, with its header in its
//!   first pages; a pointer finds the header by masking. Its count of live slabs is a
//!   Refcache count, so it goes back only after staying empty for two epochs.
//! - **run**: consecutive 4 KiB pages of a region, handed to one slab.
//! - **page map**: one word per page of a region naming the slab header that owns it.
//! - **slab**: a run cut into equal **chunks** (objects), with a header in the run (small
//!   objects) or outside it (large ones), a free list and an allocated bitmap.
//! - **colour**: the varying offset of a slab's first object, by cache-line steps.
//! - **vmem** ([`vmem`]): Bonwick and Adams' resource arenas of integer ranges (address
//!   space, or ids), the bottom layer that slabs will take their pages from.
//! - **round**: a constructed object cached in a magazine (an opaque pointer here).
//! - **magazine** (`magazine.rs`): a fixed-capacity array of rounds, in mmap'd memory.
//! - **loaded / previous**: the two magazines each CPU holds (Bonwick, 2001); after any
//!   depot exchange a CPU can serve a full magazine's worth of allocations or frees
//!   before it needs the depot again.
//! - **depot** (`depot.rs`): the cache's lock-free stacks of full and empty magazines,
//!   with working-set (idle magazine) accounting and a contention count.
//! - **miss**: the layer has no round (alloc) or no room (free); the caller goes to the
//!   slab layer and runs the constructor or destructor.
//! - **reconfiguration**: draining every CPU (resize, reap, destroy), the write side of
//!   the stop-flag protocol in `cpu_cache.rs`.
//!
//! # Invariants
//!
//! - Each round is in exactly one place: a CPU's loaded or previous magazine (below its
//!   count), a full depot magazine, or the caller's hands.
//! - A CPU's previous magazine is full, empty or absent; depot lists hold only full
//!   (count = capacity) or only empty magazines.
//! - Every change of a CPU's magazines commits with one store of its state word, inside
//!   an rseq section (or under the CPU slot's lock in the fallback mode).
//! - Nothing on the alloc/free paths allocates through the global allocator or formats.

#[cfg(not(target_pointer_width = "64"))]
compile_error!("umem packs per-CPU magazine state into 64-bit words");

// Public under loom only, for the model in loom-tests/tests/background.rs.
#[cfg(scalemem_loom)]
pub mod background;
#[cfg(not(scalemem_loom))]
mod background;
// Public under loom only, for the model in loom-tests/tests/boot.rs.
#[cfg(scalemem_loom)]
pub mod boot;
#[cfg(not(scalemem_loom))]
mod boot;
pub mod cache;
pub mod cpu_cache;
mod depot;
#[cfg(not(scalemem_loom))]
mod fork;
#[cfg(not(scalemem_loom))]
pub mod global;
pub mod large;
mod magazine;
// Public under loom only, for the model in loom-tests/tests/once.rs.
#[cfg(scalemem_loom)]
pub mod once;
#[cfg(not(scalemem_loom))]
mod once;
pub mod os;
pub mod region;
pub mod sizeclass;
pub mod slab;
// Public under loom only, for the model in loom-tests/tests/slot_table.rs.
#[cfg(scalemem_loom)]
pub mod slot_table;
#[cfg(not(scalemem_loom))]
pub(crate) mod slot_table;
pub mod vmem;

pub use cache::{CacheBox, CacheError, ObjectCache, TypedCache};
pub use cpu_cache::{Config, CpuCaches, Stats};
#[cfg(not(scalemem_loom))]
pub use global::Umem;
