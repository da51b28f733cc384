//! [`PercpuOwner`] and [`PercpuArc`]: a typed, heap-allocated object counted by a
//! [`PercpuRef`](super::PercpuRef)'s machinery.

use core::fmt;
use core::marker::PhantomData;
use core::ops::Deref;
use core::ptr::NonNull;

use super::percpu::{Init, RawRef};
use crate::util::AllocError;

/// The allocation: the count and the value.
struct ArcInner<T> {
    rc: RawRef,
    value: T,
}

/// Frees the allocation once the count has reached zero.
///
/// # Safety
/// 1. `inner` came from `Box::into_raw` in [`PercpuOwner::new`].
/// 2. The count reached zero on the calling thread (it owns the release), and nothing
///    uses the allocation afterwards.
unsafe fn free<T>(inner: NonNull<ArcInner<T>>) {
    // SAFETY: (1) a Box's pointer; (2) the last reference is gone and the zero-reaching
    // RMW was AcqRel, so every other handle's accesses happened before.
    drop(unsafe { Box::from_raw(inner.as_ptr()) });
}

/// The owner of a per-CPU counted object: it holds the initial reference, hands out
/// [`PercpuArc`] handles with [`share`](Self::share), and kills the count when dropped.
///
/// The trade-off against [`std::sync::Arc`]: while the owner is alive, cloning and
/// dropping a `PercpuArc` is a per-CPU get/put (an rseq section of 2-3 ns, no shared
/// write, so threads on different CPUs never contend), where an `Arc` bounces one
/// counter line between all CPUs. The price is paid at the end and at the start:
/// dropping the owner switches the count to atomic mode with one
/// `membarrier(PRIVATE_EXPEDITED_RSEQ)` (10-35 us with other threads running), after
/// which every clone and drop is an atomic RMW on a shared count, as with `Arc`; and
/// creating one maps a page of per-CPU slots. Use it for long-lived objects that many
/// threads reference and that one owner retires: a cache, a connection table, a module.
///
/// ```
/// use scalemem::refcount::PercpuOwner;
///
/// let owner = PercpuOwner::new(String::from("config v1")).unwrap();
/// let handles: Vec<_> = (0..4).map(|_| owner.share()).collect();
/// std::thread::scope(|s| {
///     for h in &handles {
///         s.spawn(move || {
///             let mine = h.clone(); // per-CPU get
///             assert_eq!(*mine, "config v1");
///         }); // per-CPU put
///     }
/// });
/// drop(owner); // kill: atomic mode from here on
/// drop(handles); // the last drop frees the string
/// ```
pub struct PercpuOwner<T> {
    inner: NonNull<ArcInner<T>>,
    _owns: PhantomData<ArcInner<T>>,
}

/// A counted handle to an object owned by a [`PercpuOwner`]: `clone` is a get and `drop`
/// a put, per-CPU while the owner lives and atomic after it is dropped; the last drop
/// after the owner's frees the object.
///
/// ```
/// use std::sync::Arc;
/// use scalemem::refcount::PercpuOwner;
///
/// let witness = Arc::new(()); // counts the copies alive: ours, and the owned object's
/// let owner = PercpuOwner::new(Arc::clone(&witness)).unwrap();
/// let a = owner.share();
/// let b = a.clone(); // a per-CPU get
/// drop(owner); // kill: atomic mode; the handles keep the object
/// drop(a);
/// assert_eq!(Arc::strong_count(&witness), 2); // `b` still holds it
/// drop(b); // the last put frees the object
/// assert_eq!(Arc::strong_count(&witness), 1);
/// ```
pub struct PercpuArc<T> {
    inner: NonNull<ArcInner<T>>,
    _owns: PhantomData<ArcInner<T>>,
}

// SAFETY: as for std's Arc: the value is shared between threads (&T from any handle:
// T: Sync) and dropped by whichever thread drops the last handle (T: Send). The count is
// made of atomics.
unsafe impl<T: Send + Sync> Send for PercpuOwner<T> {}
// SAFETY: see the Send impl.
unsafe impl<T: Send + Sync> Sync for PercpuOwner<T> {}
// SAFETY: see PercpuOwner's Send impl.
unsafe impl<T: Send + Sync> Send for PercpuArc<T> {}
// SAFETY: see PercpuOwner's Send impl.
unsafe impl<T: Send + Sync> Sync for PercpuArc<T> {}

