//! [`Collector`] (a reclamation domain) and [`LocalHandle`] (a thread's registration).

use core::fmt;
use core::ptr::NonNull;

use super::guard::Guard;
use super::internal::{Global, Local};
use crate::util::AllocError;

/// A reclamation domain: objects deferred through its guards are freed once no thread
/// pinned in *this* collector can hold them. Most code uses the process-wide default
/// through [`epoch::pin`](super::pin); a separate collector isolates a subsystem whose
/// readers should not hold back everybody else's garbage, and vice versa.
///
/// A collector lives until its last handle is gone: every `Collector` clone, every
/// registered thread (`LocalHandle`) and every guard holds it alive. When the last goes,
/// all remaining garbage is run and its memory returns to the kernel.
///
/// ```
/// use scalemem::epoch::{Atomic, Collector};
/// use std::sync::atomic::Ordering::{AcqRel, Acquire};
///
/// let collector = Collector::new();
/// let handle = collector.register();
/// let slot = Atomic::new(1u64);
/// {
///     let guard = handle.pin();
///     let old = slot.swap(scalemem::epoch::Owned::new(2), AcqRel, &guard);
///     // SAFETY: `old` is unlinked; readers pinned in this collector may still see it.
///     unsafe { guard.defer_destroy(old) };
/// }
/// drop(handle);
/// drop(collector); // the last handle: the deferred destruction runs here
/// # let guard = &scalemem::epoch::pin();
/// # // SAFETY: no other thread can reach `slot`, and nothing else frees it.
/// # unsafe { drop(slot.into_owned()) };
/// ```
#[repr(transparent)]
pub struct Collector {
    pub(crate) global: NonNull<Global>,
}

// SAFETY: a Collector is a counted reference to a Global, whose shared state is atomics
// and whose per-thread state is reached only through records claimed by one thread.
// - Send: the reference may be released from any thread (release_ref is an atomic RMW).
// - Sync: &Collector only registers threads and reads statistics, both thread-safe.
unsafe impl Send for Collector {}
// SAFETY: see the Send impl.
unsafe impl Sync for Collector {}

impl Collector {
    /// A new collector. Aborts if the kernel refuses a page of memory, like `Box::new`;
    /// see [`try_new`](Collector::try_new).
    ///
    /// ```
    /// use scalemem::epoch::{self, Collector};
    ///
    /// let collector = Collector::new();
    /// let handle = collector.register();
    /// let _outer = epoch::pin(); // pinned in the default collector...
    /// let before = collector.epoch();
    /// handle.pin().flush();
    /// handle.pin().flush(); // ...which does not hold this one back
    /// assert_eq!(collector.epoch(), before + 2);
    /// assert_ne!(&collector, epoch::default_collector());
    /// ```
    pub fn new() -> Self {
        Self::try_new().unwrap_or_else(|_| std::alloc::handle_alloc_error(std::alloc::Layout::new::<Global>()))
    }

    /// A new collector, or `Err` if the kernel refuses the memory.
    ///
    /// ```
    /// let collector = scalemem::epoch::Collector::try_new().expect("a page of memory");
    /// let handle = collector.register();
    /// assert!(handle.pin().collector() == Some(&collector));
    /// ```
    pub fn try_new() -> Result<Self, AllocError> {
        Ok(Self { global: Global::new_mapped()? })
    }

    /// Registers the calling thread (or any owner: the handle is `!Send`, so it stays
    /// on the thread that uses it). Aborts on out-of-memory; see
    /// [`try_register`](Collector::try_register).
    ///
    /// ```
    /// let collector = scalemem::epoch::Collector::new();
    /// let first = collector.register();
    /// let second = collector.register(); // a second record, even on the same thread
    /// assert_eq!(collector.stats().threads, 2);
    /// drop(first);
    /// assert_eq!(collector.stats().threads, 1);
    /// assert_eq!(second.collector(), &collector);
    /// ```
    pub fn register(&self) -> LocalHandle {
        self.try_register().unwrap_or_else(|_| std::alloc::handle_alloc_error(std::alloc::Layout::new::<Local>()))
    }

