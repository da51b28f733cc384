//! Epoch-protected pointers: [`Atomic<T>`], [`Owned<T>`] and [`Shared<'g, T>`], shaped
//! like crossbeam-epoch's so that its users can switch by changing the import.
//!
//! The low bits of a pointer that `T`'s alignment leaves zero carry a *tag* (a deleted
//! mark, a version): `align_of::<T>() - 1` is the largest tag.

use core::borrow::{Borrow, BorrowMut};
use core::fmt;
use core::marker::PhantomData;
use core::mem;
use core::ops::{Deref, DerefMut};

use super::guard::Guard;
use crate::sync::atomic::{AtomicUsize, Ordering};

/// Mask of the tag bits of a `*T`.
#[inline]
const fn low_bits<T>() -> usize {
    mem::align_of::<T>() - 1
}

#[inline]
fn compose<T>(raw: usize, tag: usize) -> usize {
    (raw & !low_bits::<T>()) | (tag & low_bits::<T>())
}

#[inline]
fn decompose<T>(data: usize) -> (usize, usize) {
    (data & !low_bits::<T>(), data & low_bits::<T>())
}

/// A pointer type that can be stored in an [`Atomic`]: [`Owned`] or [`Shared`].
///
/// ```
/// use scalemem::epoch::{self, Atomic, Guard, Owned, Pointer, Shared};
/// use std::sync::atomic::Ordering::AcqRel;
///
/// // Generic over what is stored: a fresh `Owned` or an already published `Shared`.
/// fn replace<'g, P: Pointer<u32>>(a: &Atomic<u32>, new: P, guard: &'g Guard) -> Shared<'g, u32> {
///     a.swap(new, AcqRel, guard)
/// }
/// let a = Atomic::null();
/// let guard = epoch::pin();
/// assert!(replace(&a, Owned::new(7), &guard).is_null());
/// let seven = replace(&a, Shared::null(), &guard);
/// // SAFETY: `seven` is not null and unlinked; no other thread has seen `a`.
/// assert_eq!(*unsafe { seven.into_owned() }, 7);
/// ```
pub trait Pointer<T> {
    /// The tagged address, giving up ownership.
    fn into_usize(self) -> usize;
    /// Rebuilds the pointer from a tagged address.
    ///
    /// # Safety
    /// `data` came from `into_usize` of the same pointer type and is used once.
    unsafe fn from_usize(data: usize) -> Self;
}

/// The error of a failed compare-exchange: the value found, and the new pointer handed
/// back (so an `Owned` is not lost).
///
/// ```
/// use scalemem::epoch::{self, Atomic, CompareExchangeError, Owned, Shared};
/// use std::sync::atomic::Ordering::{AcqRel, Acquire};
/// let a = Atomic::new(1);
/// let guard = epoch::pin();
/// let result = a.compare_exchange(Shared::null(), Owned::new(2), AcqRel, Acquire, &guard);
/// let CompareExchangeError { current, new } = result.unwrap_err();
/// // SAFETY: `current` was loaded under `guard` and nothing frees it while `guard` lives.
/// assert_eq!(unsafe { *current.deref() }, 1);
/// assert_eq!(*new, 2); // not stored: the `Owned` comes back, and is freed when dropped
/// // SAFETY: the pointer is not null and no other thread can reach `a`.
/// drop(unsafe { a.into_owned() });
/// ```
pub struct CompareExchangeError<'g, T, P: Pointer<T>> {
    /// The value the atomic held.
    pub current: Shared<'g, T>,
    /// The pointer that was to be stored.
    pub new: P,
}

impl<T, P: Pointer<T> + fmt::Debug> fmt::Debug for CompareExchangeError<'_, T, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompareExchangeError").field("current", &self.current).field("new", &self.new).finish()
    }
}

/// An atomic pointer to a heap `T` that epoch-pinned threads may read while others
/// replace it.
///
/// Dropping an `Atomic` does not drop what it points to (as with crossbeam-epoch's): the
/// owner of the last reference takes it back with [`into_owned`](Self::into_owned) or
/// [`try_into_owned`](Self::try_into_owned) first.
///
/// ```
/// use scalemem::epoch::{self, Atomic, Owned};
/// use std::sync::atomic::Ordering::{AcqRel, Acquire};
///
/// let head = Atomic::new(String::from("old"));
/// let guard = epoch::pin();
/// let old = head.swap(Owned::new(String::from("new")), AcqRel, &guard);
/// // SAFETY: `old` is unlinked; pinned readers may still hold it until they unpin.
/// unsafe { guard.defer_destroy(old) };
/// // SAFETY: loaded under `guard`.
/// assert_eq!(unsafe { head.load(Acquire, &guard).deref() }, "new");
/// # drop(guard);
/// # // SAFETY: no other thread can reach `head`, and nothing else frees it.
/// # unsafe { drop(head.into_owned()) };
/// ```
pub struct Atomic<T> {
    data: AtomicUsize,
    _marker: PhantomData<*mut T>,
}

