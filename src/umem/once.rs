//! How the global heap and each of its size classes' caches are made once and published
//! to every thread, and the spin lock it uses for that and for its other set-up paths.
//!
//! The heap cannot use `std::sync::OnceLock`: making it may allocate (through the
//! bootstrap arena), `fork` handlers must hold the lock across the fork without a scope,
//! and a refusal by the kernel must not be remembered.
//!
//! # Protocol ([`OnceRef`] under a lock the caller supplies, [`OncePtr`] with its own)
//!
//! 1. A reader loads the pointer with Acquire; non-null means published, and the value
//!    it names was fully made before it was published (step 3).
//! 2. A thread that finds it null takes the lock, loads the pointer again (a maker
//!    that ran meanwhile published under the lock, whose Release/Acquire orders it
//!    before us) and, if it is still null, runs the maker.
//! 3. The maker returns the value or `None`. A value is published with a Release store,
//!    still under the lock; `None` publishes nothing, so the next caller tries again.
//! 4. Every caller unlocks (Release) before it returns.
//!
//! # Invariants
//!
//! - The pointer is null until the one successful maker publishes it, and never changes
//!   after; makers run one at a time, and none runs once it is published.
//! - The value lives for the `OnceRef`'s lifetime `'a` (the maker returns a `&'a T`).
//! - All the makers of one value take the same lock (several values may share it).
//!
//! The loom models `loom-tests/tests/once.rs` run two racing first uses (one of whose
//! makers may refuse) against a reader, with the value's contents in a cell loom checks
//! for unsynchronised access, and two values made under one shared lock.

use core::marker::PhantomData;

use crate::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use crate::util::Backoff;

/// A test-and-test-and-set lock that never allocates and can be taken and released
/// without a scope (the `fork` handlers need both).
pub struct SpinLock(AtomicBool);

impl SpinLock {
    /// An unlocked lock.
    #[cfg(not(scalemem_loom))]
    pub const fn new() -> Self {
        Self(AtomicBool::new(false))
    }

    /// An unlocked lock.
    #[cfg(scalemem_loom)]
    pub fn new() -> Self {
        Self(AtomicBool::new(false))
    }

    /// Takes the lock if it is free.
    pub fn try_lock(&self) -> bool {
        // Acquire: pairs with the Release in `unlock` (the previous holder's writes).
        !self.0.load(Ordering::Relaxed)
            && self.0.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// Takes the lock, spinning and then yielding while it is held.
    pub fn lock(&self) {
        let backoff = Backoff::new();
        while !self.try_lock() {
            backoff.snooze();
        }
    }

    /// Releases the lock; only its holder may call this.
    pub fn unlock(&self) {
        // Release: pairs with the Acquire in `try_lock`.
        self.0.store(false, Ordering::Release);
    }
}

impl Default for SpinLock {
    fn default() -> Self {
        Self::new()
    }
}

/// A value made once, on first use, and published to every thread, under a lock the
/// caller supplies (module documentation: the protocol). Several of them may share one
/// lock: the global heap makes all its size classes' caches under its one set-up lock,
/// which its `fork` handlers hold across the fork.
pub struct OnceRef<'a, T> {
    ptr: AtomicPtr<T>,
    /// Hands out `&'a T` (so `Sync` needs `T: Sync`).
    _value: PhantomData<&'a T>,
}

impl<'a, T> OnceRef<'a, T> {
    /// Nothing made yet.
    #[cfg(not(scalemem_loom))]
    pub const fn new() -> Self {
        Self { ptr: AtomicPtr::new(core::ptr::null_mut()), _value: PhantomData }
    }

    /// Nothing made yet.
    #[cfg(scalemem_loom)]
    pub fn new() -> Self {
        Self { ptr: AtomicPtr::new(core::ptr::null_mut()), _value: PhantomData }
    }

    /// The value, if made (step 1).
    #[inline]
    pub fn get(&self) -> Option<&'a T> {
        // Acquire: pairs with the Release store in `get_or_make` (the value is made).
        let p = self.ptr.load(Ordering::Acquire);
        // SAFETY: null, or the `&'a T` a maker returned (invariants), valid for 'a.
        unsafe { p.cast_const().as_ref() }
    }

    /// The value, made by `make` under `lock` if no one has made it yet (steps 2-4);
    /// `None` if `make` refuses (nothing is remembered: the next call tries again).
    /// Every call for this value must pass the same lock.
    pub fn get_or_make(&self, lock: &SpinLock, make: impl FnOnce() -> Option<&'a T>) -> Option<&'a T> {
        if let Some(value) = self.get() {
            return Some(value);
        }
        lock.lock();
        // Under the lock, which orders a previous maker's publication before us.
        let value = self.get().or_else(|| {
            let made = make()?;
            // Release: pairs with the Acquire load in `get`.
            self.ptr.store(core::ptr::from_ref(made).cast_mut(), Ordering::Release);
            Some(made)
        });
        lock.unlock();
        value
    }
}

impl<T> Default for OnceRef<'_, T> {
    fn default() -> Self {
        Self::new()
    }
}

/// A [`OnceRef`] with a lock of its own.
pub struct OncePtr<'a, T> {
    once: OnceRef<'a, T>,
    lock: SpinLock,
}

impl<'a, T> OncePtr<'a, T> {
    /// Nothing made yet.
    #[cfg(not(scalemem_loom))]
    pub const fn new() -> Self {
        Self { once: OnceRef::new(), lock: SpinLock::new() }
    }

    /// Nothing made yet.
    #[cfg(scalemem_loom)]
    pub fn new() -> Self {
        Self { once: OnceRef::new(), lock: SpinLock::new() }
    }

    /// The value, if made (step 1).
    #[inline]
    pub fn get(&self) -> Option<&'a T> {
        self.once.get()
    }

    /// The value, made by `make` under the lock if no one has made it yet (steps 2-4);
    /// `None` if `make` refuses (nothing is remembered: the next call tries again).
    pub fn get_or_make(&self, make: impl FnOnce() -> Option<&'a T>) -> Option<&'a T> {
        self.once.get_or_make(&self.lock, make)
    }

    /// Takes the lock without making anything (a `fork` prepare handler: no maker is
    /// then half done when the process is copied).
    pub fn lock(&self) {
        self.lock.lock();
    }

    /// Releases what [`lock`](Self::lock) took.
    pub fn unlock(&self) {
        self.lock.unlock();
    }
}

impl<T> Default for OncePtr<'_, T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(all(test, not(scalemem_loom)))]
mod tests {
    use super::*;

    /// A refusal is not remembered; the first value made is the one every later call
    /// gets, and its maker runs once.
    #[test]
    fn made_once_refusals_forgotten() {
        static VALUES: [u64; 2] = [7, 8];
        let once: OncePtr<'static, u64> = OncePtr::new();
        assert_eq!(once.get(), None);
        assert_eq!(once.get_or_make(|| None), None);
        assert_eq!(once.get(), None);
        assert_eq!(once.get_or_make(|| Some(&VALUES[0])), Some(&7));
        assert_eq!(once.get_or_make(|| unreachable!("made twice")), Some(&7));
        assert!(core::ptr::eq(once.get().unwrap(), &VALUES[0]));
        // The fork handlers' lock and unlock leave it usable.
        once.lock();
        once.unlock();
        assert_eq!(once.get_or_make(|| Some(&VALUES[1])), Some(&7));
    }
}
