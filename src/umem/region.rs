//! Regions: memory comes from the kernel in [`REGION_SIZE`]-aligned regions of
//! [`REGION_SIZE`] bytes (2 MiB), so a pointer finds its region's header by masking its
//! low bits. The slab layer takes runs of pages from them; a region goes back to the
//! kernel only after its count of live slabs has stayed zero for two Refcache epochs.
//!
//! ```
//! use scalemem::refcount::Config;
//! use scalemem::umem::region::Regions;
//!
//! let regions = Regions::builder().refcache(Config::manual()).retain(0).build()?;
//! let cache = scalemem::umem::slab::SlabCache::builder(&regions, "example", 100, 8).build()?;
//! let p = cache.alloc()?;
//! assert_eq!(regions.stats().live_regions, 1);
//! // SAFETY: `p` came from this cache's `alloc` and is freed once.
//! unsafe { cache.free(p) }.unwrap();
//! cache.shrink(); // hands the emptied slab back: the region's count drops to zero
//! while regions.stats().live_regions != 0 {
//!     regions.tick(); // two epochs later, the region is unmapped (retain(0))
//! }
//! assert_eq!(regions.stats().mapped_bytes, 0);
//! # Ok::<(), scalemem::util::AllocError>(())
//! ```
//!
//! # Layout
//!
//! A region starts with its header ([`HEADER_PAGES`] pages of [`PAGE`] bytes): the
//! [`RcHeader`] that counts its live slabs (first, so the release callback's header
//! address is the region's base), a magic word and the owning manager, the list links and
//! counts that the manager's lock protects, a bitmap of used pages, and the **page map**:
//! one word per page, the address of the slab header that owns the page (every page of a
//! slab's run names the same header), or 0 for a free page; and a **tag** byte per page,
//! the caller's label for the run (`Regions::alloc_run`: one more than the size class
//! for the global heap's caches, 0 otherwise); and a **tag word** per page, the word a
//! manager built with a tag-word table (`RegionsBuilder::tag_words`) held for the run's
//! tag when the run was taken (the global heap's table names each class's per-CPU
//! magazine slots, so that `free` reaches them from the pointer in one load, not a load
//! of the tag and a second of the table), null otherwise. The rest of the region is
//! handed out as **runs** of whole pages, first fit in the bitmap. A region page is
//! always 4 KiB ([`PAGE`]); the kernel's page size only matters for `madvise`, which is
//! applied to the whole region past its header.
//!
//! # The lifecycle of a region
//!
//! ```text
//!   map (2 MiB aligned) ──► active ──(count stays 0 for two epochs: release)──► retained
//!                           ▲   │                                                 │
//!                           │   └──(release, retained list full)──► unmapped      │
//!                           └──────────(a run is needed: header re-initialised)───┘
//! ```
//!
//! - **Active**: on the manager's active list, registered with the manager's
//!   [`Refcache`]. Its count is the number of live runs (slabs) in it. Every count
//!   change happens under the manager's lock, right where the run is handed out or
//!   taken back ([`Refcache::inc`] for a region that has runs, [`Refcache::dec`] when a
//!   run goes back), so the count the Refcache sees is exactly the `slabs` field the
//!   lock protects.
//! - **Empty but not released**: an active region whose last run went back. It stays on
//!   the active list and is reused, though only when no region with live runs has room
//!   (so that empty regions get the chance to go back); to take a run from it the
//!   manager calls [`Refcache::try_revive`] under its lock. If the revival wins, the
//!   region is live again and the Refcache's review re-queues it instead of freeing it.
//!   If the Refcache's free won, the region is marked *dying* and skipped: its release
//!   callback is about to run (it waits for the lock we hold), so its header is valid
//!   while we look, which is the condition `try_revive` asks for.
//! - **Release** ([`RcRelease::release`], on the thread that ticks the Refcache): takes
//!   the manager's lock and unlinks the region. If fewer than the builder's `retain`
//!   regions are retained, the pages past the header and below its touched mark (the
//!   only ones written since its pages last went back), less those a purge already gave
//!   back and no run has taken since (*clean* pages), are given back with
//!   `madvise(MADV_DONTNEED)` and the region joins the retained list (mapped, not
//!   counted); otherwise it is unregistered and unmapped.
//! - **Reuse of a retained region**: when no active region has room, a retained one is
//!   taken before mapping a new one; its [`RcHeader`] is written afresh (count one, for
//!   the run being handed out) and registered again, since the Refcache is done with the
//!   old one once its callback returned.
//!
//! The two-epoch delay is the hysteresis: a slab that comes and goes on a region costs no
//! `mmap`/`munmap` pair, only a region whose count has stayed zero for a while goes.
//!
//! - **Purge** ([`Regions::purge`]): the free pages of active regions go back with
//!   `madvise(MADV_DONTNEED)` at once, region by region under the lock, without waiting
//!   for the release; each region counts the pages freed since its last purge (`dirty`)
//!   so that a purge skips regions with nothing new to give, and marks the pages it gave
//!   back clean, so that no later purge or release gives (or counts) them again before a
//!   run takes them. Object caches call it when
//!   a free finds their depot over its trim threshold (`cache.rs`, "Free-time trim").
//!
//! # Transparent huge pages
//!
//! Regions are 2 MiB aligned, which is exactly what lets the kernel back one with a
//! single huge page. With THP in `madvise` mode (the common default) that never happens
//! unasked. With THP `always`, `khugepaged` collapses any region whose resident pages
//! pass its threshold (`max_ptes_none`: by default one resident 4 KiB page is enough),
//! and so turns every page a purge or a release gave back resident again: measured, a
//! program's resident set after a reclaim grew from 19 MB to 31 MB within a minute. So,
//! when the system is in `always` mode (read once from
//! `/sys/kernel/mm/transparent_hugepage/enabled`), the first time pages of a region go
//! back it is advised `MADV_NOHUGEPAGE` for the rest of its mapping (`Locked::no_huge`).
//! Regions that never give pages back keep huge pages; so do all regions in `madvise`
//! mode, where nothing is advised.
//!
//! # Lookup
//!
//! [`Regions::lookup`] (defined in the slab module) finds a pointer's slab
//! from nothing but the pointer: mask to the region base, check that this manager mapped
//! a region there (a bitmap with one bit per [`REGION_SIZE`] of the 47-bit user address
//! space, 8 MiB of address space of which only touched pages cost memory), check the
//! header's magic and owner, read the page map. It runs under the manager's lock, which
//! the release callback also takes before it unmaps anything, so a foreign or stale
//! pointer never makes it read unmapped memory. The allocator's own free path trusts its
//! pointer and reads the page map without the lock (a live object's slab keeps its
//! region mapped).
//!
//! # The Refcache
//!
//! A [`Regions`] owns its [`Refcache`], built from the [`Config`] given to the builder
//! (the default has a background ticker with 10 ms epochs; tests pass
//! [`Config::manual`] and call [`Regions::tick`]). Owning it ties the lifetimes: the
//! release callback reaches the manager through a pointer in the header, and dropping
//! the manager first drops the Refcache (which releases every zero-count region while
//! the manager still exists), then unmaps what is left.
//!
//! # Lock order
//!
//! A slab cache's lock, then the regions lock (a cache takes runs while holding its own
//! lock). The release callback takes only the regions lock. Refcache operations under the
//! regions lock (`inc`, `dec`, `try_revive`) never call back into us; only `tick` and the
//! Refcache's drop run the callback, and neither is called with the lock held.
//!
//! # Faults
//!
//! If the kernel refuses a new region (or the registry's pages), [`Regions`] returns
//! `Err(AllocError)` having changed nothing. Giving pages back never fails: a refused
//! `madvise` only leaves the pages resident (counted as not returned).
//!
//! # Invariants (checked by [`Regions::assert_valid`])
//!
//! 1. Every listed region has the magic, names this manager, is registered, and is on
//!    the list its state says.
//! 2. In an active region, a page past the header is marked used iff its page-map entry
//!    is non-zero; the header pages are marked used; `free_pages` counts the unmarked
//!    pages; the runs (maximal stretches of equal non-zero entries) number `slabs`.
//! 3. A retained region has no runs, a zero page map, no dying mark, no dirty pages and
//!    its touched mark at the header's end; in every region the dirty count is at most
//!    `USABLE_PAGES`, no used page lies at or past the touched mark, and every clean page
//!    (given back since it was last in a run) is free and below the mark.
//! 4. The sum of `slabs` is the manager's run count; the list lengths match their counts;
//!    `mapped_bytes` is `REGION_SIZE` times the regions on both lists.
//! 5. When nothing runs ([`Regions::assert_counts_settled`]): every active region's
//!    Refcache count equals its number of runs.

use core::mem::{ManuallyDrop, size_of};
use core::ptr::{self, NonNull};

use super::os;
use super::vmem::lock::Lock;
use crate::refcount::{Config, RcHeader, RcRelease, Refcache};
use crate::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering};
use crate::util::AllocError;

/// The size and alignment of a region: 2 MiB (64 KiB under loom, so that models map
/// little).
pub const REGION_SIZE: usize = if cfg!(scalemem_loom) { 64 << 10 } else { 2 << 20 };
/// The unit of a region's page map and page allocator: 4 KiB.
pub const PAGE: usize = 4096;
/// Pages per region.
pub const PAGES: usize = REGION_SIZE / PAGE;
/// Pages at the start of every region that hold its header.
pub const HEADER_PAGES: usize = size_of::<RegionHeader>().div_ceil(PAGE);
/// Pages of a region that runs can use.
pub const USABLE_PAGES: usize = PAGES - HEADER_PAGES;

