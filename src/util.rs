//! Small helpers: cache padding and exponential back-off.

use core::fmt;
use core::ops::{Deref, DerefMut};

/// Pads and aligns a value to 128 bytes, so that two of them never share a cache line
/// (nor the adjacent-line pair that x86's spatial prefetcher pulls in together).
///
/// ```
/// use scalemem::util::CachePadded;
/// let counters = [CachePadded::new(0u64), CachePadded::new(0u64)];
/// assert_eq!(std::mem::align_of_val(&counters[0]), 128);
/// assert_eq!(*counters[1], 0);
/// ```
#[derive(Default, Clone, Copy, PartialEq, Eq)]
#[repr(C, align(128))]
pub struct CachePadded<T> {
    value: T,
}

/// Wrapping and unwrapping; in between, the value is reached through `Deref` and
/// `DerefMut`.
///
/// ```
/// use scalemem::util::CachePadded;
/// let mut padded = CachePadded::new([1u8; 3]);
/// padded[0] = 7; // through `DerefMut`
/// assert_eq!(std::mem::size_of_val(&padded), 128); // three bytes take a whole 128
/// assert_eq!(padded.into_inner(), [7, 1, 1]);
/// ```
impl<T> CachePadded<T> {
    /// Wraps `value`.
    ///
    /// ```
    /// use scalemem::util::CachePadded;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// // `const`: usable in a static.
    /// static HITS: CachePadded<AtomicUsize> = CachePadded::new(AtomicUsize::new(0));
    /// HITS.fetch_add(1, Ordering::Relaxed);
    /// assert_eq!(HITS.load(Ordering::Relaxed), 1);
    /// assert_eq!(&HITS as *const _ as usize % 128, 0); // starts a 128-byte block
    /// ```
    pub const fn new(value: T) -> Self {
        Self { value }
    }

    /// Unwraps the value.
    ///
    /// ```
    /// use scalemem::util::CachePadded;
    /// let padded = CachePadded::new(String::from("kept"));
    /// let s: String = padded.into_inner();
    /// assert_eq!(s, "kept");
    /// ```
    pub fn into_inner(self) -> T {
        self.value
    }
}

impl<T> Deref for CachePadded<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> DerefMut for CachePadded<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

impl<T: fmt::Debug> fmt::Debug for CachePadded<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachePadded").field("value", &self.value).finish()
    }
}

/// Exponential back-off for spin loops: spins with `pause` for a few rounds, then yields
/// the CPU, so that an oversubscribed machine runs the thread being waited for.
///
/// ```
/// use scalemem::util::Backoff;
/// use std::sync::atomic::{AtomicBool, Ordering};
/// let ready = AtomicBool::new(true);
/// let backoff = Backoff::new();
/// while !ready.load(Ordering::Acquire) {
///     backoff.snooze();
/// }
/// ```
#[derive(Debug, Default)]
pub struct Backoff {
    step: core::cell::Cell<u32>,
}

/// The steps of a back-off: [`spin`](Self::spin) or [`snooze`](Self::snooze) while
/// waiting, [`reset`](Self::reset) after progress, and block once
/// [`is_completed`](Self::is_completed) says so.
///
/// ```
/// use scalemem::util::Backoff;
/// use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
/// let (locked, count) = (AtomicBool::new(false), AtomicUsize::new(0));
/// std::thread::scope(|s| {
///     for _ in 0..2 {
///         s.spawn(|| {
///             let backoff = Backoff::new();
///             for _ in 0..100 {
///                 while locked.swap(true, Ordering::Acquire) {
///                     backoff.snooze(); // the other thread holds the lock
///                 }
///                 backoff.reset(); // progress: the next wait starts afresh
///                 count.store(count.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
///                 locked.store(false, Ordering::Release);
///             }
///         });
///     }
/// });
/// assert_eq!(count.into_inner(), 200); // no increment lost under the lock
/// ```
impl Backoff {
    const SPIN_LIMIT: u32 = 6;
    const YIELD_LIMIT: u32 = 10;

    /// A fresh back-off.
    ///
    /// ```
    /// use scalemem::util::Backoff;
    /// let backoff = Backoff::new();
    /// assert!(!backoff.is_completed()); // starts with the shortest spins
    /// ```
    pub const fn new() -> Self {
        Self { step: core::cell::Cell::new(0) }
    }

