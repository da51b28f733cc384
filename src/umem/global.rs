//! [`Umem`]: umem as the process's allocator — a [`GlobalAlloc`], an
//! [`allocator_api2`] `Allocator`, and the C allocation family ([`malloc`], [`free`],
//! [`realloc`], ...) that the `preload/` library exports.
//!
//! ```
//! use scalemem::umem::Umem;
//!
//! // In a program: `#[global_allocator] static A: Umem = Umem::new();`
//! // Here, called directly (doc tests share the test harness's allocator):
//! use std::alloc::{GlobalAlloc, Layout};
//! let layout = Layout::from_size_align(100, 8).unwrap();
//! // SAFETY: a non-zero-sized layout; the block is freed once with the same layout.
//! unsafe {
//!     let p = Umem::new().alloc(layout);
//!     assert!(!p.is_null());
//!     p.write_bytes(7, 100);
//!     Umem::new().dealloc(p, layout);
//! }
//! ```
//!
//! # The heap
//!
//! Every [`Umem`] value is a handle to one process-wide heap, made on the first
//! allocation:
//!
//! - **small requests** (a [`class_of`] the size and alignment, up to 128 KiB and the
//!   page): one [`ObjectCache`] per size class (libumem's `umem_alloc_8` ...), made on
//!   the class's first use over one [`Regions`] manager, with per-CPU magazines in
//!   front; no constructors.
//! - **large requests** (above the largest class, or aligned beyond the page): the
//!   [`LargeHeap`] (page-granular blocks on vmem, freed blocks kept for reuse and
//!   released by decay: no `mmap`/`munmap` per request).
//!
//! Which path a block took is decided by its layout for the Rust interfaces
//! (`class_of(size, align)`; `realloc` keeps a block in place only when the new layout
//! maps to the same path and class, so that `dealloc`'s layout always routes it
//! back), and by its address for the C ones: the regions' registry (one bit per 2 MiB
//! region, read without a lock; `free` keeps its address in a static) says whether a
//! pointer is a slab object, and its page's tag in the region header (each class's slab
//! pages are tagged class + 1 when their run is taken) names its class
//! (`malloc_usable_size` and `realloc` take the size from it). `free` does not even need
//! the class: the same run-taking copies the class's published per-CPU slots
//! (`FAST_SLOTS`) into a *tag word* beside each page's tag (`RegionsBuilder::tag_words`),
//! so `free` tests the registry bit, loads the page's word and pushes onto the current
//! CPU's magazine: one load that depends on the pointer, not a tag and then a table
//! entry (which an alloc-then-free loop waits for in turn, pair after pair). A null word
//! (a run taken before the slots were published, or locked mode) falls back to the tag.
//! Anything else is asked of the large heap.
//!
//! # No allocation through itself
//!
//! The heap's own state lives in mapped memory, but making a size-class cache, the
//! regions' Refcache domain or the `fork` handlers' registration uses `Box`, `Arc` and
//! glibc functions that call `malloc` — which is this allocator. Each thread therefore
//! carries a **guard** flag (an initial-exec thread-local word: no registration, usable
//! from thread-local destructors, and never reached through `__tls_get_addr`, which in a
//! shared library can take the loader's lock and call `malloc`; see
//! `sync::ie_thread_local!`), set for the duration of every slow path: anything past a
//! pop from or a push into the CPU's loaded magazine (that one rseq section calls
//! nothing, so it needs no guard and is safe re-entrantly). A request that finds the
//! guard set is re-entrant and is served from the **bootstrap arena**: a bump allocator
//! over lazily mapped chunks (256 KiB first, each next one twice the last, 64 MiB in
//! all), whose blocks are never reused (a free of one is ignored; a `realloc` copies
//! out). Only set-up allocations land there (about 100 KiB in the tests), so a process
//! maps one or two chunks. A thread that finds the heap being made by another thread
//! waits for it.
//!
//! # Giving memory back
//!
//! A class whose depot comes to hold more than [`TRIM_THRESHOLD`] of freed blocks
//! trims at free time: the freeing thread sends the excess to the slabs and the pages to
//! the kernel at once (`cache.rs`, "Free-time trim"; the threshold adapts to a program
//! that needs the memory again).
//!
//! Size-class caches run without the background reaper thread (a thread started from
//! inside `malloc` is a hazard: before `main`, under glibc's loader lock, across
//! `fork`). Their maintenance is piggy-backed instead: every 64th slow path (a
//! magazine miss or a large request, allocation or free) on a thread looks at the
//! clock, and when an interval has passed one thread (try-lock) ticks the regions'
//! Refcache (every 10 ms, and only while it has work: a delta cached or a region under
//! review; a region goes back two epochs after its last slab), grows the magazines of
//! any class whose depot saw more than a few dozen failed CAS attempts since the last
//! tick (a class whose bursts outgrow a CPU's two magazines would otherwise send every
//! burst through the shared depot for a whole interval), and runs each cache's
//! working-set update (every second: idle magazines reaped, a cache without slab traffic
//! for ten intervals drained unless it holds nothing). A settled or idle heap therefore
//! issues no `membarrier`: each tick, drain and epoch advance costs one, which
//! interrupts every CPU running the process. The large heap
//! decays on its own calls. A program that stops calling the allocator keeps its
//! cached memory until [`trim`] or [`maintain`] is called, or until the thread from
//! [`spawn_maintenance_thread`] does it: the documented trade-off. (The `LD_PRELOAD`
//! library starts that thread from its constructor, outside any allocation.)
//!
//! # `fork`
//!
//! The heap registers `pthread_atfork` handlers when it is made. `prepare` takes every
//! lock of the heap (set-up, maintenance, each cache's reconfiguration and slab locks
//! and, in locked mode, its per-CPU slot locks, the regions', the large heap's, the
//! magazine pool's), so no structure is half changed when the process
//! is copied; the parent and the child release them. The child can allocate at once.
//! A magazine pop or push in flight on another thread is one rseq section whose only
//! store is its commit, so the child sees it done or not at all. What a
//! vanished thread had in flight outside any lock (a magazine popped from the depot,
//! an epoch pin) is lost to the child: memory, never consistency.
//!
//! # Invariants
//!
//! - A block from a size class has the class's size and alignment; a block from the
//!   large heap is page-aligned or more; no two live blocks overlap.
//! - Nothing here allocates through the global allocator on a non-re-entrant path.
//! - An impossible request (alignment not a power of two, a size that overflows) gets
//!   null, never a panic.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use super::background::{self, Background};
use super::boot::{BootArena, ChunkSource};
use super::cache::{CacheStats, Config, ObjectCache};
use super::cpu_cache::{CpuCaches, RawSlots};
use super::large::{self, LargeConfig, LargeHeap};
use super::once::{OncePtr, OnceRef, SpinLock};
use super::os;
use super::region::{self, PAGE, Regions, StaticRegistry};
use super::sizeclass::{
    COLOURED_ALIGN, ClassIndex, LOOKUP_MAX, MAX_CLASS_SIZE, NCLASSES, class_of, class_size, is_coloured,
};
use super::slot_table::{Published, SlotTable};

/// The alignment [`malloc`] guarantees (glibc's on x86-64: `max_align_t`).
pub const MIN_ALIGN: usize = 16;

/// The process's allocator: a handle to umem's process-wide heap (module documentation).
///
/// ```
/// #[global_allocator]
/// static A: scalemem::umem::Umem = scalemem::umem::Umem::new();
///
/// fn main() {
///     let v: Vec<u64> = (0..1000).collect();
///     assert_eq!(v.iter().sum::<u64>(), 499_500);
/// }
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Umem;

/// Making a handle costs nothing: `const`, no allocation, no state of its own.
///
/// ```
/// use scalemem::umem::Umem;
/// static HANDLE: Umem = Umem::new();
/// assert_eq!(std::mem::size_of_val(&HANDLE), 0);
/// let mut v = allocator_api2::vec::Vec::new_in(HANDLE);
/// v.extend([1u32, 2, 3]);
/// assert_eq!(v.iter().sum::<u32>(), 6);
/// ```
impl Umem {
    /// A handle to the process-wide heap (made on the first allocation, not here).
    ///
    /// ```
    /// use scalemem::umem::Umem;
    /// use std::alloc::{GlobalAlloc, Layout};
    ///
    /// // Every handle is the same heap: a block from one is freed through another.
    /// let layout = Layout::new::<[u64; 4]>();
    /// // SAFETY: a non-zero-sized layout; the block is freed once, with the same layout.
    /// unsafe {
    ///     let p = Umem::new().alloc(layout);
    ///     assert!(!p.is_null() && p.align_offset(layout.align()) == 0);
    ///     Umem::default().dealloc(p, layout);
    /// }
    /// ```
    pub const fn new() -> Self {
        Self
    }
}

/// Counters of the process-wide heap (each read on its own: a hint under concurrency).
///
/// ```
/// let p = scalemem::umem::global::malloc(1000);
/// let stats = scalemem::umem::global::stats();
/// assert!(stats.in_use >= 1000 && stats.mapped >= stats.in_use);
/// // SAFETY: from `malloc`, freed once.
/// unsafe { scalemem::umem::global::free(p) };
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UmemStats {
    /// Bytes mapped from the kernel now (regions and large-heap chunks).
    pub mapped: usize,
    /// Bytes handed out and not freed (size-class objects at their class size, and large
    /// blocks at their reserved size).
    pub in_use: usize,
    /// Of `in_use`, the bytes of large blocks.
    pub large_in_use: usize,
    /// Bytes of freed large blocks kept for reuse (still committed or madvised).
    pub large_cached: usize,
    /// Bytes of cached size-class objects (in magazines and depots).
    pub small_cached: usize,
    /// Bytes the bootstrap arena handed out (set-up allocations, never reused).
    pub bootstrap: usize,
    /// Size-class caches made so far.
    pub classes: usize,
    /// Free-time trims so far, over all classes ([`TRIM_THRESHOLD`]).
    pub trims: usize,
    /// The regions' Refcache epoch. It moves only while region counts are in flux (a
    /// slab taken or given back, a region under review); a settled heap's periodic
    /// maintenance leaves it, and the CPUs, alone.
    pub region_epoch: usize,
    /// Bytes of the regions' free pages given back to the kernel (`madvise`) so far, a
    /// running total: by free-time trims, by [`trim`], and when an empty region is kept
    /// mapped for reuse ([`RegionStats::returned_bytes`](super::region::RegionStats)).
    pub returned: usize,
    /// What the size classes' magazines can hold on one CPU, all classes together, in
    /// bytes of objects (each class's loaded and previous magazines at its magazine size
    /// in force). Growth keeps it within [`CPU_CACHE_BYTES`] (tcmalloc's per-CPU cap).
    pub cpu_cache_capacity: usize,
}