/// "umregion" in ASCII: the first word after the `RcHeader` of every region.
const MAGIC: usize = 0x756d_7265_6769_6f6e;
const USED_WORDS: usize = PAGES.div_ceil(64);
// `page_bit_word` masks with it.
const _: () = assert!(USED_WORDS.is_power_of_two());

// `page_index` masks with it.
const _: () = assert!(PAGES.is_power_of_two());

/// Page `page`'s entry in a region's per-page tables (`page < PAGES`, so the mask changes
/// nothing): masked into range, so that the index needs no bounds check and the
/// allocator's paths hold no formatting panic.
#[inline(always)]
const fn page_index(page: usize) -> usize {
    page & (PAGES - 1)
}

/// The word of a region's page bitmaps that holds page `page`'s bit (`page < PAGES`):
/// masked into range, so that the index needs no bounds check and the allocator's paths
/// hold no formatting panic.
#[inline(always)]
const fn page_bit_word(page: usize) -> usize {
    (page / 64) & (USED_WORDS - 1)
}
/// Address bits of user space on x86_64 (4-level paging; we never ask for more).
const ADDRESS_BITS: u32 = 47;
/// Regions that fit in the address space: one registry bit each.
#[cfg(not(scalemem_loom))]
const REGISTRY_BITS: usize = 1 << (ADDRESS_BITS - REGION_SIZE.trailing_zeros());
/// Under loom the registry is a token (models never look up foreign pointers, and a
/// bitmap for 64 KiB regions would be 256 MiB per model run): see `registry_contains`.
#[cfg(scalemem_loom)]
const REGISTRY_BITS: usize = 64;
const REGISTRY_BYTES: usize = REGISTRY_BITS / 8;

/// A registry that lives in a static (zero until its manager maps a region) instead of
/// a mapping of its own, for the one manager whose membership test must not first load
/// and test a pointer to it: the global heap's, which `free` asks about every pointer
/// (`RegionsBuilder::static_registry`, [`StaticRegistry::has`]). As large as a mapped
/// registry (8 MiB of zero-fill address space; the pages a lookup touches come in as
/// the zero page until a bit near them is set).
pub(crate) struct StaticRegistry([core::sync::atomic::AtomicU64; REGISTRY_BITS / 64]);

impl core::fmt::Debug for StaticRegistry {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("StaticRegistry").finish_non_exhaustive()
    }
}

impl StaticRegistry {
    /// An empty registry.
    pub(crate) const fn new() -> Self {
        Self([const { core::sync::atomic::AtomicU64::new(0) }; REGISTRY_BITS / 64])
    }

    /// Whether `ptr` lies in a region of the manager that uses this registry:
    /// [`Regions::contains`] with no pointer to load and none to test for null. Exact
    /// for a pointer into a live run, a hint otherwise (as `contains`).
    #[inline(always)]
    pub(crate) fn has(&self, ptr: *const u8) -> bool {
        // SAFETY: a live registry of REGISTRY_BYTES bytes (a static); its address is not
        // null, so the null test in `registry_has` folds away.
        unsafe { registry_has(self.0.as_ptr().cast::<u64>(), ptr) }
    }
}

/// Where a region is in its lifecycle (see the module documentation).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Active,
    Retained,
}

/// Set at initialisation, read-only while the region is mapped.
#[repr(C)]
struct Ident {
    magic: usize,
    manager: *const Inner,
}

/// The part of a header that the manager's lock protects.
#[repr(C)]
struct Locked {
    prev: *mut RegionHeader,
    next: *mut RegionHeader,
    state: State,
    /// `try_revive` failed: the release callback is due; take no runs from it.
    dying: bool,
    /// Live runs (slabs) in the region: its count, as the Refcache will see it.
    slabs: usize,
    /// Pages not in a run and not in the header.
    free_pages: usize,
    /// Pages freed (by `free_run`) since the region's free pages last went back to the
    /// kernel ([`Regions::purge`] or the release): how much a purge may gain. A hint (a
    /// page freed and taken again still counts), at most `USABLE_PAGES`.
    dirty: usize,
    /// Pages from here to the end were in no run since the region was mapped or its
    /// free pages last went back (runs are taken first fit, low pages first): a purge
    /// need not give them back. Every used page lies below it.
    touched: usize,
    /// Bit `i` set: page `i` is in the header or in a run.
    used: [u64; USED_WORDS],
    /// Bit `i` set: page `i` (below `touched`) is free and has gone back to the kernel
    /// since it was last in a run, so it reads as zero and costs no memory: a purge or a
    /// release skips it (and does not count it again). Cleared when a run takes the page.
    clean: [u64; USED_WORDS],
    /// The region's mapping is advised `MADV_NOHUGEPAGE` (module documentation,
    /// "Transparent huge pages"). Lasts as long as the mapping.
    no_huge: bool,
}

/// The header at the start of every region.
#[repr(C)]
pub(crate) struct RegionHeader {
    /// First: the release callback's pointer is the region's base.
    rc: RcHeader,
    ident: Ident,
    locked: Locked,
    /// The page map: the owner (a slab header's address) of each page, 0 if free.
    /// Written under the manager's lock; read without it by the free path.
    map: [AtomicUsize; PAGES],
    /// Each page's tag: the `tag` its run was taken with ([`Regions::alloc_run`]), 0 if
    /// free. Written under the lock with the page map; read without it by the global
    /// heap's `free`, which finds a block's size class in one load this way.
    tags: [AtomicU8; PAGES],
    /// Each page's tag word: the manager's tag-word table's entry for the run's tag when
    /// the run was taken ([`RegionsBuilder::tag_words`]), 0 if free, if the manager has
    /// no table, or if the entry was null then. Written under the lock with the tags;
    /// read without it by the global heap's `free` ([`page_word`]).
    words: [AtomicUsize; PAGES],
}

/// The lock-protected state of a manager.
struct Shared {
    active: List,
    retained: List,
    retain_limit: usize,
    /// Live runs in all regions.
    runs: usize,
    /// One bit per `REGION_SIZE` of address space: a region of ours starts there.
    /// Mapped lazily (null until the first region), or a [`StaticRegistry`] given at
    /// build; `REGISTRY_BYTES` long.
    registry: *mut u64,
    /// Whether `registry` is a [`StaticRegistry`] (never unmapped).
    registry_static: bool,
    /// The tag-word table given at build ([`RegionsBuilder::tag_words`]), if any.
    tag_words: Option<&'static TagWords>,
}

/// A tag-word table ([`RegionsBuilder::tag_words`]): one word per page tag, null for
/// "none"; an entry, once non-null, names something that outlives every run taken with
/// its tag: the global heap's [`SlotTable`](super::slot_table::SlotTable) entries by tag.
pub(crate) type TagWords = [AtomicPtr<u8>; 256];

// SAFETY: the raw pointers in `Shared` point to regions and a registry mapped by the
// manager, reached only under the manager's lock, from whichever thread holds it; nothing
// in them is tied to a thread.
unsafe impl Send for Shared {}

/// A doubly linked list of region headers through `Locked::{prev, next}`.
struct List {
    head: *mut RegionHeader,
    len: usize,
}

impl List {
    const fn new() -> Self {
        Self { head: ptr::null_mut(), len: 0 }
    }

    /// # Safety
    /// `r` is a mapped region header, on no list; the manager's lock is held.
    unsafe fn push(&mut self, r: *mut RegionHeader) {
        // SAFETY: `r` and the head are mapped headers; their `locked` parts are ours
        // under the lock.
        unsafe {
            (*r).locked.prev = ptr::null_mut();
            (*r).locked.next = self.head;
            if !self.head.is_null() {
                (*self.head).locked.prev = r;
            }
        }
        self.head = r;
        self.len += 1;
    }

    /// # Safety
    /// `r` is on this list; the manager's lock is held.
    unsafe fn unlink(&mut self, r: *mut RegionHeader) {
        // SAFETY: `r` and its neighbours are mapped headers on this list, ours under the
        // lock.
        unsafe {
            let (prev, next) = ((*r).locked.prev, (*r).locked.next);
            if prev.is_null() {
                self.head = next;
            } else {
                (*prev).locked.next = next;
            }
            if !next.is_null() {
                (*next).locked.prev = prev;
            }
            (*r).locked.prev = ptr::null_mut();
            (*r).locked.next = ptr::null_mut();
        }
        self.len -= 1;
    }
}

/// The manager's state, in its own mapping so that its address never changes (region
/// headers point to it).
struct Inner {
    refcache: ManuallyDrop<Refcache>,
    shared: Lock<Shared>,
    /// Bytes of regions mapped now (active and retained). Relaxed (all counters): statistics.
    mapped: AtomicUsize,
    /// Bytes given back with `madvise` so far.
    returned: AtomicUsize,
    /// Bytes unmapped so far.
    unmapped: AtomicUsize,
    /// Release callbacks run so far.
    releases: AtomicUsize,
    /// Empty regions revived by `try_revive` so far.
    revivals: AtomicUsize,
    /// Regions mapped so far.
    maps: AtomicUsize,
    /// The registry's mapping once made (null before; a static one from the start):
    /// `Shared::registry`, published
    /// with Release for the lock-free [`Regions::contains`]. Never changes afterwards.
    registry: core::sync::atomic::AtomicPtr<u64>,
}

