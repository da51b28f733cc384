//! [`AtomicArc<T>`]: an atomically replaceable `Arc<T>` whose loads are protected by
//! hazard pointers of the global domain.
//!
//! The cell owns one strong reference to the `T` it points to. [`AtomicArc::load`]
//! protects the pointer with a hazard pointer and returns a [`Guard`] that derefs to the
//! `T`; it never touches the reference count. A store swaps the pointer and *retires*
//! the cell's old reference: the decrement runs once no hazard pointer holds the old
//! address. A guard therefore keeps its `T` alive even after the cell moved on.
//!
//! The cost of a store does not depend on how many threads ever loaded: a store is a swap
//! and a retire (one small node), and the retire's share of scans is amortised over
//! `R = max(C, 2H)` retires (module doc of [`crate::hazard`]), where `H` counts the hazard
//! slots of the threads registered *now* (exited threads' records are reused). arc-swap's
//! store, by contrast, walks the debt list of every thread that ever loaded.

use core::fmt;
use core::marker::PhantomData;
use core::ops::Deref;
use core::ptr::NonNull;
use std::sync::Arc;

use super::domain::Domain;
use super::pointer::HazardPointer;
use crate::sync::atomic::{AtomicPtr, Ordering};

/// An `Arc<T>` that can be replaced atomically while other threads read it, as
/// arc-swap's `ArcSwap` does, with loads that write no shared cache line.
///
/// ```
/// use scalemem::hazard::AtomicArc;
/// use std::sync::Arc;
///
/// let config = AtomicArc::new(Arc::new(String::from("v1")));
/// let guard = config.load();          // a hazard pointer, no refcount traffic
/// config.store(Arc::new(String::from("v2")));
/// assert_eq!(*guard, "v1");           // still valid: the guard protects it
/// drop(guard);
/// assert_eq!(*config.load_full(), "v2");
/// let previous = config.rcu(|current| format!("{current}+"));
/// assert_eq!(*previous, "v2");
/// assert_eq!(*config.load(), "v2+");
/// ```
pub struct AtomicArc<T> {
    /// `Arc::into_raw` of the reference the cell owns.
    ptr: AtomicPtr<T>,
    _owns: PhantomData<Arc<T>>,
}

// SAFETY: the cell hands out `&T` to any thread (needs T: Sync) and drops references on
// whichever thread reclaims them (needs T: Send + Sync, as for Arc<T>: Send).
// - Send: as Arc<T>.
// - Sync: loads share &T across threads; stores move Arc<T> between threads.
unsafe impl<T: Send + Sync> Send for AtomicArc<T> {}
// SAFETY: see the Send impl.
unsafe impl<T: Send + Sync> Sync for AtomicArc<T> {}

/// Drops one strong reference given as a raw pointer: the deleter of retired references.
///
/// # Safety
/// `ptr` came from `Arc::into_raw` and its reference is given up once.
unsafe fn drop_reference<T>(ptr: *mut T) {
    // SAFETY: per the contract.
    drop(unsafe { Arc::from_raw(ptr.cast_const()) });
}

impl<T: Send + Sync> AtomicArc<T> {
    /// A cell holding `value`.
    ///
    /// ```
    /// use scalemem::hazard::AtomicArc;
    /// use std::sync::Arc;
    ///
    /// let value = Arc::new(5);
    /// let cell = AtomicArc::new(Arc::clone(&value));
    /// assert_eq!(Arc::strong_count(&value), 2); // the cell owns one reference
    /// assert_eq!(*cell.load(), 5);
    /// drop(cell);
    /// assert_eq!(Arc::strong_count(&value), 1); // dropping the cell drops it
    /// ```
    pub fn new(value: Arc<T>) -> Self {
        Self { ptr: AtomicPtr::new(Arc::into_raw(value).cast_mut()), _owns: PhantomData }
    }

