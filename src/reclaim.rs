//! [`Reclaim`]: the one trait a lock-free data structure needs to be generic over the
//! reclamation scheme, epoch-based ([`Ebr`]) or hazard pointers ([`Hazard`], or any
//! [`hazard::Domain`]).
//!
//! A structure written against it does three things:
//!
//! 1. Before following a shared pointer it takes a [`Shield`] ([`Reclaim::shield`]) and
//!    loads through it ([`Shield::protect`]). Under EBR a shield is a pin (nested pins
//!    cost a counter) and `protect` is an Acquire load; under hazard pointers a shield is
//!    a [`HazardPointer`] and `protect` is the publish-validate
//!    loop. A pointer returned by `protect` stays dereferenceable while that shield lives
//!    and is not reset or reused, which is the weaker of the two guarantees; code that
//!    holds several pointers at once takes one shield per pointer.
//! 2. It unlinks a node before retiring it, exactly once, through [`Reclaim::retire`].
//!    Nodes embed the [`Retired`] link (both schemes use the same type), so retiring never
//!    allocates.
//! 3. It never re-links a retired node.
//!
//! `src/ds/` has a Treiber stack, a Michael-Scott queue and a Harris-Michael ordered
//! list built this way, tested and model-checked under both schemes.
//!
//! ```
//! use scalemem::reclaim::{Ebr, Hazard};
//! use scalemem::ds::TreiberStack;
//!
//! let a: TreiberStack<u32, Ebr> = TreiberStack::new();
//! let b: TreiberStack<u32, Hazard> = TreiberStack::new();
//! a.push(1);
//! b.push(2);
//! assert_eq!((a.pop(), b.pop()), (Some(1), Some(2)));
//! ```

use core::ptr::NonNull;

use crate::epoch::{self, ReclaimFn, Retired};
use crate::hazard::{self, Domain, HazardPointer};
use crate::sync::atomic::{AtomicPtr, Ordering};

/// A reclamation scheme a data structure can be generic over (module doc).
///
/// # Safety
/// An implementation guarantees that an object retired through [`retire`](Reclaim::retire)
/// is not reclaimed while a [`Shield`] of the same scheme returned its address from a
/// `protect` that loaded it before the object was unlinked, and that shield has not
/// since been reset, reused for another `protect`, or dropped.
pub unsafe trait Reclaim: Sync {
    /// Protection for one pointer at a time.
    type Shield<'r>: Shield
    where
        Self: 'r;

    /// A shield, protecting nothing yet.
    fn shield(&self) -> Self::Shield<'_>;

    /// Hands an unlinked object to the scheme; `reclaim` runs once no shield can hold it.
    ///
    /// # Safety
    /// 1. `object` is unreachable for every `protect` that starts from now on, and is
    ///    never linked again.
    /// 2. `link` is embedded in the object, untouched by others until `reclaim` runs; the
    ///    object is retired once.
    /// 3. `reclaim` frees the object from its link, and may run on any thread.
    unsafe fn retire<T>(&self, object: *mut T, link: NonNull<Retired>, reclaim: ReclaimFn);

    /// Drives reclamation now (tests and models): an epoch flush, or a hazard scan.
    fn flush(&self);
}

/// Protection for one pointer: see [`Reclaim`].
pub trait Shield {
    /// Loads `src` and protects what it points to; the result stays dereferenceable until
    /// this shield is reset, reused or dropped.
    ///
    /// # Safety
    /// Every non-null pointer in `src` is valid until it is unlinked and retired through
    /// this shield's scheme.
    unsafe fn protect<T>(&mut self, src: &AtomicPtr<T>) -> *mut T;

    /// Like [`protect`](Shield::protect) for pointers with tag bits in `mask`: protects
    /// the untagged address and returns the word with its tags.
    ///
    /// # Safety
    /// As for [`protect`](Shield::protect).
    unsafe fn protect_masked<T>(&mut self, src: &AtomicPtr<T>, mask: usize) -> *mut T;

    /// Gives up the protection (under EBR: nothing until the shield is dropped).
    fn reset(&mut self);
}

/// Epoch-based reclamation through the default collector ([`epoch::pin`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct Ebr;

/// A pin of the default collector, as a [`Shield`].
#[derive(Debug)]
pub struct EbrShield {
    _pin: epoch::Guard,
}