/// Counters of a [`Regions`] (each read on its own: a hint under concurrency).
///
/// ```
/// use scalemem::refcount::Config;
/// use scalemem::umem::region::{REGION_SIZE, Regions};
///
/// let regions = Regions::builder().refcache(Config::manual()).build()?;
/// let cache = scalemem::umem::slab::SlabCache::builder(&regions, "c", 64, 8).build()?;
/// let p = cache.alloc()?;
/// let s = regions.stats();
/// assert_eq!((s.runs, s.live_regions, s.maps), (1, 1, 1)); // one slab, one region
/// // Every mapped region is active or retained.
/// assert_eq!(s.mapped_bytes, (s.live_regions + s.retained_regions) * REGION_SIZE);
/// // SAFETY: `p` came from this cache's `alloc` and is freed once.
/// unsafe { cache.free(p) }.unwrap();
/// # Ok::<(), scalemem::util::AllocError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RegionStats {
    /// Bytes of regions mapped now (active and retained regions).
    pub mapped_bytes: usize,
    /// Bytes given back to the kernel with `madvise(MADV_DONTNEED)` so far: free
    /// stretches below a region's touched mark (by [`Regions::purge`], and by a release
    /// that retains the region). A page is counted once each time it goes back after
    /// being in a run: pages a purge gave back and that stayed free are not given, or
    /// counted, again by a later purge or release.
    pub returned_bytes: usize,
    /// Bytes unmapped so far.
    pub unmapped_bytes: usize,
    /// Regions on the active list (including empty ones waiting for their release).
    pub live_regions: usize,
    /// Released regions kept mapped for reuse.
    pub retained_regions: usize,
    /// Live runs (slabs) in all regions.
    pub runs: usize,
    /// Regions released by the Refcache so far.
    pub releases: usize,
    /// Empty regions revived before their release so far.
    pub revivals: usize,
    /// Regions mapped from the kernel so far.
    pub maps: usize,
}

/// The release callback of region headers.
struct RegionRelease;

/// The counted header of region `r`, projected from the region's pointer (not made
/// from a reference to the field): its provenance covers the whole header, which
/// [`RegionRelease::release`] reaches from it.
///
/// # Safety
/// `r` is a mapped region header.
unsafe fn rc_of(r: *mut RegionHeader) -> NonNull<RcHeader> {
    // SAFETY: non-null: a mapped header (the caller's contract); no reference is made.
    unsafe { NonNull::new_unchecked(&raw mut (*r).rc) }
}

impl RcRelease for RegionRelease {
    unsafe fn release(header: NonNull<RcHeader>) {
        let region = header.as_ptr().cast::<RegionHeader>();
        // SAFETY: the header is the first field of a mapped region header (repr(C)),
        // whose `ident` was written before the header was registered and is read-only.
        let manager = unsafe { (*region).ident.manager };
        // SAFETY: the manager outlives its regions' releases: its drop drops the Refcache
        // (which runs the last callbacks) before unmapping `Inner`.
        unsafe { Inner::release(manager, region) };
    }
}

/// Builds a [`Regions`].
///
/// ```
/// use scalemem::refcount::Config;
/// let regions = scalemem::umem::region::Regions::builder().refcache(Config::manual()).retain(2).build()?;
/// assert_eq!(regions.stats().mapped_bytes, 0);
/// # Ok::<(), scalemem::util::AllocError>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RegionsBuilder {
    config: Config,
    retain: usize,
    registry: Option<&'static StaticRegistry>,
    tag_words: Option<&'static TagWords>,
}

/// The builder's settings; [`build`](Self::build) makes the manager.
///
/// ```
/// use scalemem::refcount::Config;
/// use scalemem::umem::region::{REGION_SIZE, Regions};
///
/// // Ticked by hand, and nothing retained: a released region is unmapped.
/// let regions = Regions::builder().refcache(Config::manual()).retain(0).build()?;
/// let cache = scalemem::umem::slab::SlabCache::builder(&regions, "c", 64, 8).max_empty(0).build()?;
/// let p = cache.alloc()?;
/// // SAFETY: `p` came from this cache's `alloc` and is freed once.
/// unsafe { cache.free(p) }.unwrap(); // the slab goes back: the region's count is zero
/// for _ in 0..1000 {
///     if regions.stats().releases == 1 {
///         break;
///     }
///     regions.tick();
/// }
/// let s = regions.stats();
/// assert_eq!((s.mapped_bytes, s.unmapped_bytes, s.retained_regions), (0, REGION_SIZE, 0));
/// # Ok::<(), scalemem::util::AllocError>(())
/// ```
impl RegionsBuilder {
    /// The configuration of the manager's [`Refcache`] (default: [`Config::default`], a
    /// background ticker with 10 ms epochs).
    ///
    /// ```
    /// use scalemem::refcount::Config;
    /// let regions = scalemem::umem::region::Regions::builder().refcache(Config::manual()).build()?;
    /// let epoch = regions.refcache().epoch();
    /// assert_eq!(regions.tick(), epoch + 1); // no ticker thread: epochs move when ticked
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub fn refcache(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// How many released regions stay mapped (their pages given back with `madvise`)
    /// for reuse; more are unmapped. Default 4 (8 MiB of address space).
    ///
    /// ```
    /// use scalemem::refcount::Config;
    /// use scalemem::umem::region::{REGION_SIZE, Regions};
    ///
    /// let regions = Regions::builder().refcache(Config::manual()).retain(1).build()?;
    /// let cache = scalemem::umem::slab::SlabCache::builder(&regions, "c", 64, 8).max_empty(0).build()?;
    /// let p = cache.alloc()?;
    /// // SAFETY: `p` came from this cache's `alloc` and is freed once.
    /// unsafe { cache.free(p) }.unwrap(); // the slab goes back: the region's count is zero
    /// for _ in 0..1000 {
    ///     if regions.stats().releases == 1 {
    ///         break;
    ///     }
    ///     regions.tick(); // two epochs later the region is released
    /// }
    /// let s = regions.stats();
    /// assert_eq!((s.releases, s.live_regions, s.retained_regions), (1, 0, 1));
    /// assert_eq!((s.mapped_bytes, s.unmapped_bytes), (REGION_SIZE, 0)); // kept mapped
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub fn retain(mut self, regions: usize) -> Self {
        self.retain = regions;
        self
    }

    /// Keeps the registry in `registry` instead of a mapping of the manager's own, so
    /// that [`StaticRegistry::has`] tests membership without reaching the manager.
    ///
    /// # Safety
    /// No other manager uses `registry` while this one lives (its bits would claim that
    /// manager's regions for this one), and it is empty: never used, or used only by
    /// managers that have been dropped (a drop clears the bits of the regions it unmaps).
    pub(crate) unsafe fn static_registry(mut self, registry: &'static StaticRegistry) -> Self {
        self.registry = Some(registry);
        self
    }

    /// A table of words by page tag: when a run is taken with tag `t`, each of its pages'
    /// tag word ([`page_word`]) is set to `table[t]` as loaded then (Acquire), so that a
    /// reader holding a pointer into the run finds the word in one load. An entry that
    /// becomes non-null later is not copied into runs taken before (their words stay
    /// null: readers fall back to the tag). The global heap's table names each class's
    /// per-CPU slots. Default: none (every word stays null).
    pub(crate) fn tag_words(mut self, table: &'static TagWords) -> Self {
        self.tag_words = Some(table);
        self
    }

    /// Makes the manager: maps its state and starts its Refcache. Fails if the kernel
    /// refuses the memory or the ticker thread cannot start.
    ///
    /// ```
    /// use scalemem::refcount::Config;
    /// use scalemem::umem::region::{REGION_SIZE, Regions};
    ///
    /// let regions = Regions::builder().refcache(Config::manual()).build()?;
    /// assert_eq!(regions.stats().mapped_bytes, 0); // regions are mapped on demand
    /// let cache = scalemem::umem::slab::SlabCache::builder(&regions, "c", 64, 8).build()?;
    /// let p = cache.alloc()?;
    /// assert_eq!(regions.stats().mapped_bytes, REGION_SIZE);
    /// // SAFETY: `p` came from this cache's `alloc` and is freed once.
    /// unsafe { cache.free(p) }.unwrap();
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub fn build(self) -> Result<Regions, AllocError> {
        let refcache = Refcache::with_config(self.config)?;
        let inner = os::map(size_of::<Inner>())?.cast::<Inner>();
        let value = Inner {
            refcache: ManuallyDrop::new(refcache),
            shared: Lock::new(Shared {
                active: List::new(),
                retained: List::new(),
                retain_limit: self.retain,
                runs: 0,
                registry: self.registry.map_or(ptr::null_mut(), |r| r.0.as_ptr().cast::<u64>().cast_mut()),
                registry_static: self.registry.is_some(),
                tag_words: self.tag_words,
            }),
            mapped: AtomicUsize::new(0),
            returned: AtomicUsize::new(0),
            unmapped: AtomicUsize::new(0),
            releases: AtomicUsize::new(0),
            revivals: AtomicUsize::new(0),
            maps: AtomicUsize::new(0),
            registry: core::sync::atomic::AtomicPtr::new(
                self.registry.map_or(ptr::null_mut(), |r| r.0.as_ptr().cast::<u64>().cast_mut()),
            ),
        };
        // SAFETY: a fresh mapping of at least `size_of::<Inner>()` bytes, page-aligned.
        unsafe { inner.as_ptr().write(value) };
        Ok(Regions { inner })
    }
}

/// The region manager of one heap: maps regions, hands out runs of pages to slabs,
/// counts each region's live slabs in its [`Refcache`] and gives regions back once their
/// count has stayed zero for two epochs (see the module documentation).
///
/// ```
/// use scalemem::refcount::Config;
/// use scalemem::umem::region::Regions;
///
/// let mine = Regions::builder().refcache(Config::manual()).build()?;
/// let other = Regions::builder().refcache(Config::manual()).build()?;
/// let cache = scalemem::umem::slab::SlabCache::builder(&mine, "c", 32, 8).build()?;
/// let p = cache.alloc()?;
/// assert!(mine.lookup(p.as_ptr()).is_some());
/// assert!(other.lookup(p.as_ptr()).is_none()); // another heap's pointer
/// // SAFETY: `p` came from this cache's `alloc` and is freed once.
/// unsafe { cache.free(p) }.unwrap();
/// # Ok::<(), scalemem::util::AllocError>(())
/// ```
pub struct Regions {
    inner: NonNull<Inner>,
}

// SAFETY: `Inner` holds a `Refcache` (Send + Sync), counters, and the lock-protected
// `Shared`; the regions it points to are reached only under the lock or, for the page
// map, through atomics. So:
// - Send: nothing in it is tied to the creating thread;
// - Sync: every shared access is through the lock or an atomic.
unsafe impl Send for Regions {}
// SAFETY: see `Send` above.
unsafe impl Sync for Regions {}

impl core::fmt::Debug for Regions {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Regions").field("stats", &self.stats()).finish_non_exhaustive()
    }
}