// ---------------------------------------------------------------------------------------
// The per-thread guard and maintenance countdown.

// Initial-exec words, not `thread_local!`: in `libscalemem.so` the latter would reach
// them through `__tls_get_addr`, which can take the loader's lock and call `malloc`.
crate::sync::ie_thread_local! {
    /// Set while this thread is inside the heap: a request that finds it set is re-entrant.
    static GUARD: bool;
    /// Allocations left before this thread next looks at the maintenance clock.
    static COUNTDOWN: u32;
}

/// Slow paths (magazine misses, large requests) between two looks at the maintenance
/// clock, per thread.
const MAINTAIN_EVERY: u32 = 64;

/// Proof that this thread entered the heap; clears the guard when dropped.
struct Entered;

impl Entered {
    /// `None` if this thread is already inside the heap (a re-entrant call).
    #[inline]
    fn enter() -> Option<Self> {
        if GUARD.get() {
            return None;
        }
        GUARD.set(true);
        Some(Self)
    }
}

impl Drop for Entered {
    #[inline]
    fn drop(&mut self) {
        GUARD.set(false);
    }
}

// ---------------------------------------------------------------------------------------
// The bootstrap arena.

/// The bootstrap arena (`umem::boot`: its protocol and invariants): chunk `i` holds
/// `BOOT_FIRST << i` bytes of address space, mapped when the previous one is spent (256
/// KiB first, 64 MiB in all). A process reserves only what its set-up allocations need
/// (some tens of KiB: a small part of an `RLIMIT_AS` budget, where a fixed 32 MiB arena
/// made `ls` abort under `ulimit -v 40000`).
static BOOT: BootArena<BOOT_CHUNKS> = BootArena::new(BOOT_FIRST);
/// Chunks of the bootstrap arena.
const BOOT_CHUNKS: usize = 8;
/// Bytes of the first chunk.
const BOOT_FIRST: usize = 256 << 10;

/// The bootstrap arena's chunks come straight from the kernel.
struct OsChunks;

impl ChunkSource for OsChunks {
    fn map(&self, bytes: usize) -> usize {
        os::map(bytes).map_or(0, |p| p.as_ptr() as usize)
    }

    // SAFETY: the trait's contract (a chunk `map` returned that no one holds) is what
    // `os::unmap` needs below.
    unsafe fn unmap(&self, base: usize, bytes: usize) {
        // SAFETY: the caller's: `base` is a non-null mapping of `bytes` from `map`, which
        // no one else saw.
        unsafe { os::unmap(NonNull::new_unchecked(base as *mut u8), bytes) };
    }
}

/// Bytes of bootstrap chunk `i`.
#[cfg(test)]
const fn boot_chunk_bytes(i: usize) -> usize {
    BOOT.chunk_bytes(i)
}

/// Whether `ptr` is a bootstrap block.
#[inline]
fn boot_contains(ptr: *const u8) -> bool {
    BOOT.contains(ptr)
}

/// A block of `size` bytes aligned to `align` (a power of two) from the bootstrap arena,
/// with its size in the word before it; null when the arena is spent or the kernel
/// refuses a chunk.
fn boot_alloc(size: usize, align: usize) -> *mut u8 {
    BOOT.alloc(size, align.max(MIN_ALIGN), &OsChunks)
}

/// The size recorded for a bootstrap block.
///
/// # Safety
/// `ptr` is a block [`boot_alloc`] returned.
unsafe fn boot_size(ptr: *const u8) -> usize {
    // SAFETY: the caller's: a block of this arena.
    unsafe { BOOT.size_of(ptr) }
}

// ---------------------------------------------------------------------------------------
// The heap.

/// Class `i`'s per-CPU layer (its cache's magazines) once the cache is made, null
/// before: what the locked-mode hit paths load first (the rseq-mode ones load
/// [`FAST_SLOTS`]), so that a magazine hit follows one pointer from a static instead of
/// three (heap, cache handle, cache). Set once, by the maker of `Heap::caches[i]`; the global
/// caches are never destroyed, so an entry stays valid for the life of the process (in
/// `fork`ed children too).
static FAST: [AtomicPtr<CpuCaches>; NCLASSES] = [const { AtomicPtr::new(ptr::null_mut()) }; NCLASSES];

/// Class `class`'s per-CPU layer if its cache is made.
#[inline]
fn fast(class: ClassIndex) -> Option<&'static CpuCaches> {
    // `get`, not indexing (class < NCLASSES always): no allocator path may hold a
    // formatting panic. Acquire: pairs with the Release store in `make_cache`: the layer
    // is initialised.
    let cpu = FAST.get(class.get())?.load(Ordering::Acquire);
    // SAFETY: null, or the layer of a leaked global cache, never destroyed (see FAST).
    unsafe { cpu.as_ref() }
}

/// What the rseq-mode hit paths load instead of [`FAST`]: each made class's per-CPU
/// slots ([`RawSlots`]), published through a [`SlotTable`] (its module documents the
/// protocol): by page tag (class + 1), so that `free` reaches the current CPU's slot from
/// the page's tag word, and by request size for the sizes up to [`LOOKUP_MAX`] (the
/// sizes the class lookup tables cover; `by8` for alignments up to 8, Rust layouts,
/// `by16` for `malloc`'s), so that a hit loads its slots from the size in one load where
/// the class lookup and then the tag's entry are two dependent loads (one load and one
/// instruction fewer per hit: 3-7% on the 256-byte and 1 KiB batch loops,
/// `BENCHMARKS.md`). A null entry is "not here": tag 0 (no class), a class not made
/// yet, and every class in locked mode, whose hits go out of line ([`alloc_unfast`],
/// [`free_unfast`]). Set once per class, after [`FAST`]; the global caches are never
/// destroyed. 256 tag entries, so that any tag byte indexes it.
static FAST_SLOTS: FastSlots = FastSlots::new();

type FastSlots = SlotTable<256, { LOOKUP_MAX / 8 + 1 }, { LOOKUP_MAX / 16 + 1 }>;

// Every class's tag indexes FAST_SLOTS' tag entries.
const _: () = assert!(NCLASSES < 255);

/// The page tag of class `class`'s slab pages (0 means "no class").
#[inline]
fn tag_of(class: ClassIndex) -> u8 {
    // No overflow: class < NCLASSES < 255.
    class.get() as u8 + 1
}

/// A table entry's published slots as the hit paths use them.
#[inline(always)]
fn raw(published: Published) -> RawSlots {
    RawSlots { base: published.base, ncpus: published.ncpus }
}

/// The rseq-mode slots of the class whose page tag is `tag`, if published.
#[inline(always)]
fn fast_slots(tag: u8) -> Option<RawSlots> {
    FAST_SLOTS.slots_at(FAST_SLOTS.by_tag(usize::from(tag))?).map(raw)
}

/// The rseq-mode slots of class `class`, if published: [`fast_slots`] of its tag,
/// indexed without the tag's byte arithmetic.
#[inline(always)]
fn fast_slots_of(class: ClassIndex) -> Option<RawSlots> {
    // SAFETY: class < NCLASSES < 255 (ClassIndex's invariant), so class + 1 (its tag) is
    // below the table's 256 tag entries.
    FAST_SLOTS.slots_at(unsafe { FAST_SLOTS.by_tag_unchecked(class.get() + 1) }).map(raw)
}

/// The published slots for a request of `size <= LOOKUP_MAX` bytes aligned to
/// `align <= MIN_ALIGN`, if its class has them: the same slots as
/// `fast_slots_of(class_of(size, align))`.
///
/// Both entries' addresses are computed and one is picked (a conditional move).
/// Written as a branch, the compiler folded the two into one index shifted by 3 or 4: a
/// shift by a variable amount, which it wrote into `cl` with byte-sized instructions.
/// Inlined into a caller's loop (fat LTO inlines `__rust_alloc`), that made a 256-byte
/// batch loop through `#[global_allocator]` take 1.9x the time on the AMD EPYC host of
/// BENCHMARKS.md ("The class lookup without a variable shift"); the likely cause (the
/// host has no performance counters to confirm it) is that a byte write merges into the
/// whole `rcx` and so waits for its last writer, there the previous allocation's slot
/// load. With a constant `align` (`malloc`'s, or a type's layout) the pick folds away.
#[inline(always)]
fn fast_slots_by_size(size: usize, align: usize) -> Option<RawSlots> {
    debug_assert!(size <= LOOKUP_MAX && align <= MIN_ALIGN);
    // SAFETY: size <= LOOKUP_MAX, so the indexes are at most LOOKUP_MAX / 8 and
    // LOOKUP_MAX / 16, the tables' last.
    let (by8, by16) = unsafe { (FAST_SLOTS.by8_unchecked(size), FAST_SLOTS.by16_unchecked(size)) };
    FAST_SLOTS.slots_at(core::hint::select_unpredictable(align <= 8, by8, by16)).map(raw)
}

/// Publishes `cpu`'s slots for the hit paths if it runs in rseq mode (with the slot
/// count every global layer shares; a layer with another count, which cannot happen,
/// is left to [`FAST`]). Runs under the heap's set-up lock (`make_cache`), the
/// serialisation [`SlotTable::publish`] asks for.
fn publish_fast_slots(class: ClassIndex, cpu: &'static CpuCaches) {
    let Some(raw) = cpu.raw_slots() else { return };
    // The same base under every size whose lookup names this class (entry i covers the
    // sizes whose rounded-up multiple of 8, or 16, is 8i, or 16i; the lookup of that
    // multiple is the entry's class).
    FAST_SLOTS.publish(
        tag_of(class),
        raw.base,
        raw.ncpus,
        |i| class_of(8 * i, 8) == Some(class),
        |i| class_of(16 * i, 16) == Some(class),
    );
}

