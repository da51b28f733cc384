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

impl<T> CachePadded<T> {
    /// Wraps `value`.
    pub const fn new(value: T) -> Self {
        Self { value }
    }

    /// Unwraps the value.
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

impl Backoff {
    const SPIN_LIMIT: u32 = 6;
    const YIELD_LIMIT: u32 = 10;

    /// A fresh back-off.
    pub const fn new() -> Self {
        Self { step: core::cell::Cell::new(0) }
    }

    /// Restarts the back-off after progress.
    pub fn reset(&self) {
        self.step.set(0);
    }

    /// Backs off in a lock-free retry loop (a CAS lost to another thread): spins only.
    pub fn spin(&self) {
        for _ in 0..1u32 << self.step.get().min(Self::SPIN_LIMIT) {
            crate::sync::spin_loop();
        }
        if self.step.get() <= Self::SPIN_LIMIT {
            self.step.set(self.step.get() + 1);
        }
    }

    /// Backs off while waiting for another thread to act: spins, then yields.
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

    /// True once the back-off has reached the point where blocking would be better.
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