    /// Protects the current value and returns a guard that derefs to it. Touches no
    /// reference count and no shared cache line (it takes a hazard pointer from the
    /// thread's own record).
    ///
    /// ```
    /// use scalemem::hazard::AtomicArc;
    /// use std::sync::Arc;
    ///
    /// let value = Arc::new(String::from("v1"));
    /// let cell = AtomicArc::new(Arc::clone(&value));
    /// let guard = cell.load();
    /// assert_eq!(Arc::strong_count(&value), 2); // the guard took no reference
    /// cell.store(Arc::new(String::from("v2")));
    /// assert_eq!(*guard, "v1"); // still protected after the store
    /// assert_eq!(*cell.load(), "v2");
    /// ```
    #[inline]
    pub fn load(&self) -> Guard<'_, T> {
        let mut hazard = HazardPointer::new();
        // SAFETY: (1) the cell always holds a live Arc's pointer, and a replaced one is
        // retired to the global domain (store, swap, compare_and_swap) after the swap
        // unlinked it; (2) nobody takes &mut to an Arc's contents while it is shared.
        let ptr = unsafe { hazard.protect_ptr(&self.ptr) };
        // SAFETY: the cell never holds null.
        Guard { hazard, ptr: unsafe { NonNull::new_unchecked(ptr) }, _cell: PhantomData }
    }

    /// The current value as an `Arc` (one reference-count increment).
    ///
    /// ```
    /// use scalemem::hazard::AtomicArc;
    /// use std::sync::Arc;
    ///
    /// let cell = AtomicArc::from(String::from("v1"));
    /// let full = cell.load_full();
    /// assert_eq!(Arc::strong_count(&full), 2); // the cell's reference and this one
    /// cell.store(Arc::new(String::from("v2")));
    /// assert_eq!(*full, "v1"); // an owned reference: no hazard pointer needed
    /// ```
    #[inline]
    pub fn load_full(&self) -> Arc<T> {
        Guard::to_arc(&self.load())
    }

    /// Replaces the value. The cell's reference to the old value is retired to the global
    /// domain: dropped by a later scan that finds no guard holding it (this thread's
    /// scans run every 1024 retires, on a 10 ms check every 8 retires, at thread exit, or
    /// at [`Domain::global().reclaim()`](crate::hazard::Domain::reclaim)).
    ///
    /// ```
    /// use scalemem::hazard::{AtomicArc, Domain};
    /// use std::sync::Arc;
    ///
    /// let old = Arc::new(1);
    /// let cell = AtomicArc::new(Arc::clone(&old));
    /// cell.store(Arc::new(2));
    /// assert_eq!(*cell.load(), 2);
    /// Domain::global().reclaim(); // no guard holds `old`: the cell's reference is dropped
    /// assert_eq!(Arc::strong_count(&old), 1);
    /// ```
    pub fn store(&self, new: Arc<T>) {
        // AcqRel: Release publishes the new value's contents to the Acquire re-load of
        // protect; Acquire orders the old value's contents before its eventual drop.
        let old = self.ptr.swap(Arc::into_raw(new).cast_mut(), Ordering::AcqRel);
        // SAFETY: the swap unlinked the cell's reference to `old`, retired once here.
        unsafe { Self::retire(old) };
    }

    /// Replaces the value and returns the old one.
    ///
    /// ```
    /// use scalemem::hazard::{AtomicArc, Domain};
    /// use std::sync::Arc;
    ///
    /// let cell = AtomicArc::new(Arc::new(1));
    /// let old = cell.swap(Arc::new(2));
    /// assert_eq!((*old, *cell.load()), (1, 2));
    /// Domain::global().reclaim(); // drops the cell's retired reference to `old`
    /// assert_eq!(Arc::strong_count(&old), 1);
    /// ```
    pub fn swap(&self, new: Arc<T>) -> Arc<T> {
        // AcqRel: as in store.
        let old = self.ptr.swap(Arc::into_raw(new).cast_mut(), Ordering::AcqRel);
        // SAFETY: the cell's reference to `old` is still held (it is retired below, after
        // the increment), so the count is at least one.
        unsafe { Self::take_previous(old) }
    }

    /// Stores `new` if the cell still holds `current` (compared by address). On success
    /// returns the previous value (which is `current`'s); on failure hands `new` back.
    ///
    /// ```
    /// use scalemem::hazard::AtomicArc;
    /// use std::sync::Arc;
    ///
    /// let cell = AtomicArc::new(Arc::new(1));
    /// let current = cell.load_full();
    /// let lookalike = Arc::new(1); // an equal value at another address
    /// assert_eq!(cell.compare_and_swap(&lookalike, Arc::new(3)), Err(Arc::new(3)));
    /// let previous = cell.compare_and_swap(&current, Arc::new(2)).unwrap();
    /// assert!(Arc::ptr_eq(&previous, &current));
    /// assert_eq!(*cell.load(), 2);
    /// ```
    pub fn compare_and_swap<C: AsRaw<T>>(&self, current: &C, new: Arc<T>) -> Result<Arc<T>, Arc<T>> {
        let expected = current.as_raw().cast_mut();
        let new_ptr = Arc::into_raw(new).cast_mut();
        // AcqRel on success: as in store. Relaxed on failure: nothing is read through the
        // value found.
        match self.ptr.compare_exchange(expected, new_ptr, Ordering::AcqRel, Ordering::Relaxed) {
            // SAFETY: as in swap.
            Ok(old) => Ok(unsafe { Self::take_previous(old) }),
            // SAFETY: `new_ptr` came from into_raw above and was not stored.
            Err(_) => Err(unsafe { Arc::from_raw(new_ptr) }),
        }
    }

    /// Read-copy-update: computes a new value from the current one and stores it if the
    /// cell has not changed meanwhile, retrying otherwise. Returns the value replaced.
    /// `f` may run more than once.
    ///
    /// ```
    /// use scalemem::hazard::AtomicArc;
    /// use std::sync::Arc;
    ///
    /// let counter = AtomicArc::new(Arc::new(0u64));
    /// let previous = counter.rcu(|n| n + 1);
    /// assert_eq!(*previous, 0);
    /// counter.rcu(|n| n + 1);
    /// assert_eq!(*counter.load(), 2);
    /// ```
    pub fn rcu<R, Fn>(&self, mut f: Fn) -> Arc<T>
    where
        R: Into<Arc<T>>,
        Fn: FnMut(&T) -> R,
    {
        loop {
            let current = self.load();
            let new = f(&current).into();
            if let Ok(previous) = self.compare_and_swap(&current, new) {
                return previous;
            }
        }
    }

    /// Consumes the cell, returning its value.
    ///
    /// ```
    /// use scalemem::hazard::AtomicArc;
    /// use std::sync::Arc;
    ///
    /// let cell = AtomicArc::new(Arc::new(String::from("first")));
    /// cell.store(Arc::new(String::from("last")));
    /// let value = cell.into_inner();
    /// assert_eq!(*value, "last");
    /// assert_eq!(Arc::strong_count(&value), 1); // the cell's own reference, handed over
    /// ```
    pub fn into_inner(self) -> Arc<T> {
        let this = core::mem::ManuallyDrop::new(self);
        // Relaxed: we own the cell; no other thread can reach it.
        let ptr = this.ptr.load(Ordering::Relaxed);
        // SAFETY: the cell's reference, handed to the caller; the cell is not dropped.
        unsafe { Arc::from_raw(ptr.cast_const()) }
    }

    /// Turns the cell's reference to `old`, just unlinked, into an `Arc` for the caller,
    /// and retires the cell's reference.
    ///
    /// # Safety
    /// `old` was the cell's pointer and has just been unlinked by this thread.
    unsafe fn take_previous(old: *mut T) -> Arc<T> {
        // SAFETY: the cell's reference keeps the count at least one until the retire.
        unsafe {
            Arc::increment_strong_count(old.cast_const());
            Self::retire(old);
            Arc::from_raw(old.cast_const())
        }
    }

    /// # Safety
    /// `old` is a reference the cell owned and has just unlinked; retired once.
    unsafe fn retire(old: *mut T) {
        // SAFETY: (1) unlinked by the caller's swap; (2) once; (3) dropping an Arc<T>
        // on another thread is sound for T: Send + Sync.
        unsafe { Domain::global().retire_ptr(old, drop_reference::<T>) };
    }
}

