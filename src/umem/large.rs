//! The large-allocation path: blocks above the largest size class (128 KiB), or aligned
//! beyond the page, carved page-granular out of a vmem arena, with freed blocks kept for
//! reuse and given back to the kernel by **decay**, jemalloc-style, so that a program
//! that allocates and frees large blocks in a loop makes no `mmap`/`munmap` (and takes
//! no page faults) per request.
//!
//! ```
//! use scalemem::umem::large::{LargeConfig, LargeHeap};
//!
//! let heap = LargeHeap::new(LargeConfig::default())?;
//! let p = heap.alloc(1 << 20, 4096)?;
//! // SAFETY: the heap handed out 1 MiB of writable memory at `p`.
//! unsafe { p.as_ptr().write_bytes(0xA5, 1 << 20) };
//! heap.free(p)?;
//! let q = heap.alloc(1 << 20, 4096)?; // the same block, still committed: no fault
//! assert_eq!(p, q);
//! assert_eq!(heap.stats().maps, 1);
//! heap.free(q)?;
//! # Ok::<(), scalemem::umem::large::LargeError>(())
//! ```
//!
//! # Layers
//!
//! - **Chunks** (the arena's source): address space from the kernel through
//!   `os::map_aligned`, in spans that are multiples of the chunk size (2 MiB by default)
//!   and aligned to it. `release` unmaps. It counts maps, unmaps and mapped bytes.
//! - **The arena**: a [`Vmem`] with the page as its quantum, importing from the chunks.
//!   Each block is one or more allocated vmem segments ("pieces", more than one only after
//!   [`LargeHeap::grow_in_place`] took the free segment, or absorbed (the front of) the
//!   cached block, right after a block, after cached neighbours were merged, or after a
//!   request extended a cached block; a merge or an extension within one span joins the
//!   two segments instead ([`Vmem::join`]), so pieces stay about one per span a block
//!   crosses; a cut inside a piece splits its segment, so pieces never straddle two
//!   blocks). Alignment comes
//!   from `xalloc`'s `align`; the arena imports a span with `align - page` bytes of slack
//!   for a stricter alignment (address space only: untouched pages cost no memory).
//! - **The block tables**: vmem's hash knows each segment's size but does not expose it,
//!   so the heap keeps its own open-addressed tables in mapped memory: live blocks by
//!   address (reserved bytes, usable bytes, size of the first piece) and the later pieces
//!   of multi-piece blocks by address (their sizes).
//! - **The cache** of freed blocks: a fixed array (512 entries, mapped) of blocks that
//!   stay allocated in the arena, so the arena can never hand their span back to the
//!   kernel behind the heap's back.
//!
//! # Lifecycle of a block
//!
//! ```text
//!  alloc ──▶ in use ──free──▶ dirty ──decay──▶ madvised ──release──▶ free in vmem ──▶ unmapped
//!    ▲                         │                  │                (clean)    (when its whole
//!    └──────── reuse ◀─────────┴──────────────────┘                           span is free)
//! ```
//!
//! - **in use**: in the live table.
//! - **dirty**: freed, in the cache, pages still committed. An allocation reuses a
//!   cached block before it asks the arena (dirty ones first: no page faults): a dirty
//!   block that wastes at most a fifth of itself whole; else the front of the smallest
//!   larger dirty block, **cut** to size (the cut falls on a piece boundary or splits
//!   that piece's arena segment, [`Vmem::split`]), whose rest stays cached; else a
//!   madvised block within the same waste bound. A request that finds none first
//!   **merges** every run of adjacent dirty cached blocks into one block and looks
//!   again. (Merging at every free instead would join the blocks of a program that
//!   cycles through a few sizes; its next round would cut them up in another order,
//!   miss, and map anew. Without cuts and merges, random sizes grew the cache to about
//!   six times what was live.) A request that still finds none **extends** a smaller
//!   dirty block into the free arena space right after it, if there is room (the
//!   largest of the eight largest that can be): its pages are resident already, and
//!   only the extension is fresh. (Without it, random sizes kept 2.6 times what was
//!   live; with it, 1.35.)
//! - **madvised**: in the cache after `madvise(MADV_DONTNEED)`: the pages are back with
//!   the kernel, the address range is kept, a reuse faults in fresh zero pages.
//! - **released**: freed to the arena, which coalesces it with its free neighbours; an
//!   imported span that becomes wholly free goes back to the chunks, which unmap it.
//!
//! **Decay** ([`LargeHeap::decay`], and piggybacked on every `alloc` and `free` once its
//! next deadline has passed, so no background thread is needed): a block dirty for at
//! least [`LargeConfig::decay`] (default 10 s, jemalloc's `dirty_decay_ms`) is madvised;
//! a block cached for at least [`LargeConfig::release`] (default 30 s) is released. Both
//! are counted from the free, on the coarse monotonic clock ([`now_ns`]: to within a
//! scheduler tick, a few milliseconds). A decay time of 0 madvises a block inside the free that
//! caches it; a release time of 0 releases it there. When the cache is full, a free releases the
//! oldest cached block at once; when the arena cannot serve an allocation (the kernel
//! refused a map), the whole cache is released and the allocation retried once.
//!
//! # Transparent huge pages
//!
//! Spans are chunk-aligned (2 MiB by default), so the kernel can back each chunk with
//! one huge page. Where THP is in `always` mode, `khugepaged` would collapse a chunk
//! holding a given-back block and any resident page (a live neighbour) back into a
//! resident huge page, undoing the give-back. So in that mode (read once from
//! `/sys/kernel/mm/transparent_hugepage/enabled`) every give-back (decay, release, the
//! cut tail of a shrink) also advises the chunks it touches `MADV_NOHUGEPAGE`. And a
//! range fresh from the arena (an allocation, or the piece a grow adds) has the chunks it
//! covers only in part advised the same before it is touched: the first touch would
//! otherwise fault in the whole chunk as one huge page, and the rest of the chunk (a free
//! arena segment) would hold resident zeros that no give-back returns (measured: 48 blocks
//! of 1.5 MiB, freed, kept 24 MB of such tails until their spans were released). Chunks
//! a block covers whole keep huge pages. In `madvise` or `never` mode nothing is
//! advised. (The region layer does the same for its regions: `region`'s module doc.)
//!
//! # Invariants (checked by [`LargeHeap::assert_valid`])
//!
//! 1. Every block, live or cached, is a run of allocated arena segments that tile
//!    `[base, base + reserved)`: the first piece of the recorded head size, then the
//!    pieces in the piece table. Blocks do not overlap (vmem hands out disjoint
//!    segments; the random model test also checks it against its own map of ranges).
//! 2. The arena's allocated bytes equal the reserved bytes of the live and cached blocks.
//! 3. A live block has `page <= usable <= reserved`, both page multiples; `in use` is the
//!    sum of the reserved bytes of live blocks, `dirty` and `madvised` the sums over the
//!    cached blocks in each state.
//! 4. Every free arena segment is clean: its pages were never touched, or were madvised
//!    before the segment was freed to the arena. (So the arena never hides dirty pages
//!    from decay.)
//! 5. Nothing here allocates through the global allocator: tables and cache live in
//!    `mmap`ed memory, and no path formats or panics on bad input.
//!
//! # Bad input
//!
//! | input | result |
//! |---|---|
//! | zero size | [`LargeError::ZeroSize`] |
//! | size that overflows when rounded to pages and aligned, or above `isize::MAX` | [`LargeError::Overflow`] |
//! | alignment not a power of two, or above [`MAX_ALIGN`] (1 GiB) | [`LargeError::BadAlign`] |
//! | free (or resize, or `usable_size`) of an address that is not a live block | [`LargeError::NotAllocated`] (`false`/`None` for the resize and query calls) |
//! | the kernel refuses memory | [`LargeError::OutOfMemory`]; the heap stays consistent and usable (its cache may have been released) |
//!
//! # Concurrency
//!
//! One `Lock` (the arena's futex mutex) guards the tables, the cache and every call
//! into the arena; the arena's own lock is then always uncontended. Lock order: the
//! heap's lock, then the arena's, then (import and release) the chunks, which take none.
//! Large requests are rare next to small ones, and each costs a system call or page
//! faults anyway, so one lock is enough.

