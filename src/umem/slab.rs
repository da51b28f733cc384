//! Slabs: a [`SlabCache`] hands out objects of one size and alignment, carved from
//! slabs, which are runs of pages taken from a [`Regions`] manager. After Bonwick, "The
//! Slab Allocator" (USENIX Summer 1994), sections 3 and 4, and libumem.
//!
//! ```
//! use scalemem::umem::region::Regions;
//! use scalemem::umem::slab::SlabCache;
//!
//! let regions = Regions::new()?;
//! let cache = SlabCache::builder(&regions, "nodes", 48, 16).build()?;
//! let p = cache.alloc()?;
//! assert_eq!(p.as_ptr() as usize % 16, 0);
//! let found = regions.lookup(p.as_ptr().wrapping_add(10)).unwrap(); // an interior pointer
//! assert_eq!((found.cache, found.base), (cache.id(), p));
//! // SAFETY: `p` came from `cache.alloc()` and is freed once.
//! unsafe { cache.free(p) }.unwrap();
//! cache.assert_valid();
//! # Ok::<(), scalemem::util::AllocError>(())
//! ```
//!
//! Objects are raw, uninitialised memory: constructors and destructors belong to the
//! object-cache layer above, which runs them as objects enter and leave the slab layer.
//!
//! # Glossary
//!
//! - **chunk**: the stride of objects in a slab: the size rounded up to the alignment
//!   (at least 8, for the free-list link), plus a redzone in checking mode.
//! - **slab**: a run of pages holding `capacity` chunks, described by a **slab header**.
//! - **small** caches (chunk ≤ [`SMALL_MAX`] = 512 bytes, an eighth of the one-page
//!   slab): the slab is one page and its header sits at the start of the page.
//! - **large** caches: the header is **external** (in a page of headers the cache maps
//!   for itself, never from the global allocator), and the slab spans the fewest pages
//!   that waste at most an eighth of the slab (12.5%); with colour room
//!   ([`SlabCacheBuilder::colour_room`]) the fewest that keep the room and waste at
//!   most a sixteenth. A destroyed slab's header goes on the cache's spare list; each
//!   header page counts its headers in use, and [`SlabCache::shrink`] unmaps the pages
//!   whose headers are all spare (a page-sized object's slab is one object, so a
//!   program that freed 256 MiB of 4 KiB blocks otherwise kept 10 MiB of headers).
//! - **colour**: the offset of a slab's first object, stepping by a cache line (or the
//!   alignment, if larger) from one slab to the next within the slab's slack, so that the
//!   first objects of different slabs do not all fall on the same cache sets.
//! - **partial / full / empty** lists: slabs with some, all, or none of their objects
//!   allocated. Allocation takes from a partial slab, then an empty one, then a new one;
//!   up to `max_empty` empty slabs are kept, past that an emptied slab goes back to its
//!   region at once.
//!
//! # How an object is found from its address
//!
//! Mask the address to its 2 MiB region, read the region's page map (which slab header
//! owns the page), then divide the offset from the slab's first object by the chunk.
//! [`SlabCache::free`] does this without any lock but the cache's; [`Regions::lookup`]
//! does it under the regions lock after checking the region registry, so any address,
//! even an unmapped or foreign one, is answered without a fault.
//!
//! Within a slab, a free object's first word links the slab's **free list**; objects
//! never handed out yet lie past the slab's `fresh` index (so a new slab touches no page
//! it does not hand out). Each slab header has an **allocated bitmap** (one bit per
//! object), which catches double frees and frees of never-allocated chunks always, and
//! answers lookups.
//!
//! # Checking mode
//!
//! [`SlabCacheBuilder::checking`] turns on, at some cost:
//! - validation of every freed pointer under the regions lock, so that a foreign, stale
//!   or interior pointer, or one of another cache, is refused with a [`FreeError`] and
//!   never dereferenced blindly;
//! - a **redzone** after each object (at least 8 bytes of `0xBB`), checked on free (an
//!   overrun is refused: the object stays allocated);
//! - **poisoning** of freed objects (`0xDE` past the link word), checked when the object
//!   is handed out again; a corrupted one (a write after free) is counted in
//!   [`SlabStats::corruptions`].
//!
//! # Locking
//!
//! One futex lock per cache guards its lists and every slab's free list and counts
//! (magazines in front of it are the layer above). Lock order: the cache's lock, then the
//! regions lock (taking and returning runs, validating pointers in checking mode).
//!
//! # Limits and faults
//!
//! Sizes up to [`MAX_SIZE`] and alignments up to [`PAGE`] (4 KiB); larger ones are the
//! oversize arena's (the builder refuses them). At most [`MAX_OBJECTS`] objects per
//! slab. When the kernel refuses memory, [`SlabCache::alloc`] returns `Err` having
//! changed nothing, and works again once memory is available.
//!
//! # Invariants (checked by [`SlabCache::assert_valid`])
//!
//! 1. Each slab is on the list its counts call for (partial: `0 < allocated <
//!    capacity`; full: `allocated == capacity`; empty: `allocated == 0`) and carries
//!    that list's tag; the lists are doubly linked and their lengths match.
//! 2. A slab's bitmap has `allocated` bits set, all below `fresh`; its free list holds
//!    exactly the other `fresh - allocated` objects below `fresh`, each at a chunk
//!    boundary.
//! 3. Every page of a slab's run names the slab's header in the region page map.
//! 4. The colour is a multiple of the step, at most the slack, and the first object
//!    sits at the header's end plus the colour.
//! 5. The cache's object and slab counts are the sums over its slabs.

use core::mem::size_of;
use core::ptr::{self, NonNull};

use super::os;
use super::region::{PAGE, Regions, USABLE_PAGES};
use super::vmem::lock::Lock;
use crate::sync::atomic::{AtomicUsize, Ordering};
use crate::util::AllocError;

mod lookup;

pub use lookup::{CacheId, Found};

/// The largest chunk kept in small slabs (header inside the one-page slab): an eighth of
/// the page.
pub const SMALL_MAX: usize = PAGE / 8;
/// The largest object size a slab cache serves.
pub const MAX_SIZE: usize = if cfg!(scalemem_loom) { 8 << 10 } else { 128 << 10 };
/// The most objects in one slab (the size of a slab's bitmap).
pub const MAX_OBJECTS: usize = 512;
const BITMAP_WORDS: usize = MAX_OBJECTS / usize::BITS as usize;
// `bit_word` masks with it; each word holds 64 objects' bits.
const _: () = assert!(BITMAP_WORDS.is_power_of_two() && usize::BITS == 64);