// SAFETY: an Atomic<T> is a shared pointer to a T that any thread holding it may load
// (&T: needs T: Sync) or take ownership of and drop (needs T: Send).
unsafe impl<T: Send + Sync> Send for Atomic<T> {}
// SAFETY: see the Send impl.
unsafe impl<T: Send + Sync> Sync for Atomic<T> {}

impl<T> Atomic<T> {
    /// Allocates `value` and points at it.
    ///
    /// ```
    /// use scalemem::epoch::{self, Atomic};
    /// use std::sync::atomic::Ordering::Acquire;
    /// let a = Atomic::new(42);
    /// let guard = epoch::pin();
    /// // SAFETY: loaded under `guard`; nothing frees it while `guard` lives.
    /// assert_eq!(unsafe { a.load(Acquire, &guard).as_ref() }, Some(&42));
    /// // SAFETY: not null, and no other thread can reach `a`.
    /// assert_eq!(*unsafe { a.into_owned() }, 42);
    /// ```
    pub fn new(value: T) -> Self {
        Self::from(Owned::new(value))
    }

    /// A null pointer.
    ///
    /// ```
    /// let a = scalemem::epoch::Atomic::<u32>::null();
    /// assert!(a.load(std::sync::atomic::Ordering::Relaxed, &scalemem::epoch::pin()).is_null());
    /// ```
    #[cfg(not(scalemem_loom))]
    pub const fn null() -> Self {
        Self { data: AtomicUsize::new(0), _marker: PhantomData }
    }

    /// A null pointer.
    #[cfg(scalemem_loom)]
    pub fn null() -> Self {
        Self { data: AtomicUsize::new(0), _marker: PhantomData }
    }

    fn from_usize(data: usize) -> Self {
        Self { data: AtomicUsize::new(data), _marker: PhantomData }
    }

