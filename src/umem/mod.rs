//! umem, the libumem-style allocator; layers land one at a time.
//!
//! The layers, bottom up, as `DESIGN.md` lays them out: kernel memory (`mmap`) →
//! [`vmem`] arenas → slabs → depot → per-CPU magazines → object caches → size-class
//! caches → `GlobalAlloc`. Only [`vmem`] exists so far.

pub mod vmem;