/// The process-wide heap, in its own mapping (never unmapped).
struct Heap {
    regions: Regions,
    large: LargeHeap,
    /// Class `i`'s cache once made (a leaked box), made under `create` (`umem::once`).
    caches: [OnceRef<'static, ObjectCache>; NCLASSES],
    /// Serialises the making of caches (and is held across `fork`).
    create: SpinLock,
    /// Held by the thread doing maintenance (try-lock), and across `fork`.
    maint: SpinLock,
    /// `large::now_ns` deadlines of the next Refcache tick and the next working-set update.
    next_tick: AtomicU64,
    next_update: AtomicU64,
    /// Per class, for the per-CPU cache cap ([`CPU_CACHE_BYTES`]): its cache's depot
    /// exchanges at the last maintenance tick, and when (`large::now_ns`) a tick last saw
    /// them move. Written under the maintenance lock (and once by `make_cache`).
    seen_exchanges: [AtomicUsize; NCLASSES],
    active_ns: [AtomicU64; NCLASSES],
}

/// How often the regions' Refcache epoch moves on (piggy-backed).
const TICK_NS: u64 = 10_000_000;
/// Failed depot CAS attempts (or retried pops) in one maintenance tick past which a
/// class's magazines grow a step at once (`CpuCaches::grow_if_contended`).
const GROW_FAILURES: usize = 32;
/// Magazines installed from the depot in one maintenance tick past which a class's
/// magazines grow a step at once, contended or not (`CpuCaches::grow_if_exchanging`):
/// 64 in 10 ms is a CPU trading a magazine every 150 us.
const GROW_EXCHANGES: usize = 64;
/// The most a magazine may hold, in bytes of objects, for the exchange rule: up to 1
/// MiB per magazine (a CPU then caches up to 2 MiB of a class in its two), so 4 KiB
/// blocks may reach the ladder's 143 rounds, 16 KiB ones 63, and 64 KiB ones stay at
/// 15 (only contention grows those).
const GROW_MAX_BYTES: usize = super::cache::EXCHANGE_GROWTH_BYTES;
/// The most the size classes' magazines may hold on one CPU, all classes together, in
/// bytes of objects (each class's loaded and previous magazines at its magazine size,
/// [`UmemStats::cpu_cache_capacity`]): tcmalloc's per-CPU cache cap, so that what a
/// CPU caches does not grow with the number of classes a program uses (a class's first
/// magazines hold up to 3.8 MiB per CPU, a grown one's 2 MiB, and there are dozens of
/// classes). Room for four classes at the most the growth rules give one.
///
/// - A class is made with first magazines that fit in what the others leave (but at
///   least one round: each class keeps its magazines).
/// - The growth rules (depot contention, a stream of exchanges) stop at the cap.
/// - A class that trades magazines fast enough to grow, held back by the cap alone,
///   takes a step of the ladder from the largest class idle for a working-set interval
///   (1 s) at the next maintenance tick (tcmalloc's classes steal capacity from each
///   other); and idle classes shrink by the working-set rule too.
///
/// All of it runs in the maintenance, under its lock; a class made while a growth runs
/// may overshoot the cap by that one step.
///
/// ```
/// use scalemem::umem::global::{CPU_CACHE_BYTES, free, maintain, malloc, stats};
///
/// // Bursts in a few classes, each grown at the next maintenance if it traded
/// // magazines with the depot fast enough.
/// for size in [20_000, 40_000, 100_000] {
///     let blocks: Vec<*mut u8> = (0..400).map(|_| malloc(size)).collect();
///     for p in blocks {
///         // SAFETY: from `malloc`, freed once.
///         unsafe { free(p) };
///     }
///     maintain();
/// }
/// assert!(stats().cpu_cache_capacity <= CPU_CACHE_BYTES);
/// ```
pub const CPU_CACHE_BYTES: usize = 8 << 20;
/// How often each cache's working set is updated (libumem's reap interval).
const UPDATE_NS: u64 = 1_000_000_000;

/// The heap once made (`umem::once`: its protocol). Its lock serialises making the heap
/// and is held across `fork`, so a child never inherits a half-made heap.
static HEAP: OncePtr<'static, Heap> = OncePtr::new();

/// The heap, making it on first use; `None` if the kernel refused memory for it.
/// Called with the guard set, so what making it allocates goes to the bootstrap arena.
#[inline]
fn heap() -> Option<&'static Heap> {
    HEAP.get().or_else(make_heap)
}

#[cold]
#[inline(never)]
fn make_heap() -> Option<&'static Heap> {
    // Before the heap's lock: a fork in another thread holds glibc's handler lock while
    // its prepare handler waits for that lock. The registration allocates: the guard
    // (set by our caller) sends that to the bootstrap arena. A refusal is not
    // remembered: the next request tries again, so allocation works once the kernel
    // gives memory.
    super::fork::register();
    HEAP.get_or_make(|| {
        // SAFETY: a fresh mapping, initialised, never unmapped.
        build_heap().map(|heap| unsafe { &*heap })
    })
}

/// Maps and initialises the heap; null-free pointer or `None` (nothing kept).
fn build_heap() -> Option<*const Heap> {
    // Manual Refcache epochs: ticked by maintenance, not by a background thread.
    // SAFETY: REGISTRY is this heap's alone: the heap is built under HEAP's lock, and a build
    // that fails after this line drops its manager, which maps no region before that.
    // The tag words: each slab page names its class's published slots (see `free`).
    let regions = unsafe { Regions::builder().refcache(crate::refcount::Config::manual()).static_registry(&REGISTRY) }
        .tag_words(FAST_SLOTS.tag_words())
        .build()
        .ok()?;
    let large = LargeHeap::new(LargeConfig::default()).ok()?;
    let mem = os::map(core::mem::size_of::<Heap>()).ok()?.cast::<Heap>();
    let now = large::now_ns();
    let heap = Heap {
        regions,
        large,
        caches: [const { OnceRef::new() }; NCLASSES],
        create: SpinLock::new(),
        maint: SpinLock::new(),
        next_tick: AtomicU64::new(now + TICK_NS),
        next_update: AtomicU64::new(now + UPDATE_NS),
        seen_exchanges: [const { AtomicUsize::new(0) }; NCLASSES],
        active_ns: [const { AtomicU64::new(0) }; NCLASSES],
    };
    // SAFETY: a fresh, page-aligned mapping at least `size_of::<Heap>()` long.
    unsafe { mem.as_ptr().write(heap) };
    Some(mem.as_ptr().cast_const())
}

/// The heap if it has been made (no set-up).
#[inline]
fn heap_if_made() -> Option<&'static Heap> {
    HEAP.get()
}

/// The magazine tuning of a size class: magazines of about 128 KiB of objects (a CPU
/// then caches up to two, so a batch of a hundred small blocks allocated and freed stays
/// on the CPU), between the default 15 rounds and 127; the depot's contention still
/// grows them up to the default maximum.
fn magazine_config(size: usize) -> super::cpu_cache::Config {
    let default = super::cpu_cache::Config::default();
    let rounds = ((128 << 10) / size).clamp(default.initial_rounds, 127);
    super::cpu_cache::Config { initial_rounds: rounds, max_rounds: default.max_rounds.max(rounds), ..default }
}

/// The free-time trim threshold of every size-class cache
/// ([`cache::Config::trim_threshold`](super::cache::Config::trim_threshold)): a class
/// whose depot holds more than 4 MiB of freed blocks in full magazines gives the excess
/// back to its slabs on the freeing thread, and the emptied pages go back to the kernel
/// at once, as glibc trims its heap at free time. The threshold of a class doubles past
/// the demand it saw when the program needs the trimmed memory again within about a
/// working-set interval, and decays back after ten quiet intervals, so an
/// allocate-everything, free-everything loop pays the page faults only while the
/// threshold catches up with it.
///
/// ```
/// assert_eq!(scalemem::umem::global::TRIM_THRESHOLD, 4 << 20);
/// ```
pub const TRIM_THRESHOLD: usize = 4 << 20;

/// The cache names, one per class (`umem_alloc_<size>` in libumem).
const NAME: &str = "umem_alloc";

impl Heap {
    /// Class `i`'s cache, making it on first use; `None` if the kernel refuses.
    #[inline]
    fn cache(&'static self, class: ClassIndex) -> Option<&'static ObjectCache> {
        // (`get`: as in `fast`.)
        let once = self.caches.get(class.get())?;
        once.get().or_else(|| self.make_cache(class, once))
    }

    /// Makes class `class`'s cache under the set-up lock, unless a thread did meanwhile,
    /// and publishes its per-CPU layer for the hit paths ([`FAST`], [`FAST_SLOTS`])
    /// before the cache itself.
    #[cold]
    #[inline(never)]
    fn make_cache(
        &'static self,
        class: ClassIndex,
        once: &OnceRef<'static, ObjectCache>,
    ) -> Option<&'static ObjectCache> {
        // (`get`: as in `fast`.)
        let fast_slot = FAST.get(class.get())?;
        once.get_or_make(&self.create, || {
            let size = class_size(class);
            let align = super::sizeclass::class_align(class);
            // The class's first magazines fit in what the others leave of the per-CPU
            // cap (at least one round: a class is never without magazines). Read without
            // the maintenance lock: a growth running now may overshoot the cap by its
            // one step.
            let others = self.made().map(ObjectCache::magazine_bytes).sum::<usize>();
            let mut magazines = magazine_config(size);
            magazines.initial_rounds =
                magazines.initial_rounds.min((CPU_CACHE_BYTES.saturating_sub(others) / (2 * size)).max(1));
            // The exchange rule runs on the maintenance tick (`GROW_EXCHANGES`), within
            // the per-CPU cap, not once per working-set interval.
            let config = Config {
                reaper: false,
                magazines,
                trim_threshold: Some(TRIM_THRESHOLD),
                grow_exchanges: None,
                ..Config::default()
            };
            // Class i's slab pages carry the tag i + 1 (NCLASSES < 255), which `free`
            // reads to find the class in one load.
            let tag = tag_of(class);
            // The coloured classes (`sizeclass`, "Alignment") get a page of room for
            // 64 colours of a cache line.
            let room = if is_coloured(class) { PAGE - COLOURED_ALIGN } else { 0 };
            let cache = ObjectCache::builder(NAME, size, align)
                .regions(&self.regions)
                .config(config)
                .unregistered()
                .page_tag(tag)
                .colour_room(room)
                .build()
                .ok()?;
            // The box comes from the bootstrap arena (the guard is set): never freed.
            let cache: &'static ObjectCache = Box::leak(Box::new(cache));
            let cpu = cache.cpu_caches();
            // Release: pairs with the Acquire load in `fast`.
            fast_slot.store(ptr::from_ref(cpu).cast_mut(), Ordering::Release);
            publish_fast_slots(class, cpu);
            // A new class counts as busy: not a donor of room before it has had a
            // chance to be used. Relaxed: maintenance state (see `Heap`).
            if let Some(active) = self.active_ns.get(class.get()) {
                active.store(large::now_ns(), Ordering::Relaxed);
            }
            Some(cache)
        })
    }