    /// Loads the pointer. The result borrows `guard`, so it cannot outlive the pin.
    ///
    /// ```
    /// use scalemem::epoch::{self, Atomic};
    /// use std::sync::atomic::Ordering::Acquire;
    /// let a = Atomic::new(7);
    /// let guard = epoch::pin();
    /// let p = a.load(Acquire, &guard);
    /// assert!(!p.is_null());
    /// // SAFETY: not null, loaded under `guard`, and nothing frees it while `guard` lives.
    /// assert_eq!(unsafe { *p.deref() }, 7);
    /// // SAFETY: not null, and no other thread can reach `a`.
    /// drop(unsafe { a.into_owned() });
    /// ```
    #[inline]
    pub fn load<'g>(&self, order: Ordering, _guard: &'g Guard) -> Shared<'g, T> {
        // SAFETY: the word was stored from a Pointer<T>; a Shared does not own it.
        unsafe { Shared::from_usize(self.data.load(order)) }
    }

    /// Stores `new`, dropping nothing (the previous pointer is simply overwritten).
    ///
    /// ```
    /// use scalemem::epoch::{self, Atomic, Owned, Shared};
    /// use std::sync::atomic::Ordering::{Acquire, Release};
    /// let a = Atomic::null();
    /// let guard = epoch::pin();
    /// a.store(Owned::new(1), Release);
    /// let one = a.load(Acquire, &guard);
    /// a.store(Shared::null(), Release); // overwrites `one` without freeing it
    /// assert!(a.load(Acquire, &guard).is_null());
    /// // SAFETY: `one` is not null and unlinked; no other thread has seen `a`.
    /// assert_eq!(*unsafe { one.into_owned() }, 1);
    /// ```
    #[inline]
    pub fn store<P: Pointer<T>>(&self, new: P, order: Ordering) {
        self.data.store(new.into_usize(), order);
    }

    /// Stores `new` and returns the previous pointer.
    ///
    /// ```
    /// use scalemem::epoch::{self, Atomic, Owned};
    /// use std::sync::atomic::Ordering::{AcqRel, Acquire};
    /// let a = Atomic::new(1);
    /// let guard = epoch::pin();
    /// let old = a.swap(Owned::new(2), AcqRel, &guard);
    /// // SAFETY: `old` is not null and unlinked; no other thread has seen `a`.
    /// assert_eq!(*unsafe { old.into_owned() }, 1);
    /// // SAFETY: loaded under `guard`; nothing frees it while `guard` lives.
    /// assert_eq!(unsafe { *a.load(Acquire, &guard).deref() }, 2);
    /// // SAFETY: not null, and no other thread can reach `a`.
    /// drop(unsafe { a.into_owned() });
    /// ```
    #[inline]
    pub fn swap<'g, P: Pointer<T>>(&self, new: P, order: Ordering, _guard: &'g Guard) -> Shared<'g, T> {
        // SAFETY: as in load().
        unsafe { Shared::from_usize(self.data.swap(new.into_usize(), order)) }
    }

    /// Stores `new` if the pointer (with its tag) equals `current`. On success returns
    /// the new value as a `Shared`; on failure the value found and `new` back.
    ///
    /// ```
    /// use scalemem::epoch::{self, Atomic, Owned, Shared};
    /// use std::sync::atomic::Ordering::{AcqRel, Acquire};
    /// let a = Atomic::<u8>::null();
    /// let guard = epoch::pin();
    /// let won = a.compare_exchange(Shared::null(), Owned::new(1), AcqRel, Acquire, &guard);
    /// assert!(won.is_ok());
    /// let lost = a.compare_exchange(Shared::null(), Owned::new(2), AcqRel, Acquire, &guard);
    /// let err = lost.unwrap_err();
    /// assert_eq!(*err.new, 2); // the Owned comes back
    /// # drop(guard);
    /// # // SAFETY: no other thread can reach `a`, and nothing else frees it.
    /// # unsafe { drop(a.into_owned()) };
    /// ```
    #[inline]
    pub fn compare_exchange<'g, P: Pointer<T>>(
        &self,
        current: Shared<'_, T>,
        new: P,
        success: Ordering,
        failure: Ordering,
        _guard: &'g Guard,
    ) -> Result<Shared<'g, T>, CompareExchangeError<'g, T, P>> {
        let new = new.into_usize();
        match self.data.compare_exchange(current.data, new, success, failure) {
            // SAFETY: `new` now lives in the atomic; the Shared does not own it.
            Ok(_) => Ok(unsafe { Shared::from_usize(new) }),
            Err(found) => Err(CompareExchangeError {
                // SAFETY: a Shared does not own the value found.
                current: unsafe { Shared::from_usize(found) },
                // SAFETY: `new` was not stored, so ownership returns to the caller's type.
                new: unsafe { P::from_usize(new) },
            }),
        }
    }

    /// Like [`compare_exchange`](Atomic::compare_exchange), but may fail spuriously;
    /// cheaper in a retry loop on some targets.
    ///
    /// ```
    /// use scalemem::epoch::{self, Atomic, Owned};
    /// use std::sync::atomic::Ordering::{AcqRel, Acquire};
    /// let a = Atomic::new(0);
    /// let guard = epoch::pin();
    /// let (mut current, mut new) = (a.load(Acquire, &guard), Owned::new(1));
    /// // Retry on failure (spurious or not), with the value found and the `Owned` handed back.
    /// while let Err(e) = a.compare_exchange_weak(current, new, AcqRel, Acquire, &guard) {
    ///     (current, new) = (e.current, e.new);
    /// }
    /// // SAFETY: `current` (the value replaced) is unlinked; no other thread has seen `a`.
    /// assert_eq!(*unsafe { current.into_owned() }, 0);
    /// // SAFETY: not null, and no other thread can reach `a`.
    /// assert_eq!(*unsafe { a.into_owned() }, 1);
    /// ```
    #[inline]
    pub fn compare_exchange_weak<'g, P: Pointer<T>>(
        &self,
        current: Shared<'_, T>,
        new: P,
        success: Ordering,
        failure: Ordering,
        _guard: &'g Guard,
    ) -> Result<Shared<'g, T>, CompareExchangeError<'g, T, P>> {
        let new = new.into_usize();
        match self.data.compare_exchange_weak(current.data, new, success, failure) {
            // SAFETY: as in compare_exchange.
            Ok(_) => Ok(unsafe { Shared::from_usize(new) }),
            Err(found) => Err(CompareExchangeError {
                // SAFETY: as in compare_exchange.
                current: unsafe { Shared::from_usize(found) },
                // SAFETY: as in compare_exchange.
                new: unsafe { P::from_usize(new) },
            }),
        }
    }

    /// Bitwise-and of the tag with `val` (the address is kept); returns the previous.
    ///
    /// ```
    /// use scalemem::epoch::{self, Atomic, Shared};
    /// use std::sync::atomic::Ordering::SeqCst;
    /// let a = Atomic::<u64>::from(Shared::null().with_tag(3));
    /// let guard = &epoch::pin();
    /// assert_eq!(a.fetch_and(2, SeqCst, guard).tag(), 3);
    /// assert_eq!(a.load(SeqCst, guard).tag(), 2);
    /// ```
    #[inline]
    pub fn fetch_and<'g>(&self, val: usize, order: Ordering, _guard: &'g Guard) -> Shared<'g, T> {
        // SAFETY: the address bits are unchanged; a Shared does not own the pointer.
        unsafe { Shared::from_usize(self.data.fetch_and(val | !low_bits::<T>(), order)) }
    }

    /// Bitwise-or of the tag with `val`; returns the previous. Marking a node deleted
    /// (Harris's list) is `fetch_or(1, ..)`. Bits of `val` above the tag (those of `T`'s
    /// alignment) are ignored: the address never changes.
    ///
    /// ```
    /// use scalemem::epoch::{self, Atomic};
    /// use std::sync::atomic::Ordering::SeqCst;
    /// let a = Atomic::new(5u64);
    /// let guard = &epoch::pin();
    /// let before = a.fetch_or(1, SeqCst, guard); // mark deleted
    /// let after = a.load(SeqCst, guard);
    /// assert_eq!((before.tag(), after.tag()), (0, 1));
    /// assert_eq!(after.as_raw(), before.as_raw()); // the address is kept
    /// // SAFETY: not null, and no other thread can reach `a` (the tag is ignored).
    /// drop(unsafe { a.into_owned() });
    /// ```
    #[inline]
    pub fn fetch_or<'g>(&self, val: usize, order: Ordering, _guard: &'g Guard) -> Shared<'g, T> {
        // SAFETY: as in fetch_and.
        unsafe { Shared::from_usize(self.data.fetch_or(val & low_bits::<T>(), order)) }
    }

    /// Bitwise-xor of the tag with `val`; returns the previous. Bits of `val` above the
    /// tag are ignored, as in [`fetch_or`](Self::fetch_or).
    ///
    /// ```
    /// use scalemem::epoch::{self, Atomic, Shared};
    /// use std::sync::atomic::Ordering::SeqCst;
    /// let a = Atomic::<u64>::from(Shared::null().with_tag(1));
    /// let guard = &epoch::pin();
    /// assert_eq!(a.fetch_xor(3, SeqCst, guard).tag(), 1);
    /// let now = a.load(SeqCst, guard);
    /// assert_eq!(now.tag(), 2);
    /// assert!(now.is_null()); // the address is kept
    /// ```
    #[inline]
    pub fn fetch_xor<'g>(&self, val: usize, order: Ordering, _guard: &'g Guard) -> Shared<'g, T> {
        // SAFETY: as in fetch_and.
        unsafe { Shared::from_usize(self.data.fetch_xor(val & low_bits::<T>(), order)) }
    }

    /// Takes ownership of the pointee.
    ///
    /// # Safety
    /// The pointer is not null, and no other thread can use it any more (this is for
    /// destructors of the structure holding the `Atomic`).
    ///
    /// ```
    /// use scalemem::epoch::Atomic;
    /// use std::rc::Rc;
    /// let value = Rc::new(());
    /// let a = Atomic::new(Rc::clone(&value));
    /// // SAFETY: not null, and `a` was never shared with another thread.
    /// let owned = unsafe { a.into_owned() };
    /// assert_eq!(Rc::strong_count(&value), 2);
    /// drop(owned);
    /// assert_eq!(Rc::strong_count(&value), 1); // the pointee was dropped, once
    /// ```
    pub unsafe fn into_owned(self) -> Owned<T> {
        // SAFETY: per the contract the pointer is uniquely ours and non-null.
        unsafe { Owned::from_usize(self.data.into_inner_word()) }
    }

    /// Takes ownership of the pointee, or `None` if null.
    ///
    /// # Safety
    /// As for [`into_owned`](Atomic::into_owned), except that null is allowed.
    ///
    /// ```
    /// use scalemem::epoch::Atomic;
    /// let a = Atomic::new(3);
    /// // SAFETY: `a` was never shared with another thread.
    /// assert_eq!(unsafe { a.try_into_owned() }.map(|o| *o), Some(3));
    /// let null = Atomic::<i32>::null();
    /// // SAFETY: null is allowed, and `null` was never shared with another thread.
    /// assert!(unsafe { null.try_into_owned() }.is_none());
    /// ```
    pub unsafe fn try_into_owned(self) -> Option<Owned<T>> {
        let data = self.data.into_inner_word();
        if decompose::<T>(data).0 == 0 {
            None
        } else {
            // SAFETY: non-null and uniquely ours per the contract.
            Some(unsafe { Owned::from_usize(data) })
        }
    }
}