/// Building, ticking, statistics, purging and checks.
///
/// ```
/// use scalemem::refcount::Config;
/// use scalemem::umem::region::Regions;
/// use scalemem::umem::slab::SlabCache;
///
/// let regions = Regions::builder().refcache(Config::manual()).build()?;
/// let small = SlabCache::builder(&regions, "small", 16, 8).build()?;
/// let large = SlabCache::builder(&regions, "large", 8192, 8).build()?;
/// let (p, q) = (small.alloc()?, large.alloc()?);
/// let s = regions.stats();
/// assert_eq!((s.runs, s.live_regions), (2, 1)); // two slabs' runs in one region
/// regions.assert_valid();
/// // SAFETY: each came from its cache's `alloc` and is freed once.
/// unsafe {
///     small.free(p).unwrap();
///     large.free(q).unwrap();
/// }
/// # Ok::<(), scalemem::util::AllocError>(())
/// ```
impl Regions {
    /// A manager with the default builder settings.
    ///
    /// ```
    /// let regions = scalemem::umem::region::Regions::new()?;
    /// assert_eq!(regions.stats().live_regions, 0);
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub fn new() -> Result<Self, AllocError> {
        Self::builder().build()
    }

    /// The builder: Refcache configuration and retention limit.
    ///
    /// ```
    /// use scalemem::refcount::Config;
    /// use scalemem::umem::region::{RegionStats, Regions};
    ///
    /// let regions = Regions::builder().refcache(Config::manual()).retain(0).build()?;
    /// assert_eq!(regions.stats(), RegionStats::default()); // nothing mapped yet
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub fn builder() -> RegionsBuilder {
        RegionsBuilder { config: Config::default(), retain: 4, registry: None, tag_words: None }
    }

    fn inner(&self) -> &Inner {
        // SAFETY: `inner` was written in `build` and is unmapped only in `drop`.
        unsafe { self.inner.as_ref() }
    }

    /// The Refcache that counts this manager's regions.
    ///
    /// ```
    /// use scalemem::refcount::Config;
    /// let regions = scalemem::umem::region::Regions::builder().refcache(Config::manual()).build()?;
    /// let cache = scalemem::umem::slab::SlabCache::builder(&regions, "c", 64, 8).build()?;
    /// let p = cache.alloc()?;
    /// assert_eq!(regions.refcache().stats().live, 1); // the region is its one counted object
    /// // SAFETY: `p` came from this cache's `alloc` and is freed once.
    /// unsafe { cache.free(p) }.unwrap();
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub fn refcache(&self) -> &Refcache {
        &self.inner().refcache
    }

    /// One Refcache epoch step by hand ([`Refcache::tick`]): regions whose count has
    /// stayed zero for two epochs are released on this thread. Returns the epoch.
    ///
    /// ```
    /// let regions = scalemem::umem::region::Regions::builder()
    ///     .refcache(scalemem::refcount::Config::manual())
    ///     .build()?;
    /// let e = regions.tick();
    /// assert_eq!(regions.tick(), e + 1);
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub fn tick(&self) -> usize {
        self.inner().refcache.tick()
    }

    /// [`tick`](Self::tick) only if the Refcache has work ([`Refcache::tick_if_busy`]):
    /// what a periodic caller uses, so that a heap whose region counts are settled
    /// pays no rseq fence per period. `None` when it skipped.
    pub(crate) fn tick_if_busy(&self) -> Option<usize> {
        self.inner().refcache.tick_if_busy()
    }