    /// Class `i`'s cache if it has been made (no set-up).
    #[inline]
    fn made_cache(&self, class: ClassIndex) -> Option<&'static ObjectCache> {
        // (`get`: as in `fast`.)
        self.caches.get(class.get())?.get()
    }

    /// Every cache made so far.
    fn made(&self) -> impl Iterator<Item = &ObjectCache> {
        self.made_classes().map(|(_, cache)| cache)
    }

    /// Every cache made so far, with its class index.
    fn made_classes(&self) -> impl Iterator<Item = (usize, &'static ObjectCache)> {
        self.caches.iter().enumerate().filter_map(|(i, c)| c.get().map(|c| (i, c)))
    }

    /// A block for `size` bytes aligned to `align` (a power of two).
    #[inline]
    fn alloc(&'static self, size: usize, align: usize) -> *mut u8 {
        countdown(self);
        match class_of(size, align) {
            Some(class) => match self.cache(class) {
                Some(cache) => cache.alloc().map_or(ptr::null_mut(), NonNull::as_ptr),
                None => ptr::null_mut(),
            },
            None => self.large.alloc(size.max(1), align).map_or(ptr::null_mut(), NonNull::as_ptr),
        }
    }

    /// Frees a block whose path is known: `class` for a size-class object, `None` for
    /// a large block. The fast path: a push into this CPU's loaded magazine, with no
    /// guard (one rseq section calls nothing, so it is safe even re-entrantly).
    ///
    /// # Safety
    /// `ptr` is a live block of that path, freed once; with `None` it may also be a
    /// pointer that is not a live block of ours (the large heap refuses it with
    /// `NotAllocated`, changing nothing).
    #[inline]
    unsafe fn free_block(&'static self, ptr: NonNull<u8>, class: Option<ClassIndex>) {
        if let Some(class) = class
            && push_fast(ptr, class)
        {
            return;
        }
        // SAFETY: the caller's contract.
        unsafe { self.free_slow(ptr, class) }
    }

    /// [`free_block`](Self::free_block) past the loaded magazine, under the guard.
    ///
    /// # Safety
    /// As `free_block`.
    #[cold]
    #[inline(never)]
    unsafe fn free_slow(&'static self, ptr: NonNull<u8>, class: Option<ClassIndex>) {
        let _entered = Entered::enter();
        countdown(self);
        // SAFETY: the caller's contract.
        unsafe { self.free_known(ptr, class) }
    }

    /// # Safety
    /// As `free_block`.
    unsafe fn free_known(&'static self, ptr: NonNull<u8>, class: Option<ClassIndex>) {
        match class {
            Some(class) => {
                // The cache exists: it made the block.
                if let Some(cache) = self.made_cache(class) {
                    // SAFETY: a live object of this cache (the caller's), without a
                    // constructor: any bytes are a valid "constructed" object.
                    let _ = unsafe { cache.free(ptr) };
                }
            }
            None => {
                let _ = self.large.free(ptr);
            }
        }
    }

    /// The path of a live block found by its address: `Some(Some(class))` for a
    /// size-class object, `Some(None)` for a large block, `None` for neither.
    ///
    /// # Safety
    /// If `ptr` is in one of our regions, it is a live object there.
    #[inline]
    unsafe fn find(&'static self, ptr: *const u8) -> Option<(Option<ClassIndex>, usize)> {
        // A size-class object's page names its class (the registry bit and one load),
        // whose size is the object's: no page-map walk to the slab header.
        if let Some(class) = tagged_class(ptr) {
            return Some((Some(class), class_size(class)));
        }
        // SAFETY: the caller's contract.
        if let Some(size) = unsafe { self.regions.object_size(ptr) } {
            return class_of(size, 1).map(|class| (Some(class), size));
        }
        self.large.usable_size(NonNull::new(ptr.cast_mut())?).map(|size| (None, size))
    }

    /// Resizes the large block at `ptr` (`usable` bytes) to `size` in place if it can:
    /// a shrink to more than half stays as it is, a deeper one gives pages back, a growth
    /// takes the pages after the block. False: the caller moves the block.
    fn resize_large(&self, ptr: NonNull<u8>, usable: usize, size: usize) -> bool {
        if size <= usable {
            size > usable / 2 || self.large.shrink_in_place(ptr, usable, size)
        } else {
            self.large.grow_in_place(ptr, usable, size)
        }
    }

    /// One maintenance step if one is due and nobody else is doing it. Returns the
    /// nanoseconds the maintenance thread may sleep before the next step: a tick
    /// ([`TICK_NS`]) while the regions' counts have work (or when the step was not this
    /// caller's to take), else until the next working-set update is due (at most
    /// [`UPDATE_NS`]).
    fn maintain(&'static self, force: bool) -> u64 {
        let now = large::now_ns();
        // Relaxed: deadlines are hints; the try-lock serialises the work.
        if !force && now < self.next_tick.load(Ordering::Relaxed) {
            return TICK_NS;
        }
        if !self.maint.try_lock() {
            return TICK_NS;
        }
        // Relaxed: as above.
        self.next_tick.store(now + TICK_NS, Ordering::Relaxed);
        let busy = if force {
            self.regions.tick();
            true
        } else {
            // Periodic: no fence while the region counts are settled (nothing cached,
            // nothing under review), so a steady or idle process is not interrupted
            // 100 times a second.
            self.regions.tick_if_busy().is_some()
        };
        // Magazines too small for the traffic show as depot contention, or as a stream
        // of exchanges with the depot: grow them within a tick, not a working-set
        // interval (two loads per cache when there is neither). Every growth, here and
        // in the working-set update, stays within CPU_CACHE_BYTES for all classes: each
        // class may grow into what the others leave (all growth of the global caches
        // runs here, under the maintenance lock, so the sum is exact).
        let mut cached = self.made().map(ObjectCache::magazine_bytes).sum::<usize>();
        // Runs a resizing `step` of `cache` capped to what the other classes leave, and
        // keeps `cached` (every class's magazine bytes) exact.
        fn within(cached: &mut usize, cache: &ObjectCache, step: impl FnOnce(&ObjectCache)) {
            let own = cache.magazine_bytes();
            let others = cached.saturating_sub(own);
            cache.cap_growth(CPU_CACHE_BYTES.saturating_sub(others));
            step(cache);
            *cached = others + cache.magazine_bytes();
        }
        // A class that traded magazines fast enough to grow, held back by the cap alone,
        // takes a step from the largest class idle for a working-set interval
        // (tcmalloc's classes steal capacity from each other): at most one step a tick.
        let mut starved = false;
        for (i, cache) in self.made_classes() {
            let exchanges = cache.exchanges();
            // Relaxed (both arrays): maintenance state, under the maintenance lock.
            let moved =
                self.seen_exchanges.get(i).map_or(0, |s| exchanges.wrapping_sub(s.swap(exchanges, Ordering::Relaxed)));
            if moved != 0
                && let Some(active) = self.active_ns.get(i)
            {
                active.store(now, Ordering::Relaxed);
            }
            within(&mut cached, cache, |c| {
                c.grow_if_busy(GROW_FAILURES, GROW_EXCHANGES, GROW_MAX_BYTES);
            });
            starved |= moved > GROW_EXCHANGES && cache.growth_capped(GROW_MAX_BYTES);
        }
        if starved {
            let idle = |i: usize| {
                // Relaxed: as above.
                self.active_ns.get(i).is_some_and(|a| now.saturating_sub(a.load(Ordering::Relaxed)) >= UPDATE_NS)
            };
            let donor = self
                .made_classes()
                .filter(|&(i, cache)| idle(i) && cache.magazine_rounds() > 1)
                .map(|(_, cache)| cache)
                .max_by_key(|cache| cache.magazine_bytes());
            if let Some(donor) = donor {
                within(&mut cached, donor, |c| {
                    c.shrink_step();
                });
            }
        }
        // Relaxed: as above (a hint, written under the try-lock).
        if force || now >= self.next_update.load(Ordering::Relaxed) {
            self.next_update.store(now + UPDATE_NS, Ordering::Relaxed);
            for cache in self.made() {
                within(&mut cached, cache, |c| {
                    c.update();
                });
            }
            self.large.decay();
        }
        self.maint.unlock();
        if busy {
            TICK_NS
        } else {
            // Relaxed: as above.
            self.next_update.load(Ordering::Relaxed).saturating_sub(now).clamp(TICK_NS, UPDATE_NS)
        }
    }
}

/// Counts this thread's allocations down to the next look at the maintenance clock.
#[inline]
fn countdown(heap: &'static Heap) {
    let left = COUNTDOWN.get();
    if left == 0 {
        COUNTDOWN.set(MAINTAIN_EVERY);
        let _ = heap.maintain(false);
    } else {
        COUNTDOWN.set(left - 1);
    }
}

// ---------------------------------------------------------------------------------------
// The C family.

/// `malloc`: `size` bytes aligned to [`MIN_ALIGN`]; a size of 0 gets a unique block.
/// Null when memory is refused (the caller sets `errno`).
///
/// ```
/// let p = scalemem::umem::global::malloc(24);
/// assert!(!p.is_null() && p as usize % 16 == 0);
/// // SAFETY: from `malloc`, freed once.
/// unsafe { scalemem::umem::global::free(p) };
/// ```
#[inline]
pub fn malloc(size: usize) -> *mut u8 {
    // The sizes the size-indexed slots cover first, so that their hit tests the size
    // once; then the other size classes, then the large path.
    if size <= LOOKUP_MAX {
        return alloc_block(size, MIN_ALIGN);
    }
    if size <= MAX_CLASS_SIZE { alloc_block(size, MIN_ALIGN) } else { aligned_alloc(MIN_ALIGN, size) }
}

/// `aligned_alloc`/`memalign`: `size` bytes aligned to `align` (at least [`MIN_ALIGN`]
/// is given); null if `align` is not a power of two, the request overflows, or memory
/// is refused.
///
/// ```
/// use scalemem::umem::global::{aligned_alloc, free};
/// let p = aligned_alloc(1 << 16, 100);
/// assert_eq!(p as usize % (1 << 16), 0);
/// assert!(aligned_alloc(3, 8).is_null());
/// // SAFETY: from `aligned_alloc`, freed once.
/// unsafe { free(p) };
/// ```
#[inline]
pub fn aligned_alloc(align: usize, size: usize) -> *mut u8 {
    if !align.is_power_of_two() || size > isize::MAX as usize - PAGE {
        return ptr::null_mut();
    }
    alloc_block(size, align.max(MIN_ALIGN))
}