use core::mem::{ManuallyDrop, size_of};
use core::ptr::NonNull;
use core::time::Duration;

use super::os;
use super::vmem::lock::Lock;
use super::vmem::{Constraints, Source, Vmem, VmemError};
use crate::sync::atomic::{AtomicUsize, Ordering};

mod table;

use table::Table;

/// The largest alignment served: 1 GiB.
pub const MAX_ALIGN: usize = 1 << 30;

/// From this size on, [`LargeHeap::alloc_zeroed`] zeroes a reused dirty block with
/// `MADV_DONTNEED` instead of a memset.
const ZERO_BY_MADVISE: usize = 4 << 20;

/// Cached (freed) blocks the heap keeps at most.
pub const CACHE_SLOTS: usize = 512;

/// How many of the largest dirty cached blocks a request that missed the cache tries to
/// extend into the free arena space after them ([`Inner::extend_for`]).
const EXTEND_TRIES: usize = 8;

/// Why a large-heap operation failed. Every error leaves the heap consistent.
///
/// ```
/// use scalemem::umem::large::{LargeConfig, LargeError, LargeHeap};
///
/// let heap = LargeHeap::new(LargeConfig::default())?;
/// let err = heap.alloc(4096, 1 << 31).unwrap_err();
/// assert_eq!(err, LargeError::BadAlign);
/// assert_eq!(err.to_string(), "large heap: alignment not a power of two or above 1 GiB");
/// # Ok::<(), LargeError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LargeError {
    /// A size of zero.
    ZeroSize,
    /// The size overflows when rounded up to pages and aligned.
    Overflow,
    /// An alignment that is not a power of two, or above [`MAX_ALIGN`].
    BadAlign,
    /// The kernel refused memory (for the block, or for the heap's tables).
    OutOfMemory,
    /// The address is not that of a live block.
    NotAllocated,
    /// An invalid [`LargeConfig`] (chunk size not a power of two at least the page).
    BadConfig,
}

impl core::fmt::Display for LargeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::ZeroSize => "large heap: zero size",
            Self::Overflow => "large heap: size overflows",
            Self::BadAlign => "large heap: alignment not a power of two or above 1 GiB",
            Self::OutOfMemory => "large heap: out of memory",
            Self::NotAllocated => "large heap: not a live block",
            Self::BadConfig => "large heap: chunk size must be a power of two at least the page size",
        })
    }
}

impl std::error::Error for LargeError {}

/// Tuning for a [`LargeHeap`].
///
/// ```
/// use core::time::Duration;
/// use scalemem::umem::large::LargeConfig;
///
/// let c = LargeConfig::default();
/// assert_eq!((c.decay, c.release, c.chunk), (Duration::from_secs(10), Duration::from_secs(30), 2 << 20));
/// // Return memory as soon as possible (jemalloc's `dirty_decay_ms:0`):
/// let eager = LargeConfig { decay: Duration::ZERO, release: Duration::ZERO, ..c };
/// # let _ = eager;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LargeConfig {
    /// How long a freed block stays dirty (committed) before decay madvises it (default
    /// 10 s).
    pub decay: Duration,
    /// How long a freed block stays cached before decay frees it to the arena, which
    /// unmaps its span once the span is wholly free (default 30 s).
    pub release: Duration,
    /// The granularity and alignment of spans mapped from the kernel: a power of two at
    /// least the page size (default 2 MiB).
    pub chunk: usize,
}

impl Default for LargeConfig {
    fn default() -> Self {
        Self { decay: Duration::from_secs(10), release: Duration::from_secs(30), chunk: 2 << 20 }
    }
}

/// A snapshot of a heap's counts ([`LargeHeap::stats`]), in bytes unless named a count.
///
/// ```
/// use scalemem::umem::large::{LargeConfig, LargeHeap};
///
/// let heap = LargeHeap::new(LargeConfig::default())?;
/// let p = heap.alloc(1 << 20, 8)?;
/// let q = heap.alloc(1 << 20, 8)?;
/// heap.free(p)?; // cached, its pages still committed
/// let s = heap.stats();
/// assert_eq!((s.live, s.in_use, s.dirty, s.madvised), (1, 1 << 20, 1 << 20, 0));
/// assert!(s.in_use + s.dirty + s.madvised <= s.mapped);
/// assert_eq!(s.maps - s.unmaps, 1); // both blocks came from one 2 MiB chunk
/// heap.free(q)?;
/// # Ok::<(), scalemem::umem::large::LargeError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LargeStats {
    /// Bytes mapped from the kernel now.
    pub mapped: usize,
    /// Bytes reserved by live blocks.
    pub in_use: usize,
    /// Live blocks.
    pub live: usize,
    /// Bytes of cached blocks whose pages are still committed.
    pub dirty: usize,
    /// Bytes of cached blocks that were madvised.
    pub madvised: usize,
    /// Bytes unmapped so far (cumulative).
    pub unmapped: usize,
    /// Maps made (spans imported from the kernel), cumulative.
    pub maps: usize,
    /// Unmaps made, cumulative.
    pub unmaps: usize,
    /// Allocations served from the cache, cumulative.
    pub reused: usize,
    /// Of `reused`, those served by the front of a larger dirty block whose rest stayed
    /// cached, cumulative.
    pub cuts: usize,
    /// Freed blocks merged with a dirty cached neighbour (one per neighbour), cumulative.
    pub merges: usize,
    /// Requests no cached block served that took a dirty cached block extended into
    /// the free arena space after it (not counted in `reused`), cumulative.
    pub extended: usize,
    /// Pieces of blocks (live or cached) past their first, now: one per span a block
    /// crosses past the first, or more where a record could not be joined.
    pub pieces: usize,
    /// Blocks madvised by decay, cumulative.
    pub purged: usize,
    /// Blocks released to the arena (by decay, eviction or a failed allocation), cumulative.
    pub released: usize,
}

/// Now, in nanoseconds of the coarse monotonic clock (`CLOCK_MONOTONIC_COARSE`, which
/// moves in steps of a scheduler tick, 1-4 ms): the time base of
/// [`LargeHeap::decay_at`]. Every `alloc` and `free` reads it (the free to stamp the
/// cached block, both to see whether decay is due), and decay times are seconds, so the
/// step costs nothing while the fine clock's read would: about 35 ns here under a
/// hypervisor, against 12 ns for the coarse one, a third of a large request's time.
///
/// ```
/// let a = scalemem::umem::large::now_ns();
/// assert!(scalemem::umem::large::now_ns() >= a);
/// ```
pub fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
    (t.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(t.tv_nsec as u64)
}

/// `Duration` to nanoseconds, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// An address as the pointer the chunks exposed for it.
fn ptr_of(addr: usize) -> Option<NonNull<u8>> {
    NonNull::new(core::ptr::with_exposed_provenance_mut::<u8>(addr))
}

// ---------------------------------------------------------------------------------------
// Chunks: the arena's source.
// ---------------------------------------------------------------------------------------

/// Address space from the kernel in chunk-aligned spans. Its counters are only written
/// while the heap's lock is held (import and release run inside arena calls, which run
/// under it) and read under it too, so the lock orders every access: they are atomics
/// only because `Source` must be `Sync`, and Relaxed pairs with nothing.
struct Chunks {
    chunk: usize,
    maps: AtomicUsize,
    unmaps: AtomicUsize,
    mapped: AtomicUsize,
    unmapped: AtomicUsize,
}

impl Source for Chunks {
    fn import(&self, size: usize, _align: usize) -> Result<usize, VmemError> {
        // `size` is a multiple of the granularity, the chunk; the chunk alignment covers
        // the arena's (the page).
        let ptr = os::map_aligned(size, self.chunk).map_err(|_| VmemError::Exhausted)?;
        // Relaxed: see the type's doc (ordered by the heap's lock).
        self.maps.fetch_add(1, Ordering::Relaxed);
        self.mapped.fetch_add(size, Ordering::Relaxed);
        Ok(ptr.as_ptr().expose_provenance())
    }

