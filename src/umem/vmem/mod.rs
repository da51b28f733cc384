//! vmem: a general resource allocator for integer ranges (addresses, or ids), after
//! Bonwick and Adams, "Magazines and Vmem: Extending the Slab Allocator to Many CPUs and
//! Arbitrary Resources" (USENIX 2001), sections 4 and 5. It is the bottom layer of
//! `umem`: slabs will take their pages from a vmem arena, which takes address space from
//! the kernel.
//!
//! ```
//! use scalemem::umem::vmem::{Policy, Vmem};
//!
//! // A process-id allocator: ids 1 ..= 2^20 - 1, one at a time.
//! let pids = Vmem::new("pids", 1, (1 << 20) - 1, 1, None, 0)?;
//! let a = pids.alloc(1, Policy::InstantFit)?;
//! let b = pids.alloc(1, Policy::InstantFit)?;
//! assert_ne!(a, b);
//! assert!((1..1 << 20).contains(&a));
//! pids.free(a, 1)?;
//! pids.free(b, 1)?;
//! assert_eq!(pids.stats().in_use, 0);
//! pids.assert_valid();
//! # Ok::<(), scalemem::umem::vmem::VmemError>(())
//! ```
//!
//! # Glossary
//!
//! - **arena** ([`Vmem`]): a set of integers, made of spans, handed out in segments.
//! - **quantum**: the arena's unit; every span, segment and address is a multiple of it
//!   (a power of two; 1 for ids, the page size for address space).
//! - **span**: a range given to the arena with [`Vmem::add`] or imported from its
//!   source. Spans need not be adjacent.
//! - **segment**: a free or allocated piece of a span. The segments of a span tile it.
//! - **boundary tag / segment record**: the external record describing a span or a
//!   segment. It never lives in the managed range (which may be ids, or memory nobody
//!   has mapped).
//! - **source**: where an arena imports spans when it runs short ([`Source`]): another
//!   arena, or a pair of functions such as [`OsPages`] over `mmap`/`munmap`.
//! - **quantum cache**: a small cache of free ranges of size `k * quantum` for
//!   `k = 1 ..= qcache_max / quantum`, in front of the arena.
//!
//! # How it works
//!
//! Every span and segment has a record taken from a pool of records mapped with `mmap`
//! (never the global allocator). The records of an arena form one circular, doubly
//! linked **address list**: each span marker is followed by the segments that tile it,
//! in address order. Spans are appended as they come, so the list is sorted within each
//! span, not across spans.
//!
//! **Free segments** sit on one of 64 free lists, list `i` holding the segments whose
//! size is in `[2^i, 2^(i+1))`, and a bitmap has bit `i` set iff list `i` is non-empty.
//! **Instant fit** (the default [`Policy`]) serves `size` from the head of the first
//! non-empty list whose every member is large enough: list `highbit(size)` if `size` is
//! a power of two, else the next one up. Finding it is a mask and a count of trailing
//! zeros, so allocation takes constant time, at the price of sometimes splitting a larger
//! segment when a list below held an exact fit. Only if no such list exists does it
//! search list `highbit(size)` itself (whose members may or may not fit). **Best fit**
//! searches from list `highbit(size)` up and takes the smallest segment that fits from
//! the first list with any fit (every member of a higher list is larger).
//!
//! **Allocated segments** are in an address-keyed hash table, so [`Vmem::free`] finds
//! the segment in O(1) (and checks the size the caller passes against it). The table
//! starts at 512 buckets and grows fourfold, in freshly mapped memory, when it holds more
//! than two segments per bucket.
//!
//! **Freeing** coalesces the segment with a free neighbour on either side (address-list
//! neighbours in the same span: a span marker is never free, so segments of different
//! spans never merge). If the result covers a whole **imported** span, the span goes
//! back to the source at once. Spans added with [`Vmem::add`] stay.
//!
//! **Importing**: when no free segment fits, an arena with a source imports a span big
//! enough for the request (plus `align - quantum` of slack for a stricter alignment,
//! rounded up to the source's granularity) and allocates from it. Requests with
//! `nocross` or an address window are not imported for: a span lands wherever the
//! source puts it.
//!
//! **Quantum caches** absorb the small sizes that dominate most arenas. See the
//! `qcache` module: a bounded stack per size, each under its own lock. They are to
//! become umem object caches (with per-CPU magazines) once those exist. An allocation
//! that the arena cannot serve drains all of them ([`Vmem::reap`]) and retries once, so
//! cached ranges never make an allocation fail.
//!
//! # Concurrency
//!
//! An arena is `Send + Sync`. Its state is behind one futex mutex that never allocates;
//! each quantum cache has its own. Lock order: an arena's lock, then its quantum caches'
//! locks (`stats`, `assert_valid`), and an arena's lock, then its source's locks (import
//! and release run with the arena locked). No path takes a quantum cache's lock and then
//! the arena's, and a source never calls into the arenas it serves, so there is no cycle.
//!
//! # Invariants (checked by [`Vmem::assert_valid`])
//!
//! 1. The address list is doubly linked and consistent; after each span marker come
//!    segments that tile the span exactly (contiguous, in address order, starting at the
//!    span's base and ending at its end); every size and base is a multiple of the
//!    quantum.
//! 2. No two adjacent segments are both free.
//! 3. Every free segment is on exactly the free list of its size class, and bit `i` of
//!    the bitmap is set iff list `i` is non-empty.
//! 4. The hash holds exactly the allocated segments, each in the bucket its base hashes to.
//! 5. `free + in_use == total` (the sum of span sizes), and the imported total, the span
//!    count and the record count match the lists.
//! 6. Every range in a quantum cache is an allocated segment of the cache's size, held
//!    once.
//!
//! # Segment records and failure
//!
//! Before any operation that may need records (an allocation: at most two to split a
//! segment and two to import a span), the arena tops its pool up to a reserve of four,
//! mapping a page of records if needed. If the kernel refuses, the operation fails with
//! [`VmemError::NoRecords`] before changing anything. A free needs no new record
//! (coalescing only gives records back), so it never fails for want of memory. Records
//! return to the pool, not to the kernel; the pool and the hash are unmapped when the
//! arena is dropped.
//!
//! # Bad input
//!
//! Every case below returns an error and leaves the arena as it was; nothing on the
//! allocation and free paths panics or formats.
//!
//! | input | result |
//! |---|---|
//! | zero size | [`VmemError::ZeroSize`] |
//! | size not a multiple of the quantum | rounded up (for free too, so passing the allocation's size back works) |
//! | size, range or alignment arithmetic overflows | [`VmemError::Overflow`] |
//! | free of an address that is not allocated | [`VmemError::NotAllocated`] |
//! | free with a size other than the allocated one | [`VmemError::WrongSize`] |
//! | `split` of a segment that is not allocated, or with another size | [`VmemError::NotAllocated`], [`VmemError::WrongSize`] |
//! | `split` at 0, at or past the size, or off the quantum | [`VmemError::BadConstraints`] |
//! | `add` of a span overlapping another | [`VmemError::Overlap`] |
//! | `add` of a span whose base or size is not a multiple of the quantum | [`VmemError::BadConstraints`] |
//! | impossible constraints (alignment not a power of two, phase not below it, bad `nocross`, `min_addr > max_addr`) | [`VmemError::BadConstraints`] |
//! | quantum not a power of two | [`VmemError::BadQuantum`] |
//! | a source returning a misaligned span | [`VmemError::BadSource`] (the span is released) |
//!
//! One exception is cheap to detect only with a lookup under the arena lock, which the
//! quantum caches exist to avoid: a free of a quantum-cache size is pushed on the cache
//! unchecked, unless the arena is in **checking mode** ([`VmemBuilder::checking`], on by
//! default in debug builds), where it is looked up first (and a double free into the
//! cache is found by scanning it). Unchecked, such a bad free cannot break the arena's
//! own structure (a range that is not allocated is refused when the cache drains), but
//! it can hand the same range to two callers.
//!
//! # Differences from the paper and illumos
//!
//! - Quantum caches are bounded stacks, not object caches (see above).
//! - Import and release run under the importing arena's lock (illumos drops it); the
//!   lock order above makes this safe, and it keeps the failure paths simple.
//! - No next-fit (rotor) policy, and no `VM_SLEEP`: an allocation that cannot be served
//!   fails at once.
//! - `free` returns a `Result` and checks the size against the segment, instead of
//!   panicking.