    /// Restarts the back-off after progress.
    ///
    /// ```
    /// use scalemem::util::Backoff;
    /// let backoff = Backoff::new();
    /// while !backoff.is_completed() {
    ///     backoff.snooze();
    /// }
    /// backoff.reset(); // progress: the next wait starts with short spins again
    /// assert!(!backoff.is_completed());
    /// backoff.snooze();
    /// assert!(!backoff.is_completed());
    /// ```
    pub fn reset(&self) {
        self.step.set(0);
    }

    /// Backs off in a lock-free retry loop (a CAS lost to another thread): spins only.
    ///
    /// ```
    /// use scalemem::util::Backoff;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// let counter = AtomicUsize::new(5);
    /// let backoff = Backoff::new();
    /// let mut seen = counter.load(Ordering::Relaxed);
    /// while let Err(now) = counter.compare_exchange_weak(seen, seen * 2, Ordering::AcqRel, Ordering::Relaxed) {
    ///     seen = now;
    ///     backoff.spin(); // lost a race (or failed spuriously): spin, then retry
    /// }
    /// assert_eq!(counter.load(Ordering::Relaxed), 10);
    /// for _ in 0..20 {
    ///     backoff.spin();
    /// }
    /// assert!(!backoff.is_completed()); // spinning alone never advises blocking
    /// ```
    pub fn spin(&self) {
        for _ in 0..1u32 << self.step.get().min(Self::SPIN_LIMIT) {
            crate::sync::spin_loop();
        }
        if self.step.get() <= Self::SPIN_LIMIT {
            self.step.set(self.step.get() + 1);
        }
    }

    /// Backs off while waiting for another thread to act: spins, then yields.
    ///
    /// ```
    /// use scalemem::util::Backoff;
    /// use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    /// let (value, ready) = (AtomicUsize::new(0), AtomicBool::new(false));
    /// std::thread::scope(|s| {
    ///     s.spawn(|| {
    ///         value.store(42, Ordering::Relaxed);
    ///         ready.store(true, Ordering::Release);
    ///     });
    ///     let backoff = Backoff::new();
    ///     while !ready.load(Ordering::Acquire) {
    ///         backoff.snooze(); // lets the writer run, even on one CPU
    ///     }
    ///     assert_eq!(value.load(Ordering::Relaxed), 42);
    /// });
    /// ```
    pub fn snooze(&self) {
        if self.step.get() <= Self::SPIN_LIMIT {
            for _ in 0..1u32 << self.step.get() {
                crate::sync::spin_loop();
            }
        } else {
            crate::sync::yield_now();
        }
        if self.step.get() <= Self::YIELD_LIMIT {
            self.step.set(self.step.get() + 1);
        }
    }

    /// True once the back-off has reached the point where blocking would be better. Only
    /// [`snooze`](Self::snooze) gets it there: [`spin`](Self::spin) stops counting short of
    /// it, as a lock-free retry loop never needs to block.
    ///
    /// ```
    /// use scalemem::util::Backoff;
    /// let backoff = Backoff::new();
    /// let mut snoozes = 0;
    /// while !backoff.is_completed() {
    ///     backoff.snooze();
    ///     snoozes += 1;
    /// }
    /// // Bounded: a waiter would now park or wait on a futex instead.
    /// assert!(snoozes > 1 && snoozes < 100);
    /// ```
    pub fn is_completed(&self) -> bool {
        self.step.get() > Self::YIELD_LIMIT
    }
}

/// Memory could not be obtained from the operating system.
///
/// ```
/// let err = scalemem::util::AllocError;
/// assert_eq!(err.to_string(), "out of memory");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocError;

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("out of memory")
    }
}

impl std::error::Error for AllocError {}

/// Marks the branch that calls it as the unlikely one, so that the compiler lays the
/// other branch out as the fall-through (what `core::hint::cold_path` does from Rust
/// 1.95; the crate's minimum Rust is older). A call of an empty `#[cold]` function: the
/// call is inlined away and leaves only the branch weight.
#[cold]
pub(crate) fn cold_path() {}