/// Every interface's allocation: the fast path is a pop from this CPU's loaded magazine
/// of the class's cache, with no guard (one rseq section calls nothing, so it is safe
/// even re-entrantly), reached through [`FAST_SLOTS`]' size entries for requests of up to
/// [`LOOKUP_MAX`] bytes aligned to at most [`MIN_ALIGN`], else through the class and its
/// tag's entry; anything else is [`alloc_slow`] (or, for a class without published
/// slots, [`alloc_unfast`]).
#[inline(always)]
fn alloc_block(size: usize, align: usize) -> *mut u8 {
    if size <= LOOKUP_MAX
        && align <= MIN_ALIGN
        && let Some(slots) = fast_slots_by_size(size, align)
    {
        // SAFETY: published slots of a global layer, which lives forever.
        if let Some(p) = unsafe { slots.pop() } {
            return p.as_ptr();
        }
        return alloc_slow(size, align);
    }
    if let Some(class) = class_of(size, align) {
        let Some(slots) = fast_slots_of(class) else { return alloc_unfast(class, size, align) };
        // SAFETY: published slots of a global layer, which lives forever.
        if let Some(p) = unsafe { slots.pop() } {
            return p.as_ptr();
        }
    }
    alloc_slow(size, align)
}

/// [`alloc_block`] for a class whose slots are not in [`FAST_SLOTS`]: in locked mode (no
/// rseq) the magazine hit behind the CPU slot's try-lock, out of line so that the rseq
/// hit path holds no call, and without the guard, as the rseq hit (a bounded try-lock
/// calls nothing); else (the cache not made yet) [`alloc_slow`].
#[inline(never)]
fn alloc_unfast(class: ClassIndex, size: usize, align: usize) -> *mut u8 {
    if let Some(cpu) = fast(class)
        && let Some(p) = cpu.try_pop_locked()
    {
        return p.as_ptr();
    }
    alloc_slow(size, align)
}

/// The allocation slow path, under the guard: a re-entrant request goes to the
/// bootstrap arena; the heap and the class's cache are made on first use.
#[cold]
#[inline(never)]
fn alloc_slow(size: usize, align: usize) -> *mut u8 {
    let Some(_entered) = Entered::enter() else { return boot_alloc(size.max(1), align) };
    match heap() {
        Some(heap) => heap.alloc(size, align),
        None => ptr::null_mut(),
    }
}

/// `calloc`: `n * size` zeroed bytes; null on overflow or when memory is refused.
///
/// ```
/// use scalemem::umem::global::{calloc, free};
/// let p = calloc(10, 8);
/// // SAFETY: 80 readable bytes.
/// assert!(unsafe { std::slice::from_raw_parts(p, 80) }.iter().all(|&b| b == 0));
/// assert!(calloc(usize::MAX, 2).is_null());
/// // SAFETY: from `calloc`, freed once.
/// unsafe { free(p) };
/// ```
pub fn calloc(n: usize, size: usize) -> *mut u8 {
    let Some(total) = n.checked_mul(size) else { return ptr::null_mut() };
    if class_of(total, MIN_ALIGN).is_none() && total <= isize::MAX as usize - PAGE {
        // A large block: zero only a reused dirty one (fresh pages are zero already, so
        // a big sparse table costs no memory until it is touched).
        let Some(_entered) = Entered::enter() else { return boot_alloc(total, MIN_ALIGN) };
        let Some(heap) = heap() else { return ptr::null_mut() };
        countdown(heap);
        return heap.large.alloc_zeroed(total, MIN_ALIGN).map_or(ptr::null_mut(), NonNull::as_ptr);
    }
    let p = malloc(total);
    if !p.is_null() {
        // SAFETY: `p` holds at least `total` writable bytes. (Size-class objects are
        // recycled, so dirty; at most 128 KiB are cleared.)
        unsafe { p.write_bytes(0, total) };
    }
    p
}

/// `free`: null is a no-op; a pointer that is not a live block of ours (a bootstrap
/// block, or a foreign pointer) is ignored.
///
/// # Safety
/// `ptr` is null, or came from this module's allocation functions (or [`Umem`]'s) and
/// is not used again; freed once.
///
/// ```
/// // SAFETY: null is always accepted.
/// unsafe { scalemem::umem::global::free(std::ptr::null_mut()) };
/// ```
#[inline]
pub unsafe fn free(ptr: *mut u8) {
    let Some(nn) = NonNull::new(ptr) else { return };
    if REGISTRY.has(ptr) {
        // SAFETY: in one of the heap's regions, so (the caller's contract: a live block
        // of ours) in a live slab of a size-class cache, whose pages were given their
        // tag word before the object was handed out (see `region::page_word`).
        let word = unsafe { region::page_word(ptr) };
        if !word.is_null() {
            // The page's class's slots, as `FAST_SLOTS` published them (the heap's regions
            // copy `FAST_SLOTS`' entry for `tag` into each page of a run taken with `tag`): one
            // load from the pointer instead of the tag's and then the table's, which an
            // alloc-then-free loop would wait for in turn. Relaxed: `ncpus` was stored
            // before any base was published, and the word was loaded from the table
            // with Acquire before the object was handed out.
            let slots = RawSlots { base: word, ncpus: FAST_SLOTS.ncpus() };
            // SAFETY: published slots of a global layer, which lives forever; the object
            // is one of its cache's (its page's word is its class's slots).
            if unsafe { slots.push(nn) } {
                return;
            }
            // SAFETY: the caller's contract.
            return unsafe { free_rest(nn) };
        }
        // SAFETY: the caller's contract; in one of the heap's regions.
        return unsafe { free_by_tag(nn) };
    }
    // SAFETY: the caller's contract.
    unsafe { free_rest(nn) };
}

/// [`free`] of an object in one of the heap's regions whose page has no tag word: a run
/// taken before its class's slots were published, or locked mode. Goes by the page's
/// tag instead; out of line, so that `free`'s hit holds one copy of the push section.
///
/// # Safety
/// As [`free`], and `nn` is in one of the heap's regions (its registry bit is set).
#[inline(never)]
unsafe fn free_by_tag(nn: NonNull<u8>) {
    // SAFETY: in one of the heap's regions, a live block of ours (the caller's contract),
    // so in a live slab whose page is tagged (see `page_tag`).
    let tag = unsafe { region::page_tag(nn.as_ptr()) };
    // A live object of its page's tag's class, freed once (the caller's contract).
    if let Some(slots) = fast_slots(tag) {
        // SAFETY: published slots of a global layer, which lives forever; the object is
        // one of its cache's (its page's tag).
        if unsafe { slots.push(nn) } {
            return;
        }
    } else if tag != 0 {
        // SAFETY: the caller's contract; a size-class object (its page has a tag).
        return unsafe { free_unfast(nn) };
    }
    // SAFETY: the caller's contract.
    unsafe { free_rest(nn) };
}