/// The word of a slab's bitmap that holds object `index`'s bit (`index < MAX_OBJECTS`):
/// masked into range, so that the index needs no bounds check and the allocator's paths
/// hold no formatting panic.
#[inline(always)]
pub(super) const fn bit_word(index: usize) -> usize {
    (index / 64) & (BITMAP_WORDS - 1)
}
const CACHE_LINE: usize = 64;
/// Redzone fill (checking mode).
const REDZONE: u8 = 0xBB;
/// Freed-object fill (checking mode).
const POISON: u8 = 0xDE;
/// "umslabhd".
const SLAB_MAGIC: usize = 0x756d_736c_6162_6864;
/// "umcache!".
const CACHE_MAGIC: usize = 0x756d_6361_6368_6521;

/// Which list a slab is on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Which {
    Partial,
    Full,
    Empty,
}

/// Written when the slab is made (under the regions lock, before the page map names the
/// header); read-only while the slab lives. Lookups read it under the regions lock.
#[repr(C)]
struct SlabIdent {
    magic: usize,
    cache: *const CacheInner,
    /// The run's base.
    base: *mut u8,
    /// The first object: the header's end (small caches) plus the colour.
    first: *mut u8,
    colour: usize,
    /// The cache's object size (a copy: `free(ptr)` reads it from the header it has
    /// found anyway, one dependent load fewer than through `cache`).
    size: usize,
}

/// The part of a slab header that the cache's lock protects.
#[repr(C)]
struct SlabLocked {
    prev: *mut SlabHeader,
    next: *mut SlabHeader,
    which: Which,
    allocated: usize,
    /// Objects at indices `fresh..capacity` have never been handed out.
    fresh: usize,
    /// Free list through the objects' first words.
    free: *mut u8,
}

/// A slab's header: at the start of the slab (small caches) or in a header page (large).
#[repr(C)]
struct SlabHeader {
    ident: SlabIdent,
    locked: SlabLocked,
    /// Bit `i`: object `i` is allocated. Written under the cache's lock, read by lookups
    /// (Relaxed: a lookup racing with an alloc or free of the same object may see either).
    bits: [AtomicUsize; BITMAP_WORDS],
}

/// Why [`SlabCache::free`] refused a pointer (nothing was changed).
///
/// ```
/// use scalemem::umem::slab::{FreeError, SlabCache};
/// let regions = scalemem::umem::region::Regions::new()?;
/// let a = SlabCache::builder(&regions, "a", 64, 8).build()?;
/// let b = SlabCache::builder(&regions, "b", 64, 8).build()?;
/// let p = a.alloc()?;
/// // SAFETY: every pointer is inside a live slab over the same regions (all that `free`
/// // trusts outside checking mode), and `p` is freed once.
/// unsafe {
///     assert_eq!(b.free(p), Err(FreeError::WrongCache));
///     assert_eq!(a.free(p.add(8)), Err(FreeError::NotObjectBase)); // an interior pointer
///     assert_eq!(a.free(p), Ok(())); // the refusals changed nothing
/// }
/// assert_eq!(FreeError::WrongCache.to_string(), "pointer belongs to another cache");
/// # Ok::<(), scalemem::util::AllocError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FreeError {
    /// Not in a live slab of these regions (checking mode).
    Foreign,
    /// In a slab of another cache.
    WrongCache,
    /// Inside an object, or in a slab's header, colour or tail, not at an object's base.
    NotObjectBase,
    /// The object is not allocated: a double free, or a chunk never handed out.
    NotAllocated,
    /// The object's redzone was overwritten (checking mode): it stays allocated.
    Overrun,
}

impl core::fmt::Display for FreeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::Foreign => "pointer not in a slab of these regions",
            Self::WrongCache => "pointer belongs to another cache",
            Self::NotObjectBase => "pointer is not an object's base",
            Self::NotAllocated => "object is not allocated (double free?)",
            Self::Overrun => "object's redzone was overwritten",
        })
    }
}

impl std::error::Error for FreeError {}

/// Counters and geometry of a [`SlabCache`].
///
/// ```
/// let regions = scalemem::umem::region::Regions::new()?;
/// let cache = scalemem::umem::slab::SlabCache::builder(&regions, "c", 200, 8).build()?;
/// let objects = [cache.alloc()?, cache.alloc()?, cache.alloc()?];
/// let s = cache.stats();
/// assert_eq!(s.allocated, 3);
/// assert!(s.small && s.chunk >= s.size && s.capacity >= 3);
/// // Every slab made and not yet destroyed is on exactly one list.
/// assert_eq!(s.partial + s.full + s.empty, s.slabs_created - s.slabs_destroyed);
/// for p in objects {
///     // SAFETY: each came from this cache's `alloc` and is freed once.
///     unsafe { cache.free(p) }.unwrap();
/// }
/// assert_eq!(cache.stats().allocated, 0);
/// # Ok::<(), scalemem::util::AllocError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SlabStats {
    /// Object size.
    pub size: usize,
    /// Object alignment (at least 8).
    pub align: usize,
    /// Stride of objects in a slab.
    pub chunk: usize,
    /// Whether the slab header lives in the slab.
    pub small: bool,
    /// Pages per slab.
    pub slab_pages: usize,
    /// Objects per slab.
    pub capacity: usize,
    /// The largest colour (first-object offset beyond the header).
    pub colour_max: usize,
    /// Objects allocated now.
    pub allocated: usize,
    /// Slabs on each list now.
    pub partial: usize,
    /// See `partial`.
    pub full: usize,
    /// See `partial`.
    pub empty: usize,
    /// Slabs made so far.
    pub slabs_created: usize,
    /// Slabs given back to their region so far.
    pub slabs_destroyed: usize,
    /// Poisoned objects found written to after their free (checking mode).
    pub corruptions: usize,
    /// Pages mapped for external slab headers now (large caches: one header per slab);
    /// [`shrink`](SlabCache::shrink) gives back those whose headers are all spare.
    pub header_pages: usize,
}

/// The in-use count of the header page that holds the external header `h`: the page's
/// second word ([`SlabCache::spare_header`]).
///
/// # Safety
/// `h` lies in a live header page of a cache whose lock the caller holds.
unsafe fn header_uses(h: *mut SlabHeader) -> *mut usize {
    // The page's base, with `h`'s provenance (the page is one mapping).
    let back = h.addr() & (PAGE - 1);
    // SAFETY: the caller's: `h` is `back` bytes into its page; the second word of the
    // page lies before every header (headers start at CACHE_LINE).
    unsafe { h.cast::<u8>().sub(back).cast::<usize>().add(1) }
}

/// A doubly linked list of slab headers.
struct SlabList {
    head: *mut SlabHeader,
    len: usize,
}

impl SlabList {
    const fn new() -> Self {
        Self { head: ptr::null_mut(), len: 0 }
    }

    /// # Safety
    /// `h` is a live slab header of the cache, on no list; the cache's lock is held.
    unsafe fn push(&mut self, h: *mut SlabHeader, which: Which) {
        // SAFETY: live headers of this cache; their `locked` parts are ours under the lock.
        unsafe {
            (*h).locked.which = which;
            (*h).locked.prev = ptr::null_mut();
            (*h).locked.next = self.head;
            if !self.head.is_null() {
                (*self.head).locked.prev = h;
            }
        }
        self.head = h;
        self.len += 1;
    }