/// `into_inner` for both std and loom atomics (loom's has `unsync_load` instead).
trait IntoInnerWord {
    fn into_inner_word(self) -> usize;
}

impl IntoInnerWord for AtomicUsize {
    fn into_inner_word(self) -> usize {
        #[cfg(not(scalemem_loom))]
        {
            self.into_inner()
        }
        #[cfg(scalemem_loom)]
        {
            // SAFETY: we own the atomic by value: no concurrent access is possible.
            unsafe { self.unsync_load() }
        }
    }
}

impl<T> Default for Atomic<T> {
    fn default() -> Self {
        Self::null()
    }
}

impl<T> From<Owned<T>> for Atomic<T> {
    fn from(owned: Owned<T>) -> Self {
        Self::from_usize(owned.into_usize())
    }
}

impl<T> From<Shared<'_, T>> for Atomic<T> {
    fn from(shared: Shared<'_, T>) -> Self {
        Self::from_usize(shared.data)
    }
}

impl<T> From<*const T> for Atomic<T> {
    fn from(raw: *const T) -> Self {
        Self::from_usize(raw as usize)
    }
}

impl<T> From<T> for Atomic<T> {
    fn from(value: T) -> Self {
        Self::new(value)
    }
}

impl<T> Clone for Atomic<T> {
    /// Copies the pointer (not the pointee), with a Relaxed load.
    fn clone(&self) -> Self {
        // Relaxed: a snapshot of the word; cloning publishes nothing.
        Self::from_usize(self.data.load(Ordering::Relaxed))
    }
}