impl<T> Drop for AtomicArc<T> {
    fn drop(&mut self) {
        // Relaxed: we own the cell; guards borrow it, so none is alive.
        let ptr = self.ptr.load(Ordering::Relaxed);
        // SAFETY: the cell's reference, given up once.
        unsafe { drop_reference(ptr) };
    }
}

impl<T: Send + Sync> From<Arc<T>> for AtomicArc<T> {
    fn from(value: Arc<T>) -> Self {
        Self::new(value)
    }
}

impl<T: Send + Sync> From<T> for AtomicArc<T> {
    fn from(value: T) -> Self {
        Self::new(Arc::new(value))
    }
}

impl<T: Send + Sync + fmt::Debug> fmt::Debug for AtomicArc<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("AtomicArc").field(&*self.load()).finish()
    }
}

/// A protected view of an [`AtomicArc`]'s value: derefs to `T`, keeps it alive, holds one
///
/// ```
/// use scalemem::hazard::{AtomicArc, Guard};
/// use std::sync::Arc;
///
/// let cell = AtomicArc::from(vec![1, 2, 3]);
/// let guard: Guard<'_, Vec<i32>> = cell.load();
/// cell.store(Arc::new(Vec::new()));
/// assert_eq!(guard.len(), 3); // derefs to the value it protects, replaced or not
/// assert!(cell.load().is_empty());
/// ```
/// hazard pointer of the thread. `!Send`, like the hazard pointer.
pub struct Guard<'a, T> {
    hazard: HazardPointer<'static>,
    ptr: NonNull<T>,
    _cell: PhantomData<&'a T>,
}