mod arena;
pub(crate) mod lock;
mod qcache;
mod seg;

use core::fmt;

use arena::{Arena, Fit};
use lock::Lock;
use qcache::{MAX_QCACHES, QCache};

/// How [`Vmem::alloc`] and [`Vmem::xalloc`] choose among free segments.
///
/// ```
/// use scalemem::umem::vmem::{Policy, Vmem};
///
/// let arena = Vmem::new("policy", 0, 100, 1, None, 0)?;
/// let a = arena.alloc(10, Policy::InstantFit)?;
/// let b = arena.alloc(30, Policy::InstantFit)?;
/// arena.free(a, 10)?; // free: 10 units at `a`, 60 at the end
/// // Instant fit skips the 10-unit hole: its list, [8, 16), may hold segments below 9.
/// let x = arena.alloc(9, Policy::InstantFit)?;
/// assert_ne!(x, a);
/// // Best fit takes the smallest hole that fits.
/// let y = arena.alloc(9, Policy::BestFit)?;
/// assert_eq!(y, a);
/// for (addr, size) in [(b, 30), (x, 9), (y, 9)] {
///     arena.free(addr, size)?;
/// }
/// assert_eq!(arena.stats().in_use, 0);
/// # Ok::<(), scalemem::umem::vmem::VmemError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Policy {
    /// Constant time: the first segment of the first free list whose members are all
    /// large enough (see the module doc).
    #[default]
    InstantFit,
    /// The smallest free segment that fits: less fragmentation, a search per call.
    BestFit,
}

/// Placement constraints for [`Vmem::xalloc`]. `Constraints::default()` asks for
/// nothing beyond the quantum.
///
/// ```
/// use scalemem::umem::vmem::{Constraints, Vmem};
///
/// let arena = Vmem::new("example", 0x1000, 0x10000, 0x10, None, 0)?;
/// // 0x40 units, starting 0x20 past a 0x100 boundary, not crossing a 0x1000 boundary.
/// let c = Constraints { align: 0x100, phase: 0x20, nocross: 0x1000, ..Constraints::default() };
/// let a = arena.xalloc(0x40, &c)?;
/// assert_eq!(a % 0x100, 0x20);
/// assert_eq!(a / 0x1000, (a + 0x40 - 1) / 0x1000);
/// arena.xfree(a, 0x40)?;
/// # Ok::<(), scalemem::umem::vmem::VmemError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Constraints {
    /// The result is `phase` past a multiple of `align`: a power of two, or 0 for the
    /// quantum. Values below the quantum mean the quantum.
    pub align: usize,
    /// A multiple of the quantum below `align` (0 for none).
    pub phase: usize,
    /// 0, or a power of two at least `align` and the size: the result does not cross a
    /// multiple of it.
    pub nocross: usize,
    /// The result starts at or above this.
    pub min_addr: usize,
    /// The result ends at or below this (exclusive bound; `usize::MAX` for none).
    pub max_addr: usize,
    /// How to choose among fitting segments.
    pub policy: Policy,
}

impl Default for Constraints {
    fn default() -> Self {
        Self { align: 0, phase: 0, nocross: 0, min_addr: 0, max_addr: usize::MAX, policy: Policy::InstantFit }
    }
}

/// Why a vmem operation failed. Every error leaves the arena consistent and unchanged.
///
/// ```
/// use scalemem::umem::vmem::{Policy, Vmem, VmemError};
///
/// let ids = Vmem::new("errors", 1, 100, 1, None, 0)?;
/// let a = ids.alloc(4, Policy::InstantFit)?;
/// assert_eq!(ids.alloc(0, Policy::InstantFit), Err(VmemError::ZeroSize));
/// assert_eq!(ids.alloc(200, Policy::InstantFit), Err(VmemError::Exhausted));
/// assert_eq!(ids.free(a, 5), Err(VmemError::WrongSize));
/// assert_eq!(ids.free(a + 1, 4), Err(VmemError::NotAllocated));
/// assert_eq!(VmemError::Exhausted.to_string(), "vmem: arena exhausted");
/// ids.free(a, 4)?; // the failed calls changed nothing
/// assert_eq!(ids.stats().in_use, 0);
/// # Ok::<(), VmemError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum VmemError {
    /// A size of zero.
    ZeroSize,
    /// Size or range arithmetic overflowed `usize`.
    Overflow,
    /// Invalid [`Constraints`].
    BadConstraints,
    /// A quantum that is not a power of two.
    BadQuantum,
    /// No free segment fits, and none could be imported.
    Exhausted,
    /// The kernel refused memory for segment records or the hash table.
    NoRecords,
    /// Free of an address that is not the start of an allocated segment.
    NotAllocated,
    /// Free with a size other than the one allocated (after rounding to the quantum).
    WrongSize,
    /// [`Vmem::add`] of a span overlapping one the arena has.
    Overlap,
    /// The source returned a span the arena cannot use (misaligned or overflowing).
    BadSource,
    /// [`Vmem::join`] of two segments that are not next to each other in one span.
    NotAdjacent,
}