impl<T> PercpuOwner<T> {
    /// Moves `value` to the heap with a per-CPU count holding the owner's reference.
    /// Fails only if the kernel refuses the memory for the per-CPU slots (a failed `Box`
    /// allocation aborts, as `Box::new` does).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use scalemem::refcount::PercpuOwner;
    ///
    /// let witness = Arc::new("table");
    /// let owner = PercpuOwner::new(Arc::clone(&witness)).unwrap();
    /// assert_eq!(**owner, "table");
    /// assert_eq!(Arc::strong_count(&witness), 2); // one copy moved into the object
    /// drop(owner); // no handle was shared: the kill drops the last reference and frees it
    /// assert_eq!(Arc::strong_count(&witness), 1);
    /// ```
    pub fn new(value: T) -> Result<Self, AllocError> {
        let inner = Box::new(ArcInner { rc: RawRef::new(Init::PerCpu)?, value });
        Ok(Self { inner: NonNull::from(Box::leak(inner)), _owns: PhantomData })
    }

    fn inner(&self) -> &ArcInner<T> {
        // SAFETY: the owner's reference keeps the allocation alive while `self` lives.
        unsafe { self.inner.as_ref() }
    }

    /// A new handle (a get).
    ///
    /// ```
    /// let owner = scalemem::refcount::PercpuOwner::new(7).unwrap();
    /// let handle = owner.share();
    /// assert_eq!(*handle + *owner, 14);
    /// ```
    pub fn share(&self) -> PercpuArc<T> {
        self.inner().rc.get_many(1);
        PercpuArc { inner: self.inner, _owns: PhantomData }
    }

    /// Drops the owner (kills the count); the same as `drop(owner)`.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use scalemem::refcount::PercpuOwner;
    ///
    /// let witness = Arc::new(5);
    /// let owner = PercpuOwner::new(Arc::clone(&witness)).unwrap();
    /// let handle = owner.share();
    /// owner.kill(); // the count turns atomic; `handle` keeps the object alive
    /// assert_eq!(**handle, 5);
    /// drop(handle); // the last put frees it
    /// assert_eq!(Arc::strong_count(&witness), 1);
    /// ```
    pub fn kill(self) {
        drop(self);
    }
}

impl<T> Drop for PercpuOwner<T> {
    fn drop(&mut self) {
        // The owner is the only one that kills, once: `kill` returns Some.
        let zero = self.inner().rc.kill(|| {}).unwrap_or(false);
        if zero {
            // SAFETY: (1) from new(); (2) the kill dropped the last reference here, and
            // `self` is not used after.
            unsafe { free(self.inner) };
        }
    }
}

impl<T> Deref for PercpuOwner<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner().value
    }
}

impl<T: fmt::Debug> fmt::Debug for PercpuOwner<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PercpuOwner").field(&**self).finish()
    }
}

impl<T> PercpuArc<T> {
    fn inner(&self) -> &ArcInner<T> {
        // SAFETY: this handle's reference keeps the allocation alive while `self` lives.
        unsafe { self.inner.as_ref() }
    }

    /// Whether two handles point to the same object.
    ///
    /// ```
    /// let owner = scalemem::refcount::PercpuOwner::new(()).unwrap();
    /// let (a, b) = (owner.share(), owner.share());
    /// assert!(scalemem::refcount::PercpuArc::ptr_eq(&a, &b));
    /// ```
    pub fn ptr_eq(this: &Self, other: &Self) -> bool {
        this.inner == other.inner
    }
}

impl<T> Clone for PercpuArc<T> {
    #[inline]
    fn clone(&self) -> Self {
        self.inner().rc.get_many(1);
        Self { inner: self.inner, _owns: PhantomData }
    }
}

impl<T> Drop for PercpuArc<T> {
    #[inline]
    fn drop(&mut self) {
        if self.inner().rc.put_many(1) {
            // SAFETY: (1) from PercpuOwner::new; (2) our put brought the count to zero and
            // the borrow of the allocation above has ended.
            unsafe { free(self.inner) };
        }
    }
}

impl<T> Deref for PercpuArc<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        &self.inner().value
    }
}

impl<T: fmt::Debug> fmt::Debug for PercpuArc<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PercpuArc").field(&**self).finish()
    }
}
