//! [`Lock`]: the mutex of an arena and of each quantum cache. A three-state futex mutex
//! (Drepper, "Futexes Are Tricky", mutex 2): it never allocates, so it can guard the
//! allocator's own state, and it sleeps instead of spinning forever, which matters on a
//! machine with more threads than CPUs.
//!
//! Access is closure-scoped ([`Lock::with`]) so that the protected value is reached only
//! through the facade's `UnsafeCell::with_mut`, which loom checks for unsynchronised use.

use crate::sync::atomic::Ordering;
use crate::sync::{Futex, UnsafeCell};

/// `state`: nobody holds the lock.
const UNLOCKED: u32 = 0;
/// `state`: held, and no thread sleeps on the word.
const LOCKED: u32 = 1;
/// `state`: held, and some thread may sleep on the word (the unlocker must wake one).
const CONTENDED: u32 = 2;

/// How many times a waiter retries before it sleeps. Under loom it sleeps at once: the
/// models are about the sleep and the wake-up, and spinning only multiplies interleavings.
const SPINS: u32 = if cfg!(scalemem_loom) { 0 } else { 64 };

/// A mutex over a `T`, reached through [`with`](Lock::with).
pub(crate) struct Lock<T> {
    state: Futex,
    data: UnsafeCell<T>,
}

// SAFETY: a `Lock<T>` hands out `&mut T` to one thread at a time (the futex protocol
// below), so sharing it between threads only ever moves the `T` between them:
// - `Sync` needs `T: Send` (each `with` may run on a different thread);
// - no `&T` is ever given out concurrently, so `T: Sync` is not needed.
unsafe impl<T: Send> Sync for Lock<T> {}

impl<T> Lock<T> {
    /// An unlocked lock over `value`.
    pub(crate) fn new(value: T) -> Self {
        Self { state: Futex::new(UNLOCKED), data: UnsafeCell::new(value) }
    }

    /// Runs `f` with exclusive access to the value. The lock is released when `f`
    /// returns or unwinds (the value's own invariants are then the caller's business:
    /// nothing that runs under an arena lock panics, except `assert_valid`).
    #[inline]
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        self.lock();
        let _unlock = Unlock(self);
        // SAFETY: we hold the lock (acquired above, released by `_unlock` after `f`), so
        // no other thread has a reference to the value; the `&mut` does not outlive `f`.
        self.data.with_mut(|value| f(unsafe { &mut *value }))
    }

    /// An unlocked lock over `value`, for a `static` (there is no loom facade to build).
    #[cfg(not(scalemem_loom))]
    pub(crate) const fn new_const(value: T) -> Self {
        Self { state: Futex::new(UNLOCKED), data: UnsafeCell::new(value) }
    }

    /// The value, while the lock is held through [`force_lock`](Self::force_lock).
    ///
    /// # Safety
    /// This thread holds the lock through `force_lock` until the reference is dropped,
    /// and makes no other reference to the value meanwhile.
    #[cfg(not(scalemem_loom))]
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn force_get(&self) -> &mut T {
        // SAFETY: the caller holds the lock and makes no other reference (contract).
        self.data.with_mut(|value| unsafe { &mut *value })
    }

    /// Exclusive access through `&mut self`: no locking is needed.
    pub(crate) fn get_mut(&mut self) -> &mut T {
        // SAFETY: `&mut self` proves that no other reference to the lock exists, so no
        // thread is inside `with`; the reference borrows `self`.
        self.data.with_mut(|value| unsafe { &mut *value })
    }

    /// Takes the lock with no scope: for `fork` handlers, which take every allocator lock
    /// before `fork` and release them in the parent and in the child.
    pub(crate) fn force_lock(&self) {
        self.lock();
    }

    /// Releases a lock taken by [`force_lock`](Self::force_lock). In a `fork`ed child
    /// the holder was the forking thread, which is this one; no other thread exists to
    /// wake, and waking nobody is harmless.
    ///
    /// # Safety
    /// The lock is held through `force_lock` (in this process, or in the parent before
    /// the `fork` that made this one) and nobody else will release it.
    pub(crate) unsafe fn force_unlock(&self) {
        self.unlock();
    }

    #[inline]
    fn lock(&self) {
        // Acquire: pairs with the Release swap in `unlock`, so the previous holder's
        // writes to the value happen before ours. Relaxed on failure: the slow path
        // retries with its own Acquire operations.
        if self.state.compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed).is_err() {
            self.lock_slow();
        }
    }

    #[cold]
    #[inline(never)]
    fn lock_slow(&self) {
        let mut spins = SPINS;
        while spins > 0 {
            spins -= 1;
            crate::sync::spin_loop();
            // The load is Relaxed: it only decides whether to try; the CAS that takes the
            // lock is Acquire, as in `lock` (Relaxed on failure: nothing is read through
            // a failed attempt).
            if self.state.load(Ordering::Relaxed) == UNLOCKED
                && self.state.compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed).is_ok()
            {
                return;
            }
        }
        // Mark the lock contended before sleeping, so that the holder's `unlock` wakes
        // us. Getting UNLOCKED back means we took the lock (as CONTENDED, which costs at
        // most one spurious wake-up later). Acquire: as in `lock`.
        while self.state.swap(CONTENDED, Ordering::Acquire) != UNLOCKED {
            self.state.wait(CONTENDED);
        }
    }

    #[inline]
    fn unlock(&self) {
        // Release: pairs with the Acquire in `lock`/`lock_slow` of the next holder.
        if self.state.swap(UNLOCKED, Ordering::Release) == CONTENDED {
            self.state.wake_one();
        }
    }
}

/// Releases the lock when dropped (also on unwind).
struct Unlock<'a, T>(&'a Lock<T>);

impl<T> Drop for Unlock<'_, T> {
    fn drop(&mut self) {
        self.0.unlock();
    }
}