impl fmt::Display for VmemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ZeroSize => "vmem: zero size",
            Self::Overflow => "vmem: size or range overflows",
            Self::BadConstraints => "vmem: invalid alignment, phase, nocross or address window",
            Self::BadQuantum => "vmem: the quantum must be a power of two",
            Self::Exhausted => "vmem: arena exhausted",
            Self::NoRecords => "vmem: out of memory for segment records",
            Self::NotAllocated => "vmem: free of an address that is not allocated",
            Self::WrongSize => "vmem: free with a size other than the allocated one",
            Self::Overlap => "vmem: span overlaps an existing span",
            Self::BadSource => "vmem: the source returned an unusable span",
            Self::NotAdjacent => "vmem: the segments are not next to each other in one span",
        })
    }
}

impl std::error::Error for VmemError {}

/// Where an arena imports spans from when it runs short: another arena (`Vmem`
/// implements this), or functions over some other resource, such as [`OsPages`].
///
/// The arena calls `import` and `release` while it holds its own lock, so a source must
/// not call back into the arenas it serves.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use scalemem::umem::vmem::{Policy, Source, Vmem, VmemError};
///
/// /// Fresh ids from 1000 up, never reused; counts the spans given back.
/// struct Counter {
///     next: AtomicUsize,
///     released: AtomicUsize,
/// }
///
/// impl Source for Counter {
///     fn import(&self, size: usize, _align: usize) -> Result<usize, VmemError> {
///         Ok(self.next.fetch_add(size, Ordering::Relaxed)) // `align` is 1: any base will do
///     }
///
///     unsafe fn release(&self, _base: usize, _size: usize) {
///         self.released.fetch_add(1, Ordering::Relaxed);
///     }
/// }
///
/// let counter = Counter { next: AtomicUsize::new(1000), released: AtomicUsize::new(0) };
/// let ids = Vmem::builder("ids").source(&counter).build()?;
/// let a = ids.alloc(10, Policy::InstantFit)?; // the arena is empty: it imports 10 ids
/// assert_eq!(a, 1000);
/// ids.free(a, 10)?; // the span is wholly free again: released
/// assert_eq!(counter.released.load(Ordering::Relaxed), 1);
/// # Ok::<(), VmemError>(())
/// ```
pub trait Source: Sync {
    /// Returns the base of a fresh span of exactly `size` units (a multiple of
    /// [`granularity`](Self::granularity)) whose base is a multiple of `align` (a power
    /// of two: the importing arena's quantum).
    ///
    /// ```
    /// use scalemem::umem::vmem::{Source, Vmem};
    ///
    /// // A `Vmem` is a source: it serves imports with `xalloc`.
    /// let parent = Vmem::new("parent", 0x1010, 0x1000, 0x10, None, 0)?;
    /// let base = parent.import(0x200, 0x100)?;
    /// assert_eq!(base % 0x100, 0);
    /// assert_eq!(parent.stats().in_use, 0x200);
    /// // SAFETY: (1) the span `import` just returned, released once; (2) unused.
    /// unsafe { parent.release(base, 0x200) };
    /// # Ok::<(), scalemem::umem::vmem::VmemError>(())
    /// ```
    fn import(&self, size: usize, align: usize) -> Result<usize, VmemError>;

    /// Takes back a span.
    ///
    /// # Safety
    /// 1. `base` and `size` are exactly a span that `import` returned, and it has not been
    ///    released since.
    /// 2. Nothing uses the span any more.
    ///
    /// ```
    /// use scalemem::umem::vmem::{Source, Vmem};
    ///
    /// let parent = Vmem::new("parent", 0, 0x1000, 0x10, None, 0)?;
    /// let base = parent.import(0x100, 0x10)?;
    /// assert_eq!(parent.stats().in_use, 0x100);
    /// // SAFETY: (1) the span `import` just returned, released once; (2) unused.
    /// unsafe { parent.release(base, 0x100) };
    /// assert_eq!(parent.stats().in_use, 0); // back in the parent, free
    /// # Ok::<(), scalemem::umem::vmem::VmemError>(())
    /// ```
    unsafe fn release(&self, base: usize, size: usize);

    /// Import sizes are multiples of this (a power of two).
    ///
    /// ```
    /// use scalemem::umem::os::page_size;
    /// use scalemem::umem::vmem::{OsPages, Source, Vmem};
    ///
    /// assert_eq!(OsPages.granularity(), page_size()); // the kernel maps whole pages
    /// let arena = Vmem::builder("arena").quantum(64).build()?;
    /// assert_eq!(arena.granularity(), 64); // an arena hands out whole quanta
    /// # Ok::<(), scalemem::umem::vmem::VmemError>(())
    /// ```
    fn granularity(&self) -> usize {
        1
    }
}

/// The bottom source: address space from the kernel. `import` maps `size` bytes of
/// private read-write memory (page-aligned, so `align` may be at most the page size) and
/// `release` unmaps them.
///
/// ```
/// use scalemem::umem::vmem::{OsPages, Policy, Vmem};
///
/// // A heap arena with a 16-byte quantum over pages from the kernel.
/// let heap = Vmem::builder("heap").quantum(16).source(&OsPages).build()?;
/// let p = heap.alloc(100, Policy::InstantFit)?;
/// // SAFETY: the arena handed out 112 bytes of mapped memory at `p`.
/// unsafe { std::ptr::write_bytes(p as *mut u8, 0xA5, 100) };
/// heap.free(p, 100)?;
/// assert_eq!(heap.stats().imported, 0); // the page went back to the kernel
/// # Ok::<(), scalemem::umem::vmem::VmemError>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct OsPages;

