//! [`PerCpuCounter`]: a sloppy counter with one slot per CPU, updated by an rseq critical
//! section where the thread has rseq, and by an atomic `fetch_add` otherwise.

use core::mem::offset_of;

use crate::cpu::{PerCpu, rseq};
use crate::sync::atomic::{AtomicIsize, Ordering};
use crate::util::AllocError;

/// One CPU's part of the count. The two words are never written the same way: `rseq`
/// only by [`rseq::add`] (a plain `add` to memory, committed by the owning CPU), `atomic`
/// only by `fetch_add`. Mixing the two on one word would lose updates: a `fetch_add`
/// from a thread without rseq can land between the load and the store of the owning
/// CPU's plain `add`, which does not lock the cache line.
#[repr(C)]
struct Slot {
    /// Written only by [`rseq::add`]; read by [`PerCpuCounter::sum`].
    rseq: AtomicIsize,
    /// Written only by `fetch_add`: threads without rseq, or whose CPU number is out of
    /// range.
    atomic: AtomicIsize,
}

/// A counter that many threads can update without sharing a cache line: each update
/// goes to the current CPU's slot, and [`sum`](Self::sum) adds up the slots.
///
/// Where this thread has rseq ([`rseq::thread_area`]), an update is a restartable
/// sequence of a few plain instructions (about 2 ns, no `lock` prefix); elsewhere it is a
/// `fetch_add` on the current CPU's slot, which is uncontended as long as threads rarely
/// share a CPU.
///
/// # Sloppiness and ordering
///
/// The counter is for statistics and heuristics, not for synchronisation. Every access
/// is `Relaxed`: an update publishes nothing else, and [`sum`](Self::sum) is not an
/// atomic snapshot. While updates race with it, `sum` returns some value that each slot
/// passed through, not necessarily a total the counter ever held (it may even be
/// negative when increments and decrements run on different CPUs). Once the updating
/// threads are joined (or otherwise synchronised with the reader), `sum` is exact. The
/// total wraps on overflow.
///
/// ```
/// use scalemem::cpu::PerCpuCounter;
///
/// let hits = PerCpuCounter::new().unwrap();
/// std::thread::scope(|s| {
///     for _ in 0..4 {
///         s.spawn(|| (0..1000).for_each(|_| hits.inc()));
///     }
/// });
/// hits.dec();
/// assert_eq!(hits.sum(), 3999);
/// ```
pub struct PerCpuCounter {
    slots: PerCpu<Slot>,
}

impl PerCpuCounter {
    /// A zeroed counter. Fails only if the kernel refuses the memory for its slots.
    ///
    /// ```
    /// let counter = scalemem::cpu::PerCpuCounter::new().unwrap();
    /// assert_eq!(counter.sum(), 0);
    /// ```
    pub fn new() -> Result<Self, AllocError> {
        let slots = PerCpu::new(|_cpu| Slot { rseq: AtomicIsize::new(0), atomic: AtomicIsize::new(0) })?;
        Ok(Self { slots })
    }

    /// Adds `delta` (wrapping) to the current CPU's slot.
    ///
    /// ```
    /// let counter = scalemem::cpu::PerCpuCounter::new().unwrap();
    /// counter.add(40);
    /// counter.add(-2);
    /// assert_eq!(counter.sum(), 38);
    /// ```
    #[inline]
    pub fn add(&self, delta: isize) {
        if let Some(area) = rseq::thread_area() {
            let (base, stride, ncpus) = self.slots.raw_parts();
            // SAFETY: `rseq` is at this offset inside slot 0, which lies in the mapping.
            let word0 = unsafe { base.add(offset_of!(Slot, rseq)) }.cast::<isize>();
            // SAFETY: (1) `area` comes from thread_area() on this thread, just now.
            // (2) Slot `cpu` is at base + cpu * stride for cpu < ncpus, all initialised and
            // alive while &self is; `rseq` is an 8-byte-aligned AtomicIsize (interior
            // mutability, so writing through the raw pointer is allowed).
            // (3) The `rseq` words are written only here; `sum` reads them with atomic
            // loads; `reset` writes them only with &mut self, when no `add` can run.
            if unsafe { rseq::add(area, word0, stride, ncpus, delta) } {
                return;
            }
        }
        self.add_atomic(delta);
    }

    /// The fallback: an atomic RMW on the current CPU's `atomic` word.
    #[inline]
    fn add_atomic(&self, delta: isize) {
        // Relaxed: a statistic; the update publishes nothing (see the type's docs).
        self.slots.local().atomic.fetch_add(delta, Ordering::Relaxed);
    }