/// [`free`] of a size-class object whose class has no slots in [`FAST_SLOTS`]: in locked
/// mode (no rseq) the magazine push behind the CPU slot's try-lock, out of line (as
/// [`alloc_unfast`]); else [`free_rest`].
///
/// # Safety
/// As [`free`].
#[inline(never)]
unsafe fn free_unfast(nn: NonNull<u8>) {
    if let Some(cpu) = tagged_class(nn.as_ptr()).and_then(fast)
        && cpu.try_push_locked(nn)
    {
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { free_rest(nn) };
}

/// `free` past a magazine push: size-class objects whose CPU's magazine is full (or in
/// locked mode), bootstrap blocks, large blocks, foreign pointers. It finds the class
/// again itself, so that nothing but `ptr` stays live across `free`'s rseq section.
///
/// # Safety
/// As [`free`].
#[cold]
#[inline(never)]
unsafe fn free_rest(nn: NonNull<u8>) {
    let ptr = nn.as_ptr();
    let class = tagged_class(ptr);
    if let Some(class) = class
        && let Some(heap) = heap_if_made()
    {
        // SAFETY: a live object of that class (its page's tag); freed once.
        unsafe { heap.free_slow(nn, Some(class)) };
        return;
    }
    if boot_contains(ptr) {
        return;
    }
    let Some(heap) = heap_if_made() else { return };
    // SAFETY: a live block of ours or a foreign pointer (the caller's contract).
    if let Some(size) = unsafe { heap.regions.object_size(ptr) } {
        // A region object whose page carries no tag (none does; kept for safety).
        if let Some(class) = class_of(size, 1) {
            // SAFETY: found live in its slab; freed once (the caller's).
            unsafe { heap.free_block(nn, Some(class)) };
        }
        return;
    }
    // A large block or a foreign pointer: the large heap's free tells them apart itself
    // (`NotAllocated`, ignored), with one lookup under its lock rather than a lookup to
    // find the block and a second to free it.
    // SAFETY: not a size-class object; a live large block or not ours (the caller's).
    unsafe { heap.free_slow(nn, None) };
}

// Every class index + 1 fits a page tag (0 means "no tag").
const _: () = assert!(NCLASSES < u8::MAX as usize);

/// Every interface's free fast path: a push of `ptr`, a live object of `class`'s cache
/// freed once (the callers'), into this CPU's loaded magazine; `false` if the cache is
/// not made or the push was refused (the caller goes to the slow path). The global
/// caches are never destroyed and never in checking mode, so a push is all a free needs.
#[inline]
fn push_fast(ptr: NonNull<u8>, class: ClassIndex) -> bool {
    match fast_slots_of(class) {
        // SAFETY: published slots of a global layer, which lives forever; `ptr` is one
        // of its cache's objects (the caller's).
        Some(slots) => unsafe { slots.push(ptr) },
        None => push_unfast(ptr, class),
    }
}

/// `push_fast` for a class without published slots (locked mode, or not made), out of
/// line so that the rseq push holds no call.
#[inline(never)]
fn push_unfast(ptr: NonNull<u8>, class: ClassIndex) -> bool {
    fast(class).is_some_and(|cpu| cpu.try_push_locked(ptr))
}

/// The heap's region registry (`RegionsBuilder::static_registry`): a static, so that
/// `free` tests a pointer against it with no pointer to load and none to test for null
/// (all zero until the heap maps its first region; never used by another manager).
static REGISTRY: StaticRegistry = StaticRegistry::new();

/// The size class of a block in the heap's regions, from its page's tag (the registry
/// bit, then one load from the region header); `None` for anything else (a large block,
/// a bootstrap block, a foreign pointer, no heap yet).
#[inline]
fn tagged_class(ptr: *const u8) -> Option<ClassIndex> {
    ClassIndex::new(usize::from(page_tag(ptr)).checked_sub(1)?)
}

/// The page tag of a block in the heap's regions (its class + 1: see [`tagged_class`]);
/// 0 for anything else.
#[inline(always)]
fn page_tag(ptr: *const u8) -> u8 {
    if !REGISTRY.has(ptr) {
        return 0;
    }
    // SAFETY: `ptr` is in one of the heap's regions, so (the callers' contract: a live
    // block of ours) in a live slab of a size-class cache, whose pages were tagged with
    // its class + 1 before the object was handed out.
    unsafe { region::page_tag(ptr) }
}

/// `malloc_usable_size`: the bytes usable at `ptr` (at least what was asked); 0 for
/// null or a pointer that is not ours.
///
/// # Safety
/// `ptr` is null or a live block from this module (or [`Umem`]).
///
/// ```
/// let p = scalemem::umem::global::malloc(100);
/// // SAFETY: live.
/// assert!(unsafe { scalemem::umem::global::usable_size(p) } >= 100);
/// # unsafe { scalemem::umem::global::free(p) };
/// ```
pub unsafe fn usable_size(ptr: *const u8) -> usize {
    if ptr.is_null() {
        return 0;
    }
    // A block in a registered region is no bootstrap block: only others pay the chunk test.
    if !REGISTRY.has(ptr) && boot_contains(ptr) {
        // SAFETY: a bootstrap block (the caller's contract: live, ours).
        return unsafe { boot_size(ptr) };
    }
    let Some(heap) = heap_if_made() else { return 0 };
    // SAFETY: the caller's contract.
    unsafe { heap.find(ptr) }.map_or(0, |(_, size)| size)
}

/// `realloc` with glibc's rules: a null `ptr` is [`malloc`]; a size of 0 frees and
/// returns null; otherwise the block is resized in place where it can be (within its
/// size class, or a large block grown or shrunk by pages), else moved. Null when memory
/// is refused: the old block is then untouched.
///
/// # Safety
/// As [`free`] for `ptr`.
///
/// ```
/// use scalemem::umem::global::{free, malloc, realloc};
/// let p = malloc(8);
/// // SAFETY: live, 8 bytes; the old pointer is not used after the call.
/// let q = unsafe { p.write(42); realloc(p, 1 << 20) };
/// // SAFETY: the content moved with the block.
/// assert_eq!(unsafe { q.read() }, 42);
/// // SAFETY: from `realloc`, freed once.
/// unsafe { free(q) };
/// ```
pub unsafe fn realloc(ptr: *mut u8, size: usize) -> *mut u8 {
    if ptr.is_null() {
        return malloc(size);
    }
    if size == 0 {
        // SAFETY: the caller's contract.
        unsafe { free(ptr) };
        return ptr::null_mut();
    }
    // As in `usable_size`.
    if !REGISTRY.has(ptr) && boot_contains(ptr) {
        // SAFETY: a live bootstrap block.
        let old = unsafe { boot_size(ptr) };
        // SAFETY: the caller's contract; the old block is ignored when freed.
        return unsafe { move_block(ptr, old, size, MIN_ALIGN) };
    }
    let Some(heap) = heap_if_made() else { return ptr::null_mut() };
    // SAFETY: the caller's contract.
    let Some((class, usable)) = (unsafe { heap.find(ptr) }) else { return ptr::null_mut() };
    match class {
        Some(class) => {
            // Stay in place within the class, unless the block would be mostly empty, or
            // it is not aligned as `malloc`'s are (a block from the Rust interfaces with
            // a smaller alignment, in a class below 16 bytes): a C caller may rely on
            // `MIN_ALIGN` for what `realloc` returns, which a move gives.
            if size <= usable && (size > usable / 2 || class.get() < 8) && ptr.addr().is_multiple_of(MIN_ALIGN) {
                return ptr;
            }
        }
        None => {
            // SAFETY: `ptr` is a live large block of `usable` bytes (found above).
            let nn = unsafe { NonNull::new_unchecked(ptr) };
            let _entered = Entered::enter();
            if size > super::sizeclass::MAX_CLASS_SIZE && heap.resize_large(nn, usable, size) {
                return ptr;
            }
        }
    }
    // SAFETY: the caller's contract; `usable` bytes are readable at `ptr`.
    unsafe { move_block(ptr, usable, size, MIN_ALIGN) }
}

/// Allocates `size` bytes aligned to `align`, copies `min(old, size)` bytes from `ptr`
/// and frees `ptr` (through [`free`]); null (and `ptr` untouched) if memory is refused.
///
/// # Safety
/// `ptr` is a live block of at least `old` readable bytes, freed by this call.
unsafe fn move_block(ptr: *mut u8, old: usize, size: usize, align: usize) -> *mut u8 {
    let new = aligned_alloc(align, size);
    if !new.is_null() {
        // SAFETY: both blocks hold at least `min(old, size)` bytes and do not overlap
        // (`ptr` is live while `new` was handed out).
        unsafe {
            ptr::copy_nonoverlapping(ptr, new, old.min(size));
            free(ptr);
        }
    }
    new
}

/// `malloc_trim`: gives back now what the heap caches — every magazine drained, empty
/// slabs back to the regions, the regions' Refcache ticked until empty regions are
/// released, the free pages of the regions still in use given back (`madvise`, as
/// glibc's `malloc_trim` does inside its heaps; pages already given back are skipped),
/// freed large blocks released. Returns whether anything went back (mapped bytes
/// dropped, or pages were given back).
///
/// ```
/// let p = scalemem::umem::global::malloc(1 << 20);
/// // SAFETY: from `malloc`, freed once.
/// unsafe { scalemem::umem::global::free(p) };
/// scalemem::umem::global::trim();
/// assert_eq!(scalemem::umem::global::stats().large_cached, 0);
/// ```
pub fn trim() -> bool {
    let Some(heap) = heap_if_made() else { return false };
    let _entered = Entered::enter();
    let before = mapped(heap);
    heap.maint.lock();
    for cache in heap.made() {
        cache.reap();
    }
    // Two whole Refcache epochs after the last slab left a region, plus one for the
    // review queue: the region is released on this thread (or by a concurrent ticker).
    heap.regions.advance(4);
    let purged = heap.regions.purge(1);
    heap.large.purge();
    heap.maint.unlock();
    mapped(heap) < before || purged > 0
}

/// One maintenance step now (the Refcache tick, every cache's working-set update and
/// the large heap's decay), whether or not one is due: for a program that wants its
/// cached memory back without allocating again.
///
/// ```
/// use scalemem::umem::global::{free, maintain, malloc, stats};
///
/// let p = malloc(1000);
/// // SAFETY: from `malloc`, freed once.
/// unsafe { free(p) };
/// let epoch = stats().region_epoch;
/// // A step ticks the regions' Refcache, settled or not (unless another thread's
/// // maintenance holds the lock at that moment: then it does).
/// for _ in 0..1000 {
///     maintain();
///     if stats().region_epoch > epoch {
///         break;
///     }
/// }
/// assert!(stats().region_epoch > epoch);
/// ```
pub fn maintain() {
    if let Some(heap) = heap_if_made() {
        let _entered = Entered::enter();
        let _ = heap.maintain(true);
    }
}

/// Starts a thread that runs the heap's maintenance on its own clock — a Refcache tick
/// every 10 ms while the region counts have work, each cache's working-set update and
/// the large heap's decay every second, as the piggy-backed maintenance would — so that
/// memory freed by a program that then goes quiet still goes back to the kernel (within
/// about ten working-set intervals plus two Refcache epochs, some 11 s). While the
/// region counts are settled the thread sleeps until the next working-set update, so a
/// quiet process sees it wake about once a second, not 100 times. At most one such
/// thread runs per process (a call while one runs returns `Ok` and starts nothing); a
/// `fork`ed child has none until it calls this itself. It runs until
/// [`stop_maintenance_thread`]. The thread blocks every signal, so that a signal the
/// program blocks in its own threads (to take it with `sigwait` or a `signalfd`) stays
/// the program's. Call it from ordinary code (`main`, or a library constructor), never
/// from inside an allocation: starting a thread takes glibc's loader locks.
///
/// ```no_run
/// scalemem::umem::global::spawn_maintenance_thread()?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn spawn_maintenance_thread() -> std::io::Result<()> {
    let control = BACKGROUND.control();
    if control.running() {
        return Ok(());
    }
    // Starting a thread allocates (its name, std's bookkeeping), and a refused
    // allocation there aborts the process. Under a tight `RLIMIT_AS` the heap may not be
    // made at all: see first that it can serve a block, and start nothing if it cannot
    // (the piggy-backed maintenance remains; `malloc` itself returns null, `ENOMEM`).
    let probe = malloc(1024);
    if probe.is_null() {
        return Err(std::io::ErrorKind::OutOfMemory.into());
    }
    // SAFETY: from `malloc` just above, freed once.
    unsafe { free(probe) };
    let generation = control.prepare();
    let builder = std::thread::Builder::new().name("umem-maintain".into()).stack_size(64 << 10);
    let spawned = crate::os::spawn_signal_free(builder, move || {
        BACKGROUND.started();
        let mut sleep = TICK_NS;
        while BACKGROUND.sleep(generation, sleep) {
            sleep = match heap_if_made() {
                Some(heap) => {
                    let _entered = Entered::enter();
                    heap.maintain(false)
                }
                None => UPDATE_NS,
            };
        }
    });
    // The handle is dropped (the thread detached): stopping it waits on the kernel
    // instead of `pthread_join` (`umem::background`).
    spawned.map(|_| control.spawned())
}

/// Stops the thread [`spawn_maintenance_thread`] started, if one runs in this process,
/// and returns whether one did. On return the thread is gone from the kernel's thread
/// group, not only finished: a program that was single-threaded but for it is so
/// again, and may call what Linux refuses to a multi-threaded process
/// (`unshare(CLONE_NEWUSER)`, `setns` into a user or mount namespace). The thread is
/// stopped between two maintenance steps; the call waits for a step in progress.
/// Maintenance goes on piggy-backed on allocations, and a later
/// [`spawn_maintenance_thread`] starts a new thread. (The `LD_PRELOAD` library does
/// this around `unshare` and `setns`.)
///
/// ```
/// use scalemem::umem::global::{spawn_maintenance_thread, stop_maintenance_thread};
/// spawn_maintenance_thread()?;
/// assert!(stop_maintenance_thread());
/// assert!(!stop_maintenance_thread());
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn stop_maintenance_thread() -> bool {
    BACKGROUND.control().stop()
}