impl Source for OsPages {
    fn import(&self, size: usize, align: usize) -> Result<usize, VmemError> {
        if align > crate::os::page_size() {
            return Err(VmemError::BadConstraints);
        }
        let ptr = crate::os::map(size).map_err(|_| VmemError::Exhausted)?;
        Ok(ptr.as_ptr().expose_provenance())
    }

    unsafe fn release(&self, base: usize, size: usize) {
        let ptr = core::ptr::with_exposed_provenance_mut::<u8>(base);
        if let Some(ptr) = core::ptr::NonNull::new(ptr) {
            // SAFETY: (1) of the caller's contract: `base`, `size` are a mapping `import`
            // made with `os::map(size)` (whose provenance it exposed); (2) it is unused.
            unsafe { crate::os::unmap(ptr, size) };
        }
    }

    fn granularity(&self) -> usize {
        crate::os::page_size()
    }
}

/// A snapshot of an arena's counts ([`Vmem::stats`]). Sizes are in the arena's units.
///
/// ```
/// use scalemem::umem::vmem::{Policy, Vmem};
///
/// let arena = Vmem::builder("counts").quantum(8).span(0, 1024).qcache_max(16).build()?;
/// let a = arena.alloc(8, Policy::InstantFit)?;
/// let b = arena.alloc(100, Policy::InstantFit)?; // rounded up to 104
/// arena.free(a, 8)?; // parked in the 8-unit quantum cache
/// let s = arena.stats();
/// assert_eq!(s.free + s.in_use, s.total);
/// assert_eq!((s.in_use, s.qcached, s.allocated_segments), (112, 8, 2)); // cached ranges count as in use
/// assert_eq!((s.allocations, s.frees, s.failures), (2, 1, 0));
/// arena.free(b, 100)?;
/// # Ok::<(), scalemem::umem::vmem::VmemError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct VmemStats {
    /// The sum of the spans' sizes.
    pub total: usize,
    /// Allocated units, including ranges parked in quantum caches.
    pub in_use: usize,
    /// Units in free segments (not counting quantum caches).
    pub free: usize,
    /// Units in spans imported from the source.
    pub imported: usize,
    /// Units parked in quantum caches (allocated in the arena, free to callers).
    pub qcached: usize,
    /// Spans the arena holds.
    pub spans: usize,
    /// Segment records in use (span markers and segments).
    pub segments: usize,
    /// Allocated segments (live allocations plus ranges in quantum caches).
    pub allocated_segments: usize,
    /// Buckets in the address hash.
    pub hash_buckets: usize,
    /// Successful allocations (`alloc` and `xalloc`, quantum-cache hits included).
    pub allocations: u64,
    /// Successful frees by callers (`free` and `xfree`).
    pub frees: u64,
    /// Failed allocations.
    pub failures: u64,
    /// Spans imported from the source.
    pub imports: u64,
    /// Spans returned to the source.
    pub releases: u64,
}

/// A vmem arena (see the [module documentation](self)). `'s` is the lifetime of its
/// source; an arena without one is a `Vmem<'static>`.
///
/// ```
/// use scalemem::umem::vmem::{Policy, Vmem};
///
/// let parent: Vmem<'static> = Vmem::new("parent", 0x1000, 0x1000, 1, None, 0)?;
/// let child = Vmem::builder("child").source(&parent).build()?; // borrows `parent`
/// // `Send + Sync`: threads share an arena by reference.
/// let (a, b) = std::thread::scope(|s| {
///     let t = s.spawn(|| child.alloc(16, Policy::InstantFit));
///     (child.alloc(16, Policy::InstantFit), t.join().unwrap())
/// });
/// let (a, b) = (a?, b?);
/// assert!(a + 16 <= b || b + 16 <= a); // disjoint
/// child.free(a, 16)?;
/// child.free(b, 16)?;
/// assert_eq!(parent.stats().in_use, 0); // the child's spans went back
/// # Ok::<(), scalemem::umem::vmem::VmemError>(())
/// ```
pub struct Vmem<'s> {
    name: &'static str,
    quantum: usize,
    /// The largest size served by quantum caches (0: none).
    qcache_max: usize,
    checking: bool,
    source: Option<&'s dyn Source>,
    arena: Lock<Arena>,
    qcaches: [Lock<QCache>; MAX_QCACHES],
}

/// Builds a [`Vmem`] (see [`Vmem::builder`]).
///
/// ```
/// use scalemem::umem::vmem::Vmem;
///
/// let arena = Vmem::builder("pages").quantum(4096).span(0x10_0000, 16 * 4096).build()?;
/// assert_eq!((arena.name(), arena.quantum()), ("pages", 4096));
/// assert_eq!(arena.stats().total, 16 * 4096);
/// # Ok::<(), scalemem::umem::vmem::VmemError>(())
/// ```
#[must_use]
pub struct VmemBuilder<'s> {
    name: &'static str,
    quantum: usize,
    span: Option<(usize, usize)>,
    source: Option<&'s dyn Source>,
    qcache_max: usize,
    checking: bool,
}

/// The options; each setter takes and returns the builder, so they chain.
///
/// ```
/// use scalemem::umem::vmem::{OsPages, Policy, Vmem};
///
/// let heap = Vmem::builder("heap").quantum(16).source(&OsPages).qcache_max(64).checking(true).build()?;
/// let p = heap.alloc(40, Policy::InstantFit)?; // 48 units, imported from the kernel
/// heap.free(p, 40)?;
/// assert_eq!(heap.stats().qcached, 48);
/// # Ok::<(), scalemem::umem::vmem::VmemError>(())
/// ```
impl<'s> VmemBuilder<'s> {
    /// The arena's unit, a power of two (default 1).
    ///
    /// ```
    /// use scalemem::umem::vmem::{Policy, Vmem};
    ///
    /// let arena = Vmem::builder("q").quantum(16).span(0, 256).build()?;
    /// let a = arena.alloc(1, Policy::InstantFit)?;
    /// assert_eq!(arena.stats().in_use, 16); // rounded up to the quantum
    /// arena.free(a, 1)?;
    /// # Ok::<(), scalemem::umem::vmem::VmemError>(())
    /// ```
    pub fn quantum(mut self, quantum: usize) -> Self {
        self.quantum = quantum;
        self
    }

    /// An initial span `[base, base + size)` (default none).
    ///
    /// ```
    /// use scalemem::umem::vmem::{Policy, Vmem};
    ///
    /// let arena = Vmem::builder("span").span(100, 50).build()?;
    /// assert_eq!(arena.stats().total, 50);
    /// let a = arena.alloc(50, Policy::InstantFit)?;
    /// assert_eq!(a, 100);
    /// arena.free(a, 50)?;
    /// # Ok::<(), scalemem::umem::vmem::VmemError>(())
    /// ```
    pub fn span(mut self, base: usize, size: usize) -> Self {
        self.span = Some((base, size));
        self
    }

