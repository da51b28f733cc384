//! umem, the libumem-style allocator; layers land one at a time.
//!
//! The layers, bottom up, as `DESIGN.md` lays them out: kernel memory (`mmap`) →
//! [`vmem`] arenas → slabs → depot → per-CPU magazines → object caches → size-class
//! caches → `GlobalAlloc`. So far: [`os`] (the kernel: `mmap`, `madvise`), [`vmem`]
//! arenas, [`region`] (2 MiB regions counted by Refcache) and [`slab`] (slab caches with
//! pointer lookup).
//!
//! # Glossary (the lower layers)
//!
//! - **region**: 2 MiB of memory from the kernel, 2 MiB-aligned, with its header in its
//!   first pages; a pointer finds the header by masking. Its count of live slabs is a
//!   Refcache count, so it goes back only after staying empty for two epochs.
//! - **run**: consecutive 4 KiB pages of a region, handed to one slab.
//! - **page map**: one word per page of a region naming the slab header that owns it.
//! - **slab**: a run cut into equal **chunks** (objects), with a header in the run (small
//!   objects) or outside it (large ones), a free list and an allocated bitmap.
//! - **colour**: the varying offset of a slab's first object, by cache-line steps.

pub mod os;
pub mod region;
pub mod slab;
pub mod vmem;