    /// Adds 1.
    ///
    /// ```
    /// let counter = scalemem::cpu::PerCpuCounter::new().unwrap();
    /// counter.inc();
    /// assert_eq!(counter.sum(), 1);
    /// ```
    #[inline]
    pub fn inc(&self) {
        self.add(1);
    }

    /// Subtracts 1.
    ///
    /// ```
    /// let counter = scalemem::cpu::PerCpuCounter::new().unwrap();
    /// counter.dec();
    /// assert_eq!(counter.sum(), -1);
    /// ```
    #[inline]
    pub fn dec(&self) {
        self.add(-1);
    }

    /// The (wrapping) sum of every CPU's slot. Exact when no update races with it;
    /// otherwise approximate (see the type's docs).
    ///
    /// ```
    /// let counter = scalemem::cpu::PerCpuCounter::new().unwrap();
    /// counter.add(7);
    /// assert_eq!(counter.sum(), 7);
    /// ```
    pub fn sum(&self) -> isize {
        let (by_rseq, by_atomic) = self.sum_by_path();
        by_rseq.wrapping_add(by_atomic)
    }

    /// The sum split by how the updates were made: `(rseq, atomic)`. A diagnostic: the
    /// second part counts updates from threads without rseq (or with a CPU number past
    /// the slot count). Same exactness as [`sum`](Self::sum).
    ///
    /// ```
    /// let counter = scalemem::cpu::PerCpuCounter::new().unwrap();
    /// counter.inc();
    /// let (by_rseq, by_atomic) = counter.sum_by_path();
    /// assert_eq!(by_rseq + by_atomic, 1);
    /// if scalemem::cpu::rseq::thread_area().is_some() {
    ///     assert_eq!(by_rseq, 1);
    /// }
    /// ```
    pub fn sum_by_path(&self) -> (isize, isize) {
        let mut by_rseq = 0isize;
        let mut by_atomic = 0isize;
        for slot in self.slots.iter() {
            // Relaxed: see the type's docs; the rseq word's writer is a plain 8-byte store
            // (single-copy atomic), so this load sees an old or a new value, never a torn
            // one.
            by_rseq = by_rseq.wrapping_add(slot.rseq.load(Ordering::Relaxed));
            // Relaxed: see the type's docs.
            by_atomic = by_atomic.wrapping_add(slot.atomic.load(Ordering::Relaxed));
        }
        (by_rseq, by_atomic)
    }

    /// Sets the counter to zero. Takes `&mut self`, so no update can race with it.
    ///
    /// ```
    /// let mut counter = scalemem::cpu::PerCpuCounter::new().unwrap();
    /// counter.add(3);
    /// counter.reset();
    /// assert_eq!(counter.sum(), 0);
    /// ```
    pub fn reset(&mut self) {
        for slot in self.slots.iter_mut() {
            // Relaxed: &mut self excludes every other access; whatever hands the counter
            // to another thread afterwards orders these stores.
            slot.rseq.store(0, Ordering::Relaxed);
            slot.atomic.store(0, Ordering::Relaxed);
        }
    }
}

impl core::fmt::Debug for PerCpuCounter {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PerCpuCounter").field("sum", &self.sum()).finish()
    }
}

#[cfg(all(test, not(scalemem_loom)))]
mod tests {
    use super::*;

    /// Threads with rseq and threads using the atomic fallback update the same slots at
    /// the same time; no update may be lost.
    #[test]
    fn rseq_and_atomic_updates_mix_without_loss() {
        let counter = PerCpuCounter::new().unwrap();
        let per_thread: isize = if cfg!(debug_assertions) { 100_000 } else { 1_000_000 };
        std::thread::scope(|s| {
            for t in 0..6 {
                let counter = &counter;
                s.spawn(move || {
                    for i in 0..per_thread {
                        let delta = if i % 7 == 0 { -2 } else { 1 };
                        if t % 2 == 0 { counter.add(delta) } else { counter.add_atomic(delta) }
                    }
                });
            }
        });
        let expected_per_thread: isize = (0..per_thread).map(|i| if i % 7 == 0 { -2 } else { 1 }).sum();
        assert_eq!(counter.sum(), 6 * expected_per_thread);
        let (by_rseq, by_atomic) = counter.sum_by_path();
        assert_eq!(by_atomic.wrapping_add(by_rseq), 6 * expected_per_thread);
        if rseq::thread_area().is_some() {
            assert_eq!(by_rseq, 3 * expected_per_thread);
            assert_eq!(by_atomic, 3 * expected_per_thread);
        }
    }
}