    /// Where to import spans from when the arena runs short (default none).
    ///
    /// ```
    /// use scalemem::umem::vmem::{Policy, Vmem};
    ///
    /// let parent = Vmem::new("parent", 0x1000, 0x1000, 1, None, 0)?;
    /// let child = Vmem::builder("child").source(&parent).build()?;
    /// let a = child.alloc(0x10, Policy::InstantFit)?; // imported from `parent`
    /// assert_eq!((child.stats().imported, parent.stats().in_use), (0x10, 0x10));
    /// child.free(a, 0x10)?;
    /// assert_eq!(parent.stats().in_use, 0); // the span went back
    /// # Ok::<(), scalemem::umem::vmem::VmemError>(())
    /// ```
    pub fn source(mut self, source: &'s dyn Source) -> Self {
        self.source = Some(source);
        self
    }

    /// Quantum caches for sizes up to `qcache_max` (rounded down to a multiple of the
    /// quantum, at most 16 quanta; default 0: none).
    ///
    /// ```
    /// use scalemem::umem::vmem::{Policy, Vmem};
    ///
    /// let arena = Vmem::builder("qc").quantum(8).span(0, 1024).qcache_max(1000).build()?; // 16 quanta
    /// let a = arena.alloc(128, Policy::InstantFit)?;
    /// let b = arena.alloc(136, Policy::InstantFit)?;
    /// arena.free(a, 128)?; // 16 quanta: parked in its quantum cache
    /// arena.free(b, 136)?; // 17 quanta: back to the arena
    /// assert_eq!(arena.stats().qcached, 128);
    /// # Ok::<(), scalemem::umem::vmem::VmemError>(())
    /// ```
    pub fn qcache_max(mut self, qcache_max: usize) -> Self {
        self.qcache_max = qcache_max;
        self
    }

    /// Checking mode: frees of quantum-cache sizes are verified against the arena
    /// (default: on in debug builds, off in release builds).
    ///
    /// ```
    /// use scalemem::umem::vmem::{Policy, Vmem, VmemError};
    ///
    /// let arena = Vmem::builder("checked").span(0, 64).qcache_max(4).checking(true).build()?;
    /// let a = arena.alloc(2, Policy::InstantFit)?;
    /// arena.free(a, 2)?; // into the quantum cache
    /// assert_eq!(arena.free(a, 2), Err(VmemError::NotAllocated)); // the double free is found
    /// assert_eq!(arena.free(40, 2), Err(VmemError::NotAllocated)); // so is a stray one
    /// # Ok::<(), VmemError>(())
    /// ```
    pub fn checking(mut self, checking: bool) -> Self {
        self.checking = checking;
        self
    }

    /// Creates the arena: maps its first page of segment records and its hash table.
    ///
    /// ```
    /// use scalemem::umem::vmem::{Vmem, VmemError};
    ///
    /// assert_eq!(Vmem::builder("bad").quantum(24).build().unwrap_err(), VmemError::BadQuantum);
    /// let arena = Vmem::builder("good").quantum(32).span(0, 1024).build()?;
    /// assert_eq!(arena.stats().free, 1024);
    /// # Ok::<(), VmemError>(())
    /// ```
    pub fn build(self) -> Result<Vmem<'s>, VmemError> {
        if !self.quantum.is_power_of_two() {
            return Err(VmemError::BadQuantum);
        }
        let qcache_max = (self.qcache_max / self.quantum).min(MAX_QCACHES) * self.quantum;
        let vmem = Vmem {
            name: self.name,
            quantum: self.quantum,
            qcache_max,
            checking: self.checking,
            source: self.source,
            arena: Lock::new(Arena::new(self.quantum)?),
            qcaches: core::array::from_fn(|_| Lock::new(QCache::new())),
        };
        if let Some((base, size)) = self.span {
            vmem.add(base, size)?;
        }
        Ok(vmem)
    }
}