    /// Registers a handle, or `Err` if the kernel refuses memory for a new record.
    /// Records are reused after their threads unregister, so this allocates only when
    /// more threads are registered at once than ever before.
    ///
    /// ```
    /// let collector = scalemem::epoch::Collector::new();
    /// let handle = collector.try_register().expect("memory for a record");
    /// let mapped = collector.stats().records;
    /// drop(handle); // its record is free again...
    /// let handle = collector.try_register().expect("memory for a record");
    /// assert_eq!(collector.stats().records, mapped); // ...and reused: nothing new mapped
    /// assert_eq!(collector.stats().threads, 1);
    /// # drop(handle);
    /// ```
    pub fn try_register(&self) -> Result<LocalHandle, AllocError> {
        Ok(LocalHandle { local: Global::register(self.global)? })
    }

    /// The collector's global epoch (for monitoring and tests).
    ///
    /// ```
    /// let collector = scalemem::epoch::Collector::new();
    /// let handle = collector.register();
    /// let before = collector.epoch();
    /// handle.pin().flush(); // no other thread is pinned: the epoch advances
    /// assert!(collector.epoch() > before);
    /// ```
    pub fn epoch(&self) -> usize {
        self.global().epoch()
    }

    /// How many times the epoch has advanced (for monitoring and tests).
    ///
    /// ```
    /// let collector = scalemem::epoch::Collector::new();
    /// let handle = collector.register();
    /// let before = collector.advances();
    /// handle.pin().flush(); // the only thread, pinned in the current epoch: it advances
    /// assert_eq!(collector.advances(), before + 1);
    /// assert_eq!(collector.stats().advances, collector.advances());
    /// ```
    pub fn advances(&self) -> usize {
        self.global().advances()
    }

    /// A snapshot of the collector's state (walks the thread records: not for hot paths).
    ///
    /// ```
    /// let collector = scalemem::epoch::Collector::new();
    /// let handle = collector.register();
    /// let stats = collector.stats();
    /// assert_eq!(stats.threads, 1);
    /// assert!(stats.records >= 1);
    /// ```
    pub fn stats(&self) -> CollectorStats {
        let (records, threads) = self.global().record_counts();
        let pending = self.global().pending();
        CollectorStats { epoch: self.epoch(), advances: self.advances(), records, threads, pending }
    }

    /// Drives the collector through whole grace periods, freeing what expires, until
    /// nothing sealed is pending, or a round frees nothing and the epoch cannot advance,
    /// or `rounds` advances have been tried. For callers that have just retired a large
    /// batch (umem's reap and decay) and must give its memory back now rather than over
    /// the next pins: each collect frees a bounded number of bags, and what was retired
    /// in the current epoch needs two advances. Seal the caller's own garbage first
    /// (`pin().flush()`), and call this unpinned, or the caller's pin holds the second
    /// advance back. Runs deferred functions on this thread.
    #[cfg(not(scalemem_loom))]
    pub(crate) fn settle(&self, rounds: usize) {
        let global = self.global();
        for _ in 0..rounds {
            if global.pending() == 0 {
                return;
            }
            let advanced = global.try_advance();
            let mut freed_any = false;
            loop {
                let before = global.pending();
                global.collect();
                if global.pending() >= before {
                    break;
                }
                freed_any = true;
            }
            if !advanced && !freed_any {
                return;
            }
        }
    }

    fn global(&self) -> &Global {
        // SAFETY: this Collector holds a reference, so the Global is alive.
        unsafe { self.global.as_ref() }
    }
}

/// What [`Collector::stats`] reports.
///
/// ```
/// let collector = scalemem::epoch::Collector::new();
/// let handle = collector.register();
/// let guard = handle.pin();
/// guard.defer(|| ());
/// guard.flush(); // seals the bag; it waits for two advances
/// let stats = collector.stats();
/// assert_eq!((stats.threads, stats.pending), (1, 1));
/// drop(guard);
/// for _ in 0..3 {
///     handle.pin().flush();
/// }
/// assert_eq!(collector.stats().pending, 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CollectorStats {
    /// The global epoch.
    pub epoch: usize,
    /// Successful advances so far.
    pub advances: usize,
    /// Thread records mapped. They are reused, so this follows the peak of `threads`:
    /// a thread that registers while no record is free maps a page of 31, and threads
    /// that do so at the same moment map one page each, so it is at most 31 times the
    /// peak number of threads registered at once.
    pub records: usize,
    /// Records claimed now: registered threads, plus any kept by a leaked guard.
    pub threads: usize,
    /// Bags (up to 64 deferred functions) and intrusive batches (up to 64 objects)
    /// sealed and waiting to be reclaimed. Garbage still in a thread's unsealed bag is
    /// not counted.
    pub pending: usize,
}