impl<T> fmt::Debug for Atomic<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Relaxed: a diagnostic snapshot.
        let (raw, tag) = decompose::<T>(self.data.load(Ordering::Relaxed));
        f.debug_struct("Atomic").field("raw", &(raw as *const T)).field("tag", &tag).finish()
    }
}

/// An owned, heap-allocated `T` (a `Box` with a tag), ready to be published.
///
/// ```
/// use scalemem::epoch::Owned;
/// let mut o = Owned::new(5).with_tag(1);
/// *o += 1;
/// assert_eq!((*o, o.tag()), (6, 1));
/// ```
pub struct Owned<T> {
    data: usize,
    _marker: PhantomData<Box<T>>,
}

impl<T> Owned<T> {
    /// Allocates `value`.
    ///
    /// ```
    /// use scalemem::epoch::Owned;
    /// let mut o = Owned::new(vec![1, 2]);
    /// o.push(3);
    /// assert_eq!(*o, [1, 2, 3]);
    /// assert_eq!(o.tag(), 0);
    /// ```
    pub fn new(value: T) -> Self {
        Self::from(Box::new(value))
    }

    /// Takes ownership of a pointer from `Box::into_raw`.
    ///
    /// # Safety
    /// `raw` came from `Box::<T>::into_raw`, is aligned for the tag bits, and is owned.
    ///
    /// ```
    /// use scalemem::epoch::Owned;
    /// let raw = Box::into_raw(Box::new(9u32));
    /// // SAFETY: `raw` comes from `Box::into_raw` (so it is aligned) and its ownership passes
    /// // to `o`; `raw` is only compared below, never dereferenced or freed.
    /// let o = unsafe { Owned::from_raw(raw) };
    /// assert_eq!((*o, o.tag()), (9, 0));
    /// assert_eq!(&*o as *const u32, raw);
    /// ```
    pub unsafe fn from_raw(raw: *mut T) -> Self {
        debug_assert_eq!(raw as usize & low_bits::<T>(), 0);
        Self { data: raw as usize, _marker: PhantomData }
    }

    /// Converts into a `Box`, dropping the tag.
    ///
    /// ```
    /// use scalemem::epoch::Owned;
    /// let o = Owned::new(String::from("x")).with_tag(1);
    /// let b: Box<String> = o.into_box();
    /// assert_eq!(*b, "x");
    /// assert_eq!(Owned::<String>::from(b).tag(), 0); // the tag is gone
    /// ```
    pub fn into_box(self) -> Box<T> {
        let (raw, _) = decompose::<T>(self.data);
        mem::forget(self);
        // SAFETY: an Owned always holds a pointer from Box::into_raw that it owns.
        unsafe { Box::from_raw(raw as *mut T) }
    }

