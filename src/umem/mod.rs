//! umem, the libumem-style allocator; layers land one at a time.
//!
//! The layers, bottom up, as `DESIGN.md` lays them out: kernel memory (`mmap`) →
//! [`vmem`] arenas → slabs → depot → per-CPU magazines → object caches → size-class
//! caches → `GlobalAlloc`. So far: [`os`] (the kernel: `mmap`, `madvise`), [`vmem`]
//! arenas, [`region`] (2 MiB regions counted by Refcache) and [`slab`] (slab caches with
//! pointer lookup).

pub mod os;
pub mod region;
pub mod slab;
pub mod vmem;