    /// Ticks until the epoch has advanced `epochs` times since the call, by this thread
    /// or another ticker: a tick that finds the advancer busy (a background tick, or
    /// umem's `fork` handler holding it while the process is copied) or a CPU's cache
    /// busy does not advance, so this yields and tries again, for at most a second.
    /// Returns whether all `epochs` passed.
    #[cfg(not(scalemem_loom))]
    pub(crate) fn advance(&self, epochs: usize) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        let mut last = self.tick();
        let mut passed = 0;
        // The first tick may itself have advanced: count from the epoch before it is
        // unknown, so it counts only through later ones (one extra tick at most).
        while passed < epochs {
            let now = self.tick();
            if now != last {
                passed += now.wrapping_sub(last);
                last = now;
            } else if std::time::Instant::now() > deadline {
                return false;
            } else {
                std::thread::yield_now();
            }
        }
        true
    }

    /// The counters.
    ///
    /// ```
    /// let regions = scalemem::umem::region::Regions::new()?;
    /// assert_eq!(regions.stats().runs, 0);
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub fn stats(&self) -> RegionStats {
        let inner = self.inner();
        let (live_regions, retained_regions, runs) = inner.shared.with(|s| (s.active.len, s.retained.len, s.runs));
        // Relaxed: statistics.
        RegionStats {
            mapped_bytes: inner.mapped.load(Ordering::Relaxed),
            returned_bytes: inner.returned.load(Ordering::Relaxed),
            unmapped_bytes: inner.unmapped.load(Ordering::Relaxed),
            live_regions,
            retained_regions,
            runs,
            releases: inner.releases.load(Ordering::Relaxed),
            revivals: inner.revivals.load(Ordering::Relaxed),
            maps: inner.maps.load(Ordering::Relaxed),
        }
    }

    /// An identity for this manager (its state's address), for checking who owns what.
    pub(crate) fn id(&self) -> usize {
        self.inner.as_ptr() as usize
    }

    /// Whether `ptr` lies in a region of this manager, without the lock: exact for a
    /// pointer into a live run (its region stays registered while the run is out), a
    /// hint for anything else (a region may be mapped or unmapped meanwhile). This is
    /// how `free(ptr)` tells slab objects from large blocks in constant time.
    #[inline]
    pub(crate) fn contains(&self, ptr: *const u8) -> bool {
        // SAFETY: our own registry, alive as long as `self`.
        unsafe { registry_has(self.registry(), ptr) }
    }

    /// The manager's registry mapping (null before its first region): it never moves
    /// and lives as long as the manager, so a caller may keep it and test membership
    /// with [`registry_has`] without reaching the manager (the global heap's `free`).
    #[inline]
    pub(crate) fn registry(&self) -> *const u64 {
        // Acquire: pairs with the Release store in `map_region` (the mapping is there).
        self.inner().registry.load(core::sync::atomic::Ordering::Acquire)
    }

    /// Takes the manager's lock without a scope, for `fork` (the prepare handler); the
    /// parent and the child each release it with [`fork_unlock`](Self::fork_unlock).
    pub(crate) fn fork_lock(&self) {
        let inner = self.inner();
        // The Refcache's locks first: nobody waits on them (see `Domain::fork_lock`).
        #[cfg(not(scalemem_loom))]
        inner.refcache.fork_lock();
        inner.shared.force_lock();
    }

    /// Releases what [`fork_lock`](Self::fork_lock) took.
    ///
    /// # Safety
    /// The lock was taken by `fork_lock` in this process (or in the parent, before the
    /// `fork` that made this process) and not released since.
    pub(crate) unsafe fn fork_unlock(&self) {
        let inner = self.inner();
        // SAFETY: the caller's contract (`fork_lock` took both).
        unsafe {
            inner.shared.force_unlock();
            #[cfg(not(scalemem_loom))]
            inner.refcache.fork_unlock();
        }
    }

    /// Hands out a run of `pages` pages (`1 ..= USABLE_PAGES`), each tagged `tag` (see
    /// [`page_tag`]). `init` runs under the
    /// manager's lock with the run's base, before the page map names the run's owner: it
    /// writes the slab header (in the run or elsewhere) and returns the owner's address,
    /// so a lookup never sees a half-written owner. The region's count goes up by one.
    /// Fails only if a new region is needed and the kernel refuses it, or for a bad
    /// `pages`; `init` then does not run. `init` must not call into this manager.
    pub(crate) fn alloc_run(
        &self,
        pages: usize,
        tag: u8,
        init: impl FnOnce(NonNull<u8>) -> NonNull<u8>,
    ) -> Result<NonNull<u8>, AllocError> {
        if pages == 0 || pages > USABLE_PAGES {
            return Err(AllocError);
        }
        let inner = self.inner();
        inner.shared.with(|s| {
            // 1. First fit in an active region that has runs, then in an empty one
            //    (reviving it): empty regions are used last, so that they can go back.
            for want_empty in [false, true] {
                let mut cursor = s.active.head;
                while !cursor.is_null() {
                    let r = cursor;
                    // SAFETY: listed headers are mapped; `locked` is ours under the lock.
                    let locked = unsafe { &mut (*r).locked };
                    cursor = locked.next;
                    if locked.dying || locked.free_pages < pages || (locked.slabs == 0) != want_empty {
                        continue;
                    }
                    let Some(first) = find_run(&locked.used, pages) else { continue };
                    // SAFETY: `rc` is the region's registered header, valid while the region
                    // is on the active list (its release callback unlinks it under the lock
                    // we hold, so it has not returned).
                    let rc = unsafe { rc_of(r) };
                    if locked.slabs == 0 {
                        // SAFETY: as above: the callback cannot return while we hold the lock.
                        if !unsafe { inner.refcache.try_revive(rc) } {
                            locked.dying = true;
                            continue;
                        }
                        // Relaxed: a statistic.
                        inner.revivals.fetch_add(1, Ordering::Relaxed);
                    } else {
                        // SAFETY: the region has live runs, so its count is not zero (every
                        // count change happens under this lock, matching `slabs`).
                        unsafe { inner.refcache.inc(rc) };
                    }
                    // SAFETY: `r` is an active region with room at `first`.
                    return Ok(unsafe { take_run(s, r, first, pages, tag, init) });
                }
            }
            // 2. A retained region, with a fresh count.
            if !s.retained.head.is_null() {
                let r = s.retained.head;
                // SAFETY: `r` is on the retained list.
                unsafe { s.retained.unlink(r) };
                // SAFETY: the Refcache finished with the old header when its release
                // callback returned (before the region was listed as retained), so we
                // may write a new one and register it: count one, for the run below.
                unsafe {
                    ptr::addr_of_mut!((*r).rc).write(RcHeader::new::<RegionRelease>());
                    (*r).locked.state = State::Active;
                    inner.refcache.register(rc_of(r));
                    s.active.push(r);
                }
                let first = HEADER_PAGES;
                // SAFETY: a retained region has no runs: `first` starts a free stretch of
                // `USABLE_PAGES >= pages`.
                return Ok(unsafe { take_run(s, r, first, pages, tag, init) });
            }
            // 3. A new region.
            let r = map_region(s, inner)?;
            // SAFETY: a fresh region: `first` starts a free stretch.
            Ok(unsafe { take_run(s, r, HEADER_PAGES, pages, tag, init) })
        })
    }

    /// Takes back a run from [`alloc_run`](Self::alloc_run): the pages become free and
    /// the region's count goes down by one (at zero, the region is released two epochs
    /// later unless a run is taken from it first).
    ///
    /// # Safety
    /// 1. `base` and `pages` are a run handed out by this manager's `alloc_run`, not yet
    ///    freed.
    /// 2. Nothing uses the run's memory any more (its page-map entries are cleared here).
    pub(crate) unsafe fn free_run(&self, base: NonNull<u8>, pages: usize) {
        let inner = self.inner();
        let r = region_of(base.as_ptr() as usize) as *mut RegionHeader;
        let first = (base.as_ptr() as usize - r as usize) / PAGE;
        inner.shared.with(|s| {
            // SAFETY: (1) the run lies in an active region of ours (its count is at least
            // one for this run, so it is not released); `locked` is ours under the lock.
            let locked = unsafe { &mut (*r).locked };
            for page in first..first + pages {
                locked.used[page_bit_word(page)] &= !(1 << (page % 64));
                // SAFETY: as above; `map` is only read through atomics.
                // Relaxed: a free page's entry is read only by lookups, which hold the lock
                // we hold (the unlocked readers, `owner_of` and `page_tag`, are only for
                // live runs).
                unsafe {
                    (*r).map[page_index(page)].store(0, Ordering::Relaxed);
                    (*r).tags[page_index(page)].store(0, Ordering::Relaxed);
                    (*r).words[page_index(page)].store(0, Ordering::Relaxed);
                }
            }
            locked.free_pages += pages;
            locked.dirty = (locked.dirty + pages).min(USABLE_PAGES);
            locked.slabs -= 1;
            s.runs -= 1;
            // SAFETY: (1) we drop the reference the run held; the region is registered.
            unsafe { inner.refcache.dec(rc_of(r)) };
        });
    }

    /// Gives the kernel the free pages of every active region that has had at least
    /// `min_dirty` pages (at least one) freed since its free pages last went back:
    /// `madvise(MADV_DONTNEED)` on each stretch of free pages below the region's touched
    /// mark (pages past every run taken since the region's pages last went back were
    /// never written, and are left alone) that has not gone back since it was last in a
    /// run (such pages are marked clean, and skipped), under the manager's lock,
    /// so that no run can be taken from a stretch while it is given back. The lock is
    /// taken once per region, not across the pass. A page given back reads as zero and
    /// costs a fault when a later run touches it: this is the free-time trim of the
    /// object caches ([`Config::trim_threshold`](crate::umem::cache::Config)), not
    /// something to call per free. Regions about to be released are skipped (their
    /// release gives their pages back). Returns the bytes given back (also counted in
    /// [`RegionStats::returned_bytes`]).
    ///
    /// ```
    /// use scalemem::refcount::Config;
    /// use scalemem::umem::region::Regions;
    /// use scalemem::umem::slab::SlabCache;
    ///
    /// let regions = Regions::builder().refcache(Config::manual()).build()?;
    /// let cache = SlabCache::builder(&regions, "pages", 4096, 4096).max_empty(0).build()?;
    /// let (a, b) = (cache.alloc()?, cache.alloc()?);
    /// // SAFETY: from this cache, freed once.
    /// unsafe { cache.free(a) }.unwrap(); // its slab (one page) goes back to the region
    /// assert_eq!(regions.purge(1), 4096); // and its page to the kernel
    /// assert_eq!(regions.purge(1), 0); // nothing freed since
    /// # unsafe { cache.free(b) }.unwrap();
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub fn purge(&self, min_dirty: usize) -> usize {
        let inner = self.inner();
        let min_dirty = min_dirty.max(1);
        let mut given = 0;
        // The region purged last: the walk resumes after it (or from the head if it has
        // left the active list while the lock was free).
        let mut last: *mut RegionHeader = ptr::null_mut();
        // At most twice the regions active at the start are purged (pages freed into a
        // region already purged make it dirty again: the pass must end anyway).
        let mut budget = None;
        loop {
            let step = inner.shared.with(|s| {
                let left = budget.get_or_insert(2 * s.active.len + 1);
                if *left == 0 {
                    return None;
                }
                *left -= 1;
                // SAFETY: a region our registry holds is mapped by us (the release
                // unregisters before unmapping, under this lock), so its header can be read.
                let resume = !last.is_null()
                    && unsafe { registry_contains(s.registry, last as usize) }
                    // SAFETY: as above; under the lock.
                    && unsafe { (*last).locked.state } == State::Active;
                // SAFETY: `last` is an active region (just checked): its links are valid.
                let mut cursor = if resume { unsafe { (*last).locked.next } } else { s.active.head };
                while !cursor.is_null() {
                    let r = cursor;
                    // SAFETY: listed headers are mapped; `locked` is ours under the lock.
                    let locked = unsafe { &mut (*r).locked };
                    cursor = locked.next;
                    if locked.dying || locked.dirty < min_dirty {
                        continue;
                    }
                    // SAFETY: a mapped region of ours, under the lock (nobody can take a
                    // run from it meanwhile).
                    let (bytes, refused) = unsafe { give_back_free(r, locked) };
                    // Refused pages are still there to give: the next purge retries them.
                    locked.dirty = refused;
                    // Relaxed: a statistic.
                    inner.returned.fetch_add(bytes, Ordering::Relaxed);
                    return Some((r, bytes));
                }
                None
            });
            match step {
                Some((r, bytes)) => {
                    given += bytes;
                    last = r;
                }
                None => return given,
            }
        }
    }

    /// The owner word of the page holding `ptr`, read without the lock (the free path).
    ///
    /// # Safety
    /// `ptr` points into a run of this manager that is live (handed out and not freed)
    /// and whose owner was set before the caller learnt of `ptr`.
    #[inline]
    pub(crate) unsafe fn owner_of(&self, ptr: *const u8) -> usize {
        let base = region_of(ptr as usize);
        let page = (ptr as usize - base) / PAGE;
        // SAFETY: a live run keeps its region mapped and active; `page < PAGES`.
        // Acquire: pairs with the Release store in `take_run`, so the owner's header is
        // initialised before we follow the address.
        unsafe { (*(base as *const RegionHeader)).map[page].load(Ordering::Acquire) }
    }

    /// Runs `f` with the owner of the page holding `ptr` (`None` if no live run of this
    /// manager holds it), under the manager's lock, so that nothing `f` reads through the
    /// owner can be unmapped or freed meanwhile. Safe for any pointer: it reads a region
    /// header only after finding the region in the registry. `f` must not call into this
    /// manager.
    pub(crate) fn with_owner<R>(&self, ptr: *const u8, f: impl FnOnce(Option<NonNull<u8>>) -> R) -> R {
        let me = self.inner.as_ptr().cast_const();
        self.inner().shared.with(|s| {
            let base = region_of(ptr as usize);
            // SAFETY: `registry` is null or a mapping of REGISTRY_BYTES, ours under the lock.
            if !unsafe { registry_contains(s.registry, base) } {
                return f(None);
            }
            let r = base as *const RegionHeader;
            // SAFETY: the registry says this manager mapped a region at `base` and has not
            // unmapped it (unmapping clears the bit first, under this lock).
            let (ident, state) = unsafe { (&(*r).ident, (*r).locked.state) };
            let page = (ptr as usize - base) / PAGE;
            if ident.magic != MAGIC || ident.manager != me || state != State::Active || page < HEADER_PAGES {
                return f(None);
            }
            // SAFETY: as above. Relaxed: the entry was written under the lock we hold.
            let owner = unsafe { (*r).map[page_index(page)].load(Ordering::Relaxed) };
            f(NonNull::new(owner as *mut u8))
        })
    }

    /// Checks the invariants listed in the module documentation (1 to 4); panics if one
    /// is broken. Safe to call at any time (it takes the lock).
    ///
    /// ```
    /// let regions = scalemem::umem::region::Regions::new()?;
    /// regions.assert_valid();
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub fn assert_valid(&self) {
        let inner = self.inner();
        let me = self.inner.as_ptr().cast_const();
        inner.shared.with(|s| {
            let mut runs = 0;
            for (list, state) in [(&s.active, State::Active), (&s.retained, State::Retained)] {
                let mut len = 0;
                let mut cursor = list.head;
                while !cursor.is_null() {
                    let r = cursor;
                    len += 1;
                    // SAFETY: listed regions are mapped; under the lock.
                    let (ident, locked) = unsafe { (&(*r).ident, &(*r).locked) };
                    assert_eq!(ident.magic, MAGIC, "region: bad magic");
                    assert_eq!(ident.manager, me, "region: wrong manager");
                    assert_eq!(locked.state, state, "region: on the wrong list");
                    // SAFETY: as above.
                    assert!(unsafe { registry_contains(s.registry, r as usize) }, "region: not registered");
                    if !locked.next.is_null() {
                        // SAFETY: as above.
                        assert_eq!(unsafe { (*locked.next).locked.prev }, r, "region: broken links");
                    }
                    let mut free = 0;
                    let mut region_runs = 0;
                    let mut previous = 0;
                    for page in 0..PAGES {
                        let used = locked.used[page_bit_word(page)] & (1 << (page % 64)) != 0;
                        // SAFETY: as above. Relaxed: written under the lock we hold.
                        let owner = unsafe { (*r).map[page_index(page)].load(Ordering::Relaxed) };
                        // SAFETY: as above. Relaxed: as above.
                        let tag = unsafe { (*r).tags[page_index(page)].load(Ordering::Relaxed) };
                        assert!(used || tag == 0, "region: a free page keeps a tag");
                        // SAFETY: as above. Relaxed: as above.
                        let word = unsafe { (*r).words[page_index(page)].load(Ordering::Relaxed) };
                        assert!(used || word == 0, "region: a free page keeps a tag word");
                        assert!(
                            word == 0
                                || s.tag_words
                                    .is_some_and(|t| t[usize::from(tag)].load(Ordering::Relaxed) as usize == word),
                            "region: a tag word that is not its tag's"
                        );
                        if page < HEADER_PAGES {
                            assert!(used && owner == 0, "region: header page free or owned");
                            continue;
                        }
                        assert_eq!(used, owner != 0, "region: page map disagrees with the bitmap");
                        if !used {
                            free += 1;
                        } else if owner != previous {
                            region_runs += 1;
                        }
                        previous = owner;
                    }
                    assert_eq!(free, locked.free_pages, "region: free page count");
                    assert_eq!(region_runs, locked.slabs, "region: run count");
                    if state == State::Retained {
                        assert!(region_runs == 0 && !locked.dying, "region: a retained region in use");
                        assert_eq!(locked.dirty, 0, "region: a retained region with dirty pages");
                    }
                    assert!(locked.dirty <= USABLE_PAGES, "region: dirty count out of range");
                    assert!(
                        (HEADER_PAGES..=PAGES).contains(&locked.touched)
                            && (locked.touched..PAGES).all(|p| locked.used[page_bit_word(p)] & (1 << (p % 64)) == 0),
                        "region: a used page past the touched mark"
                    );
                    if state == State::Retained {
                        assert_eq!(locked.touched, HEADER_PAGES, "region: a retained region marked touched");
                    }
                    assert!(
                        (0..USED_WORDS).all(|w| locked.clean[w] & locked.used[w] == 0)
                            && (locked.touched..PAGES).all(|p| locked.clean[page_bit_word(p)] & (1 << (p % 64)) == 0),
                        "region: a clean page in a run or past the touched mark"
                    );
                    runs += region_runs;
                    cursor = locked.next;
                }
                assert_eq!(len, list.len, "region: list length");
            }
            assert_eq!(runs, s.runs, "region: total runs");
            // Relaxed: mapped only changes under the lock we hold.
            assert_eq!(
                inner.mapped.load(Ordering::Relaxed),
                (s.active.len + s.retained.len) * REGION_SIZE,
                "region: mapped bytes"
            );
        });
    }

    /// Invariant 5: flushes every CPU's cached deltas (by ticking until the epoch has
    /// advanced twice; this may release regions), then checks that every active region's
    /// Refcache count equals its runs. Call only when no other thread uses the manager.
    ///
    /// ```
    /// let regions = scalemem::umem::region::Regions::builder()
    ///     .refcache(scalemem::refcount::Config::manual())
    ///     .build()?;
    /// regions.assert_counts_settled();
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub fn assert_counts_settled(&self) {
        let inner = self.inner();
        let start = inner.refcache.epoch();
        while inner.refcache.epoch() < start + 2 {
            inner.refcache.tick();
            crate::sync::yield_now();
        }
        inner.shared.with(|s| {
            let mut cursor = s.active.head;
            while !cursor.is_null() {
                // SAFETY: listed regions are mapped; under the lock.
                let (rc, locked) = unsafe { (&(*cursor).rc, &(*cursor).locked) };
                if !locked.dying {
                    assert_eq!(rc.global_count(), locked.slabs as isize, "region: Refcache count != live runs");
                }
                cursor = locked.next;
            }
        });
    }
}