    /// Gives up ownership for a `Shared` bound to `guard` (to store it elsewhere).
    ///
    /// ```
    /// use scalemem::epoch::{self, Atomic, Owned, Shared};
    /// use std::sync::atomic::Ordering::{AcqRel, Acquire};
    /// let a = Atomic::null();
    /// let guard = epoch::pin();
    /// let node = Owned::new(8).into_shared(&guard);
    /// assert!(a.compare_exchange(Shared::null(), node, AcqRel, Acquire, &guard).is_ok());
    /// assert_eq!(a.load(Acquire, &guard), node); // `node` still names the published value
    /// // SAFETY: not null, and live while `guard` lives (only `a` owns it, and it is not freed).
    /// assert_eq!(unsafe { *node.deref() }, 8);
    /// // SAFETY: not null, and no other thread can reach `a`.
    /// drop(unsafe { a.into_owned() });
    /// ```
    pub fn into_shared<'g>(self, _guard: &'g Guard) -> Shared<'g, T> {
        // SAFETY: ownership passes to whoever stores the Shared.
        unsafe { Shared::from_usize(self.into_usize()) }
    }

    /// The tag.
    ///
    /// ```
    /// use scalemem::epoch::Owned;
    /// assert_eq!(Owned::new(0u64).tag(), 0);
    /// assert_eq!(Owned::new(0u64).with_tag(5).tag(), 5);
    /// ```
    pub fn tag(&self) -> usize {
        decompose::<T>(self.data).1
    }

    /// The same pointer with tag `tag` (truncated to the available bits).
    ///
    /// ```
    /// use scalemem::epoch::Owned;
    /// let o = Owned::new(1u32).with_tag(2); // a `u32` leaves two tag bits
    /// assert_eq!((*o, o.tag()), (1, 2));
    /// let o = o.with_tag(7); // truncated to 7 & 3
    /// assert_eq!((*o, o.tag()), (1, 3));
    /// ```
    pub fn with_tag(self, tag: usize) -> Self {
        let data = self.into_usize();
        Self { data: compose::<T>(data, tag), _marker: PhantomData }
    }
}

impl<T> Pointer<T> for Owned<T> {
    fn into_usize(self) -> usize {
        let data = self.data;
        mem::forget(self);
        data
    }

    unsafe fn from_usize(data: usize) -> Self {
        debug_assert!(decompose::<T>(data).0 != 0, "Owned from a null pointer");
        Self { data, _marker: PhantomData }
    }
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        let (raw, _) = decompose::<T>(self.data);
        // SAFETY: an Owned always holds a pointer from Box::into_raw that it owns.
        drop(unsafe { Box::from_raw(raw as *mut T) });
    }
}

impl<T> Deref for Owned<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: an Owned points to a live T it owns.
        unsafe { &*(decompose::<T>(self.data).0 as *const T) }
    }
}

impl<T> DerefMut for Owned<T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: an Owned points to a live T it owns exclusively.
        unsafe { &mut *(decompose::<T>(self.data).0 as *mut T) }
    }
}

impl<T> Borrow<T> for Owned<T> {
    fn borrow(&self) -> &T {
        self
    }
}

impl<T> BorrowMut<T> for Owned<T> {
    fn borrow_mut(&mut self) -> &mut T {
        self
    }
}

impl<T> From<T> for Owned<T> {
    fn from(value: T) -> Self {
        Self::new(value)
    }
}

impl<T> From<Box<T>> for Owned<T> {
    fn from(b: Box<T>) -> Self {
        // SAFETY: from Box::into_raw, owned; Box alignment is T's, so tag bits are 0.
        unsafe { Self::from_raw(Box::into_raw(b)) }
    }
}

impl<T: Clone> Clone for Owned<T> {
    fn clone(&self) -> Self {
        Owned::new((**self).clone()).with_tag(self.tag())
    }
}

impl<T: fmt::Debug> fmt::Debug for Owned<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Owned").field("value", &**self).field("tag", &self.tag()).finish()
    }
}

/// A pointer loaded under a guard: valid (if not null) while the guard `'g` lives.
///
/// ```
/// use scalemem::epoch::{self, Atomic, Shared};
/// use std::sync::atomic::Ordering::Acquire;
/// let a = Atomic::new(3);
/// let guard = epoch::pin();
/// let s: Shared<'_, i32> = a.load(Acquire, &guard);
/// // SAFETY: loaded under `guard`, not freed while it lives.
/// assert_eq!(unsafe { s.as_ref() }, Some(&3));
/// assert!(Shared::<i32>::null().is_null());
/// # drop(guard);
/// # // SAFETY: no other thread can reach `a`, and nothing else frees it.
/// # unsafe { drop(a.into_owned()) };
/// ```
pub struct Shared<'g, T> {
    data: usize,
    _marker: PhantomData<(&'g (), *const T)>,
}

impl<T> Clone for Shared<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Shared<'_, T> {}