/// Creating an arena, allocating and freeing, and looking inside.
///
/// ```
/// use scalemem::umem::vmem::{Constraints, Policy, Vmem};
///
/// let arena = Vmem::new("tour", 0, 1 << 16, 16, None, 0)?;
/// let a = arena.alloc(100, Policy::InstantFit)?;
/// let b = arena.xalloc(100, &Constraints { align: 4096, ..Constraints::default() })?;
/// assert_eq!(b % 4096, 0);
/// assert_eq!(arena.stats().in_use, 2 * 112);
/// arena.free(a, 100)?;
/// arena.xfree(b, 100)?;
/// arena.assert_valid();
/// # Ok::<(), scalemem::umem::vmem::VmemError>(())
/// ```
impl<'s> Vmem<'s> {
    /// A builder with the defaults: quantum 1, no span, no source, no quantum caches.
    ///
    /// ```
    /// use scalemem::umem::vmem::{Policy, Vmem};
    ///
    /// let pages = Vmem::builder("pages").quantum(4096).span(0x10_0000, 64 << 12).qcache_max(4 * 4096).build()?;
    /// let a = pages.alloc(4096, Policy::InstantFit)?; // from the 1-page quantum cache
    /// pages.free(a, 4096)?;
    /// assert_eq!(pages.stats().qcached, 4096); // parked in the cache
    /// pages.reap();
    /// assert_eq!(pages.stats().qcached, 0);
    /// # Ok::<(), scalemem::umem::vmem::VmemError>(())
    /// ```
    pub fn builder(name: &'static str) -> VmemBuilder<'s> {
        VmemBuilder { name, quantum: 1, span: None, source: None, qcache_max: 0, checking: cfg!(debug_assertions) }
    }

    /// An arena named `name` with quantum `quantum`, holding `[base, base + size)` (none
    /// if `size` is 0), importing from `source` when short, with quantum caches up to
    /// `qcache_max` (see [`VmemBuilder::qcache_max`]).
    ///
    /// ```
    /// use scalemem::umem::vmem::{Policy, Vmem, VmemError};
    ///
    /// let ids = Vmem::new("ids", 1, 99, 1, None, 0)?;
    /// assert_eq!(ids.stats().total, 99);
    /// let empty = Vmem::new("empty", 0, 0, 1, None, 0)?; // size 0: no span
    /// assert_eq!(empty.alloc(1, Policy::InstantFit), Err(VmemError::Exhausted));
    /// assert_eq!(Vmem::new("bad", 0, 0, 3, None, 0).unwrap_err(), VmemError::BadQuantum);
    /// # Ok::<(), VmemError>(())
    /// ```
    pub fn new(
        name: &'static str,
        base: usize,
        size: usize,
        quantum: usize,
        source: Option<&'s dyn Source>,
        qcache_max: usize,
    ) -> Result<Self, VmemError> {
        let mut builder = Self::builder(name).quantum(quantum).qcache_max(qcache_max);
        if size > 0 {
            builder = builder.span(base, size);
        }
        if let Some(source) = source {
            builder = builder.source(source);
        }
        builder.build()
    }

    /// The arena's name.
    ///
    /// ```
    /// let pids = scalemem::umem::vmem::Vmem::new("pids", 1, 100, 1, None, 0)?;
    /// assert_eq!(pids.name(), "pids");
    /// # Ok::<(), scalemem::umem::vmem::VmemError>(())
    /// ```
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The arena's quantum.
    ///
    /// ```
    /// let pages = scalemem::umem::vmem::Vmem::builder("pages").quantum(4096).build()?;
    /// assert_eq!(pages.quantum(), 4096);
    /// # Ok::<(), scalemem::umem::vmem::VmemError>(())
    /// ```
    pub fn quantum(&self) -> usize {
        self.quantum
    }

    /// Adds the span `[base, base + size)` to the arena for good (it is never released).
    ///
    /// ```
    /// use scalemem::umem::vmem::{Policy, Vmem, VmemError};
    ///
    /// let ids = Vmem::builder("ids").build()?;
    /// assert_eq!(ids.alloc(1, Policy::InstantFit), Err(VmemError::Exhausted));
    /// ids.add(100, 10)?;
    /// assert_eq!(ids.add(105, 10), Err(VmemError::Overlap));
    /// assert_eq!(ids.alloc(10, Policy::InstantFit), Ok(100));
    /// # Ok::<(), VmemError>(())
    /// ```
    pub fn add(&self, base: usize, size: usize) -> Result<(), VmemError> {
        if size == 0 {
            return Err(VmemError::ZeroSize);
        }
        if !base.is_multiple_of(self.quantum) || !size.is_multiple_of(self.quantum) {
            return Err(VmemError::BadConstraints);
        }
        self.arena.with(|arena| arena.add(base, size))
    }

    /// Rounds a size up to the quantum.
    #[inline]
    fn round(&self, size: usize) -> Result<usize, VmemError> {
        if size == 0 {
            return Err(VmemError::ZeroSize);
        }
        size.checked_next_multiple_of(self.quantum).ok_or(VmemError::Overflow)
    }

    /// The quantum cache for `size` (rounded), if there is one.
    #[inline]
    fn qcache(&self, size: usize) -> Option<&Lock<QCache>> {
        if size <= self.qcache_max { self.qcaches.get(size / self.quantum - 1) } else { None }
    }

    /// Allocates `size` units (rounded up to the quantum) and returns the first.
    /// Sizes up to `qcache_max` come from the quantum caches whatever the policy.
    ///
    /// ```
    /// use scalemem::umem::vmem::{Policy, Vmem};
    ///
    /// let arena = Vmem::new("fit", 0, 100, 1, None, 0)?;
    /// let a = arena.alloc(10, Policy::InstantFit)?;
    /// let b = arena.alloc(30, Policy::InstantFit)?;
    /// arena.free(a, 10)?; // a free hole of 10 in front, 60 at the end
    /// assert_eq!(arena.alloc(8, Policy::BestFit)?, a); // the smallest hole that fits
    /// # let _ = b;
    /// # Ok::<(), scalemem::umem::vmem::VmemError>(())
    /// ```
    #[inline]
    pub fn alloc(&self, size: usize, policy: Policy) -> Result<usize, VmemError> {
        let size = self.round(size)?;
        if let Some(cache) = self.qcache(size)
            && let Some(addr) = cache.with(QCache::pop)
        {
            return Ok(addr);
        }
        self.alloc_slow(size, &Fit::simple(self.quantum), policy)
    }

    /// Allocates `size` units (rounded up to the quantum) under `constraints`, from the
    /// arena itself (never a quantum cache). Release it with [`xfree`](Self::xfree) or
    /// [`free`](Self::free).
    ///
    /// ```
    /// use scalemem::umem::vmem::{Constraints, Vmem, VmemError};
    ///
    /// let arena = Vmem::new("window", 0, 0x1000, 0x10, None, 0)?;
    /// let low = Constraints { min_addr: 0x800, max_addr: 0x900, ..Constraints::default() };
    /// let a = arena.xalloc(0x40, &low)?;
    /// assert!(a >= 0x800 && a + 0x40 <= 0x900);
    /// assert_eq!(arena.xalloc(0x200, &low), Err(VmemError::Exhausted)); // wider than the window
    /// let odd = Constraints { align: 0x30, ..Constraints::default() };
    /// assert_eq!(arena.xalloc(0x40, &odd), Err(VmemError::BadConstraints));
    /// arena.xfree(a, 0x40)?;
    /// # Ok::<(), VmemError>(())
    /// ```
    pub fn xalloc(&self, size: usize, constraints: &Constraints) -> Result<usize, VmemError> {
        let size = self.round(size)?;
        let fit = self.fit(size, constraints)?;
        self.alloc_slow(size, &fit, constraints.policy)
    }

    /// Validates constraints (see [`Constraints`]).
    fn fit(&self, size: usize, c: &Constraints) -> Result<Fit, VmemError> {
        let align = if c.align == 0 { self.quantum } else { c.align };
        if !align.is_power_of_two() {
            return Err(VmemError::BadConstraints);
        }
        let align = align.max(self.quantum);
        let nocross_ok = c.nocross == 0 || (c.nocross.is_power_of_two() && c.nocross >= align && c.nocross >= size);
        if !c.phase.is_multiple_of(self.quantum) || c.phase >= align || !nocross_ok || c.min_addr > c.max_addr {
            return Err(VmemError::BadConstraints);
        }
        Ok(Fit { align, phase: c.phase, nocross: c.nocross, min: c.min_addr, max: c.max_addr })
    }

    /// The arena path of an allocation; on exhaustion, drains the quantum caches and
    /// retries once.
    #[cold]
    #[inline(never)]
    fn alloc_slow(&self, size: usize, fit: &Fit, policy: Policy) -> Result<usize, VmemError> {
        let may_retry = self.qcache_max > 0;
        let first = self.arena.with(|arena| {
            let result = arena.alloc(size, fit, policy, self.source);
            if !(may_retry && result == Err(VmemError::Exhausted)) {
                arena.count(&result);
            }
            result
        });
        if !(may_retry && first == Err(VmemError::Exhausted)) {
            return first;
        }
        self.reap();
        self.arena.with(|arena| {
            let result = arena.alloc(size, fit, policy, self.source);
            arena.count(&result);
            result
        })
    }

    /// Frees `[addr, addr + size)` (size rounded up to the quantum), which an
    /// [`alloc`](Self::alloc) or [`xalloc`](Self::xalloc) returned. Sizes up to
    /// `qcache_max` go to the quantum cache if it has room (see "Bad input" in the
    /// module doc for what is checked there).
    ///
    /// ```
    /// use scalemem::umem::vmem::{Policy, Vmem, VmemError};
    ///
    /// let arena = Vmem::builder("free").span(0, 64).qcache_max(4).build()?;
    /// let (a, b) = (arena.alloc(2, Policy::InstantFit)?, arena.alloc(20, Policy::InstantFit)?);
    /// arena.free(a, 2)?; // a quantum-cache size: parked in the cache
    /// arena.free(b, 20)?; // above `qcache_max`: back to the arena
    /// let s = arena.stats();
    /// assert_eq!((s.in_use, s.qcached), (2, 2));
    /// assert_eq!(arena.free(b, 20), Err(VmemError::NotAllocated));
    /// # Ok::<(), VmemError>(())
    /// ```
    #[inline]
    pub fn free(&self, addr: usize, size: usize) -> Result<(), VmemError> {
        let size = self.round(size)?;
        if let Some(cache) = self.qcache(size) {
            if self.checking {
                self.arena.with(|arena| arena.is_allocated(addr, size))?;
            }
            let cached = cache.with(|cache| {
                if self.checking && cache.contains(addr) {
                    return Err(VmemError::NotAllocated);
                }
                Ok(cache.push(addr))
            })?;
            if cached {
                return Ok(());
            }
        }
        self.arena.with(|arena| arena.free(addr, size, self.source, true))
    }

    /// Frees `[addr, addr + size)` to the arena itself, bypassing the quantum caches.
    ///
    /// ```
    /// use scalemem::umem::vmem::{Policy, Vmem};
    ///
    /// let arena = Vmem::builder("xfree").span(0, 64).qcache_max(4).build()?;
    /// let a = arena.alloc(2, Policy::InstantFit)?;
    /// arena.xfree(a, 2)?; // not parked in the 2-unit quantum cache
    /// let s = arena.stats();
    /// assert_eq!((s.in_use, s.qcached, s.segments), (0, 0, 2)); // span marker, one free segment
    /// # Ok::<(), scalemem::umem::vmem::VmemError>(())
    /// ```
    pub fn xfree(&self, addr: usize, size: usize) -> Result<(), VmemError> {
        let size = self.round(size)?;
        if self.checking
            && let Some(cache) = self.qcache(size)
            && cache.with(|cache| cache.contains(addr))
        {
            return Err(VmemError::NotAllocated);
        }
        self.arena.with(|arena| arena.free(addr, size, self.source, true))
    }

    /// Splits the allocated segment `[addr, addr + size)` (size rounded up to the
    /// quantum, as for [`free`](Self::free)) into two allocated segments at
    /// `addr + head`, each then freed on its own: what lets a caller keep a range and
    /// hand out its front (the large heap serves a smaller request from the front of a
    /// cached block, keeping the rest cached). `head` must be a multiple of the quantum
    /// strictly between 0 and the size ([`VmemError::BadConstraints`] otherwise); the
    /// segment must be one the caller holds from [`alloc`](Self::alloc),
    /// [`xalloc`](Self::xalloc) or an earlier split ([`VmemError::NotAllocated`],
    /// [`VmemError::WrongSize`]); [`VmemError::NoRecords`] if a record cannot be had. On
    /// error nothing changed.
    ///
    /// ```
    /// use scalemem::umem::vmem::{Constraints, Vmem};
    ///
    /// let arena = Vmem::new("split", 0x1000, 0x10000, 0x1000, None, 0)?;
    /// let a = arena.xalloc(0x4000, &Constraints::default())?;
    /// arena.split(a, 0x4000, 0x1000)?;
    /// arena.free(a + 0x1000, 0x3000)?; // the back, on its own
    /// assert_eq!(arena.stats().in_use, 0x1000);
    /// arena.free(a, 0x1000)?;
    /// arena.assert_valid();
    /// # Ok::<(), scalemem::umem::vmem::VmemError>(())
    /// ```
    pub fn split(&self, addr: usize, size: usize, head: usize) -> Result<(), VmemError> {
        let size = self.round(size)?;
        if head == 0 || head >= size || !head.is_multiple_of(self.quantum) {
            return Err(VmemError::BadConstraints);
        }
        self.arena.with(|arena| arena.split(addr, size, head))
    }

    /// Joins the allocated segment `[addr, addr + size)` and the allocated segment right
    /// after it, `[addr + size, addr + size + next)` (sizes rounded up to the quantum, as
    /// for [`free`](Self::free)), into one allocated segment: [`split`](Self::split)
    /// undone, so that a caller that keeps adjacent ranges together (the large heap
    /// merging freed neighbours) need not keep a record per range. Both must be segments
    /// the caller holds ([`VmemError::NotAllocated`], [`VmemError::WrongSize`]) in the
    /// same span ([`VmemError::NotAdjacent`]: two spans the source returned may lie
    /// next to each other in the address space, and each is given back on its own). On
    /// error nothing changed; the units stay allocated either way.
    ///
    /// ```
    /// use scalemem::umem::vmem::{Constraints, Vmem, VmemError};
    ///
    /// let arena = Vmem::new("join", 0x1000, 0x10000, 0x1000, None, 0)?;
    /// let a = arena.xalloc(0x4000, &Constraints::default())?;
    /// arena.split(a, 0x4000, 0x1000)?;
    /// arena.join(a, 0x1000, 0x3000)?; // whole again
    /// assert_eq!(arena.free(a + 0x1000, 0x3000), Err(VmemError::NotAllocated));
    /// arena.free(a, 0x4000)?;
    /// arena.assert_valid();
    /// # Ok::<(), VmemError>(())
    /// ```
    pub fn join(&self, addr: usize, size: usize, next: usize) -> Result<(), VmemError> {
        let size = self.round(size)?;
        let next = self.round(next)?;
        let at = addr.checked_add(size).ok_or(VmemError::Overflow)?;
        self.arena.with(|arena| arena.join(addr, size, at, next))
    }

    /// Returns every range held in the quantum caches to the arena (which coalesces them
    /// and may release spans to the source).
    ///
    /// ```
    /// use scalemem::umem::vmem::{Policy, Vmem};
    ///
    /// let parent = Vmem::new("parent", 0x1000, 0x100, 1, None, 0)?;
    /// let child = Vmem::builder("child").source(&parent).qcache_max(8).build()?;
    /// let a = child.alloc(4, Policy::InstantFit)?; // imports a 4-unit span
    /// child.free(a, 4)?; // parked in the child's quantum cache: the span stays imported
    /// assert_eq!(parent.stats().in_use, 4);
    /// child.reap();
    /// assert_eq!(parent.stats().in_use, 0); // freed, and the span released
    /// # Ok::<(), scalemem::umem::vmem::VmemError>(())
    /// ```
    pub fn reap(&self) {
        for (i, cache) in self.qcaches.iter().enumerate().take(self.qcache_max / self.quantum) {
            let size = (i + 1) * self.quantum;
            let (addrs, n) = cache.with(QCache::drain);
            if n > 0 {
                self.arena.with(|arena| {
                    // (`take`, not a slice index: no allocator path may hold a
                    // formatting panic.)
                    for &addr in addrs.iter().take(n) {
                        // Only allocated segments enter a cache in checking mode; without
                        // it, a bad free may have put anything here, and the arena refuses
                        // it unchanged.
                        let result = arena.free(addr, size, self.source, false);
                        debug_assert!(!self.checking || result.is_ok());
                    }
                });
            }
        }
    }

    /// A snapshot of the arena's counts.
    ///
    /// ```
    /// use scalemem::umem::vmem::{Policy, Vmem};
    ///
    /// let arena = Vmem::new("stats", 0, 1024, 8, None, 0)?;
    /// let a = arena.alloc(25, Policy::InstantFit)?; // rounded up to 32
    /// let s = arena.stats();
    /// assert_eq!((s.total, s.in_use, s.free), (1024, 32, 992));
    /// assert_eq!((s.allocations, s.spans, s.segments), (1, 1, 3)); // span, used, free
    /// arena.free(a, 25)?;
    /// assert_eq!(arena.stats().segments, 2); // coalesced back
    /// # Ok::<(), scalemem::umem::vmem::VmemError>(())
    /// ```
    pub fn stats(&self) -> VmemStats {
        self.arena.with(|arena| {
            let mut stats = VmemStats {
                total: arena.total,
                in_use: arena.in_use,
                free: arena.free,
                imported: arena.imported,
                spans: arena.spans,
                segments: arena.segments(),
                allocated_segments: arena.hash.count(),
                hash_buckets: arena.hash.buckets(),
                allocations: arena.counters.allocs,
                frees: arena.counters.frees,
                failures: arena.counters.failures,
                imports: arena.counters.imports,
                releases: arena.counters.releases,
                qcached: 0,
            };
            for (i, cache) in self.qcaches.iter().enumerate() {
                cache.with(|cache| {
                    stats.qcached += cache.cached().len() * (i + 1) * self.quantum;
                    stats.allocations += cache.hits;
                    stats.frees += cache.frees;
                });
            }
            stats
        })
    }

    /// Checks every invariant of the module doc, and panics with a message naming the
    /// first one broken. Takes the arena's lock and then each quantum cache's, and walks
    /// everything: O(segments + hash buckets).
    ///
    /// ```
    /// use scalemem::umem::vmem::{Policy, Vmem};
    ///
    /// let arena = Vmem::new("valid", 0, 100, 1, None, 4)?;
    /// let a = arena.alloc(3, Policy::InstantFit)?;
    /// let b = arena.alloc(50, Policy::InstantFit)?;
    /// arena.free(a, 3)?;
    /// arena.assert_valid(); // `a` is in the 3-unit quantum cache, still allocated in the arena
    /// assert_eq!(arena.stats().qcached, 3);
    /// arena.free(b, 50)?;
    /// arena.assert_valid();
    /// # Ok::<(), scalemem::umem::vmem::VmemError>(())
    /// ```
    pub fn assert_valid(&self) {
        self.arena.with(|arena| {
            arena.check();
            for (i, cache) in self.qcaches.iter().enumerate() {
                let size = (i + 1) * self.quantum;
                cache.with(|cache| {
                    assert!(
                        cache.cached().is_empty() || size <= self.qcache_max,
                        "vmem: a disabled quantum cache holds ranges"
                    );
                    for (j, &addr) in cache.cached().iter().enumerate() {
                        assert!(
                            arena.is_allocated(addr, size).is_ok(),
                            "vmem: {:#x} in the {size:#x} quantum cache is not an allocated segment of that size",
                            addr
                        );
                        assert!(!cache.cached()[..j].contains(&addr), "vmem: {addr:#x} twice in a quantum cache");
                    }
                });
            }
        });
    }
}

impl Source for Vmem<'_> {
    fn import(&self, size: usize, align: usize) -> Result<usize, VmemError> {
        self.xalloc(size, &Constraints { align, ..Constraints::default() })
    }

    unsafe fn release(&self, base: usize, size: usize) {
        // (1) of the contract: the span is one of our allocations, so this succeeds.
        let result = self.xfree(base, size);
        debug_assert!(result.is_ok(), "vmem: a child arena released a span it did not import");
    }

    fn granularity(&self) -> usize {
        self.quantum
    }
}

impl Drop for Vmem<'_> {
    /// Returns every imported span to the source (whether or not ranges in it are still
    /// allocated: they die with the arena) and unmaps the records and the hash.
    fn drop(&mut self) {
        let source = self.source;
        self.arena.get_mut().teardown(source);
    }
}

impl fmt::Debug for Vmem<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Vmem")
            .field("name", &self.name)
            .field("quantum", &self.quantum)
            .field("qcache_max", &self.qcache_max)
            .field("stats", &self.stats())
            .finish()
    }
}