    /// # Safety
    /// `h` is on this list; the cache's lock is held.
    unsafe fn unlink(&mut self, h: *mut SlabHeader) {
        // SAFETY: `h` and its neighbours are live headers on this list, ours under the lock.
        unsafe {
            let (prev, next) = ((*h).locked.prev, (*h).locked.next);
            if prev.is_null() {
                self.head = next;
            } else {
                (*prev).locked.next = next;
            }
            if !next.is_null() {
                (*next).locked.prev = prev;
            }
        }
        self.len -= 1;
    }
}

/// The lock-protected state of a cache.
struct CacheState {
    partial: SlabList,
    full: SlabList,
    empty: SlabList,
    /// The colour of the next slab.
    colour_next: usize,
    /// Spare external headers (large caches), linked through `locked.next`.
    spare: *mut SlabHeader,
    /// Pages of external headers, linked through their first word; the second word
    /// counts the page's headers in use (not spare).
    header_pages: *mut u8,
    header_page_count: usize,
    allocated: usize,
    slabs_created: usize,
    slabs_destroyed: usize,
    corruptions: usize,
}

// SAFETY: the raw pointers lead to slabs and pages owned by the cache, reached only under
// its lock, from whichever thread holds it.
unsafe impl Send for CacheState {}

/// A cache's immutable geometry and its locked state, in its own mapping (slab headers
/// point to it, so it must not move).
struct CacheInner {
    magic: usize,
    regions: usize,
    name: &'static str,
    size: usize,
    align: usize,
    chunk: usize,
    small: bool,
    slab_pages: usize,
    capacity: usize,
    /// Offset of the first object (before colouring) from the run's base.
    offset: usize,
    colour_step: usize,
    colour_max: usize,
    checking: bool,
    max_empty: usize,
    /// The tag of this cache's slab pages in their regions ([`page_tag`](super::region::page_tag)).
    page_tag: u8,
    state: Lock<CacheState>,
}

/// Builds a [`SlabCache`].
///
/// ```
/// let regions = scalemem::umem::region::Regions::new()?;
/// let cache = scalemem::umem::slab::SlabCache::builder(&regions, "big", 40_000, 64)
///     .checking(true)
///     .max_empty(0)
///     .build()?;
/// assert!(!cache.stats().small);
/// # Ok::<(), scalemem::util::AllocError>(())
/// ```
#[derive(Debug)]
pub struct SlabCacheBuilder<'r> {
    regions: &'r Regions,
    name: &'static str,
    size: usize,
    align: usize,
    checking: bool,
    max_empty: usize,
    page_tag: u8,
    colour_room: usize,
}

/// The builder's settings; [`build`](Self::build) makes the cache.
///
/// ```
/// use scalemem::umem::slab::SlabCache;
/// let regions = scalemem::umem::region::Regions::new()?;
/// let plain = SlabCache::builder(&regions, "plain", 8, 8).build()?;
/// let checked = SlabCache::builder(&regions, "checked", 8, 8).checking(true).build()?;
/// assert_eq!(plain.stats().chunk, 8);
/// assert_eq!(checked.stats().chunk, 16); // the object and its 8-byte redzone
/// # Ok::<(), scalemem::util::AllocError>(())
/// ```
impl<'r> SlabCacheBuilder<'r> {
    /// Keeps at least `bytes` of slack in each slab of a large cache (chunks above
    /// [`SMALL_MAX`]) for colouring: with objects of a page multiple, the slabs' first
    /// objects would otherwise all share one offset in their pages (and so one set of
    /// cache lines). The slab then spans the fewest pages that waste at most a sixteenth
    /// of it, room included, if there are such. Default 0 (colour only in the slack the
    /// geometry leaves). No effect on small caches.
    ///
    /// ```
    /// let regions = scalemem::umem::region::Regions::new()?;
    /// let plain = scalemem::umem::slab::SlabCache::builder(&regions, "plain", 64 << 10, 64).build()?;
    /// assert_eq!(plain.stats().colour_max, 0); // 16 pages, one object, no slack
    /// let coloured = scalemem::umem::slab::SlabCache::builder(&regions, "coloured", 64 << 10, 64)
    ///     .colour_room(4096 - 64)
    ///     .build()?;
    /// assert_eq!(coloured.stats().colour_max, 4096); // 17 pages: 65 colours of a cache line
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub fn colour_room(mut self, bytes: usize) -> Self {
        self.colour_room = bytes;
        self
    }

    /// The tag this cache's slab pages carry in their regions (`Regions::page_tag`):
    /// the global heap tags each size class's pages with the class, so that `free(ptr)`
    /// finds it in one load. Default 0 (no tag).
    pub(crate) fn page_tag(mut self, tag: u8) -> Self {
        self.page_tag = tag;
        self
    }

    /// Checking mode (see the module documentation). Default: off.
    ///
    /// ```
    /// use scalemem::umem::slab::{FreeError, SlabCache};
    /// let regions = scalemem::umem::region::Regions::new()?;
    /// let cache = SlabCache::builder(&regions, "checked", 24, 8).checking(true).build()?;
    /// let p = cache.alloc()?;
    /// // SAFETY: byte 24 is the first of the object's redzone, inside its chunk; checking
    /// // mode validates any pointer before `free` uses it.
    /// unsafe {
    ///     p.as_ptr().add(24).write(0); // an overrun
    ///     assert_eq!(cache.free(p), Err(FreeError::Overrun)); // refused: still allocated
    ///     p.as_ptr().add(24).write(0xBB); // the redzone's fill restored
    ///     assert_eq!(cache.free(p), Ok(()));
    /// }
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub fn checking(mut self, on: bool) -> Self {
        self.checking = on;
        self
    }

    /// How many empty slabs the cache keeps; past that an emptied slab goes back to its
    /// region at once. Default 2.
    ///
    /// ```
    /// let regions = scalemem::umem::region::Regions::new()?;
    /// let cache = scalemem::umem::slab::SlabCache::builder(&regions, "c", 64, 8).max_empty(0).build()?;
    /// let p = cache.alloc()?;
    /// // SAFETY: `p` came from this cache's `alloc` and is freed once.
    /// unsafe { cache.free(p) }.unwrap(); // its slab empties and goes back at once
    /// let s = cache.stats();
    /// assert_eq!((s.empty, s.slabs_created, s.slabs_destroyed), (0, 1, 1));
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub fn max_empty(mut self, slabs: usize) -> Self {
        self.max_empty = slabs;
        self
    }