impl<'g, T> Shared<'g, T> {
    /// A null pointer.
    ///
    /// ```
    /// use scalemem::epoch::Shared;
    /// const EMPTY: Shared<'static, u64> = Shared::null();
    /// assert!(EMPTY.is_null());
    /// assert_eq!(EMPTY.tag(), 0);
    /// assert_eq!(EMPTY, Shared::default());
    /// ```
    pub const fn null() -> Self {
        Self { data: 0, _marker: PhantomData }
    }

    /// Whether the address is null (the tag is ignored).
    ///
    /// ```
    /// use scalemem::epoch::{self, Atomic, Shared};
    /// use std::sync::atomic::Ordering::Acquire;
    /// let a = Atomic::new(1);
    /// let guard = epoch::pin();
    /// assert!(!a.load(Acquire, &guard).is_null());
    /// assert!(Shared::<i32>::null().with_tag(1).is_null()); // the tag is ignored
    /// // SAFETY: not null, and no other thread can reach `a`.
    /// drop(unsafe { a.into_owned() });
    /// ```
    pub fn is_null(&self) -> bool {
        decompose::<T>(self.data).0 == 0
    }

    /// The raw address, without the tag.
    ///
    /// ```
    /// use scalemem::epoch::{self, Owned};
    /// let guard = epoch::pin();
    /// let o = Owned::new(4u64);
    /// let addr = &*o as *const u64;
    /// let s = o.into_shared(&guard).with_tag(3);
    /// assert_eq!((s.as_raw(), s.tag()), (addr, 3)); // the address without the tag
    /// // SAFETY: not null, and `s` was never published: it is ours alone.
    /// drop(unsafe { s.into_owned() });
    /// ```
    pub fn as_raw(&self) -> *const T {
        decompose::<T>(self.data).0 as *const T
    }