    unsafe fn release(&self, base: usize, size: usize) {
        if let Some(ptr) = ptr_of(base) {
            // SAFETY: (1) of the caller's contract: `base`, `size` are a span `import`
            // mapped with `map_aligned(size, self.chunk)` (its provenance exposed there);
            // (2) nothing uses it.
            unsafe { os::unmap_aligned(ptr, size, self.chunk) };
            // Relaxed: see the type's doc.
            self.unmaps.fetch_add(1, Ordering::Relaxed);
            self.mapped.fetch_sub(size, Ordering::Relaxed);
            self.unmapped.fetch_add(size, Ordering::Relaxed);
        }
    }

    fn granularity(&self) -> usize {
        self.chunk
    }
}

// ---------------------------------------------------------------------------------------
// The heap.
// ---------------------------------------------------------------------------------------

/// A live block (keyed by its base).
#[derive(Clone, Copy, Debug)]
struct Live {
    /// Bytes the block holds in the arena (the sum of its pieces).
    reserved: usize,
    /// Bytes the caller may use (`usable_size`).
    usable: usize,
    /// The size of its first piece.
    head: usize,
}

/// A cached (freed) block.
#[derive(Clone, Copy, Debug)]
struct Cached {
    base: usize,
    reserved: usize,
    head: usize,
    /// When it was freed ([`now_ns`]: the coarse clock, so blocks freed within one
    /// tick share a stamp).
    since: u64,
    /// The order of the frees that cached it: a full cache evicts the smallest.
    seq: u64,
    madvised: bool,
}

/// The state under the heap's lock.
struct Inner {
    live: Table<Live>,
    /// The later pieces of multi-piece blocks (live or cached): base -> size.
    pieces: Table<usize>,
    /// `CACHE_SLOTS` entries in mapped memory, the first `ncached` in use.
    cache: NonNull<Cached>,
    ncached: usize,
    /// The `seq` of the next cached block.
    next_seq: u64,
    /// The earliest time decay has work to do (`u64::MAX`: none).
    deadline: u64,
    in_use: usize,
    dirty: usize,
    madvised: usize,
    reused: usize,
    cuts: usize,
    merges: usize,
    extended: usize,
    /// A block was freed since the last [`merge_neighbours`](Self::merge_neighbours)
    /// (nothing else can make two cached blocks adjacent: a cut leaves its two parts one
    /// live, one cached).
    freed_since_merge: bool,
    purged: usize,
    released: usize,
    /// The chunk size (a copy of the chunks' own, for [`give_back`]).
    chunk: usize,
}

/// Gives a freed range's pages back to the kernel (`madvise(MADV_DONTNEED)`) and, where
/// the system backs memory with huge pages unasked (`always`), keeps the chunks that the
/// range touches off huge pages from then on (`MADV_NOHUGEPAGE`), so that `khugepaged`
/// cannot collapse the range back in with a resident neighbour (see "Transparent huge
/// pages" in the module doc). Returns whether the pages went back.
///
/// # Safety
/// `[ptr, ptr + len)` is page-aligned and inside a span the chunks mapped (chunk-aligned,
/// a multiple of `chunk`, so the chunks around the range are mapped too), and nobody
/// needs its contents.
unsafe fn give_back(ptr: NonNull<u8>, len: usize, chunk: usize) -> bool {
    // SAFETY: the caller's.
    let gone = unsafe { os::dontneed(ptr, len) };
    if gone && len > 0 && os::thp_always() {
        let start = ptr.as_ptr().addr() & !(chunk - 1);
        let end = (ptr.as_ptr().addr() + len).next_multiple_of(chunk);
        // `with_addr` keeps the span's provenance; the envelope is never null (the
        // span is mapped, and nothing maps the null chunk), but a `None` would only
        // skip the advice.
        if let Some(envelope) = NonNull::new(ptr.as_ptr().with_addr(start)) {
            // SAFETY: `[start, end)` is the chunk-aligned envelope of the range, inside
            // the same mapped span (spans are chunk-aligned multiples of the chunk);
            // the advice changes no contents. A refusal (the kernel's map count at its
            // limit) only leaves huge pages on.
            let _ = unsafe { os::no_huge_pages(envelope, end - start) };
        }
    }
    gone
}

/// Where the system backs memory with huge pages unasked (`always`), advises
/// `MADV_NOHUGEPAGE` on the chunks that a range fresh from the arena covers only in
/// part, before anyone touches it: otherwise the first touch faults in a whole huge page,
/// and the part of the chunk outside the range (a free arena segment, or a neighbour's
/// slack) becomes resident zeros that no give-back of this block returns, breaking
/// invariant 4 until the span goes. Chunks the range covers whole keep huge pages.
fn no_huge_pages_on_partial_chunks(base: usize, len: usize, chunk: usize) {
    if len == 0 || !os::thp_always() {
        return;
    }
    let end = base + len;
    let first = base & !(chunk - 1);
    let last = end & !(chunk - 1);
    let advise = |at: usize| {
        if let Some(ptr) = ptr_of(at) {
            // SAFETY: `[at, at + chunk)` is a chunk of the span that holds the range
            // (spans are chunk-aligned multiples of the chunk, mapped whole); the advice
            // changes no contents. A refusal only leaves huge pages on.
            let _ = unsafe { os::no_huge_pages(ptr, chunk) };
        }
    };
    if base != first {
        advise(first);
    }
    // The last chunk, unless it is the first one and was just advised.
    if end != last && !(base != first && last == first) {
        advise(last);
    }
}

// SAFETY: `Inner` owns its tables and its cache mapping outright (nobody else has their
// addresses), so moving it between threads moves that ownership; it has no thread
// affinity.
unsafe impl Send for Inner {}

impl Inner {
    fn cache(&self) -> &[Cached] {
        // SAFETY: `cache` is a live mapping of `CACHE_SLOTS` entries, of which the first
        // `ncached <= CACHE_SLOTS` were written; the slice borrows `self`.
        unsafe { core::slice::from_raw_parts(self.cache.as_ptr(), self.ncached) }
    }

    fn cache_mut(&mut self) -> &mut [Cached] {
        // SAFETY: as in `cache`; `&mut self` makes the slice unique.
        unsafe { core::slice::from_raw_parts_mut(self.cache.as_ptr(), self.ncached) }
    }

    fn push_cached(&mut self, c: Cached) {
        debug_assert!(self.ncached < CACHE_SLOTS);
        // SAFETY: `ncached < CACHE_SLOTS`: in bounds of the mapping; `&mut self`.
        unsafe { self.cache.as_ptr().add(self.ncached).write(c) };
        self.ncached += 1;
        if c.madvised {
            self.madvised += c.reserved;
        } else {
            self.dirty += c.reserved;
        }
    }

    /// Takes cache entry `i` out (the last entry moves into its place); `None` if there
    /// is no entry `i`. (Callers pass the index of a cached block; `get`, not indexing:
    /// no allocator path may hold a formatting panic.)
    fn take_cached(&mut self, i: usize) -> Option<Cached> {
        let cache = self.cache_mut();
        let last = cache.len().checked_sub(1)?;
        let c = *cache.get(i)?;
        let moved = *cache.get(last)?;
        if let Some(slot) = cache.get_mut(i) {
            *slot = moved;
        }
        self.ncached = last;
        if c.madvised {
            self.madvised -= c.reserved;
        } else {
            self.dirty -= c.reserved;
        }
        Some(c)
    }

    /// The best cached block for `n` bytes aligned to `align`, and whether to cut `n`
    /// bytes off its front rather than hand it out whole (only aligned blocks of at least
    /// `n` bytes count). First the smallest dirty one wasting at most a fifth of itself
    /// (`reserved - n <= n / 4`), whole: a program that cycles through a few sizes finds
    /// each its own block again. Then the smallest larger dirty one, cut: its pages are
    /// resident already, where the arena's would be faulted in beside it, and its rest
    /// stays cached for other requests. Then the smallest madvised one within the waste
    /// bound, whole (a madvised block is no better than the arena's free space, and a cut
    /// only splinters it).
    fn best_cached(&self, n: usize, align: usize) -> Option<(usize, bool)> {
        // The best of each kind so far: (index, reserved).
        let (mut fit, mut cut, mut madvised) = (None::<(usize, usize)>, None::<(usize, usize)>, None::<(usize, usize)>);
        let smaller = |best: Option<(usize, usize)>, r: usize| best.is_none_or(|(_, b)| r < b);
        for (i, c) in self.cache().iter().enumerate() {
            // `align` is a power of two (checked): a mask, not a division.
            if c.base & (align - 1) != 0 || c.reserved < n {
                continue;
            }
            let tight = c.reserved - n <= n / 4;
            let slot = match (c.madvised, tight) {
                (false, true) => &mut fit,
                (false, false) => &mut cut,
                (true, true) => &mut madvised,
                (true, false) => continue,
            };
            if smaller(*slot, c.reserved) {
                *slot = Some((i, c.reserved));
            }
        }
        fit.map(|(i, _)| (i, false)).or(cut.map(|(i, _)| (i, true))).or(madvised.map(|(i, _)| (i, false)))
    }