    /// Makes the cache: computes its geometry and maps its state. Fails for a size of
    /// zero or above [`MAX_SIZE`], an alignment that is not a power of two or is above
    /// [`PAGE`], or if the kernel refuses the page for the cache's state.
    ///
    /// ```
    /// use scalemem::umem::slab::{SlabCache, MAX_SIZE};
    /// use scalemem::util::AllocError;
    /// let regions = scalemem::umem::region::Regions::new()?;
    /// let cache = SlabCache::builder(&regions, "lines", 100, 64).build()?;
    /// assert_eq!(cache.stats().chunk, 128); // 100 bytes rounded up to the alignment
    /// assert_eq!(SlabCache::builder(&regions, "empty", 0, 8).build().unwrap_err(), AllocError);
    /// assert_eq!(SlabCache::builder(&regions, "huge", MAX_SIZE + 1, 8).build().unwrap_err(), AllocError);
    /// assert_eq!(SlabCache::builder(&regions, "odd", 8, 12).build().unwrap_err(), AllocError);
    /// # Ok::<(), AllocError>(())
    /// ```
    pub fn build(self) -> Result<SlabCache<'r>, AllocError> {
        let Self { regions, name, size, align, checking, max_empty, page_tag, colour_room } = self;
        if size == 0 || size > MAX_SIZE || !align.is_power_of_two() || align > PAGE {
            return Err(AllocError);
        }
        let align = align.max(8);
        let redzone = if checking { 8 } else { 0 };
        let chunk = (size.max(8) + redzone).next_multiple_of(align);
        let small = chunk <= SMALL_MAX;
        let (slab_pages, capacity, offset) = if small {
            let offset = size_of::<SlabHeader>().next_multiple_of(align);
            (1, ((PAGE - offset) / chunk).min(MAX_OBJECTS), offset)
        } else {
            let (pages, capacity) = large_geometry(chunk, colour_room);
            (pages, capacity, 0)
        };
        let slack = slab_pages * PAGE - offset - capacity * chunk;
        let colour_step = CACHE_LINE.max(align);
        let colour_max = slack / colour_step * colour_step;
        let inner = os::map(size_of::<CacheInner>())?.cast::<CacheInner>();
        let value = CacheInner {
            magic: CACHE_MAGIC,
            regions: regions.id(),
            name,
            size,
            align,
            chunk,
            small,
            slab_pages,
            capacity,
            offset,
            colour_step,
            colour_max,
            checking,
            max_empty,
            page_tag,
            state: Lock::new(CacheState {
                partial: SlabList::new(),
                full: SlabList::new(),
                empty: SlabList::new(),
                colour_next: 0,
                spare: ptr::null_mut(),
                header_pages: ptr::null_mut(),
                header_page_count: 0,
                allocated: 0,
                slabs_created: 0,
                slabs_destroyed: 0,
                corruptions: 0,
            }),
        };
        // SAFETY: a fresh page-aligned mapping of at least `size_of::<CacheInner>()` bytes.
        unsafe { inner.as_ptr().write(value) };
        Ok(SlabCache { inner, regions })
    }
}

/// Pages and capacity of a large cache's slabs: the fewest pages whose tail waste is at
/// most an eighth of the slab (always found by `8 * chunk / PAGE + 1` pages, since the
/// waste is below one chunk), capped by the region's usable pages and `MAX_OBJECTS`.
/// With `room` (the colour room, [`SlabCacheBuilder::colour_room`]): at least `room`
/// bytes of tail, and at most a sixteenth of the slab wasted, room included, or else
/// the least waste per mille.
fn large_geometry(chunk: usize, room: usize) -> (usize, usize) {
    let mut best = (usize::MAX, 1, 1); // (waste per mille, pages, capacity)
    for pages in 1..=USABLE_PAGES {
        let bytes = pages * PAGE;
        let capacity = (bytes.saturating_sub(room) / chunk).min(MAX_OBJECTS);
        if capacity == 0 {
            continue;
        }
        let waste = bytes - capacity * chunk;
        let bound = if room == 0 { 8 } else { 16 };
        if waste * bound <= bytes {
            return (pages, capacity);
        }
        let per_mille = waste * 1000 / bytes;
        if per_mille < best.0 {
            best = (per_mille, pages, capacity);
        }
    }
    (best.1, best.2)
}

/// A cache of objects of one size and alignment, carved from slabs (see the module
/// documentation). `Send + Sync`; every operation takes the cache's lock.
///
/// ```
/// let regions = scalemem::umem::region::Regions::new()?;
/// let cache = scalemem::umem::slab::SlabCache::builder(&regions, "shared", 32, 8).build()?;
/// std::thread::scope(|s| {
///     for _ in 0..2 {
///         s.spawn(|| {
///             let p = cache.alloc().unwrap();
///             // SAFETY: `p` came from this cache's `alloc` and is freed once.
///             unsafe { cache.free(p) }.unwrap();
///         });
///     }
/// });
/// let s = cache.stats();
/// assert_eq!((s.allocated, s.slabs_created), (0, 1)); // both threads used one slab
/// # Ok::<(), scalemem::util::AllocError>(())
/// ```
pub struct SlabCache<'r> {
    inner: NonNull<CacheInner>,
    regions: &'r Regions,
}

// SAFETY: `CacheInner` is immutable geometry plus lock-protected state; the slabs it owns
// are reached under that lock (or, for lookups, their immutable parts and atomic bitmaps
// under the regions lock). So:
// - Send: nothing in it is tied to a thread;
// - Sync: every shared access goes through the lock or an atomic.
unsafe impl Send for SlabCache<'_> {}
// SAFETY: see `Send` above.
unsafe impl Sync for SlabCache<'_> {}

impl core::fmt::Debug for SlabCache<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SlabCache").field("name", &self.inner().name).field("stats", &self.stats()).finish()
    }
}