    /// Dereferences the pointer.
    ///
    /// # Safety
    /// The pointer is not null, points to a live `T` (it was loaded under a guard that
    /// protects it), and no `&mut T` to it exists.
    ///
    /// ```
    /// use scalemem::epoch::{self, Atomic};
    /// use std::sync::atomic::Ordering::Acquire;
    /// let a = Atomic::new(String::from("hi"));
    /// let guard = epoch::pin();
    /// let s = a.load(Acquire, &guard);
    /// // SAFETY: not null, loaded under `guard` (nothing frees it meanwhile), no `&mut` exists.
    /// assert_eq!(unsafe { s.deref() }, "hi");
    /// // SAFETY: not null, and no other thread can reach `a`.
    /// drop(unsafe { a.into_owned() });
    /// ```
    pub unsafe fn deref(&self) -> &'g T {
        // SAFETY: per the contract.
        unsafe { &*self.as_raw() }
    }

    /// Dereferences the pointer mutably.
    ///
    /// # Safety
    /// As for [`deref`](Shared::deref), and no other reference to the `T` exists.
    ///
    /// ```
    /// use scalemem::epoch::{self, Atomic};
    /// use std::sync::atomic::Ordering::Acquire;
    /// let a = Atomic::new(vec![1]);
    /// let guard = epoch::pin();
    /// let mut s = a.load(Acquire, &guard);
    /// // SAFETY: not null, live under `guard`, and no other reference exists: `a` is ours alone.
    /// unsafe { s.deref_mut() }.push(2);
    /// // SAFETY: as above, and the `&mut` is no longer used.
    /// assert_eq!(unsafe { s.deref() }, &[1, 2]);
    /// // SAFETY: not null, and no other thread can reach `a`.
    /// drop(unsafe { a.into_owned() });
    /// ```
    pub unsafe fn deref_mut(&mut self) -> &'g mut T {
        // SAFETY: per the contract.
        unsafe { &mut *(self.as_raw() as *mut T) }
    }

    /// `None` if null, else the reference.
    ///
    /// # Safety
    /// As for [`deref`](Shared::deref) when not null.
    ///
    /// ```
    /// use scalemem::epoch::{self, Atomic, Shared};
    /// use std::sync::atomic::Ordering::Acquire;
    /// let a = Atomic::new(1);
    /// let guard = epoch::pin();
    /// // SAFETY: loaded under `guard`; nothing frees it while `guard` lives.
    /// assert_eq!(unsafe { a.load(Acquire, &guard).as_ref() }, Some(&1));
    /// // SAFETY: null is allowed.
    /// assert_eq!(unsafe { Shared::<i32>::null().as_ref() }, None);
    /// // SAFETY: not null, and no other thread can reach `a`.
    /// drop(unsafe { a.into_owned() });
    /// ```
    pub unsafe fn as_ref(&self) -> Option<&'g T> {
        // SAFETY: per the contract.
        unsafe { self.as_raw().as_ref() }
    }

    /// Takes ownership of the pointee.
    ///
    /// # Safety
    /// Not null, and no other thread can use the pointer any more.
    ///
    /// ```
    /// use scalemem::epoch::{self, Atomic, Shared};
    /// use std::rc::Rc;
    /// use std::sync::atomic::Ordering::AcqRel;
    /// let value = Rc::new(());
    /// let a = Atomic::new(Rc::clone(&value));
    /// let guard = epoch::pin();
    /// let old = a.swap(Shared::null(), AcqRel, &guard);
    /// // SAFETY: `old` is not null and unlinked; no other thread has seen `a`.
    /// drop(unsafe { old.into_owned() });
    /// assert_eq!(Rc::strong_count(&value), 1); // the pointee was dropped, once
    /// ```
    pub unsafe fn into_owned(self) -> Owned<T> {
        // SAFETY: per the contract.
        unsafe { Owned::from_usize(self.data) }
    }

    /// Takes ownership of the pointee, or `None` if null.
    ///
    /// # Safety
    /// As for [`into_owned`](Shared::into_owned), except that null is allowed.
    ///
    /// ```
    /// use scalemem::epoch::{self, Atomic, Shared};
    /// use std::sync::atomic::Ordering::{AcqRel, Acquire};
    /// let a = Atomic::new(2);
    /// let guard = epoch::pin();
    /// let old = a.swap(Shared::null(), AcqRel, &guard);
    /// // SAFETY: `old` is unlinked; no other thread has seen `a`.
    /// assert_eq!(unsafe { old.try_into_owned() }.map(|o| *o), Some(2));
    /// // SAFETY: null is allowed.
    /// assert!(unsafe { a.load(Acquire, &guard).try_into_owned() }.is_none());
    /// ```
    pub unsafe fn try_into_owned(self) -> Option<Owned<T>> {
        // SAFETY: per the contract.
        (!self.is_null()).then(|| unsafe { Owned::from_usize(self.data) })
    }

    /// The tag.
    ///
    /// ```
    /// use scalemem::epoch::{self, Atomic, Shared};
    /// use std::sync::atomic::Ordering::SeqCst;
    /// let a = Atomic::<u64>::null();
    /// let guard = &epoch::pin();
    /// a.store(Shared::null().with_tag(2), SeqCst);
    /// assert_eq!(a.load(SeqCst, guard).tag(), 2);
    /// assert_eq!(Shared::<u64>::null().tag(), 0);
    /// ```
    pub fn tag(&self) -> usize {
        decompose::<T>(self.data).1
    }

    /// The same address with tag `tag` (truncated to the available bits).
    ///
    /// ```
    /// use scalemem::epoch::{self, Owned};
    /// let guard = epoch::pin();
    /// let s = Owned::new(1u32).into_shared(&guard);
    /// let marked = s.with_tag(1);
    /// assert_eq!((marked.tag(), marked.as_raw()), (1, s.as_raw())); // same address
    /// assert_eq!(s.with_tag(6).tag(), 2); // truncated: a `u32` leaves two tag bits
    /// // SAFETY: not null, and `s` was never published: it is ours alone.
    /// drop(unsafe { s.into_owned() });
    /// ```
    pub fn with_tag(&self, tag: usize) -> Self {
        Self { data: compose::<T>(self.data, tag), _marker: PhantomData }
    }
}

impl<T> Pointer<T> for Shared<'_, T> {
    fn into_usize(self) -> usize {
        self.data
    }

    unsafe fn from_usize(data: usize) -> Self {
        Self { data, _marker: PhantomData }
    }
}

impl<T> From<*const T> for Shared<'_, T> {
    fn from(raw: *const T) -> Self {
        debug_assert_eq!(raw as usize & low_bits::<T>(), 0);
        Self { data: raw as usize, _marker: PhantomData }
    }
}

impl<T> PartialEq for Shared<'_, T> {
    fn eq(&self, other: &Self) -> bool {
        self.data == other.data
    }
}

impl<T> Eq for Shared<'_, T> {}

impl<T> PartialOrd for Shared<'_, T> {
    fn partial_cmp(&self, other: &Self) -> Option<core::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<T> Ord for Shared<'_, T> {
    fn cmp(&self, other: &Self) -> core::cmp::Ordering {
        self.data.cmp(&other.data)
    }
}

impl<T> Default for Shared<'_, T> {
    fn default() -> Self {
        Self::null()
    }
}

impl<T> fmt::Debug for Shared<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared").field("raw", &self.as_raw()).field("tag", &self.tag()).finish()
    }
}

impl<T> fmt::Pointer for Shared<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Pointer::fmt(&self.as_raw(), f)
    }
}