    /// Cuts the cached block `c` (taken out of the cache by the caller) at `n` bytes
    /// (a page multiple, `0 < n < c.reserved`): returns the head piece of the front
    /// block of `n` bytes, and the back block, which keeps `c`'s state and age. The
    /// pieces wholly in front stay the front's, those behind the back's; a cut inside a
    /// piece splits its arena segment in two. `None`, with nothing changed, if the arena
    /// has no record for that split.
    fn cut(&mut self, vmem: &Vmem<'_>, c: &Cached, n: usize) -> Option<(usize, Cached)> {
        let end = c.base + n;
        // The piece holding the front's last page: [at, at + size).
        let (at, size) = self.last_piece(c.base, n, c.head)?;
        let back_head = if at + size == end {
            // On a piece boundary: the next piece's record becomes the back's head.
            self.pieces.remove(end)?
        } else {
            vmem.split(at, size, end - at).ok()?;
            if at != c.base
                && let Some(piece) = self.pieces.get_mut(at)
            {
                *piece = end - at;
            }
            at + size - end
        };
        // A cut inside the head piece (or at its end) leaves the front one piece of `n`.
        let front_head = if at == c.base { n } else { c.head };
        Some((front_head, Cached { base: end, reserved: c.reserved - n, head: back_head, ..*c }))
    }

    /// The last piece of the block `[base, base + reserved)` whose first piece is
    /// `head` bytes: its start and size (a walk of the piece table); `None` if a record
    /// is missing.
    fn last_piece(&self, base: usize, reserved: usize, head: usize) -> Option<(usize, usize)> {
        let (mut at, mut size) = (base, head);
        while at + size < base + reserved {
            at += size;
            size = self.pieces.get(at)?;
        }
        Some((at, size))
    }

    /// Appends the allocated segment of `size` bytes right after the block
    /// `[base, base + reserved)` (first piece `head` bytes) to it: joined in the arena
    /// to the block's last piece when the two lie in one span ([`Vmem::join`]), recorded
    /// as a piece of its own otherwise (the caller has reserved room for the record).
    /// Returns the block's first piece's size after.
    fn append_piece(&mut self, vmem: &Vmem<'_>, base: usize, reserved: usize, head: usize, size: usize) -> usize {
        match self
            .last_piece(base, reserved, head)
            .filter(|&(last, last_size)| vmem.join(last, last_size, size).is_ok())
        {
            Some((last, _)) if last == base => head + size,
            Some((last, _)) => {
                if let Some(piece) = self.pieces.get_mut(last) {
                    *piece += size;
                }
                head
            }
            None => {
                self.pieces.insert(base + reserved, size);
                head
            }
        }
    }

    /// Joins each piece of the block `[base, base + reserved)` (first piece `head`
    /// bytes) to the piece before it in the arena where the two lie in one span
    /// ([`Vmem::join`]), dropping its record; returns the first piece's new size. Stops
    /// at a missing record (nothing is then lost: the pieces not joined keep theirs).
    fn join_pieces(&mut self, vmem: &Vmem<'_>, base: usize, reserved: usize, head: usize) -> usize {
        let end = base + reserved;
        let (mut at, mut size, mut first) = (base, head, head);
        while at + size < end {
            let next = at + size;
            let Some(next_size) = self.pieces.get(next) else { break };
            if vmem.join(at, size, next_size).is_ok() {
                self.pieces.remove(next);
                size += next_size;
                if at == base {
                    first = size;
                } else if let Some(piece) = self.pieces.get_mut(at) {
                    *piece = size;
                }
            } else {
                at = next;
                size = next_size;
            }
        }
        first
    }

    /// Merges every run of adjacent dirty cached blocks into one block (each later
    /// block's head is joined in the arena ([`Vmem::join`]) to the last piece before it
    /// when the two lie in one span, and becomes a piece of its own otherwise, so that a
    /// block merged and cut over and over keeps about one piece per span it crosses
    /// for each cut to walk; the merged block takes the newest age),
    /// so that freed neighbours can serve a request larger than each of them. Run when a
    /// request found no cached block: merging at every free would join the blocks of a
    /// program that cycles through a few sizes, and its next round would cut them up
    /// differently, miss and map anew. Sorts the cache by address (in place: the cache's
    /// order means nothing). A run stops where a piece record cannot be had.
    fn merge_neighbours(&mut self, vmem: &Vmem<'_>) {
        self.cache_mut().sort_unstable_by_key(|c| c.base);
        let mut kept = 0usize;
        for r in 0..self.ncached {
            // `get`, not indexing: `kept <= r < ncached`, and no path of the allocator
            // may hold a formatting panic.
            let Some(&cur) = self.cache().get(r) else { break };
            if let Some(&prev) = kept.checked_sub(1).and_then(|k| self.cache().get(k))
                && !prev.madvised
                && !cur.madvised
                && prev.base + prev.reserved == cur.base
                && self.pieces.reserve(1).is_ok()
            {
                // The next block's head, appended (its later pieces keep their records).
                let head = self.append_piece(vmem, prev.base, prev.reserved, prev.head, cur.head);
                if let Some(merged) = self.cache_mut().get_mut(kept - 1) {
                    merged.head = head;
                    merged.reserved += cur.reserved;
                    merged.since = merged.since.max(cur.since);
                    merged.seq = merged.seq.max(cur.seq);
                }
                self.merges += 1;
                continue;
            }
            if let Some(slot) = self.cache_mut().get_mut(kept) {
                *slot = cur;
            }
            kept += 1;
        }
        // The byte counts stay: merged blocks are dirty, as their parts were.
        self.ncached = kept;
        self.freed_since_merge = false;
    }

    /// Takes a cached block for `n` bytes aligned to `align` ([`best_cached`](Self::best_cached)), cutting
    /// it if that is the best: returns the new live block's base, reserved bytes, head
    /// piece and whether it reads as zero. `None` if no cached block serves (or the cut
    /// found no arena record: the block stays cached).
    fn take_for(&mut self, vmem: &Vmem<'_>, n: usize, align: usize) -> Option<(usize, Live, bool)> {
        let (i, cut) = match self.best_cached(n, align) {
            Some(found) => found,
            // Nothing to merge unless a block was freed since the last merge.
            None if self.ncached > 1 && self.freed_since_merge => {
                self.merge_neighbours(vmem);
                self.best_cached(n, align)?
            }
            None => return None,
        };
        let c = self.take_cached(i)?;
        let live = if cut {
            let Some((head, back)) = self.cut(vmem, &c, n) else {
                self.push_cached(c);
                return None;
            };
            self.push_cached(back);
            self.cuts += 1;
            Live { reserved: n, usable: n, head }
        } else {
            Live { reserved: c.reserved, usable: n, head: c.head }
        };
        self.reused += 1;
        // A madvised block reads as zero pages (MADV_DONTNEED on private anonymous
        // memory); a dirty one holds its last user's bytes.
        Some((c.base, live, c.madvised))
    }

