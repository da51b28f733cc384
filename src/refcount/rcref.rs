//! The object side of a [`Refcache`](super::Refcache): the header every counted object
//! embeds, and the typed handles [`RcRef`] (strong) and [`RcWeak`] (weak).

use core::fmt;
use core::marker::PhantomData;
use core::ops::Deref;
use core::ptr::NonNull;

use super::refcache::Domain;
use crate::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// `Header::state`: a delta was flushed into the count since the object was last queued
/// for review (or re-queued).
pub(crate) const DIRTY: usize = 1;
/// `Header::state`: the object is on a review list (the inbox or the advancer's list);
/// its `next` and `review_epoch` belong to that list.
pub(crate) const REVIEW: usize = 2;
/// `Header::state`: the count reached zero and no weak upgrade has happened since; the
/// reviewer may free the object only while this is set (the paper's "dying" bit).
pub(crate) const DYING: usize = 4;
/// `Header::state`: freed (the value is dropped or being dropped); upgrades fail.
pub(crate) const FREED: usize = 8;
/// The global count lives in the bits above the flags, as a signed number.
pub(crate) const COUNT_SHIFT: u32 = 8;

/// The signed global count in a state word.
#[inline]
pub(crate) fn count_of(state: usize) -> isize {
    (state as isize) >> COUNT_SHIFT
}

/// `state` with `delta` added to its count (wrapping in the count's 56 bits).
#[inline]
pub(crate) fn add_count(state: usize, delta: isize) -> usize {
    state.wrapping_add((delta as usize) << COUNT_SHIFT)
}

/// What [`Header::free`] is asked to do.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum FreeStep {
    /// Drop the value in place.
    DropValue,
    /// Deallocate the memory (the value is already dropped).
    Dealloc,
}

/// The header of a counted object: 40 bytes, first in the allocation.
///
/// # Ownership of the fields
/// - `state` (count and flags): read-modify-written by flushes, weak upgrades and the
///   reviewer, always with one SeqCst RMW (see the `refcache` module documentation).
/// - `weak`: the number of [`RcWeak`] handles, plus one for the strong side until the
///   value is dropped; the allocation is freed when it reaches zero.
/// - `review_epoch`, `next`: owned by whoever set `REVIEW` (until it pushes the object
///   onto the inbox), then by the inbox, then by the holder of the advancer lock; after
///   `FREED`, by the freeing thread.
#[repr(C)]
pub(crate) struct Header {
    pub(crate) state: AtomicUsize,
    pub(crate) weak: AtomicUsize,
    pub(crate) review_epoch: AtomicUsize,
    pub(crate) next: AtomicPtr<Header>,
    /// Drops the value or deallocates the box, for the concrete `T`.
    pub(crate) free: unsafe fn(NonNull<Header>, FreeStep),
}

impl Header {
    /// Frees an object the reviewer has marked `FREED`: drops the value, then gives up
    /// the strong side's weak unit (deallocating if no weak handle is left).
    ///
    /// # Safety
    /// 1. `this` is a live object of some domain whose state the caller has just moved to
    ///    `FREED` (so no strong reference exists and none can be made), and
    /// 2. the caller does this once per object.
    pub(crate) unsafe fn free_value(this: NonNull<Header>) {
        // SAFETY: (1) the value is unreachable (count zero, no cache entry, upgrades fail
        // on FREED); (2) it is dropped once.
        unsafe {
            let free = this.as_ref().free;
            free(this, FreeStep::DropValue);
            Self::drop_weak_unit(this);
        }
    }

    /// A strong reference made from nothing but the header, unless the object has been
    /// freed: one SeqCst RMW that adds one to the global count and clears `DYING` (the
    /// weak upgrade of the `refcache` module documentation).
    pub(crate) fn try_upgrade(&self) -> bool {
        // Relaxed first read; the CAS decides.
        let mut state = self.state.load(Ordering::Relaxed);
        loop {
            if state & FREED != 0 {
                return false;
            }
            let new = add_count(state, 1) & !DYING;
            // SeqCst: the upgrade and the reviewer's free race on this word; the one RMW
            // each makes decides, and SeqCst keeps the proof in the module docs in terms
            // of one order of header RMWs. Acquire also orders our use of the value after
            // everything published by earlier RMWs.
            match self.state.compare_exchange_weak(state, new, Ordering::SeqCst, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(seen) => state = seen,
            }
        }
    }

    /// Gives up one weak unit; deallocates at zero.
    ///
    /// # Safety
    /// The caller owns one unit of `this.weak` and does not use `this` afterwards.
    pub(crate) unsafe fn drop_weak_unit(this: NonNull<Header>) {
        // SAFETY: the caller's unit keeps the allocation alive until this RMW.
        let header = unsafe { this.as_ref() };
        // Release: our accesses to the object (the value's drop, for the strong unit)
        // happen before the deallocation; the last decrement pairs with it (AcqRel).
        if header.weak.fetch_sub(1, Ordering::AcqRel) == 1 {
            let free = header.free;
            // SAFETY: no unit is left: nobody can reach the allocation any more, and the
            // value was dropped when the strong unit went.
            unsafe { free(this, FreeStep::Dealloc) };
        }
    }
}