/// Allocation, freeing, lookup, statistics and checks.
///
/// ```
/// let regions = scalemem::umem::region::Regions::new()?;
/// let cache = scalemem::umem::slab::SlabCache::builder(&regions, "c", 512, 8).build()?;
/// let capacity = cache.stats().capacity;
/// let objects = (0..=capacity).map(|_| cache.alloc()).collect::<Result<Vec<_>, _>>()?;
/// let s = cache.stats();
/// assert_eq!((s.full, s.partial), (1, 1)); // one slab filled, a second begun
/// for p in objects {
///     // SAFETY: each came from this cache's `alloc` and is freed once.
///     unsafe { cache.free(p) }.unwrap();
/// }
/// cache.assert_valid();
/// # Ok::<(), scalemem::util::AllocError>(())
/// ```
impl<'r> SlabCache<'r> {
    /// A builder for a cache of `size`-byte objects aligned to `align`, whose slabs come
    /// from `regions`.
    ///
    /// ```
    /// let regions = scalemem::umem::region::Regions::new()?;
    /// let cache = scalemem::umem::slab::SlabCache::builder(&regions, "u64", 8, 8).build()?;
    /// assert_eq!(cache.stats().chunk, 8);
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub fn builder(regions: &'r Regions, name: &'static str, size: usize, align: usize) -> SlabCacheBuilder<'r> {
        SlabCacheBuilder { regions, name, size, align, checking: false, max_empty: 2, page_tag: 0, colour_room: 0 }
    }

    fn inner(&self) -> &CacheInner {
        // SAFETY: written in `build`, unmapped only in `drop`.
        unsafe { self.inner.as_ref() }
    }

    /// Takes the cache's lock without a scope, for `fork` (see `Regions::fork_lock`).
    pub(crate) fn fork_lock(&self) {
        self.inner().state.force_lock();
    }

    /// Releases what [`fork_lock`](Self::fork_lock) took.
    ///
    /// # Safety
    /// As `Regions::fork_unlock`.
    pub(crate) unsafe fn fork_unlock(&self) {
        // SAFETY: the caller's contract.
        unsafe { self.inner().state.force_unlock() };
    }

    /// This cache's identity, as [`Regions::lookup`] reports it.
    ///
    /// ```
    /// use scalemem::umem::slab::SlabCache;
    /// let regions = scalemem::umem::region::Regions::new()?;
    /// let a = SlabCache::builder(&regions, "a", 8, 8).build()?;
    /// let b = SlabCache::builder(&regions, "b", 8, 8).build()?;
    /// assert_ne!(a.id(), b.id());
    /// let p = b.alloc()?;
    /// assert_eq!(regions.lookup(p.as_ptr()).map(|found| found.cache), Some(b.id()));
    /// // SAFETY: `p` came from `b`'s `alloc` and is freed once.
    /// unsafe { b.free(p) }.unwrap();
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub fn id(&self) -> CacheId {
        CacheId(self.inner.as_ptr() as usize)
    }

    /// An object: `size` bytes of uninitialised memory aligned to `align`. Fails only if
    /// a new slab is needed and the kernel refuses the memory (nothing is changed). Never
    /// allocates through the global allocator.
    ///
    /// ```
    /// let regions = scalemem::umem::region::Regions::new()?;
    /// let cache = scalemem::umem::slab::SlabCache::builder(&regions, "c", 24, 8).build()?;
    /// let p = cache.alloc()?;
    /// // SAFETY: `p` came from this cache and is freed once.
    /// unsafe { cache.free(p) }.unwrap();
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub fn alloc(&self) -> Result<NonNull<u8>, AllocError> {
        let c = self.inner();
        c.state.with(|s| {
            let mut h = s.partial.head;
            if h.is_null() {
                h = s.empty.head;
                if h.is_null() {
                    h = self.new_slab(s)?;
                } else {
                    // SAFETY: `h` heads the empty list; under the lock.
                    unsafe { s.empty.unlink(h) };
                }
                // SAFETY: `h` is on no list now.
                unsafe { s.partial.push(h, Which::Partial) };
            }
            // SAFETY: `h` is a partial slab of this cache: it has a free object.
            Ok(unsafe { self.take_object(s, h) })
        })
    }

    /// Hands out one object of the partial slab `h`.
    ///
    /// # Safety
    /// Under the lock; `h` is on the partial list.
    unsafe fn take_object(&self, s: &mut CacheState, h: *mut SlabHeader) -> NonNull<u8> {
        let c = self.inner();
        // SAFETY: a live slab of ours; `ident` is read-only, `locked` ours under the lock.
        let (ident, locked) = unsafe { (&(*h).ident, &mut (*h).locked) };
        let (obj, reused) = if let Some(obj) = NonNull::new(locked.free) {
            // SAFETY: a free object's first word is the free-list link (8-aligned).
            locked.free = unsafe { obj.as_ptr().cast::<*mut u8>().read() };
            (obj, true)
        } else {
            // SAFETY: partial, so `fresh < capacity` when the free list is empty; the
            // object lies inside the slab.
            let obj = unsafe { NonNull::new_unchecked(ident.first.add(locked.fresh * c.chunk)) };
            locked.fresh += 1;
            (obj, false)
        };
        let index = (obj.as_ptr() as usize - ident.first as usize) / c.chunk;
        // SAFETY: live slab header. Relaxed: see `SlabHeader::bits`.
        unsafe { (*h).bits[bit_word(index)].fetch_or(1 << (index % 64), Ordering::Relaxed) };
        locked.allocated += 1;
        s.allocated += 1;
        if c.checking {
            if reused {
                // SAFETY: the object is ours: `size` bytes past the link word were poisoned at free.
                let body = unsafe { core::slice::from_raw_parts(obj.as_ptr().add(8), c.size.saturating_sub(8)) };
                if body.iter().any(|&b| b != POISON) {
                    s.corruptions += 1;
                }
            }
            // SAFETY: `[size, chunk)` is the object's redzone, inside the slab.
            unsafe { ptr::write_bytes(obj.as_ptr().add(c.size), REDZONE, c.chunk - c.size) };
        }
        if locked.allocated == c.capacity {
            // SAFETY: `h` is on the partial list; under the lock.
            unsafe {
                s.partial.unlink(h);
                s.full.push(h, Which::Full);
            }
        }
        obj
    }

    /// Makes a slab (on no list yet), taking a run from the regions.
    #[cold]
    #[inline(never)]
    fn new_slab(&self, s: &mut CacheState) -> Result<*mut SlabHeader, AllocError> {
        let c = self.inner();
        let external = if c.small { None } else { Some(self.spare_header(s)?) };
        let colour = s.colour_next;
        let me = self.inner.as_ptr().cast_const();
        let init = |base: NonNull<u8>| {
            let h = external.unwrap_or(base.cast::<SlabHeader>());
            let header = SlabHeader {
                ident: SlabIdent {
                    magic: SLAB_MAGIC,
                    cache: me,
                    base: base.as_ptr(),
                    // SAFETY: offset + colour + capacity * chunk <= the run's bytes.
                    first: unsafe { base.as_ptr().add(c.offset + colour) },
                    colour,
                    size: c.size,
                },
                locked: SlabLocked {
                    prev: ptr::null_mut(),
                    next: ptr::null_mut(),
                    which: Which::Empty,
                    allocated: 0,
                    fresh: 0,
                    free: ptr::null_mut(),
                },
                bits: core::array::from_fn(|_| AtomicUsize::new(0)),
            };
            // SAFETY: `h` is a spare external header or the start of the fresh run, room
            // for a header either way; nobody else can reach it yet (the page map does
            // not name it until `init` returns).
            unsafe { h.as_ptr().write(header) };
            h.cast::<u8>()
        };
        match self.regions.alloc_run(c.slab_pages, c.page_tag, init) {
            Ok(base) => {
                s.colour_next = if colour + c.colour_step > c.colour_max { 0 } else { colour + c.colour_step };
                s.slabs_created += 1;
                Ok(external.unwrap_or(base.cast()).as_ptr())
            }
            Err(e) => {
                if let Some(h) = external {
                    // SAFETY: under the lock; the spare header was not used.
                    unsafe { Self::unuse_header(s, h.as_ptr()) };
                }
                Err(e)
            }
        }
    }

    /// A spare external header, mapping a page of them if none is left.
    fn spare_header(&self, s: &mut CacheState) -> Result<NonNull<SlabHeader>, AllocError> {
        if s.spare.is_null() {
            let page = os::map(PAGE)?.as_ptr();
            // SAFETY: a fresh page: its first word links the cache's header pages, its
            // second counts its headers in use (0: the fresh mapping is zero), the rest
            // is cut into headers (aligned: the header's alignment divides 64).
            unsafe {
                page.cast::<*mut u8>().write(s.header_pages);
                s.header_pages = page;
                s.header_page_count += 1;
                let mut at = CACHE_LINE;
                while at + size_of::<SlabHeader>() <= PAGE {
                    let h = page.add(at).cast::<SlabHeader>();
                    ptr::addr_of_mut!((*h).locked.next).write(s.spare);
                    s.spare = h;
                    at += size_of::<SlabHeader>();
                }
            }
        }
        let h = s.spare;
        // SAFETY: a spare header's `locked.next` links the spare list.
        s.spare = unsafe { (*h).locked.next };
        // SAFETY: `h` lies in one of our header pages, whose second word is its count.
        unsafe { *header_uses(h) += 1 };
        // SAFETY: non-null: the list was refilled above.
        Ok(unsafe { NonNull::new_unchecked(h) })
    }

    /// Puts the external header `h` back on the spare list.
    ///
    /// # Safety
    /// Under the lock; `h` came from [`spare_header`](Self::spare_header) and no slab
    /// uses it any more.
    unsafe fn unuse_header(s: &mut CacheState, h: *mut SlabHeader) {
        // SAFETY: the caller's: ours, unused; its page's count counted it.
        unsafe {
            *header_uses(h) -= 1;
            (*h).locked.next = s.spare;
        }
        s.spare = h;
    }

    /// Gives back the header pages none of whose headers is in use: their headers leave
    /// the spare list, then the pages are unlinked and unmapped. Under the lock.
    fn release_idle_header_pages(s: &mut CacheState) {
        // Nothing to do unless some page is wholly spare (one pass over the pages).
        let mut page = s.header_pages;
        let mut idle = false;
        while let Some(p) = NonNull::new(page) {
            // SAFETY: a header page of ours: word 0 links the next, word 1 counts uses.
            unsafe {
                idle |= p.as_ptr().cast::<usize>().add(1).read() == 0;
                page = p.as_ptr().cast::<*mut u8>().read();
            }
        }
        if !idle {
            return;
        }
        // The spare list without the idle pages' headers.
        let mut kept: *mut SlabHeader = ptr::null_mut();
        let mut h = s.spare;
        while !h.is_null() {
            // SAFETY: a spare header of ours: `locked.next` links the list, and its page's
            // count is readable.
            let (next, idle) = unsafe { ((*h).locked.next, *header_uses(h) == 0) };
            if !idle {
                // SAFETY: as above.
                unsafe { (*h).locked.next = kept };
                kept = h;
            }
            h = next;
        }
        s.spare = kept;
        // Unlink and unmap the idle pages.
        let mut link: *mut *mut u8 = &raw mut s.header_pages;
        // SAFETY: `link` is the list head or a live page's first word; every page on the
        // list is a mapping of PAGE bytes made by `spare_header`, and an idle one holds
        // no header in use and none on the spare list any more.
        unsafe {
            while let Some(p) = NonNull::new(*link) {
                let next = p.as_ptr().cast::<*mut u8>().read();
                if p.as_ptr().cast::<usize>().add(1).read() == 0 {
                    *link = next;
                    os::unmap(p, PAGE);
                    s.header_page_count -= 1;
                } else {
                    link = p.as_ptr().cast::<*mut u8>();
                }
            }
        }
    }

    /// Gives an empty slab (on no list) back to its region.
    ///
    /// # Safety
    /// Under the lock; `h` is a slab of this cache with no allocated object, on no list.
    unsafe fn destroy_slab(&self, s: &mut CacheState, h: *mut SlabHeader) {
        let c = self.inner();
        // SAFETY: live header of ours.
        let base = unsafe { (*h).ident.base };
        // SAFETY: the run was handed out for this slab by our regions' `alloc_run`; no
        // object in it is allocated, and we touch nothing in it afterwards.
        unsafe { self.regions.free_run(NonNull::new_unchecked(base), c.slab_pages) };
        if !c.small {
            // SAFETY: under the lock; the external header is ours again (the page map no
            // longer names it).
            unsafe { Self::unuse_header(s, h) };
        }
        s.slabs_destroyed += 1;
    }

    /// Returns an object to the cache.
    ///
    /// Outside checking mode the pointer is trusted to be in a live slab of a cache over
    /// the same regions (the region and page map are read unchecked); the cache, the
    /// object base and the allocated bit are still checked, so a double free or a free of
    /// an interior pointer is refused. In checking mode any pointer may be passed: it is
    /// validated under the regions lock first, and the redzone is checked. An `Err`
    /// changes nothing.
    ///
    /// # Safety
    /// Outside checking mode: `ptr` points into a live slab of a cache over the same
    /// [`Regions`] (for instance, it came from `alloc` of this cache). The object's
    /// contents are dead after a successful free.
    ///
    /// ```
    /// use scalemem::umem::slab::{FreeError, SlabCache};
    /// let regions = scalemem::umem::region::Regions::new()?;
    /// let cache = SlabCache::builder(&regions, "c", 32, 8).checking(true).build()?;
    /// let p = cache.alloc()?;
    /// // SAFETY: checking mode accepts any pointer.
    /// unsafe {
    ///     assert_eq!(cache.free(p), Ok(()));
    ///     assert_eq!(cache.free(p), Err(FreeError::NotAllocated));
    ///     let on_stack = 0u64;
    ///     assert_eq!(cache.free(core::ptr::NonNull::from(&on_stack).cast()), Err(FreeError::Foreign));
    /// }
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub unsafe fn free(&self, ptr: NonNull<u8>) -> Result<(), FreeError> {
        let c = self.inner();
        let me = self.inner.as_ptr().cast_const();
        if c.checking {
            return c.state.with(|s| {
                let h = self.regions.with_owner(ptr.as_ptr(), |owner| {
                    let h = owner.ok_or(FreeError::Foreign)?.cast::<SlabHeader>();
                    // SAFETY: under the regions lock a page-map entry names a live slab
                    // header (initialised before the entry was set, freed after it is
                    // cleared); its `ident` is read-only.
                    let ident = unsafe { &(*h.as_ptr()).ident };
                    if ident.magic != SLAB_MAGIC {
                        return Err(FreeError::Foreign);
                    }
                    if ident.cache != me {
                        return Err(FreeError::WrongCache);
                    }
                    Ok(h.as_ptr())
                })?;
                // SAFETY: `h` is a slab of this cache, whose slabs go away only under the
                // cache lock we hold.
                unsafe { self.free_locked(s, h, ptr) }
            });
        }
        // SAFETY: the caller promises a live slab over these regions.
        let h = unsafe { self.regions.owner_of(ptr.as_ptr()) } as *mut SlabHeader;
        if h.is_null() {
            return Err(FreeError::Foreign);
        }
        // SAFETY: as above: the page map names the slab's live header.
        if unsafe { (*h).ident.cache } != me {
            return Err(FreeError::WrongCache);
        }
        // SAFETY: a slab of this cache, alive while we hold the lock (it holds `ptr`).
        c.state.with(|s| unsafe { self.free_locked(s, h, ptr) })
    }

    /// # Safety
    /// Under the lock; `h` is a live slab of this cache.
    unsafe fn free_locked(&self, s: &mut CacheState, h: *mut SlabHeader, ptr: NonNull<u8>) -> Result<(), FreeError> {
        let c = self.inner();
        // SAFETY: live slab of ours; `locked` ours under the lock.
        let (ident, locked) = unsafe { (&(*h).ident, &mut (*h).locked) };
        let offset = (ptr.as_ptr() as usize).wrapping_sub(ident.first as usize);
        let index = offset / c.chunk;
        if ptr.as_ptr() < ident.first || !offset.is_multiple_of(c.chunk) || index >= c.capacity {
            return Err(FreeError::NotObjectBase);
        }
        let bit = 1 << (index % 64);
        // SAFETY: live header. Relaxed: see `SlabHeader::bits`; writers hold our lock.
        let word = unsafe { &(*h).bits[bit_word(index)] };
        if word.load(Ordering::Relaxed) & bit == 0 {
            return Err(FreeError::NotAllocated);
        }
        if c.checking {
            // SAFETY: the redzone `[size, chunk)` of an allocated object of ours.
            let zone = unsafe { core::slice::from_raw_parts(ptr.as_ptr().add(c.size), c.chunk - c.size) };
            if zone.iter().any(|&b| b != REDZONE) {
                return Err(FreeError::Overrun);
            }
            // SAFETY: the object's bytes, dead now.
            unsafe { ptr::write_bytes(ptr.as_ptr(), POISON, c.size) };
        }
        word.fetch_and(!bit, Ordering::Relaxed);
        // SAFETY: the object is free: its first word (8-aligned) links the free list.
        unsafe { ptr.as_ptr().cast::<*mut u8>().write(locked.free) };
        locked.free = ptr.as_ptr();
        let was_full = locked.allocated == c.capacity;
        locked.allocated -= 1;
        s.allocated -= 1;
        let now_empty = locked.allocated == 0;
        // SAFETY: `h` is on the list its old counts call for, and becomes empty only with no
        // object allocated (so it may be destroyed); under the lock.
        unsafe {
            if was_full {
                s.full.unlink(h);
                if now_empty {
                    s.empty.push(h, Which::Empty);
                } else {
                    s.partial.push(h, Which::Partial);
                }
            } else if now_empty {
                s.partial.unlink(h);
                s.empty.push(h, Which::Empty);
            }
            if now_empty && s.empty.len > c.max_empty {
                s.empty.unlink(h);
                self.destroy_slab(s, h);
            }
        }
        Ok(())
    }

    /// Gives every empty slab back to its region (the memory pressure path).
    ///
    /// ```
    /// let regions = scalemem::umem::region::Regions::new()?;
    /// let cache = scalemem::umem::slab::SlabCache::builder(&regions, "c", 64, 8).build()?;
    /// let p = cache.alloc()?;
    /// // SAFETY: from this cache, freed once.
    /// unsafe { cache.free(p) }.unwrap();
    /// assert_eq!(cache.stats().empty, 1);
    /// cache.shrink();
    /// assert_eq!(cache.stats().empty, 0);
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub fn shrink(&self) {
        self.inner().state.with(|s| {
            while !s.empty.head.is_null() {
                let h = s.empty.head;
                // SAFETY: `h` heads the empty list: no allocated object; under the lock.
                unsafe {
                    s.empty.unlink(h);
                    self.destroy_slab(s, h);
                }
            }
            Self::release_idle_header_pages(s);
        });
    }

    /// Gives back the pages of external headers none of whose headers is in use, as
    /// [`shrink`](Self::shrink) does after destroying the empty slabs (the object
    /// cache's free-time trim calls it after its own slabs went back).
    pub(crate) fn release_header_pages(&self) {
        self.inner().state.with(Self::release_idle_header_pages);
    }

    /// If `ptr` is inside an object of this cache's slabs, that object's base. Safe for
    /// any address (see [`Regions::lookup`]).
    ///
    /// ```
    /// let regions = scalemem::umem::region::Regions::new()?;
    /// let cache = scalemem::umem::slab::SlabCache::builder(&regions, "c", 100, 4).build()?;
    /// let p = cache.alloc()?;
    /// assert_eq!(cache.lookup(p.as_ptr().wrapping_add(99)), Some(p));
    /// assert_eq!(cache.lookup(&0u8), None);
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub fn lookup(&self, ptr: *const u8) -> Option<NonNull<u8>> {
        self.regions.lookup(ptr).filter(|found| found.cache == self.id()).map(|found| found.base)
    }

    /// Counters and geometry.
    ///
    /// ```
    /// let regions = scalemem::umem::region::Regions::new()?;
    /// let cache = scalemem::umem::slab::SlabCache::builder(&regions, "c", 1000, 8).build()?;
    /// let stats = cache.stats();
    /// assert!(!stats.small && stats.capacity * stats.chunk * 8 >= stats.slab_pages * 4096 * 7);
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub fn stats(&self) -> SlabStats {
        let c = self.inner();
        c.state.with(|s| SlabStats {
            size: c.size,
            align: c.align,
            chunk: c.chunk,
            small: c.small,
            slab_pages: c.slab_pages,
            capacity: c.capacity,
            colour_max: c.colour_max,
            allocated: s.allocated,
            partial: s.partial.len,
            full: s.full.len,
            empty: s.empty.len,
            slabs_created: s.slabs_created,
            slabs_destroyed: s.slabs_destroyed,
            corruptions: s.corruptions,
            header_pages: s.header_page_count,
        })
    }

    /// Checks the invariants listed in the module documentation; panics if one is
    /// broken. Takes the cache's lock (so it is safe at any time).
    ///
    /// ```
    /// let regions = scalemem::umem::region::Regions::new()?;
    /// let cache = scalemem::umem::slab::SlabCache::builder(&regions, "c", 8, 8).build()?;
    /// let _p = cache.alloc()?;
    /// cache.assert_valid();
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub fn assert_valid(&self) {
        let c = self.inner();
        let me = self.inner.as_ptr().cast_const();
        assert_eq!(c.magic, CACHE_MAGIC, "slab: cache magic");
        assert_eq!(c.regions, self.regions.id(), "slab: cache regions");
        c.state.with(|s| {
            let mut allocated = 0;
            for (list, which) in [(&s.partial, Which::Partial), (&s.full, Which::Full), (&s.empty, Which::Empty)] {
                let mut len = 0;
                let mut prev: *mut SlabHeader = ptr::null_mut();
                let mut h = list.head;
                while !h.is_null() {
                    len += 1;
                    // SAFETY: listed slabs are live headers of ours; under the lock.
                    let (ident, locked) = unsafe { (&(*h).ident, &(*h).locked) };
                    assert_eq!(ident.magic, SLAB_MAGIC, "slab: header magic");
                    assert_eq!(ident.cache, me, "slab: header names another cache");
                    assert_eq!(ident.size, c.size, "slab: header's object size");
                    assert_eq!(locked.which, which, "slab: wrong list tag");
                    assert_eq!(locked.prev, prev, "slab: broken links");
                    match which {
                        Which::Partial => assert!(locked.allocated > 0 && locked.allocated < c.capacity),
                        Which::Full => assert_eq!(locked.allocated, c.capacity),
                        Which::Empty => assert_eq!(locked.allocated, 0),
                    }
                    assert!(locked.fresh <= c.capacity && locked.allocated <= locked.fresh, "slab: fresh index");
                    // Invariant 4.
                    assert!(
                        ident.colour % c.colour_step == 0 && ident.colour <= c.colour_max,
                        "slab: colour out of range"
                    );
                    assert_eq!(
                        ident.first as usize,
                        ident.base as usize + c.offset + ident.colour,
                        "slab: first object"
                    );
                    // Invariant 2.
                    let mut bits = 0;
                    for (w, word) in (0..BITMAP_WORDS).map(|w| {
                        // SAFETY: live header. Relaxed: writers hold the lock we hold.
                        (w, unsafe { (*h).bits[w].load(Ordering::Relaxed) })
                    }) {
                        bits += word.count_ones() as usize;
                        for b in 0..64 {
                            if word & (1 << b) != 0 {
                                assert!(w * 64 + b < locked.fresh, "slab: allocated bit past fresh");
                            }
                        }
                    }
                    assert_eq!(bits, locked.allocated, "slab: bitmap disagrees with the count");
                    let mut free = 0;
                    let mut cursor = locked.free;
                    while !cursor.is_null() {
                        free += 1;
                        assert!(free <= c.capacity, "slab: free list cycle");
                        let offset = (cursor as usize).wrapping_sub(ident.first as usize);
                        let index = offset / c.chunk;
                        assert!(
                            offset.is_multiple_of(c.chunk) && index < locked.fresh,
                            "slab: free object out of place"
                        );
                        // SAFETY: live header. Relaxed: writers hold the lock we hold.
                        let word = unsafe { (*h).bits[bit_word(index)].load(Ordering::Relaxed) };
                        assert!(word & (1 << (index % 64)) == 0, "slab: free object marked allocated");
                        // SAFETY: a free object's first word is the link.
                        cursor = unsafe { cursor.cast::<*mut u8>().read() };
                    }
                    assert_eq!(free + locked.allocated, locked.fresh, "slab: objects do not add up");
                    // Invariant 3.
                    for page in 0..c.slab_pages {
                        // SAFETY: the run is live (its slab is listed and we hold the lock).
                        let owner = unsafe { self.regions.owner_of(ident.base.add(page * PAGE)) };
                        assert_eq!(owner, h as usize, "slab: page map does not name the slab");
                    }
                    allocated += locked.allocated;
                    prev = h;
                    h = locked.next;
                }
                assert_eq!(len, list.len, "slab: list length");
            }
            assert_eq!(allocated, s.allocated, "slab: allocated objects");
            assert_eq!(
                s.partial.len + s.full.len + s.empty.len,
                s.slabs_created - s.slabs_destroyed,
                "slab: slab count"
            );
            // External headers: each page's count is its headers in use, which add up
            // to the slabs, and the pages and spare headers add up to the pages' room.
            let (mut pages, mut uses) = (0, 0);
            let mut page = s.header_pages;
            while let Some(p) = NonNull::new(page) {
                pages += 1;
                // SAFETY: a header page of ours, under the lock: word 0 links the next,
                // word 1 counts uses.
                unsafe {
                    uses += p.as_ptr().cast::<usize>().add(1).read();
                    page = p.as_ptr().cast::<*mut u8>().read();
                }
            }
            assert_eq!(pages, s.header_page_count, "slab: header page count");
            if !c.small {
                assert_eq!(uses, s.partial.len + s.full.len + s.empty.len, "slab: header uses");
                let mut spare = 0;
                let mut h = s.spare;
                while !h.is_null() {
                    spare += 1;
                    // SAFETY: a spare header of ours, under the lock.
                    h = unsafe { (*h).locked.next };
                }
                let per_page = (PAGE - CACHE_LINE) / size_of::<SlabHeader>();
                assert_eq!(spare + uses, pages * per_page, "slab: spare and used headers");
            }
        });
    }
}