impl Shield for EbrShield {
    #[inline]
    unsafe fn protect<T>(&mut self, src: &AtomicPtr<T>) -> *mut T {
        // Acquire: pairs with the Release store or CAS that published the object. The pin
        // (taken when the shield was made) keeps it from being freed.
        src.load(Ordering::Acquire)
    }

    #[inline]
    unsafe fn protect_masked<T>(&mut self, src: &AtomicPtr<T>, _mask: usize) -> *mut T {
        // Acquire: as in protect.
        src.load(Ordering::Acquire)
    }

    #[inline]
    fn reset(&mut self) {}
}

// SAFETY: a shield is a pin made before its loads; `Guard::retire` frees an object only
// once every thread pinned before it became unreachable has unpinned (module doc of
// `epoch`), which covers every shield that could have loaded it.
unsafe impl Reclaim for Ebr {
    type Shield<'r> = EbrShield;

    #[inline]
    fn shield(&self) -> EbrShield {
        EbrShield { _pin: epoch::pin() }
    }

    #[inline]
    unsafe fn retire<T>(&self, _object: *mut T, link: NonNull<Retired>, reclaim: ReclaimFn) {
        let guard = epoch::pin();
        // SAFETY: (1)-(3) of Guard::retire are this method's (1)-(3).
        unsafe { guard.retire(link, reclaim) };
    }

    fn flush(&self) {
        epoch::pin().flush();
    }
}

/// Hazard pointers of the global domain ([`Domain::global`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct Hazard;

impl<F> Shield for HazardPointer<'_, F> {
    #[inline]
    unsafe fn protect<T>(&mut self, src: &AtomicPtr<T>) -> *mut T {
        // SAFETY: the caller's contract is protect_ptr's (1).
        unsafe { self.protect_ptr(src) }
    }

    #[inline]
    unsafe fn protect_masked<T>(&mut self, src: &AtomicPtr<T>, mask: usize) -> *mut T {
        // SAFETY: as above.
        unsafe { HazardPointer::protect_masked(self, src, mask) }
    }

    #[inline]
    fn reset(&mut self) {
        HazardPointer::reset(self);
    }
}

// SAFETY: as for Domain<F> below, with the global domain.
unsafe impl Reclaim for Hazard {
    type Shield<'r> = HazardPointer<'static>;

    #[inline]
    fn shield(&self) -> HazardPointer<'static> {
        HazardPointer::new()
    }

    #[inline]
    unsafe fn retire<T>(&self, object: *mut T, link: NonNull<Retired>, reclaim: ReclaimFn) {
        // SAFETY: the contract is Domain::retire's.
        unsafe { Domain::global().retire(object, link, reclaim) };
    }

    fn flush(&self) {
        Domain::global().reclaim();
    }
}

// SAFETY: a retired object is freed only by a scan that did not find its address in any
// hazard slot of the domain after its heavy fence; a shield that validated the address
// published it before its light fence (module doc of `hazard`).
unsafe impl<F> Reclaim for hazard::Domain<F> {
    type Shield<'r>
        = HazardPointer<'r, F>
    where
        F: 'r;

    #[inline]
    fn shield(&self) -> HazardPointer<'_, F> {
        HazardPointer::new_in(self)
    }

    #[inline]
    unsafe fn retire<T>(&self, object: *mut T, link: NonNull<Retired>, reclaim: ReclaimFn) {
        // SAFETY: the contract is Domain::retire's.
        unsafe { Domain::retire(self, object, link, reclaim) };
    }

    fn flush(&self) {
        self.reclaim();
    }
}

// SAFETY: forwards to `R`.
unsafe impl<R: Reclaim> Reclaim for &R {
    type Shield<'r>
        = R::Shield<'r>
    where
        Self: 'r;

    #[inline]
    fn shield(&self) -> R::Shield<'_> {
        (**self).shield()
    }

    #[inline]
    unsafe fn retire<T>(&self, object: *mut T, link: NonNull<Retired>, reclaim: ReclaimFn) {
        // SAFETY: forwarded unchanged.
        unsafe { (**self).retire(object, link, reclaim) }
    }

    fn flush(&self) {
        (**self).flush();
    }
}