/// The maintenance thread's life (`umem::background`: its protocol).
static BACKGROUND: Background<background::Os> = Background::new(background::Os);

fn mapped(heap: &Heap) -> usize {
    heap.regions.stats().mapped_bytes + heap.large.stats().mapped
}

/// The heap's counters ([`UmemStats`]); all zero before the first allocation. Takes
/// each cache's and the heap's locks briefly: for `mallinfo`, not for hot paths.
///
/// ```
/// use scalemem::umem::global::{free, malloc, stats};
///
/// // A block above the largest size class is the large heap's.
/// let p = malloc(4 << 20);
/// assert!(!p.is_null());
/// let s = stats();
/// assert!(s.large_in_use >= 4 << 20 && s.in_use >= s.large_in_use && s.mapped >= s.in_use);
/// // SAFETY: from `malloc`, freed once.
/// unsafe { free(p) };
/// ```
pub fn stats() -> UmemStats {
    // Relaxed: a statistic.
    let bootstrap = BOOT.used();
    let Some(heap) = heap_if_made() else { return UmemStats { bootstrap, ..UmemStats::default() } };
    let _entered = Entered::enter();
    let large = heap.large.stats();
    let mut stats = UmemStats {
        mapped: mapped(heap),
        large_in_use: large.in_use,
        large_cached: large.dirty + large.madvised,
        bootstrap,
        region_epoch: heap.regions.refcache().epoch(),
        returned: heap.regions.stats().returned_bytes,
        ..UmemStats::default()
    };
    for cache in heap.made() {
        let c = cache.stats();
        stats.in_use += c.in_use * c.size;
        stats.small_cached += (c.constructed - c.in_use.min(c.constructed)) * c.size;
        stats.classes += 1;
        stats.trims += c.trims;
        stats.cpu_cache_capacity += cache.magazine_bytes();
    }
    stats.in_use += large.in_use;
    stats
}

/// The counters of the size class that serves `malloc(size)` ([`CacheStats`]), if its
/// cache is made: jemalloc's per-bin statistics. `None` for a size no class serves (a
/// large block) and for a class not used yet.
///
/// ```
/// use scalemem::umem::global::{class_stats, free, malloc};
///
/// let p = malloc(1000);
/// let s = class_stats(1000).expect("made by the malloc above");
/// assert!(s.size >= 1000 && s.in_use >= 1);
/// assert!(class_stats(64 << 20).is_none()); // a large block: no class
/// // SAFETY: from `malloc`, freed once.
/// unsafe { free(p) };
/// ```
pub fn class_stats(size: usize) -> Option<CacheStats> {
    let heap = heap_if_made()?;
    let class = class_of(size.max(1), MIN_ALIGN)?;
    let _entered = Entered::enter();
    heap.made_cache(class).map(ObjectCache::stats)
}

/// Checks the heap's invariants (each size class's cache, the regions, the large heap)
/// and panics with the first one broken. For tests: call it while no other thread uses
/// the heap (a magazine operation in flight would look inconsistent).
///
/// ```
/// use scalemem::umem::global::{assert_valid, free, malloc};
/// let p = malloc(100);
/// assert_valid();
/// // SAFETY: from `malloc`, freed once.
/// unsafe { free(p) };
/// assert_valid();
/// ```
pub fn assert_valid() {
    let Some(heap) = heap_if_made() else { return };
    // What a panic message allocates goes to the bootstrap arena.
    let _entered = Entered::enter();
    for cache in heap.made() {
        cache.assert_valid();
    }
    heap.regions.assert_valid();
    heap.large.assert_valid();
}

// ---------------------------------------------------------------------------------------
// fork.

/// The global heap's part of umem's `fork` prepare handler (`umem::fork`, which also
/// takes the registered caches' locks before it, and the magazine pool's after).
pub(super) fn fork_lock() {
    HEAP.lock();
    if let Some(heap) = heap_if_made() {
        heap.maint.lock();
        heap.create.lock();
        for cache in heap.made() {
            cache.fork_lock();
        }
        heap.regions.fork_lock();
        heap.large.fork_lock();
    }
}

/// The `fork` child's repairs for the heap's caches (`ObjectCache::after_fork_in_child`).
///
/// # Safety
/// Called in the child of a `fork`, before it has started any other thread, between
/// [`fork_lock`] (in the parent) and [`fork_unlock`].
pub(super) unsafe fn after_fork_in_child() {
    if let Some(heap) = heap_if_made() {
        for cache in heap.made() {
            // SAFETY: the caller's contract.
            unsafe { cache.after_fork_in_child() };
        }
    }
}

/// Releases what [`fork_lock`] took (in the parent, and in the child, whose guard is
/// clear: fork is not called from inside an allocation).
///
/// # Safety
/// `fork_lock` ran before the fork, on this thread (in the child: the thread that
/// forked), and nothing released its locks since.
pub(super) unsafe fn fork_unlock() {
    if let Some(heap) = heap_if_made() {
        // SAFETY: the caller's contract.
        unsafe {
            heap.large.fork_unlock();
            heap.regions.fork_unlock();
            for cache in heap.made() {
                cache.fork_unlock();
            }
        }
        heap.create.unlock();
        heap.maint.unlock();
    }
    HEAP.unlock();
}

// ---------------------------------------------------------------------------------------
// The Rust interfaces.

/// `Umem::dealloc` past its hit: a bootstrap block (ignored), a large block, or a
/// size-class block whose magazine push was refused (full, locked mode, or the class's
/// slots not published).
///
/// # Safety
/// As `GlobalAlloc::dealloc`: a live block of this allocator with this layout, freed
/// once.
#[cold]
#[inline(never)]
unsafe fn dealloc_miss(ptr: *mut u8, layout: Layout) {
    if boot_contains(ptr) {
        return;
    }
    let Some(heap) = heap_if_made() else { return };
    // SAFETY: the caller's contract: a live block of this layout (so of this path), not
    // null, freed once.
    unsafe { heap.free_block(NonNull::new_unchecked(ptr), class_of(layout.size(), layout.align())) };
}

// SAFETY: `alloc` returns null or a block of at least `layout.size()` bytes aligned to
// `layout.align()` that no other live block overlaps (module invariants); `dealloc`
// routes a block back by its layout, which maps to the path that made it (`realloc`
// keeps blocks in place only within a path and class). Nothing unwinds.
unsafe impl GlobalAlloc for Umem {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        alloc_block(layout.size(), layout.align())
    }

    /// The hit is `free`'s: the registry bit says the block is in one of the heap's
    /// regions (so it is no bootstrap block: those live in the bootstrap chunks, never
    /// in a registered region, as `free` relies on too), and the layout names its class,
    /// so a push into this CPU's magazine is all it needs. The bootstrap arena's chunk
    /// test (up to eight bases) and the heap pointer wait for the miss.
    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if let Some(class) = class_of(layout.size(), layout.align())
            && REGISTRY.has(ptr)
            // SAFETY: the caller's contract: a live block of this layout, so (in a region)
            // an object of this class's cache, not null, freed once.
            && push_fast(unsafe { NonNull::new_unchecked(ptr) }, class)
        {
            return;
        }
        // SAFETY: the caller's contract.
        unsafe { dealloc_miss(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let align = layout.align();
        let old_class = class_of(layout.size(), align);
        let new_class = class_of(new_size, align);
        // A size-class block in a registered region is no bootstrap block (as in
        // `dealloc`): only other blocks pay the chunk test.
        if !(old_class.is_some() && REGISTRY.has(ptr)) && boot_contains(ptr) {
            // SAFETY: a live bootstrap block of `layout.size()` bytes; the new layout is
            // valid (the caller's contract).
            return unsafe { move_to(ptr, layout, new_size) };
        }
        match (old_class, new_class) {
            (Some(a), Some(b)) if a == b => return ptr,
            (None, None) => {
                if let Some(heap) = heap_if_made() {
                    let _entered = Entered::enter();
                    // SAFETY: the caller's: a live large block (its layout maps there).
                    let nn = unsafe { NonNull::new_unchecked(ptr) };
                    let usable = heap.large.usable_size(nn).unwrap_or(0);
                    if heap.resize_large(nn, usable, new_size) {
                        return ptr;
                    }
                }
            }
            _ => {}
        }
        // SAFETY: the caller's contract.
        unsafe { move_to(ptr, layout, new_size) }
    }
}

/// `GlobalAlloc::realloc` by moving: allocate, copy, free.
///
/// # Safety
/// As `GlobalAlloc::realloc`.
unsafe fn move_to(ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
    // SAFETY: the caller's contract makes this layout valid.
    let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
    // SAFETY: a non-zero-sized layout (the caller's contract).
    let new = unsafe { Umem.alloc(new_layout) };
    if !new.is_null() {
        // SAFETY: both blocks are live, disjoint, and hold `min` bytes; the old one is
        // freed once.
        unsafe {
            ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
            Umem.dealloc(ptr, layout);
        }
    }
    new
}

// SAFETY: blocks are valid until deallocated, whichever handle frees them (every `Umem`
// is the same heap; copies and moves of the handle change nothing); `allocate` returns
// memory fitting the layout (a zero-sized request is served as one byte of the same
// path, so `deallocate` routes it back by the same layout).
unsafe impl allocator_api2::alloc::Allocator for Umem {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, allocator_api2::alloc::AllocError> {
        // SAFETY: any layout is accepted by this implementation (size 0 is served as 1).
        let p = unsafe { GlobalAlloc::alloc(self, layout) };
        let p = NonNull::new(p).ok_or(allocator_api2::alloc::AllocError)?;
        Ok(NonNull::slice_from_raw_parts(p, layout.size()))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: the caller's contract: allocated here with this layout.
        unsafe { GlobalAlloc::dealloc(self, ptr.as_ptr(), layout) };
    }

    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, allocator_api2::alloc::AllocError> {
        // SAFETY: the caller's contract (`new.size() >= old.size()`, a live block).
        unsafe { resize(ptr, old, new) }
    }