impl Inner {
    /// The release callback's work (see the module documentation).
    ///
    /// # Safety
    /// `this` is a live manager; `r` is one of its active regions whose count the
    /// Refcache has just freed.
    unsafe fn release(this: *const Inner, r: *mut RegionHeader) {
        // SAFETY: fields of a live manager are reached one at a time: its drop holds a
        // `&mut` to `refcache` only while this may run.
        let (shared, stats) = unsafe { (&(*this).shared, StatsRef::of(this)) };
        shared.with(|s| {
            // SAFETY: `r` is an active region (the contract); under the lock.
            unsafe { s.active.unlink(r) };
            // SAFETY: as above.
            let locked = unsafe { &mut (*r).locked };
            debug_assert_eq!(locked.slabs, 0);
            // Relaxed (stats): statistics.
            stats.releases.fetch_add(1, Ordering::Relaxed);
            if s.retained.len < s.retain_limit {
                // Every page past the header is free (count zero): those below the touched
                // mark and not clean go back, and are counted.
                // Refused pages stay resident in the retained region: a missed saving (the
                // region is reused, or unmapped, later).
                // SAFETY: a mapped region of ours, unlinked, under the lock.
                let (bytes, _refused) = unsafe { give_back_free(r, locked) };
                stats.returned.fetch_add(bytes, Ordering::Relaxed);
                locked.clean = [0; USED_WORDS];
                locked.dying = false;
                locked.dirty = 0;
                locked.touched = HEADER_PAGES;
                locked.state = State::Retained;
                // SAFETY: `r` is on no list now.
                unsafe { s.retained.push(r) };
            } else {
                // SAFETY: registry is non-null (the region was registered).
                unsafe { registry_set(s.registry, r as usize, false) };
                // SAFETY: the region was mapped by `map_region` with these arguments; it
                // has no runs, is on no list and is unregistered, and the Refcache never
                // touches the header after this callback.
                unsafe { os::unmap_aligned(NonNull::new_unchecked(r.cast()), REGION_SIZE, REGION_SIZE) };
                stats.unmapped.fetch_add(REGION_SIZE, Ordering::Relaxed);
                stats.mapped.fetch_sub(REGION_SIZE, Ordering::Relaxed);
            }
        });
    }
}

/// The counters of an `Inner`, reached field by field from a raw pointer.
struct StatsRef<'a> {
    mapped: &'a AtomicUsize,
    returned: &'a AtomicUsize,
    unmapped: &'a AtomicUsize,
    releases: &'a AtomicUsize,
}

impl StatsRef<'_> {
    /// # Safety
    /// `this` is a live manager.
    unsafe fn of<'a>(this: *const Inner) -> StatsRef<'a> {
        // SAFETY: the caller's; each field is an atomic, shared freely.
        unsafe {
            StatsRef {
                mapped: &(*this).mapped,
                returned: &(*this).returned,
                unmapped: &(*this).unmapped,
                releases: &(*this).releases,
            }
        }
    }
}