    /// For a request no cached block serves: a dirty cached block smaller than `n`,
    /// aligned to `align`, that the free arena space right after it can extend to `n`
    /// bytes, taken out of the cache and extended (its pages are resident already; only
    /// the extension is fresh). The largest such block of the [`EXTEND_TRIES`] largest
    /// candidates wins. Returns the new live block's base and record; `None` if none
    /// can be extended (or a piece record cannot be had), with nothing changed.
    fn extend_for(&mut self, vmem: &Vmem<'_>, n: usize, align: usize) -> Option<(usize, Live)> {
        self.pieces.reserve(1).ok()?;
        // The largest candidates, largest first: (index, reserved); (0, 0) is no entry.
        let mut best = [(0usize, 0usize); EXTEND_TRIES];
        for (i, c) in self.cache().iter().enumerate() {
            if c.madvised || c.reserved >= n || c.base & (align - 1) != 0 {
                continue;
            }
            // An insertion that carries each displaced entry one place down (no
            // indexing: no allocator path may hold a panic); the smallest falls off.
            let mut carried = (i, c.reserved);
            for slot in &mut best {
                if carried.1 > slot.1 {
                    core::mem::swap(slot, &mut carried);
                }
            }
        }
        for &(i, reserved) in best.iter().take_while(|&&(_, r)| r > 0) {
            let Some(&c) = self.cache().get(i) else { continue };
            let (at, d) = (c.base + reserved, n - reserved);
            let window = Constraints { min_addr: at, max_addr: at + d, ..Constraints::default() };
            if vmem.xalloc(d, &window).is_err() {
                continue;
            }
            no_huge_pages_on_partial_chunks(at, d, self.chunk);
            let c = self.take_cached(i)?;
            let head = self.append_piece(vmem, c.base, c.reserved, c.head, d);
            self.extended += 1;
            return Some((c.base, Live { reserved: n, usable: n, head }));
        }
        None
    }

    /// Frees a block's pieces to the arena (madvising them first unless `clean`, so that
    /// free arena segments stay clean): the later pieces, then the first, so that the
    /// span can only become wholly free (and be unmapped) at the last one.
    fn release_block(&mut self, vmem: &Vmem<'_>, base: usize, reserved: usize, head: usize, clean: bool) {
        if !clean && let Some(ptr) = ptr_of(base) {
            // SAFETY: (1) the block is page-aligned and inside a span the chunks mapped;
            // (2) it is cached or being shrunk away: nobody needs its contents.
            unsafe { give_back(ptr, reserved, self.chunk) };
        }
        let end = base + reserved;
        let mut at = base + head;
        while at < end {
            let Some(size) = self.pieces.remove(at) else {
                debug_assert!(false, "large: a block's piece is missing");
                break;
            };
            let result = vmem.xfree(at, size);
            debug_assert!(result.is_ok());
            at += size;
        }
        let result = vmem.xfree(base, head);
        debug_assert!(result.is_ok());
        self.released += 1;
    }

    /// Decay at `now`: madvise blocks dirty for `decay`, release blocks cached for
    /// `release`; recompute the deadline.
    fn decay(&mut self, vmem: &Vmem<'_>, now: u64, decay: u64, release: u64) {
        let mut deadline = u64::MAX;
        let mut i = 0;
        while i < self.ncached {
            let Some(&c) = self.cache().get(i) else { break };
            let release_at = c.since.saturating_add(release);
            if now >= release_at {
                if let Some(c) = self.take_cached(i) {
                    self.release_block(vmem, c.base, c.reserved, c.head, c.madvised);
                }
                continue; // entry `i` is now the former last one
            }
            deadline = deadline.min(release_at);
            if !c.madvised {
                let decay_at = c.since.saturating_add(decay);
                if now >= decay_at {
                    if let Some(ptr) = ptr_of(c.base) {
                        // SAFETY: (1) a cached block: page-aligned, in a mapped span;
                        // (2) freed, so nobody needs its contents.
                        unsafe { give_back(ptr, c.reserved, self.chunk) };
                    }
                    if let Some(cached) = self.cache_mut().get_mut(i) {
                        cached.madvised = true;
                    }
                    self.dirty -= c.reserved;
                    self.madvised += c.reserved;
                    self.purged += 1;
                } else {
                    deadline = deadline.min(decay_at);
                }
            }
            i += 1;
        }
        self.deadline = deadline;
    }

    /// Releases every cached block to the arena.
    fn release_all(&mut self, vmem: &Vmem<'_>) {
        while let Some(c) = self.ncached.checked_sub(1).and_then(|last| self.take_cached(last)) {
            self.release_block(vmem, c.base, c.reserved, c.head, c.madvised);
        }
        self.deadline = u64::MAX;
    }
}

/// The large-allocation heap (see the [module documentation](self)).
///
/// ```
/// use scalemem::umem::large::{LargeConfig, LargeError, LargeHeap};
///
/// let heap = LargeHeap::new(LargeConfig::default())?;
/// let p = heap.alloc(256 << 10, 8)?;
/// // `Send + Sync`: threads share a heap by reference.
/// let live = std::thread::scope(|s| {
///     let t = s.spawn(|| {
///         let q = heap.alloc(256 << 10, 8)?;
///         let live = heap.stats().live; // `p` and `q`
///         heap.free(q)?;
///         Ok::<_, LargeError>(live)
///     });
///     t.join().unwrap()
/// })?;
/// assert_eq!(live, 2);
/// heap.free(p)?;
/// assert_eq!(heap.stats().live, 0);
/// # Ok::<(), LargeError>(())
/// ```
pub struct LargeHeap {
    /// The chunks, in their own mapping, so that the arena can borrow them for
    /// `'static` while the heap moves; unmapped in `drop`, after the arena.
    chunks: NonNull<Chunks>,
    vmem: ManuallyDrop<Vmem<'static>>,
    inner: Lock<Inner>,
    decay: u64,
    release: u64,
    page: usize,
}

// SAFETY: the heap's parts are shared between threads as follows:
// - `Send`: it owns the chunks mapping outright; the arena and `Inner` are `Send`.
// - `Sync`: through `&LargeHeap` the chunks are only read as `&Chunks` (atomics: `Sync`),
//   the arena is `Sync`, and `Inner` is reached only through its `Lock`.
unsafe impl Send for LargeHeap {}
// SAFETY: see above.
unsafe impl Sync for LargeHeap {}

/// Allocation, reuse and giving memory back.
///
/// ```
/// use scalemem::umem::large::{LargeConfig, LargeHeap};
///
/// let heap = LargeHeap::new(LargeConfig::default())?;
/// let p = heap.alloc(200 << 10, 8)?;
/// heap.free(p)?;
/// let q = heap.alloc(180 << 10, 8)?; // the cached block, which wastes under a fifth of itself
/// assert_eq!(q, p);
/// assert_eq!(heap.stats().reused, 1);
/// heap.free(q)?;
/// heap.purge();
/// assert_eq!(heap.stats().mapped, 0);
/// # Ok::<(), scalemem::umem::large::LargeError>(())
/// ```
impl LargeHeap {
    /// A heap with `config`. Maps its bookkeeping (a few pages); spans are mapped on
    /// demand.
    ///
    /// ```
    /// use core::time::Duration;
    /// use scalemem::umem::large::{LargeConfig, LargeHeap};
    ///
    /// let config = LargeConfig { decay: Duration::ZERO, ..LargeConfig::default() };
    /// let heap = LargeHeap::new(config)?;
    /// assert_eq!(heap.stats().mapped, 0);
    /// # Ok::<(), scalemem::umem::large::LargeError>(())
    /// ```
    pub fn new(config: LargeConfig) -> Result<Self, LargeError> {
        let page = os::page_size();
        if !config.chunk.is_power_of_two() || config.chunk < page {
            return Err(LargeError::BadConfig);
        }
        let chunks = os::map(size_of::<Chunks>()).map_err(|_| LargeError::OutOfMemory)?.cast::<Chunks>();
        let chunks_init = Chunks {
            chunk: config.chunk,
            maps: AtomicUsize::new(0),
            unmaps: AtomicUsize::new(0),
            mapped: AtomicUsize::new(0),
            unmapped: AtomicUsize::new(0),
        };
        // SAFETY: a fresh mapping, page-aligned (enough for `Chunks`) and big enough.
        unsafe { chunks.as_ptr().write(chunks_init) };
        let unmap_chunks = || {
            // SAFETY: (1) the mapping made above; (2) nothing borrows it (the arena that
            // would have was not built or was dropped).
            unsafe { os::unmap(chunks.cast(), size_of::<Chunks>()) }
        };
        let cache = match os::map(CACHE_SLOTS * size_of::<Cached>()) {
            Ok(cache) => cache.cast::<Cached>(),
            Err(_) => {
                unmap_chunks();
                return Err(LargeError::OutOfMemory);
            }
        };
        // SAFETY: the chunks stay mapped, unmoved and unmodified (apart from their
        // atomics) until `drop` unmaps them, which it does after dropping the arena, the
        // only holder of this reference.
        let source: &'static Chunks = unsafe { chunks.as_ref() };
        let vmem = match Vmem::builder("large").quantum(page).source(source).build() {
            Ok(vmem) => vmem,
            Err(_) => {
                // SAFETY: (1) the cache mapping made above; (2) unused.
                unsafe { os::unmap(cache.cast(), CACHE_SLOTS * size_of::<Cached>()) };
                unmap_chunks();
                return Err(LargeError::OutOfMemory);
            }
        };
        Ok(Self {
            chunks,
            vmem: ManuallyDrop::new(vmem),
            inner: Lock::new(Inner {
                live: Table::new(),
                pieces: Table::new(),
                cache,
                ncached: 0,
                next_seq: 0,
                deadline: u64::MAX,
                in_use: 0,
                dirty: 0,
                madvised: 0,
                reused: 0,
                cuts: 0,
                merges: 0,
                extended: 0,
                freed_since_merge: false,
                purged: 0,
                released: 0,
                chunk: config.chunk,
            }),
            decay: nanos(config.decay),
            release: nanos(config.release),
            page,
        })
    }