impl Default for Collector {
    fn default() -> Self {
        Self::new()
    }
}

impl Clone for Collector {
    fn clone(&self) -> Self {
        self.global().acquire_ref();
        Self { global: self.global }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        // SAFETY: this Collector's reference is given up and `self` is not used again.
        unsafe { Global::release_ref(self.global) };
    }
}

impl PartialEq for Collector {
    /// Two collectors are equal if they are handles to the same domain.
    fn eq(&self, other: &Self) -> bool {
        self.global == other.global
    }
}

impl Eq for Collector {}

impl fmt::Debug for Collector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Collector").field("epoch", &self.epoch()).finish_non_exhaustive()
    }
}

/// A thread's registration with a [`Collector`]: the thread pins through it. Dropping
/// it hands the thread's unreclaimed garbage to the collector (nothing is lost or freed
/// early) and frees the record for the next thread.
///
/// ```
/// let collector = scalemem::epoch::Collector::new();
/// let handle = collector.register();
/// assert!(!handle.is_pinned());
/// let guard = handle.pin();
/// assert!(handle.is_pinned());
/// drop(guard);
/// assert_eq!(handle.collector(), &collector);
/// ```
pub struct LocalHandle {
    pub(crate) local: NonNull<Local>,
}

impl LocalHandle {
    /// Pins the thread in this handle's collector.
    ///
    /// ```
    /// use scalemem::epoch::{Atomic, Collector};
    /// use std::sync::atomic::Ordering::Acquire;
    ///
    /// let collector = Collector::new();
    /// let handle = collector.register();
    /// let slot = Atomic::new(7u32);
    /// let guard = handle.pin();
    /// // SAFETY: `slot` was loaded under `guard` and nothing retires it while we are pinned.
    /// assert_eq!(unsafe { slot.load(Acquire, &guard).deref() }, &7);
    /// assert_eq!(guard.collector(), Some(&collector));
    /// drop(guard);
    /// // SAFETY: no other thread can reach `slot`, and it is not null.
    /// drop(unsafe { slot.into_owned() });
    /// ```
    #[inline]
    pub fn pin(&self) -> Guard {
        // SAFETY: the handle keeps the record claimed; Guard::enter's contract is that
        // the record outlives the guard, which it does since the guard holds a pin.
        unsafe { Guard::enter(self.local) }
    }

    /// Whether the thread is pinned through this handle.
    ///
    /// ```
    /// let collector = scalemem::epoch::Collector::new();
    /// let handle = collector.register();
    /// let outer = handle.pin();
    /// let inner = handle.pin(); // pins nest
    /// drop(outer);
    /// assert!(handle.is_pinned()); // until the last guard goes
    /// drop(inner);
    /// assert!(!handle.is_pinned());
    /// assert!(!scalemem::epoch::is_pinned()); // the default collector is another matter
    /// ```
    #[inline]
    pub fn is_pinned(&self) -> bool {
        self.local().is_pinned()
    }

    /// The collector this handle belongs to.
    ///
    /// ```
    /// use scalemem::epoch::Collector;
    ///
    /// let collector = Collector::new();
    /// let handle = collector.register();
    /// assert_eq!(handle.collector(), &collector);
    /// assert_ne!(handle.collector(), &Collector::new());
    /// let clone = handle.collector().clone(); // a counted reference to the same domain
    /// drop(collector);
    /// assert_eq!(clone, *handle.collector());
    /// ```
    pub fn collector(&self) -> &Collector {
        collector_of(self.local())
    }

    fn local(&self) -> &Local {
        // SAFETY: the handle keeps the record claimed and alive.
        unsafe { self.local.as_ref() }
    }
}

/// A `&Collector` view of a record's collector, valid while the record is claimed.
pub(crate) fn collector_of(local: &Local) -> &Collector {
    // SAFETY: Collector is a struct with one NonNull<Global> field; viewing the record's
    // pointer as a Collector borrows it without taking a count (it is never dropped
    // through this reference), and the claimed record keeps the Global alive.
    unsafe { &*(local.global_ptr() as *const NonNull<Global>).cast::<Collector>() }
}

impl Drop for LocalHandle {
    fn drop(&mut self) {
        // SAFETY: this handle is given up and not used again.
        unsafe { Local::release_handle(self.local) };
    }
}

impl fmt::Debug for LocalHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalHandle").field("pinned", &self.is_pinned()).finish_non_exhaustive()
    }
}