impl Drop for Regions {
    fn drop(&mut self) {
        let inner = self.inner.as_ptr();
        // Dropping the Refcache releases every region whose count is zero (the callback
        // reaches `shared` and the counters, not `refcache`). Slab caches borrow the
        // manager, so they have all been dropped and given their runs back.
        // SAFETY: `&mut self`: nothing else uses the Refcache; it is dropped once.
        unsafe { ManuallyDrop::drop(&mut (*inner).refcache) };
        // SAFETY: `&mut self` and the Refcache is gone: no callback can run any more.
        let s = unsafe { (*inner).shared.get_mut() };
        for list in [&mut s.active, &mut s.retained] {
            while !list.head.is_null() {
                let r = list.head;
                // SAFETY: `r` is on `list`; exclusive access.
                unsafe { list.unlink(r) };
                // A static registry outlives us: it must not keep claiming the address.
                if s.registry_static {
                    // SAFETY: registered by `map_region` (so below 2^ADDRESS_BITS);
                    // exclusive access.
                    unsafe { registry_set(s.registry, r as usize, false) };
                }
                // SAFETY: mapped by `map_region`; a region still active here had runs
                // leaked by a forgotten slab cache, which nobody can reach any more.
                unsafe { os::unmap_aligned(NonNull::new_unchecked(r.cast()), REGION_SIZE, REGION_SIZE) };
            }
        }
        if let Some(registry) = NonNull::new(s.registry)
            && !s.registry_static
        {
            // SAFETY: mapped in `map_region` with this length; no region is left.
            unsafe { os::unmap(registry.cast(), REGISTRY_BYTES) };
        }
        // SAFETY: mapped in `build` with this length; `inner` holds nothing that needs
        // dropping any more (the lock and counters are plain words), and nothing refers to it.
        unsafe { os::unmap(self.inner.cast(), size_of::<Inner>()) };
    }
}

/// The base of the region that would hold `addr`.
#[inline]
fn region_of(addr: usize) -> usize {
    addr & !(REGION_SIZE - 1)
}

/// Gives the kernel (`madvise(MADV_DONTNEED)`) every stretch of free pages of `r` below
/// its touched mark that is not clean, marks those pages clean, lowers the touched mark
/// to the first page past the last used or still dirty one (clearing the clean bits it
/// leaves behind: pages past the mark are untouched by definition), and returns the
/// bytes given back and the pages the kernel refused: those stay dirty (and uncounted)
/// below the mark.
///
/// # Safety
/// Under the manager's lock; `r` is a mapped region of the manager and `locked` its
/// `locked` field.
unsafe fn give_back_free(r: *mut RegionHeader, locked: &mut Locked) -> (usize, usize) {
    let bit = |map: &[u64; USED_WORDS], page: usize| map[page_bit_word(page)] & (1 << (page % 64)) != 0;
    let (mut bytes, mut refused) = (0, 0);
    let mut page = HEADER_PAGES;
    // The first page past the last used (or refused) one: what `touched` becomes.
    let mut end = HEADER_PAGES;
    while page < locked.touched {
        if bit(&locked.used, page) {
            page += 1;
            end = page;
            continue;
        }
        if bit(&locked.clean, page) {
            page += 1;
            continue;
        }
        let first = page;
        while page < locked.touched && !bit(&locked.used, page) && !bit(&locked.clean, page) {
            page += 1;
        }
        // SAFETY: pages `first..page` of a mapped region are in no run (their used bits
        // are clear) and nobody can take them while the caller holds the lock;
        // page-aligned (PAGE is a multiple of the kernel's page on x86_64) and inside
        // the mapping (`touched <= PAGES`).
        if unsafe { os::dontneed(NonNull::new_unchecked((r as *mut u8).add(first * PAGE)), (page - first) * PAGE) } {
            bytes += (page - first) * PAGE;
            for p in first..page {
                locked.clean[page_bit_word(p)] |= 1 << (p % 64);
            }
        } else {
            // Still resident: the touched mark must stay above it, so that a later
            // purge or release tries again.
            refused += page - first;
            end = page;
        }
    }
    for p in end..locked.touched {
        locked.clean[page_bit_word(p)] &= !(1 << (p % 64));
    }
    locked.touched = end;
    if bytes > 0 && !locked.no_huge && os::thp_always() {
        // Some pages resident and some not: `khugepaged` would collapse the region into
        // a huge page, making every page given back resident again (module
        // documentation, "Transparent huge pages").
        // SAFETY: the whole mapping of a region of ours, region-aligned.
        locked.no_huge = unsafe { os::no_huge_pages(NonNull::new_unchecked(r.cast()), REGION_SIZE) };
    }
    (bytes, refused)
}

/// The first stretch of `pages` free pages (past the header) in `used`.
fn find_run(used: &[u64; USED_WORDS], pages: usize) -> Option<usize> {
    let mut len = 0;
    for page in HEADER_PAGES..PAGES {
        if used[page_bit_word(page)] & (1 << (page % 64)) != 0 {
            len = 0;
        } else {
            len += 1;
            if len == pages {
                return Some(page + 1 - pages);
            }
        }
    }
    None
}

/// Marks `pages` pages from `first` as a run, lets `init` write its owner, names the owner
/// in the page map, counts the run, and returns its base.
///
/// # Safety
/// Under the lock; `r` is an active region whose count already includes this run, and
/// `first .. first + pages` are free pages past its header.
unsafe fn take_run(
    s: &mut Shared,
    r: *mut RegionHeader,
    first: usize,
    pages: usize,
    tag: u8,
    init: impl FnOnce(NonNull<u8>) -> NonNull<u8>,
) -> NonNull<u8> {
    // SAFETY: the region is mapped; `first` is inside it.
    let base = unsafe { NonNull::new_unchecked((r as *mut u8).add(first * PAGE)) };
    let owner = init(base).as_ptr() as usize;
    // Acquire (inside): pairs with the Release store that published the entry: what it
    // names is initialised before a reader of the page word (ordered after this run is
    // handed out, see `page_word`) can follow it (`slot_table`'s protocol, point 3).
    let word = s.tag_words.map_or(0, |t| super::slot_table::word_for_run(t, tag) as usize);
    // SAFETY: under the lock.
    let locked = unsafe { &mut (*r).locked };
    for page in first..first + pages {
        debug_assert!(locked.used[page_bit_word(page)] & (1 << (page % 64)) == 0);
        locked.used[page_bit_word(page)] |= 1 << (page % 64);
        locked.clean[page_bit_word(page)] &= !(1 << (page % 64));
        // SAFETY: the region is mapped. Relaxed (the tag): see [`page_tag`]. Release (the
        // owner): pairs with the Acquire load in `owner_of` (the free path follows the
        // address to the slab header).
        unsafe {
            (*r).tags[page_index(page)].store(tag, Ordering::Relaxed);
            (*r).words[page_index(page)].store(word, Ordering::Relaxed);
            (*r).map[page_index(page)].store(owner, Ordering::Release);
        }
    }
    locked.free_pages -= pages;
    locked.touched = locked.touched.max(first + pages);
    locked.slabs += 1;
    s.runs += 1;
    base
}

/// Maps a new region, registers it and lists it as active with a count of one (for the
/// run the caller takes next). Changes nothing if the kernel refuses.
fn map_region(s: &mut Shared, inner: &Inner) -> Result<*mut RegionHeader, AllocError> {
    if s.registry.is_null() {
        s.registry = os::map(REGISTRY_BYTES)?.as_ptr().cast();
        // Release: pairs with the Acquire in `Regions::contains` (the mapping, all zero,
        // is there before anyone follows the pointer).
        inner.registry.store(s.registry, core::sync::atomic::Ordering::Release);
    }
    let base = os::map_aligned(REGION_SIZE, REGION_SIZE)?;
    let addr = base.as_ptr() as usize;
    if addr >> ADDRESS_BITS != 0 {
        // Out of the registry's range (5-level paging handing out high addresses).
        // SAFETY: just mapped with these arguments, unused.
        unsafe { os::unmap_aligned(base, REGION_SIZE, REGION_SIZE) };
        return Err(AllocError);
    }
    let r = base.as_ptr().cast::<RegionHeader>();
    let mut used = [0u64; USED_WORDS];
    for page in 0..HEADER_PAGES {
        used[page_bit_word(page)] |= 1 << (page % 64);
    }
    let header = RegionHeader {
        rc: RcHeader::new::<RegionRelease>(),
        ident: Ident { magic: MAGIC, manager: inner },
        locked: Locked {
            prev: ptr::null_mut(),
            next: ptr::null_mut(),
            state: State::Active,
            dying: false,
            slabs: 0,
            free_pages: USABLE_PAGES,
            dirty: 0,
            touched: HEADER_PAGES,
            used,
            clean: [0; USED_WORDS],
            no_huge: false,
        },
        map: core::array::from_fn(|_| AtomicUsize::new(0)),
        tags: core::array::from_fn(|_| AtomicU8::new(0)),
        words: core::array::from_fn(|_| AtomicUsize::new(0)),
    };
    // SAFETY: a fresh, aligned mapping of REGION_SIZE bytes, larger than the header; the
    // registry is mapped (above) and ours under the lock.
    unsafe {
        r.write(header);
        registry_set(s.registry, addr, true);
        inner.refcache.register(rc_of(r));
        s.active.push(r);
    }
    // Relaxed: statistics.
    inner.mapped.fetch_add(REGION_SIZE, Ordering::Relaxed);
    inner.maps.fetch_add(1, Ordering::Relaxed);
    Ok(r)
}