/// The allocation behind [`RcRef`]/[`RcWeak`]: the header, then the value.
#[repr(C)]
pub(crate) struct RcBox<T> {
    header: Header,
    value: T,
}

impl<T> RcBox<T> {
    /// A boxed object with a global count of one (the first [`RcRef`]).
    pub(crate) fn allocate(value: T) -> NonNull<Header> {
        let boxed = Box::new(RcBox {
            header: Header {
                state: AtomicUsize::new(add_count(0, 1)),
                weak: AtomicUsize::new(1),
                review_epoch: AtomicUsize::new(0),
                next: AtomicPtr::new(core::ptr::null_mut()),
                free: Self::free,
            },
            value,
        });
        NonNull::from(Box::leak(boxed)).cast()
    }

    /// # Safety
    /// `this` is the header of a `Box<RcBox<T>>`; for `DropValue` the value is live and
    /// dropped once; for `Dealloc` the value is already dropped and the box is freed once.
    unsafe fn free(this: NonNull<Header>, step: FreeStep) {
        let this = this.cast::<RcBox<T>>();
        match step {
            // SAFETY: the header is the first field of the repr(C) RcBox<T>, so the cast
            // recovers the box; the value is dropped once (contract).
            FreeStep::DropValue => unsafe { core::ptr::drop_in_place(&raw mut (*this.as_ptr()).value) },
            FreeStep::Dealloc => {
                // SAFETY: the allocation is Box<RcBox<T>>'s; the value is already dropped,
                // so deallocate without dropping it again.
                drop(unsafe { Box::from_raw(this.as_ptr().cast::<core::mem::ManuallyDrop<RcBox<T>>>()) });
            }
        }
    }
}

/// A strong reference to an object of a [`Refcache`](super::Refcache): `clone` and `drop`
/// change only the current CPU's delta for the object (an rseq section of a few
/// nanoseconds where the object's entry is cached), and the object is freed once its
/// count has been zero, untouched, for two whole epochs.
///
/// ```
/// use scalemem::refcount::{Config, Refcache};
///
/// let cache = Refcache::with_config(Config::manual()).unwrap();
/// let a = cache.alloc(String::from("hello"));
/// let b = a.clone();
/// assert_eq!(*b, "hello");
/// drop((a, b));
/// let mut ticks = 0;
/// while cache.stats().live > 0 {
///     cache.tick(); // flush every CPU's deltas, advance the epoch, review
///     ticks += 1;
///     assert!(ticks <= 8, "never freed");
/// }
/// ```
pub struct RcRef<'d, T> {
    domain: &'d Domain,
    obj: NonNull<Header>,
    _owns: PhantomData<RcBox<T>>,
}

/// A weak reference: does not keep the object alive, but can be upgraded to an
/// [`RcRef`] until the object is freed, even after its count has reached zero (the
/// upgrade then vetoes the pending free). Keeps the memory of the object (not its
/// value) until dropped.
///
/// ```
/// use scalemem::refcount::{Config, RcRef, Refcache};
///
/// let cache = Refcache::with_config(Config::manual()).unwrap();
/// let strong = cache.alloc(5);
/// let weak = RcRef::downgrade(&strong);
/// drop(strong);
/// cache.tick(); // the count reaches zero: the object is dying
/// let revived = weak.upgrade().expect("not freed yet");
/// assert_eq!(*revived, 5);
/// drop(revived);
/// let mut ticks = 0;
/// while cache.stats().live > 0 {
///     cache.tick(); // two whole epochs at zero, untouched: freed
///     ticks += 1;
///     assert!(ticks <= 8, "never freed");
/// }
/// assert!(weak.upgrade().is_none());
/// ```
pub struct RcWeak<'d, T> {
    domain: &'d Domain,
    obj: NonNull<Header>,
    _owns: PhantomData<RcBox<T>>,
}

// SAFETY: like std's Arc: handles share the value between threads (&T from any handle,
// so T: Sync) and the value is dropped by whichever thread frees it (T: Send). The domain
// is Sync; the header is made of atomics.
unsafe impl<T: Send + Sync> Send for RcRef<'_, T> {}
// SAFETY: see the Send impl.
unsafe impl<T: Send + Sync> Sync for RcRef<'_, T> {}
// SAFETY: see RcRef's Send impl.
unsafe impl<T: Send + Sync> Send for RcWeak<'_, T> {}
// SAFETY: see RcRef's Send impl.
unsafe impl<T: Send + Sync> Sync for RcWeak<'_, T> {}

impl<'d, T> RcRef<'d, T> {
    /// Wraps a reference the caller owns (the count already includes it).
    pub(crate) fn from_owned(domain: &'d Domain, obj: NonNull<Header>) -> Self {
        Self { domain, obj, _owns: PhantomData }
    }