impl<T> Guard<'_, T> {
    /// An `Arc` of the guarded value (one reference-count increment).
    ///
    /// ```
    /// use scalemem::hazard::{AtomicArc, Guard};
    /// use std::sync::Arc;
    ///
    /// let cell = AtomicArc::from(7);
    /// let guard = cell.load();
    /// let arc = Guard::to_arc(&guard);
    /// drop(guard);
    /// assert_eq!(Arc::strong_count(&arc), 2); // the cell's reference and this one
    /// cell.store(Arc::new(8));
    /// assert_eq!(*arc, 7); // kept alive by the reference, not by a hazard pointer
    /// ```
    pub fn to_arc(this: &Self) -> Arc<T> {
        // SAFETY: the value is protected, so the reference that was the cell's (held by
        // the cell or by a pending retire) keeps the count at least one.
        unsafe {
            Arc::increment_strong_count(this.ptr.as_ptr().cast_const());
            Arc::from_raw(this.ptr.as_ptr().cast_const())
        }
    }
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: protected by `self.hazard` (validated after publishing), so not freed.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T: fmt::Debug> fmt::Debug for Guard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let _ = &self.hazard;
        fmt::Debug::fmt(&**self, f)
    }
}

/// Something that names a value by address, for [`AtomicArc::compare_and_swap`]: an
///
/// ```
/// use scalemem::hazard::{AsRaw, AtomicArc};
/// use std::sync::Arc;
///
/// let cell = AtomicArc::from(1);
/// let (guard, arc) = (cell.load(), cell.load_full());
/// assert_eq!(guard.as_raw(), Arc::as_ptr(&arc)); // both name the cell's value
/// let raw: *const i32 = arc.as_raw();
/// drop(guard);
/// assert!(cell.compare_and_swap(&raw, Arc::new(2)).is_ok());
/// assert_eq!(*cell.load(), 2);
/// ```
/// `Arc<T>`, a [`Guard`], or a raw pointer.
pub trait AsRaw<T> {
    /// The address.
    fn as_raw(&self) -> *const T;
}

impl<T> AsRaw<T> for Arc<T> {
    fn as_raw(&self) -> *const T {
        Arc::as_ptr(self)
    }
}

impl<T> AsRaw<T> for Guard<'_, T> {
    fn as_raw(&self) -> *const T {
        self.ptr.as_ptr()
    }
}

impl<T> AsRaw<T> for *const T {
    fn as_raw(&self) -> *const T {
        *self
    }
}