    fn chunks(&self) -> &Chunks {
        // SAFETY: mapped and initialised in `new`, unmapped only in `drop`.
        unsafe { self.chunks.as_ref() }
    }

    /// Rounds a request to pages and checks it (see "Bad input" in the module doc).
    fn check(&self, size: usize, align: usize) -> Result<(usize, usize), LargeError> {
        if size == 0 {
            return Err(LargeError::ZeroSize);
        }
        if !align.is_power_of_two() || align > MAX_ALIGN {
            return Err(LargeError::BadAlign);
        }
        // The page is a power of two: round with a mask (a division costs ~8% of a
        // request).
        let n = size.checked_add(self.page - 1).ok_or(LargeError::Overflow)? & !(self.page - 1);
        let align = align.max(self.page);
        if n.checked_add(align).is_none_or(|end| end > isize::MAX as usize) {
            return Err(LargeError::Overflow);
        }
        Ok((n, align))
    }

    /// Takes the heap's lock without a scope, for `fork` (the arena is reached only
    /// under it, so nothing of the heap is half changed when the process is copied).
    pub(crate) fn fork_lock(&self) {
        self.inner.force_lock();
    }

    /// Releases what [`fork_lock`](Self::fork_lock) took.
    ///
    /// # Safety
    /// As `Regions::fork_unlock`.
    pub(crate) unsafe fn fork_unlock(&self) {
        // SAFETY: the caller's contract.
        unsafe { self.inner.force_unlock() };
    }

    /// Allocates `size` bytes (rounded up to pages) aligned to `align` (a power of two up
    /// to [`MAX_ALIGN`]). A cached block is reused if one is aligned, large enough and
    /// wastes at most a fifth of itself (dirty blocks before madvised ones, then the
    /// smallest); otherwise the arena serves it, mapping a span only if no free segment
    /// fits. The memory is not zeroed unless it is fresh.
    ///
    /// ```
    /// use scalemem::umem::large::{LargeConfig, LargeError, LargeHeap};
    ///
    /// let heap = LargeHeap::new(LargeConfig::default())?;
    /// let p = heap.alloc(300 << 10, 2 << 20)?;
    /// assert_eq!(p.as_ptr() as usize % (2 << 20), 0);
    /// assert_eq!(heap.usable_size(p), Some(300 << 10));
    /// assert_eq!(heap.alloc(0, 8), Err(LargeError::ZeroSize));
    /// assert_eq!(heap.alloc(4096, 3), Err(LargeError::BadAlign));
    /// assert_eq!(heap.alloc(usize::MAX - 10, 8), Err(LargeError::Overflow));
    /// heap.free(p)?;
    /// # Ok::<(), LargeError>(())
    /// ```
    pub fn alloc(&self, size: usize, align: usize) -> Result<NonNull<u8>, LargeError> {
        self.alloc_inner(size, align).map(|(p, _, _)| p)
    }

    /// [`alloc`](Self::alloc), with the block's first `size` bytes zero: a fresh block
    /// (never touched, or madvised when it was cached) is zero already; only a reused
    /// dirty block is cleared, outside the heap's lock (with `MADV_DONTNEED` from 4 MiB). What `calloc` needs: no page of
    /// a large fresh block is touched.
    ///
    /// ```
    /// use scalemem::umem::large::{LargeConfig, LargeHeap};
    ///
    /// let heap = LargeHeap::new(LargeConfig::default())?;
    /// let p = heap.alloc(1 << 20, 8)?;
    /// // SAFETY: 1 MiB of writable memory.
    /// unsafe { p.as_ptr().write_bytes(0xFF, 1 << 20) };
    /// heap.free(p)?;
    /// let q = heap.alloc_zeroed(1 << 20, 8)?; // the same, dirty block: cleared
    /// // SAFETY: 1 MiB of readable memory.
    /// assert!(unsafe { std::slice::from_raw_parts(q.as_ptr(), 1 << 20) }.iter().all(|&b| b == 0));
    /// # Ok::<(), scalemem::umem::large::LargeError>(())
    /// ```
    pub fn alloc_zeroed(&self, size: usize, align: usize) -> Result<NonNull<u8>, LargeError> {
        let (p, n, clean) = self.alloc_inner(size, align)?;
        // From 4 MiB on, a dirty block is given back to the kernel rather than cleared:
        // its pages read as zero and cost nothing until touched (a sparse table allocated
        // and freed in a loop would otherwise be cleared whole each time).
        // SAFETY: a live, page-aligned block of `n` bytes (a page multiple), ours until
        // returned; nobody reads it before this call returns.
        let zero = clean || n >= ZERO_BY_MADVISE && unsafe { os::dontneed(p, n) };
        if !zero {
            // SAFETY: as above; `min(n, size)` bytes are writable.
            unsafe { p.as_ptr().write_bytes(0, n.min(size)) };
        }
        Ok(p)
    }

    /// `alloc`, also returning the block's usable bytes and whether they are known zero.
    fn alloc_inner(&self, size: usize, align: usize) -> Result<(NonNull<u8>, usize, bool), LargeError> {
        let (n, align) = self.check(size, align)?;
        let now = now_ns();
        let vmem = &*self.vmem;
        self.inner.with(|inner| {
            if now >= inner.deadline {
                inner.decay(vmem, now, self.decay, self.release);
            }
            inner.live.reserve(1)?;
            if let Some((base, live, clean)) = inner.take_for(vmem, n, align) {
                inner.live.insert(base, live);
                inner.in_use += live.reserved;
                return ptr_of(base).map(|p| (p, n, clean)).ok_or(LargeError::OutOfMemory);
            }
            // A dirty block that the free space after it can extend: only the rest is fresh.
            if let Some((base, live)) = inner.extend_for(vmem, n, align) {
                inner.live.insert(base, live);
                inner.in_use += live.reserved;
                return ptr_of(base).map(|p| (p, n, false)).ok_or(LargeError::OutOfMemory);
            }
            let constraints = Constraints { align, ..Constraints::default() };
            let addr = match vmem.xalloc(n, &constraints) {
                Ok(addr) => addr,
                Err(_) if inner.ncached > 0 => {
                    // Out of memory with blocks cached: give them all back and retry once.
                    inner.release_all(vmem);
                    vmem.xalloc(n, &constraints).map_err(|_| LargeError::OutOfMemory)?
                }
                Err(_) => return Err(LargeError::OutOfMemory),
            };
            no_huge_pages_on_partial_chunks(addr, n, inner.chunk);
            inner.live.insert(addr, Live { reserved: n, usable: n, head: n });
            inner.in_use += n;
            // Every free arena segment is clean (invariant 4): never touched, or madvised.
            ptr_of(addr).map(|p| (p, n, true)).ok_or(LargeError::OutOfMemory)
        })
    }