    fn value(&self) -> &T {
        // SAFETY: our reference keeps the object (and so the value) alive while `self`
        // lives; the header is the first field of the repr(C) RcBox<T>.
        unsafe { &(*self.obj.cast::<RcBox<T>>().as_ptr()).value }
    }

    /// A weak reference to the same object (an associated function, like
    /// `Arc::downgrade`, so that it does not shadow a method of `T`).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use scalemem::refcount::{Config, RcRef, Refcache};
    ///
    /// let cache = Refcache::with_config(Config::manual()).unwrap();
    /// let witness = Arc::new(());
    /// let strong = cache.alloc(Arc::clone(&witness));
    /// let weak = RcRef::downgrade(&strong);
    /// drop(strong); // the weak handle does not keep the object alive
    /// let mut ticks = 0;
    /// while cache.stats().freed == 0 {
    ///     cache.tick();
    ///     ticks += 1;
    ///     assert!(ticks <= 8, "never freed");
    /// }
    /// assert_eq!(Arc::strong_count(&witness), 1); // the value is dropped while `weak` lives
    /// assert!(weak.upgrade().is_none());
    /// ```
    pub fn downgrade(this: &Self) -> RcWeak<'d, T> {
        // SAFETY: our strong reference keeps the header alive.
        let header = unsafe { this.obj.as_ref() };
        // Relaxed: like Arc::downgrade; we hold a unit already (the strong side's).
        header.weak.fetch_add(1, Ordering::Relaxed);
        RcWeak { domain: this.domain, obj: this.obj, _owns: PhantomData }
    }

    /// Whether two handles refer to the same object.
    ///
    /// ```
    /// use scalemem::refcount::{Config, RcRef, Refcache};
    ///
    /// let cache = Refcache::with_config(Config::manual()).unwrap();
    /// let (a, b) = (cache.alloc(1), cache.alloc(1));
    /// assert!(RcRef::ptr_eq(&a, &a.clone()));
    /// assert!(!RcRef::ptr_eq(&a, &b)); // equal values, two objects
    /// ```
    pub fn ptr_eq(this: &Self, other: &Self) -> bool {
        this.obj == other.obj
    }
}

impl<T> Clone for RcRef<'_, T> {
    #[inline]
    fn clone(&self) -> Self {
        self.domain.add(self.obj, 1);
        Self { domain: self.domain, obj: self.obj, _owns: PhantomData }
    }
}

impl<T> Drop for RcRef<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.domain.add(self.obj, -1);
    }
}

impl<T> Deref for RcRef<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        self.value()
    }
}

impl<T: fmt::Debug> fmt::Debug for RcRef<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RcRef").field(self.value()).finish()
    }
}

impl<'d, T> RcWeak<'d, T> {
    /// A strong reference, unless the object has been freed. Succeeds even while the
    /// count is zero and the object waits for review: the upgrade then clears the
    /// object's dying bit, which stops the reviewer from freeing it. One SeqCst RMW on
    /// the object's header (not a per-CPU operation).
    ///
    /// ```
    /// use scalemem::refcount::{Config, RcRef, Refcache};
    ///
    /// let cache = Refcache::with_config(Config::manual()).unwrap();
    /// let strong = cache.alloc(vec![1, 2]);
    /// let weak = RcRef::downgrade(&strong);
    /// let again = weak.upgrade().expect("a strong reference exists");
    /// assert!(RcRef::ptr_eq(&strong, &again));
    /// drop((strong, again));
    /// let mut ticks = 0;
    /// while cache.stats().live > 0 {
    ///     cache.tick(); // zero for two whole epochs, untouched: freed
    ///     ticks += 1;
    ///     assert!(ticks <= 8, "never freed");
    /// }
    /// assert!(weak.upgrade().is_none()); // freed: no upgrade any more
    /// ```
    pub fn upgrade(&self) -> Option<RcRef<'d, T>> {
        // SAFETY: our weak unit keeps the header alive.
        let header = unsafe { self.obj.as_ref() };
        header.try_upgrade().then(|| RcRef::from_owned(self.domain, self.obj))
    }
}

impl<T> Clone for RcWeak<'_, T> {
    fn clone(&self) -> Self {
        // SAFETY: our weak unit keeps the header alive.
        let header = unsafe { self.obj.as_ref() };
        // Relaxed: we hold a unit already.
        header.weak.fetch_add(1, Ordering::Relaxed);
        Self { domain: self.domain, obj: self.obj, _owns: PhantomData }
    }
}

impl<T> Drop for RcWeak<'_, T> {
    fn drop(&mut self) {
        // SAFETY: we own one weak unit and do not use the object afterwards.
        unsafe { Header::drop_weak_unit(self.obj) };
    }
}

impl<T> fmt::Debug for RcWeak<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RcWeak(..)")
    }
}