impl Drop for SlabCache<'_> {
    /// Gives every slab back to its region (objects still allocated are lost with them)
    /// and unmaps the cache's state and header pages.
    fn drop(&mut self) {
        let c = self.inner.as_ptr();
        // The lock, not `get_mut`: a lookup on another thread may hold a shared reference
        // to the cache's state (through a slab it found) until `free_run` below unlists
        // the slab, so no `&mut` to the whole lock may exist meanwhile.
        // SAFETY: `inner` is live until the unmap at the end.
        unsafe { &(*c).state }.with(|s| {
            for which in [Which::Partial, Which::Full, Which::Empty] {
                let list = match which {
                    Which::Partial => &mut s.partial,
                    Which::Full => &mut s.full,
                    Which::Empty => &mut s.empty,
                };
                while !list.head.is_null() {
                    let h = list.head;
                    // SAFETY: `h` heads `list`; exclusive access.
                    unsafe { list.unlink(h) };
                    // SAFETY: live header of ours.
                    let base = unsafe { (*h).ident.base };
                    // SAFETY: the run was handed out for this slab; nobody can reach its
                    // objects through the cache any more.
                    unsafe { self.regions.free_run(NonNull::new_unchecked(base), (*c).slab_pages) };
                }
            }
            let mut page = s.header_pages;
            while let Some(p) = NonNull::new(page) {
                // SAFETY: a header page's first word links the next one.
                page = unsafe { p.as_ptr().cast::<*mut u8>().read() };
                // SAFETY: mapped in `spare_header` with this length; no slab uses it now.
                unsafe { os::unmap(p, PAGE) };
            }
        });
        // SAFETY: mapped in `build` with this length; nothing refers to it any more.
        unsafe { os::unmap(self.inner.cast(), size_of::<CacheInner>()) };
    }
}