    unsafe fn shrink(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, allocator_api2::alloc::AllocError> {
        // SAFETY: the caller's contract (`new.size() <= old.size()`, a live block).
        unsafe { resize(ptr, old, new) }
    }
}

/// `Allocator::grow`/`shrink`: `GlobalAlloc::realloc` when the alignment stays, else a
/// move.
///
/// # Safety
/// `ptr` is a live block of layout `old`.
unsafe fn resize(
    ptr: NonNull<u8>,
    old: Layout,
    new: Layout,
) -> Result<NonNull<[u8]>, allocator_api2::alloc::AllocError> {
    let p = if new.align() == old.align() {
        // SAFETY: the caller's contract; `new` is a valid layout of this alignment.
        unsafe { GlobalAlloc::realloc(&Umem, ptr.as_ptr(), old, new.size()) }
    } else {
        // SAFETY: any layout is accepted.
        let p = unsafe { GlobalAlloc::alloc(&Umem, new) };
        if !p.is_null() {
            // SAFETY: disjoint live blocks, each at least `min` bytes; the old one is
            // freed once.
            unsafe {
                ptr::copy_nonoverlapping(ptr.as_ptr(), p, old.size().min(new.size()));
                GlobalAlloc::dealloc(&Umem, ptr.as_ptr(), old);
            }
        }
        p
    };
    let p = NonNull::new(p).ok_or(allocator_api2::alloc::AllocError)?;
    Ok(NonNull::slice_from_raw_parts(p, new.size()))
}

#[cfg(all(test, not(scalemem_loom)))]
mod tests {
    use super::*;

    /// The size entries of `FAST_SLOTS` name the class of the request: every
    /// request of up to `LOOKUP_MAX` bytes, through `malloc` (aligned to 16) and through
    /// `GlobalAlloc` (aligned to 8), is served a block of its class, also when the block
    /// comes from a magazine pop through the table (a free just put one there), and
    /// each published entry equals its class's tag entry.
    #[test]
    fn slots_by_size_name_the_class_of_the_request() {
        let alloc = |size: usize, align: usize| {
            if align == MIN_ALIGN {
                malloc(size)
            } else {
                // SAFETY: a non-zero-sized layout.
                unsafe { Umem::new().alloc(Layout::from_size_align(size.max(1), align).unwrap()) }
            }
        };
        let dealloc = |p: *mut u8, size: usize, align: usize| {
            // SAFETY: from `alloc` above with this size and alignment, freed once.
            unsafe {
                if align == MIN_ALIGN {
                    free(p)
                } else {
                    Umem::new().dealloc(p, Layout::from_size_align(size.max(1), align).unwrap())
                }
            }
        };
        // Every class made and its magazine on this CPU holding a round, so that a
        // table entry naming the wrong class would pop a block of that class below.
        for size in 0..=LOOKUP_MAX {
            for align in [8, MIN_ALIGN] {
                dealloc(alloc(size, align), size, align);
            }
        }
        for size in (0..=LOOKUP_MAX).rev() {
            for align in [8, MIN_ALIGN] {
                let class = class_of(size.max(1), align).expect("a size class");
                let p = alloc(size, align);
                assert!(!p.is_null());
                // SAFETY: a live block, in one of the heap's regions (a size class).
                let tag = unsafe { region::page_tag(p) };
                assert_eq!(tag, tag_of(class), "a {size}-byte request aligned to {align} got another class");
                dealloc(p, size, align);
            }
        }
        let (by8, by16) = FAST_SLOTS.by_size();
        for (i, entry) in by8.iter().enumerate() {
            let class = class_of(8 * i, 8).unwrap();
            assert_eq!(
                FAST_SLOTS.slots_at(entry),
                FAST_SLOTS.slots_at(&FAST_SLOTS.tag_words()[usize::from(tag_of(class))]),
                "entry {i} of by8"
            );
        }
        for (i, entry) in by16.iter().enumerate() {
            let class = class_of(16 * i, 16).unwrap();
            assert_eq!(
                FAST_SLOTS.slots_at(entry),
                FAST_SLOTS.slots_at(&FAST_SLOTS.tag_words()[usize::from(tag_of(class))]),
                "entry {i} of by16"
            );
        }
    }

    /// Every size-class block's page names its class's published slots (the tag word
    /// `free` pushes through), and a free through that word goes to its own class: a
    /// block freed by `free` is handed out again only for a request of its class.
    #[test]
    fn free_finds_the_class_slots_through_the_page_word() {
        let sizes = [8, 24, 64, 100, 256, 1000, 4096, 20_000, MAX_CLASS_SIZE];
        let mut checked = 0;
        for &size in &sizes {
            let p = malloc(size);
            assert!(!p.is_null());
            let class = class_of(size, MIN_ALIGN).expect("a size class");
            // SAFETY: a live block from `malloc`, in one of the heap's regions.
            let (tag, word) = unsafe { (region::page_tag(p), region::page_word(p)) };
            assert_eq!(tag, tag_of(class), "page tag of a {size}-byte block");
            if let Some(published) = FAST_SLOTS.slots_at(&FAST_SLOTS.tag_words()[usize::from(tag)]) {
                let published = published.base;
                // Runs taken before the class's slots were published keep a null word;
                // every run taken after names them.
                assert!(word.is_null() || word == published, "a {size}-byte block's page names other slots");
                checked += usize::from(word == published);
            } else {
                assert!(word.is_null(), "a word without published slots (locked mode)");
            }
            // SAFETY: from `malloc`, freed once.
            unsafe { free(p) };
        }
        if crate::cpu::rseq_enabled() && FAST_SLOTS.ncpus() != 0 {
            assert!(checked > 0, "no block's page named its class's slots in rseq mode");
        }
        // Freed through the word into its class's magazine: a block of one class is never
        // handed out for another. (A word naming the wrong slots would hand a 64-byte
        // block out for a 4 KiB request.)
        let small: Vec<*mut u8> = (0..200).map(|_| malloc(64)).collect();
        for &p in &small {
            // SAFETY: from `malloc`, freed once.
            unsafe { free(p) };
        }
        let big: Vec<*mut u8> = (0..200).map(|_| malloc(4096)).collect();
        for &p in &big {
            assert!(!small.contains(&p), "a 64-byte block was handed out for 4096 bytes");
            // SAFETY: a live block from `malloc`.
            assert!(unsafe { usable_size(p) } >= 4096);
            // SAFETY: from `malloc`, freed once.
            unsafe { free(p) };
        }
    }

    /// The bootstrap arena moves on to the next, larger chunk when a block does not fit
    /// in the rest of the one in use; blocks in every chunk are recognised as bootstrap
    /// blocks (so `free` ignores them) with their sizes, and requests past the largest
    /// chunk's half are refused with null.
    #[test]
    fn bootstrap_arena_grows_by_chunks() {
        let small = boot_alloc(100, 16);
        assert!(!small.is_null() && boot_contains(small));
        // Larger than the first chunk: it lands in a later one.
        let big = boot_alloc(BOOT_FIRST + 4096, 64);
        assert!(!big.is_null() && (big as usize).is_multiple_of(64));
        assert!(boot_contains(big) && boot_contains(big.wrapping_add(BOOT_FIRST + 4095)));
        // SAFETY: both came from `boot_alloc`.
        assert_eq!(unsafe { (boot_size(small), boot_size(big)) }, (100, BOOT_FIRST + 4096));
        assert!(BOOT.chunk_in_use() >= 1, "still in the first chunk");
        // SAFETY: `big` has BOOT_FIRST + 4096 writable bytes of its own.
        unsafe { big.write_bytes(7, BOOT_FIRST + 4096) };
        let after = boot_alloc(8, 16);
        assert!(!after.is_null() && boot_contains(after));
        assert!(after as usize >= big as usize + BOOT_FIRST + 4096 || (after as usize) < big as usize);
        assert!(boot_alloc(boot_chunk_bytes(BOOT_CHUNKS - 1), 16).is_null());
        assert!(!boot_contains(&after as *const _ as *const u8), "a stack address is not a bootstrap block");
        // A free of a bootstrap block is ignored.
        // SAFETY: a bootstrap block, which `free` recognises and leaves alone.
        unsafe { free(small) };
    }

    /// `Umem::dealloc` of a bootstrap block with a size-class layout (a block allocated
    /// re-entrantly while the heap was being made, freed later by its owner) is ignored:
    /// its hit path pushes into the class's magazine only blocks in a registered region,
    /// so the bootstrap block is never handed out again as a heap block.
    #[test]
    fn dealloc_of_a_bootstrap_block_is_ignored() {
        let layout = Layout::from_size_align(64, 16).expect("a valid layout");
        let umem = Umem::new();
        // SAFETY: a non-zero-size layout; freed once below. (Makes the heap and the
        // class's cache, so that the class's magazine push is the hit path.)
        unsafe { umem.dealloc(umem.alloc(layout), layout) };
        let boot = boot_alloc(64, 16);
        assert!(!boot.is_null() && boot_contains(boot) && !REGISTRY.has(boot));
        // SAFETY: a bootstrap block of this layout, freed once (ignored).
        unsafe { umem.dealloc(boot, layout) };
        // Had the push taken it, this CPU's next allocations of the class would pop it.
        let blocks: Vec<*mut u8> = (0..1000)
            .map(|_| {
                // SAFETY: a non-zero-size layout.
                let p = unsafe { umem.alloc(layout) };
                assert!(!p.is_null());
                p
            })
            .collect();
        assert!(!blocks.contains(&boot), "a bootstrap block was handed out again");
        for p in blocks {
            // SAFETY: allocated above with this layout, freed once.
            unsafe { umem.dealloc(p, layout) };
        }
        // A bootstrap block holds exactly what was asked: a realloc within the class
        // moves it (a heap block of the class would stay in place).
        let small = Layout::from_size_align(50, 16).expect("a valid layout");
        let boot = boot_alloc(50, 16);
        assert!(!boot.is_null() && class_of(50, 16) == class_of(60, 16));
        // SAFETY: 50 writable bytes; then a realloc of that live bootstrap block, whose
        // result (60 bytes) is freed once.
        unsafe {
            boot.write_bytes(0x5a, 50);
            let moved = umem.realloc(boot, small, 60);
            assert!(!moved.is_null() && moved != boot, "realloc kept a bootstrap block in place");
            assert!(std::slice::from_raw_parts(moved, 50).iter().all(|&b| b == 0x5a));
            umem.dealloc(moved, Layout::from_size_align(60, 16).expect("a valid layout"));
        }
        // The C family too: `malloc_usable_size` is the bootstrap block's own size, and
        // `realloc` moves it, keeping the contents.
        let boot = boot_alloc(40, 16);
        // SAFETY: 40 writable bytes of a live bootstrap block; the realloc's result is
        // freed once.
        unsafe {
            boot.write_bytes(0x3c, 40);
            assert_eq!(usable_size(boot), 40);
            let moved = realloc(boot, 48);
            assert!(!moved.is_null() && moved != boot && REGISTRY.has(moved));
            assert!(std::slice::from_raw_parts(moved, 40).iter().all(|&b| b == 0x3c));
            free(moved);
        }
    }
}