/// Whether the registry has a region at `base`'s region.
///
/// # Safety
/// `registry` is null or a mapping of `REGISTRY_BYTES` bytes; the manager's lock is held.
unsafe fn registry_contains(registry: *const u64, addr: usize) -> bool {
    if cfg!(scalemem_loom) {
        return !registry.is_null() && addr != 0;
    }
    let index = addr >> REGION_SIZE.trailing_zeros();
    if registry.is_null() || index >= REGISTRY_BITS {
        return false;
    }
    // SAFETY: `index / 64 < REGISTRY_BITS / 64`, inside the mapping, which lives as long
    // as the manager; every access to its words is atomic (`Regions::contains` reads
    // them without the lock). Relaxed: under the lock, the lock orders it.
    unsafe { registry_word(registry, index).load(core::sync::atomic::Ordering::Relaxed) & (1 << (index % 64)) != 0 }
}

/// The tag of the page holding `ptr` (the `tag` its run was taken with,
/// [`Regions::alloc_run`]), read without any lock: the global heap's `free`. It reads
/// only the header of `ptr`'s region.
///
/// # Safety
/// As [`Regions::owner_of`]: `ptr` points into a live run of some manager, handed out
/// before the caller learnt of `ptr`.
#[inline]
pub(crate) unsafe fn page_tag(ptr: *const u8) -> u8 {
    let base = region_of(ptr as usize);
    let page = (ptr as usize - base) / PAGE;
    // SAFETY: a live run keeps its region mapped and active; `page < PAGES`. Relaxed:
    // the tag was stored before the run was handed out, and the caller learnt of `ptr`
    // after that (the contract), which orders it; it is a plain value (no address to
    // follow).
    unsafe { (*(base as *const RegionHeader)).tags[page].load(Ordering::Relaxed) }
}

/// The tag word of the page holding `ptr` ([`RegionsBuilder::tag_words`]): the entry of
/// its manager's table for the run's tag when the run was taken, null if none. Read
/// without any lock, like [`page_tag`]: the global heap's `free` reaches the class's
/// per-CPU slots with it.
///
/// # Safety
/// As [`page_tag`].
#[inline]
pub(crate) unsafe fn page_word(ptr: *const u8) -> *mut u8 {
    let base = region_of(ptr as usize);
    let page = (ptr as usize - base) / PAGE;
    // SAFETY: as in `page_tag`. Relaxed: the word was stored before the run was handed
    // out and the caller learnt of `ptr` after that (the contract), which orders the
    // store, and the Acquire load of the table entry before it, before this load.
    unsafe { (*(base as *const RegionHeader)).words[page].load(Ordering::Relaxed) as *mut u8 }
}

/// [`Regions::contains`] on a registry from [`Regions::registry`]: whether `ptr` lies in
/// a region of that manager, exact for a pointer into a live run, a hint otherwise.
///
/// # Safety
/// `registry` is null or came from `Regions::registry` of a manager that is alive.
#[inline]
pub(crate) unsafe fn registry_has(registry: *const u64, ptr: *const u8) -> bool {
    if cfg!(scalemem_loom) {
        return false;
    }
    let index = (ptr as usize) >> REGION_SIZE.trailing_zeros();
    if registry.is_null() || index >= REGISTRY_BITS {
        return false;
    }
    // SAFETY: the registry is a live mapping of REGISTRY_BYTES bytes (the contract: it is
    // unmapped only when its manager drops) and `index < REGISTRY_BITS`. Relaxed: see
    // `registry_set`.
    unsafe { registry_word(registry, index).load(core::sync::atomic::Ordering::Relaxed) & (1 << (index % 64)) != 0 }
}

/// The registry word holding bit `index`, as an atomic.
///
/// # Safety
/// `registry` is a live mapping of `REGISTRY_BYTES` bytes and `index < REGISTRY_BITS`.
unsafe fn registry_word<'a>(registry: *const u64, index: usize) -> &'a core::sync::atomic::AtomicU64 {
    // SAFETY: in bounds and aligned (the caller's contract; the mapping is page-aligned);
    // all accesses to registry words go through atomics.
    unsafe { core::sync::atomic::AtomicU64::from_ptr(registry.add(index / 64).cast_mut()) }
}

/// Sets or clears the registry bit of the region at `base`.
///
/// # Safety
/// `registry` is a mapping of `REGISTRY_BYTES` bytes; the manager's lock is held (or
/// access is exclusive); `base >> ADDRESS_BITS == 0`.
unsafe fn registry_set(registry: *mut u64, base: usize, on: bool) {
    if cfg!(scalemem_loom) {
        return;
    }
    let index = base >> REGION_SIZE.trailing_zeros();
    debug_assert!(index < REGISTRY_BITS);
    // SAFETY: inside the mapping (the contract).
    let word = unsafe { registry_word(registry, index) };
    // Relaxed: writers hold the lock. A lock-free reader (`Regions::contains`) asks only
    // about regions it knows are live (the bit was set before the region's first run was
    // handed out, and is cleared only after its last run came back), or accepts a stale
    // answer for a foreign pointer.
    if on {
        word.fetch_or(1 << (index % 64), core::sync::atomic::Ordering::Relaxed);
    } else {
        word.fetch_and(!(1 << (index % 64)), core::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(all(test, not(scalemem_loom)))]
mod tests {
    use super::*;

    /// A manager on a static registry marks its regions there (so `has` finds a run's
    /// pointers and nothing else) and clears them when it drops, leaving the registry
    /// empty for the next manager.
    #[test]
    fn a_static_registry_holds_the_managers_regions_and_is_empty_after_it() {
        static REGISTRY: StaticRegistry = StaticRegistry::new();
        let local = 7u8;
        for _ in 0..2 {
            // SAFETY: this test's registry, used by one manager at a time, empty at each
            // build (the previous manager dropped).
            let regions =
                unsafe { Regions::builder().refcache(Config::manual()).static_registry(&REGISTRY) }.build().unwrap();
            assert!(!REGISTRY.has(ptr::from_ref(&local)));
            let run = regions.alloc_run(2, 1, |base| base).unwrap();
            let p = run.as_ptr().cast_const();
            assert!(REGISTRY.has(p) && REGISTRY.has(p.wrapping_add(2 * PAGE - 1)));
            assert!(regions.contains(p), "the manager reads the same registry");
            assert!(!REGISTRY.has(ptr::from_ref(&local)), "a stack address is not ours");
            assert!(!REGISTRY.has(core::ptr::without_provenance(usize::MAX)), "beyond the address space");
            // The run is left to the drop (a leaked run's region is unmapped there).
            drop(regions);
            assert!(!REGISTRY.has(p), "the dropped manager's region is still claimed");
        }
        assert!(REGISTRY.0.iter().all(|w| w.load(Ordering::Relaxed) == 0));
    }

    /// A manager with a tag-word table gives every page of a run its tag's entry as it
    /// was when the run was taken (null for a null entry, and for a manager without a
    /// table); a freed run's pages lose their words, and the page's next run gets its
    /// own tag's.
    #[test]
    fn runs_carry_their_tags_word_from_the_table() {
        static TABLE: TagWords = [const { AtomicPtr::new(ptr::null_mut()) }; 256];
        let mut a = 1u64;
        let mut b = 2u64;
        let (pa, pb) = (ptr::from_mut(&mut a).cast::<u8>(), ptr::from_mut(&mut b).cast::<u8>());
        TABLE[3].store(pa, Ordering::Release);
        TABLE[4].store(pb, Ordering::Release);
        let regions = Regions::builder().refcache(Config::manual()).tag_words(&TABLE).build().unwrap();
        let three = regions.alloc_run(3, 3, |base| base).unwrap();
        let four = regions.alloc_run(1, 4, |base| base).unwrap();
        let none = regions.alloc_run(1, 5, |base| base).unwrap();
        // A late entry is not copied into the run taken before it.
        TABLE[5].store(pa, Ordering::Release);
        for page in 0..3 {
            // SAFETY: a pointer into a live run of this manager (as in every call below).
            assert_eq!(unsafe { page_word(three.as_ptr().wrapping_add(page * PAGE + 17)) }, pa);
        }
        // SAFETY: as above.
        assert_eq!(unsafe { page_word(four.as_ptr().wrapping_add(PAGE - 1)) }, pb);
        // SAFETY: as above.
        assert!(unsafe { page_word(none.as_ptr()) }.is_null());
        regions.assert_valid();
        // SAFETY: runs from this manager's `alloc_run`, freed once, not used after.
        unsafe {
            regions.free_run(three, 3);
            regions.free_run(four, 1);
        }
        regions.assert_valid(); // free pages keep no word
        let again = regions.alloc_run(4, 4, |base| base).unwrap();
        assert_eq!(again, three, "first fit takes the freed pages again");
        for page in 0..4 {
            // SAFETY: as above.
            assert_eq!(unsafe { page_word(again.as_ptr().wrapping_add(page * PAGE)) }, pb);
        }
        regions.assert_valid();
        // No table: every word stays null.
        let plain = Regions::builder().refcache(Config::manual()).build().unwrap();
        let run = plain.alloc_run(1, 3, |base| base).unwrap();
        // SAFETY: as above.
        assert!(unsafe { page_word(run.as_ptr()) }.is_null());
        plain.assert_valid();
    }
}