    /// Frees a block [`alloc`](Self::alloc) returned: it goes to the cache, dirty (see the
    /// lifecycle in the module doc). `Err(NotAllocated)` if `ptr` is not a live block (a
    /// foreign pointer, or a double free); nothing changes then.
    ///
    /// ```
    /// use scalemem::umem::large::{LargeConfig, LargeError, LargeHeap};
    ///
    /// let heap = LargeHeap::new(LargeConfig::default())?;
    /// let p = heap.alloc(1 << 20, 8)?;
    /// heap.free(p)?;
    /// assert_eq!(heap.free(p), Err(LargeError::NotAllocated));
    /// assert_eq!(heap.stats().dirty, 1 << 20);
    /// # Ok::<(), LargeError>(())
    /// ```
    pub fn free(&self, ptr: NonNull<u8>) -> Result<(), LargeError> {
        let base = ptr.as_ptr().addr();
        let now = now_ns();
        let vmem = &*self.vmem;
        self.inner.with(|inner| {
            let live = inner.live.remove(base).ok_or(LargeError::NotAllocated)?;
            inner.in_use -= live.reserved;
            let seq = inner.next_seq;
            inner.next_seq += 1;
            let block = Cached { base, reserved: live.reserved, head: live.head, since: now, seq, madvised: false };
            if inner.ncached == CACHE_SLOTS {
                // The oldest free (by order: the coarse clock's stamps can tie).
                let oldest = inner.cache().iter().enumerate().min_by_key(|(_, c)| c.seq).map_or(0, |(i, _)| i);
                if let Some(c) = inner.take_cached(oldest) {
                    inner.release_block(vmem, c.base, c.reserved, c.head, c.madvised);
                }
            }
            inner.push_cached(block);
            inner.freed_since_merge = true;
            inner.deadline = inner.deadline.min(now.saturating_add(self.decay.min(self.release)));
            if now >= inner.deadline {
                inner.decay(vmem, now, self.decay, self.release);
            }
            Ok(())
        })
    }

    /// Grows the live block at `ptr` from `old` to `new` bytes without moving it, and
    /// returns whether it did. It can when `new` fits the block's reserved pages, when a
    /// cached block starts right after it (it is absorbed), or when the arena has a free
    /// segment right after it (taken as one more piece). On `false` nothing changed.
    /// Contents are kept; the added bytes are unspecified. `false` also for a pointer
    /// that is not a live block, an `old` above its usable size, or `new < old`.
    ///
    /// ```
    /// use scalemem::umem::large::{LargeConfig, LargeError, LargeHeap};
    ///
    /// let heap = LargeHeap::new(LargeConfig::default())?;
    /// let p = heap.alloc(256 << 10, 4096)?; // the first block of a fresh 2 MiB span
    /// assert!(heap.grow_in_place(p, 256 << 10, 1 << 20)); // the rest of the span is free
    /// assert_eq!(heap.usable_size(p), Some(1 << 20));
    /// heap.free(p)?;
    /// # Ok::<(), LargeError>(())
    /// ```
    pub fn grow_in_place(&self, ptr: NonNull<u8>, old: usize, new: usize) -> bool {
        let base = ptr.as_ptr().addr();
        let Some(n) = new.checked_next_multiple_of(self.page) else { return false };
        if new < old || n.checked_add(base).is_none_or(|end| end > isize::MAX as usize) {
            return false;
        }
        let vmem = &*self.vmem;
        self.inner.with(|inner| {
            let Some(live) = inner.live.get(base) else { return false };
            if old > live.usable {
                return false;
            }
            if n <= live.reserved {
                if let Some(l) = inner.live.get_mut(base) {
                    l.usable = l.usable.max(n);
                }
                return true;
            }
            // Room for two piece records: the absorbed block's head and a new piece.
            if inner.pieces.reserve(2).is_err() {
                return false;
            }
            let mut reserved = live.reserved;
            let end = base + reserved;
            let neighbour = inner.cache().iter().position(|c| c.base == end);
            let absorbed = match neighbour.and_then(|i| inner.take_cached(i)) {
                Some(mut c) => {
                    // Only what the grow needs, if the block is larger (merged freed
                    // neighbours can be): its rest stays cached for other requests.
                    let need = n - reserved;
                    if c.reserved > need
                        && let Some((head, back)) = inner.cut(vmem, &c, need)
                    {
                        inner.push_cached(back);
                        inner.cuts += 1;
                        c = Cached { reserved: need, head, ..c };
                    }
                    // Its later pieces are already in the table; its head becomes a piece.
                    inner.pieces.insert(c.base, c.head);
                    reserved += c.reserved;
                    Some(c)
                }
                None => None,
            };
            if reserved < n {
                let at = base + reserved;
                let d = n - reserved;
                let window = Constraints { min_addr: at, max_addr: at + d, ..Constraints::default() };
                match vmem.xalloc(d, &window) {
                    Ok(got) => {
                        debug_assert_eq!(got, at);
                        no_huge_pages_on_partial_chunks(at, d, inner.chunk);
                        inner.pieces.insert(at, d);
                        reserved += d;
                    }
                    Err(_) => {
                        // Not enough room after all: put the absorbed block back as it was.
                        if let Some(c) = absorbed {
                            inner.pieces.remove(c.base);
                            inner.push_cached(c);
                        }
                        return false;
                    }
                }
            }
            inner.in_use += reserved - live.reserved;
            // The grown block's new pieces joined to the ones before them within a span.
            let head = inner.join_pieces(vmem, base, reserved, live.head);
            if let Some(l) = inner.live.get_mut(base) {
                l.reserved = reserved;
                l.usable = n;
                l.head = head;
            }
            true
        })
    }

    /// Shrinks the live block at `ptr` to `new` bytes (rounded up to pages, at least
    /// one) without moving it, and returns whether it did. Later pieces wholly past the
    /// new end go back to the arena; the pages past the new end in the kept pieces are
    /// madvised (kept reserved, so a later grow can take them back). `false` for a
    /// pointer that is not a live block, `new` of 0, or `new` above the usable size.
    ///
    /// ```
    /// use scalemem::umem::large::{LargeConfig, LargeError, LargeHeap};
    ///
    /// let heap = LargeHeap::new(LargeConfig::default())?;
    /// let p = heap.alloc(1 << 20, 4096)?;
    /// assert!(heap.shrink_in_place(p, 1 << 20, 5000));
    /// assert_eq!(heap.usable_size(p), Some(8192));
    /// assert!(heap.grow_in_place(p, 5000, 1 << 20)); // its own reserved pages
    /// heap.free(p)?;
    /// # Ok::<(), LargeError>(())
    /// ```
    pub fn shrink_in_place(&self, ptr: NonNull<u8>, old: usize, new: usize) -> bool {
        let base = ptr.as_ptr().addr();
        if new == 0 || new > old {
            return false;
        }
        let Some(n) = new.checked_next_multiple_of(self.page) else { return false };
        let vmem = &*self.vmem;
        self.inner.with(|inner| {
            let Some(live) = inner.live.get(base) else { return false };
            if old > live.usable || n > live.usable {
                return false;
            }
            // The end of the piece holding the new last byte: pieces from there on go.
            let cut = base + n;
            let mut keep_end = base + live.head;
            while keep_end < cut {
                match inner.pieces.get(keep_end) {
                    Some(size) => keep_end += size,
                    None => {
                        debug_assert!(false, "large: a block's piece is missing");
                        return false;
                    }
                }
            }
            let end = base + live.reserved;
            let mut at = keep_end;
            while at < end {
                let Some(size) = inner.pieces.remove(at) else {
                    debug_assert!(false, "large: a block's piece is missing");
                    break;
                };
                if let Some(ptr) = ptr_of(at) {
                    // SAFETY: (1) a piece of a live block: page-aligned, in a mapped span;
                    // (2) past the new end, so the caller no longer uses it.
                    unsafe { give_back(ptr, size, inner.chunk) };
                }
                let result = vmem.xfree(at, size);
                debug_assert!(result.is_ok());
                at += size;
            }
            if cut < keep_end
                && let Some(ptr) = ptr_of(cut)
            {
                // SAFETY: (1) page-aligned (n is a page multiple), inside the block's kept
                // pieces; (2) past the new end.
                unsafe { give_back(ptr, keep_end - cut, inner.chunk) };
            }
            inner.in_use -= end - keep_end;
            if let Some(l) = inner.live.get_mut(base) {
                l.reserved = keep_end - base;
                l.usable = n;
            }
            true
        })
    }

    /// The bytes the caller may use at `ptr` (the request rounded up to pages, as
    /// changed by grow and shrink), or `None` if `ptr` is not a live block.
    ///
    /// ```
    /// use scalemem::umem::large::{LargeConfig, LargeHeap};
    ///
    /// let heap = LargeHeap::new(LargeConfig::default())?;
    /// let p = heap.alloc(200_000, 64)?;
    /// assert_eq!(heap.usable_size(p), Some(200_704)); // 49 pages
    /// heap.free(p)?;
    /// assert_eq!(heap.usable_size(p), None);
    /// # Ok::<(), scalemem::umem::large::LargeError>(())
    /// ```
    pub fn usable_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        let base = ptr.as_ptr().addr();
        self.inner.with(|inner| inner.live.get(base).map(|l| l.usable))
    }

    /// Runs decay now (see the module doc): madvises blocks dirty for the decay time,
    /// releases blocks cached for the release time.
    ///
    /// ```
    /// use core::time::Duration;
    /// use scalemem::umem::large::{LargeConfig, LargeHeap};
    ///
    /// let config = LargeConfig { decay: Duration::ZERO, ..LargeConfig::default() };
    /// let heap = LargeHeap::new(config)?;
    /// let p = heap.alloc(1 << 20, 8)?;
    /// heap.free(p)?;
    /// heap.decay();
    /// let s = heap.stats();
    /// assert_eq!((s.dirty, s.madvised), (0, 1 << 20));
    /// # Ok::<(), scalemem::umem::large::LargeError>(())
    /// ```
    pub fn decay(&self) {
        self.decay_at(now_ns());
    }

    /// Runs decay as if the time were `now` (nanoseconds of [`now_ns`]'s clock).
    ///
    /// ```
    /// use scalemem::umem::large::{now_ns, LargeConfig, LargeHeap};
    ///
    /// let heap = LargeHeap::new(LargeConfig::default())?; // decay 10 s, release 30 s
    /// let p = heap.alloc(1 << 20, 8)?;
    /// heap.free(p)?;
    /// heap.decay_at(now_ns() + 11_000_000_000);
    /// assert_eq!(heap.stats().madvised, 1 << 20);
    /// heap.decay_at(now_ns() + 31_000_000_000);
    /// assert_eq!(heap.stats().mapped, 0); // the span went back to the kernel
    /// # Ok::<(), scalemem::umem::large::LargeError>(())
    /// ```
    pub fn decay_at(&self, now: u64) {
        let vmem = &*self.vmem;
        self.inner.with(|inner| inner.decay(vmem, now, self.decay, self.release));
    }

    /// Releases every cached block to the arena now (spans wholly free are unmapped).
    ///
    /// ```
    /// use scalemem::umem::large::{LargeConfig, LargeHeap};
    ///
    /// let heap = LargeHeap::new(LargeConfig::default())?;
    /// heap.free(heap.alloc(3 << 20, 8)?)?;
    /// heap.purge();
    /// assert_eq!(heap.stats().mapped, 0);
    /// # Ok::<(), scalemem::umem::large::LargeError>(())
    /// ```
    pub fn purge(&self) {
        let vmem = &*self.vmem;
        self.inner.with(|inner| inner.release_all(vmem));
    }

    /// A snapshot of the heap's counts.
    ///
    /// ```
    /// use scalemem::umem::large::{LargeConfig, LargeHeap};
    ///
    /// let heap = LargeHeap::new(LargeConfig::default())?;
    /// let p = heap.alloc(3 << 20, 8)?;
    /// let s = heap.stats();
    /// assert_eq!((s.mapped, s.in_use, s.live, s.maps), (4 << 20, 3 << 20, 1, 1));
    /// # heap.free(p)?;
    /// # Ok::<(), scalemem::umem::large::LargeError>(())
    /// ```
    pub fn stats(&self) -> LargeStats {
        self.inner.with(|inner| {
            let chunks = self.chunks();
            // Relaxed: the chunks' counters are written under this lock (see `Chunks`).
            LargeStats {
                mapped: chunks.mapped.load(Ordering::Relaxed),
                in_use: inner.in_use,
                live: inner.live.len,
                dirty: inner.dirty,
                madvised: inner.madvised,
                unmapped: chunks.unmapped.load(Ordering::Relaxed),
                maps: chunks.maps.load(Ordering::Relaxed),
                unmaps: chunks.unmaps.load(Ordering::Relaxed),
                reused: inner.reused,
                cuts: inner.cuts,
                merges: inner.merges,
                extended: inner.extended,
                pieces: inner.pieces.len,
                purged: inner.purged,
                released: inner.released,
            }
        })
    }

    /// Checks the invariants of the module doc and panics with the first one broken.
    /// O(live + cached blocks + table slots).
    ///
    /// ```
    /// use scalemem::umem::large::{LargeConfig, LargeHeap};
    ///
    /// let heap = LargeHeap::new(LargeConfig::default())?;
    /// let p = heap.alloc(1 << 20, 8)?;
    /// heap.assert_valid();
    /// # heap.free(p)?;
    /// # Ok::<(), scalemem::umem::large::LargeError>(())
    /// ```
    pub fn assert_valid(&self) {
        let vmem = &*self.vmem;
        self.inner.with(|inner| {
            let page = self.page;
            let mut pieces_seen = 0usize;
            let mut check_block = |base: usize, reserved: usize, head: usize| {
                assert!(
                    base.is_multiple_of(page) && reserved.is_multiple_of(page) && head.is_multiple_of(page),
                    "large: misaligned block"
                );
                assert!(head > 0 && head <= reserved, "large: bad head piece");
                let mut at = base + head;
                while at < base + reserved {
                    let size = inner.pieces.get(at).expect("large: a block's piece is missing");
                    at += size;
                    pieces_seen += 1;
                }
                assert!(at == base + reserved, "large: pieces overrun the block");
            };
            let (mut in_use, mut dirty, mut madvised) = (0, 0, 0);
            inner.live.for_each(|base, l| {
                assert!(l.usable >= page && l.usable <= l.reserved && l.usable % page == 0, "large: bad usable size");
                check_block(base, l.reserved, l.head);
                in_use += l.reserved;
            });
            for c in inner.cache() {
                check_block(c.base, c.reserved, c.head);
                assert!(inner.live.get(c.base).is_none(), "large: a block both live and cached");
                if c.madvised {
                    madvised += c.reserved;
                } else {
                    dirty += c.reserved;
                }
            }
            assert!(pieces_seen == inner.pieces.len, "large: stray piece records");
            assert!(in_use == inner.in_use, "large: in-use count wrong");
            assert!(dirty == inner.dirty && madvised == inner.madvised, "large: cache byte counts wrong");
            let vs = vmem.stats();
            assert!(vs.in_use == in_use + dirty + madvised, "large: arena allocated bytes != blocks' bytes");
            assert!(
                vs.allocated_segments == inner.live.len + inner.ncached + inner.pieces.len,
                "large: the arena's allocated segments are not the blocks' pieces"
            );
            vmem.assert_valid();
        });
    }
}

impl Drop for LargeHeap {
    /// Unmaps everything: live blocks die with the heap.
    fn drop(&mut self) {
        // SAFETY: the arena is dropped once, here, and not used after.
        unsafe { ManuallyDrop::drop(&mut self.vmem) };
        let cache = self.inner.get_mut().cache;
        // SAFETY: (1) the mappings `new` made, of these sizes; (2) the arena, the only
        // borrower of the chunks, is gone, and the cache is not used after this.
        unsafe {
            os::unmap(cache.cast(), CACHE_SLOTS * size_of::<Cached>());
            os::unmap(self.chunks.cast(), size_of::<Chunks>());
        }
    }
}

impl core::fmt::Debug for LargeHeap {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("LargeHeap").field("stats", &self.stats()).finish()
    }
}
