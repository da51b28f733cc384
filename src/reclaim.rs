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
///
/// ```
/// use core::ptr::{self, NonNull};
/// use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::SeqCst};
/// use scalemem::epoch::Retired;
/// use scalemem::reclaim::{Ebr, Hazard, Reclaim, Shield};
///
/// #[repr(C)]
/// struct Node {
///     link: Retired, // first field, so a *Retired is a *Node
///     value: u32,
/// }
/// static FREED: AtomicUsize = AtomicUsize::new(0);
/// unsafe fn free_node(link: NonNull<Retired>) {
///     // SAFETY: every link retired below is the first field of a boxed Node.
///     drop(unsafe { Box::from_raw(link.cast::<Node>().as_ptr()) });
///     FREED.fetch_add(1, SeqCst);
/// }
///
/// /// Takes the node out of `slot`: reads it under a shield, unlinks it and retires it.
/// fn take<R: Reclaim>(scheme: &R, slot: &AtomicPtr<Node>) -> u32 {
///     let mut shield = scheme.shield();
///     // SAFETY: the nodes in `slot` stay valid until unlinked and retired through `scheme`.
///     let node = unsafe { shield.protect(slot) };
///     // SAFETY: protected by `shield`.
///     let value = unsafe { (*node).value };
///     slot.store(ptr::null_mut(), SeqCst); // the unlink (one thread here: no CAS needed)
///     // SAFETY: (1) unlinked, and never linked again; (2) the link is the node's first
///     // field, and the node is retired once; (3) free_node frees a boxed Node from its
///     // link, on any thread.
///     unsafe { scheme.retire(node, NonNull::new(node).unwrap().cast(), free_node) };
///     value
/// }
///
/// let slot = |value| AtomicPtr::new(Box::into_raw(Box::new(Node { link: Retired::new(), value })));
/// assert_eq!(take(&Ebr, &slot(1)), 1);
/// assert_eq!(take(&Hazard, &slot(2)), 2);
/// let mut flushes = 0;
/// while FREED.load(SeqCst) < 2 {
///     Ebr.flush();
///     Hazard.flush();
///     flushes += 1;
///     assert!(flushes < 100, "never reclaimed");
/// }
/// ```
pub unsafe trait Reclaim: Sync {
    /// Protection for one pointer at a time.
    type Shield<'r>: Shield
    where
        Self: 'r;

    /// A shield, protecting nothing yet.
    ///
    /// ```
    /// use std::sync::atomic::AtomicPtr;
    /// use scalemem::reclaim::{Ebr, Hazard, Reclaim, Shield};
    ///
    /// fn read<R: Reclaim>(scheme: &R, slot: &AtomicPtr<u64>) -> u64 {
    ///     let mut shield = scheme.shield();
    ///     // SAFETY: `slot` points to a local that outlives it and is never retired.
    ///     unsafe { *shield.protect(slot) }
    /// }
    /// let mut value = 7;
    /// let slot = AtomicPtr::new(&mut value);
    /// assert_eq!(read(&Ebr, &slot), 7);
    /// assert_eq!(read(&Hazard, &slot), 7);
    /// ```
    fn shield(&self) -> Self::Shield<'_>;

    /// Hands an unlinked object to the scheme; `reclaim` runs once no shield can hold it.
    ///
    /// # Safety
    /// 1. `object` is unreachable for every `protect` that starts from now on, and is
    ///    never linked again.
    /// 2. `link` is embedded in the object, untouched by others until `reclaim` runs; the
    ///    object is retired once.
    /// 3. `reclaim` frees the object from its link, and may run on any thread.
    ///
    /// ```
    /// use core::ptr::NonNull;
    /// use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    /// use scalemem::epoch::Retired;
    /// use scalemem::reclaim::{Ebr, Hazard, Reclaim};
    ///
    /// static FREED: AtomicUsize = AtomicUsize::new(0);
    /// unsafe fn free(link: NonNull<Retired>) {
    ///     // SAFETY: every link retired below is a boxed object of its own.
    ///     drop(unsafe { Box::from_raw(link.as_ptr()) });
    ///     FREED.fetch_add(1, SeqCst);
    /// }
    ///
    /// /// Retires a fresh object, then flushes until it is freed: how many flushes it took.
    /// fn retire_one<R: Reclaim>(scheme: &R) -> usize {
    ///     let object = Box::into_raw(Box::new(Retired::new())); // an object that is all link
    ///     let before = FREED.load(SeqCst);
    ///     // SAFETY: (1) never linked anywhere; (2) the link is the object, retired once;
    ///     // (3) `free` frees it from its link, on any thread.
    ///     unsafe { scheme.retire(object, NonNull::new(object).unwrap(), free) };
    ///     let mut flushes = 0;
    ///     while FREED.load(SeqCst) == before {
    ///         scheme.flush();
    ///         flushes += 1;
    ///         assert!(flushes < 100, "never reclaimed");
    ///     }
    ///     flushes
    /// }
    /// assert_eq!(retire_one(&Hazard), 1); // one scan frees what no hazard pointer holds
    /// assert!(retire_one(&Ebr) >= 1); // the epoch must advance twice first
    /// ```
    unsafe fn retire<T>(&self, object: *mut T, link: NonNull<Retired>, reclaim: ReclaimFn);

    /// Drives reclamation now (tests and models): an epoch flush, or a hazard scan.
    ///
    /// ```
    /// use scalemem::ds::TreiberStack;
    /// use scalemem::reclaim::Reclaim;
    ///
    /// let domain = scalemem::unique_domain!();
    /// let stack = TreiberStack::new_in(&domain);
    /// stack.push(1);
    /// assert_eq!(stack.pop(), Some(1)); // its node is retired, not freed yet
    /// assert_eq!(domain.stats().retired, 1);
    /// domain.flush(); // a scan: no hazard pointer holds the node
    /// assert_eq!((domain.stats().retired, domain.stats().reclaimed), (0, 1));
    /// ```
    fn flush(&self);
}

/// Protection for one pointer: see [`Reclaim`].
///
/// ```
/// use std::sync::atomic::AtomicPtr;
/// use scalemem::reclaim::{Ebr, Hazard, Reclaim, Shield};
///
/// /// Adds what two slots point to, holding one shield per pointer.
/// fn sum(mut a: impl Shield, mut b: impl Shield, x: &AtomicPtr<u64>, y: &AtomicPtr<u64>) -> u64 {
///     // SAFETY: the slots point to locals that outlive them and are never retired.
///     unsafe { *a.protect(x) + *b.protect(y) }
/// }
/// let (mut one, mut two) = (1, 2);
/// let (x, y) = (AtomicPtr::new(&mut one), AtomicPtr::new(&mut two));
/// assert_eq!(sum(Ebr.shield(), Ebr.shield(), &x, &y), 3);
/// assert_eq!(sum(Hazard.shield(), Hazard.shield(), &x, &y), 3);
/// ```
pub trait Shield {
    /// Loads `src` and protects what it points to; the result stays dereferenceable until
    /// this shield is reset, reused or dropped.
    ///
    /// # Safety
    /// Every non-null pointer in `src` is valid until it is unlinked and retired through
    /// this shield's scheme.
    ///
    /// ```
    /// use core::ptr;
    /// use std::sync::atomic::{AtomicPtr, Ordering::SeqCst};
    /// use scalemem::hazard::drop_box;
    /// use scalemem::reclaim::{Reclaim, Shield};
    ///
    /// let domain = scalemem::unique_domain!();
    /// let slot = AtomicPtr::new(Box::into_raw(Box::new(7u64)));
    /// let mut shield = domain.shield();
    /// // SAFETY: the box in `slot` stays valid until unlinked and retired to `domain`.
    /// let p = unsafe { Shield::protect(&mut shield, &slot) };
    /// let old = slot.swap(ptr::null_mut(), SeqCst);
    /// // SAFETY: (1) unlinked, and never linked again; (2) retired once, valid until then;
    /// // (3) drop_box frees a Box, on any thread.
    /// unsafe { domain.retire_ptr(old, drop_box) };
    /// domain.flush(); // retired and scanned, but protected:
    /// // SAFETY: `shield` still protects `p`.
    /// assert_eq!(unsafe { *p }, 7);
    /// assert_eq!(domain.stats().reclaimed, 0);
    /// drop(shield);
    /// domain.flush();
    /// assert_eq!(domain.stats().reclaimed, 1);
    /// ```
    unsafe fn protect<T>(&mut self, src: &AtomicPtr<T>) -> *mut T;

    /// Like [`protect`](Shield::protect) for pointers with tag bits in `mask`: protects
    /// the untagged address and returns the word with its tags.
    ///
    /// # Safety
    /// As for [`protect`](Shield::protect).
    ///
    /// ```
    /// use std::sync::atomic::AtomicPtr;
    /// use scalemem::reclaim::{Ebr, Hazard, Reclaim, Shield};
    ///
    /// /// Reads through a pointer whose low bit is a mark: the value and the mark.
    /// fn read(mut shield: impl Shield, slot: &AtomicPtr<u64>) -> (u64, usize) {
    ///     // SAFETY: `slot` points to a local that outlives it and is never retired.
    ///     let word = unsafe { shield.protect_masked(slot, 1) };
    ///     // SAFETY: the untagged address is protected by `shield`.
    ///     (unsafe { *word.map_addr(|a| a & !1) }, word.addr() & 1)
    /// }
    /// let mut value = 5u64;
    /// let slot = AtomicPtr::new((&raw mut value).map_addr(|a| a | 1)); // marked
    /// assert_eq!(read(Ebr.shield(), &slot), (5, 1));
    /// assert_eq!(read(Hazard.shield(), &slot), (5, 1));
    /// ```
    unsafe fn protect_masked<T>(&mut self, src: &AtomicPtr<T>, mask: usize) -> *mut T;

    /// Gives up the protection (under EBR: nothing until the shield is dropped).
    ///
    /// ```
    /// use core::ptr;
    /// use std::sync::atomic::{AtomicPtr, Ordering::SeqCst};
    /// use scalemem::hazard::drop_box;
    /// use scalemem::reclaim::{Ebr, Reclaim, Shield};
    ///
    /// // A hazard pointer that is reset no longer holds back its object.
    /// let domain = scalemem::unique_domain!();
    /// let slot = AtomicPtr::new(Box::into_raw(Box::new(1u64)));
    /// let mut shield = domain.shield();
    /// // SAFETY: the box in `slot` stays valid until unlinked and retired to `domain`.
    /// let _ = unsafe { Shield::protect(&mut shield, &slot) };
    /// let old = slot.swap(ptr::null_mut(), SeqCst);
    /// // SAFETY: (1) unlinked, and never linked again; (2) retired once, valid until then;
    /// // (3) drop_box frees a Box, on any thread.
    /// unsafe { domain.retire_ptr(old, drop_box) };
    /// domain.flush();
    /// assert_eq!(domain.stats().reclaimed, 0);
    /// Shield::reset(&mut shield);
    /// domain.flush();
    /// assert_eq!(domain.stats().reclaimed, 1);
    /// // An EBR shield is a pin, which only dropping it ends.
    /// let mut pin = Ebr.shield();
    /// pin.reset();
    /// assert!(scalemem::epoch::is_pinned());
    /// ```
    fn reset(&mut self);
}

/// Epoch-based reclamation through the default collector ([`epoch::pin`]).
///
/// ```
/// use scalemem::reclaim::{Ebr, Reclaim};
///
/// let collector = scalemem::epoch::default_collector();
/// let before = collector.advances();
/// Ebr.flush(); // no other thread is pinned: the default collector's epoch advances
/// assert!(collector.advances() > before);
/// ```
#[derive(Debug, Default, Clone, Copy)]
pub struct Ebr;

/// A pin of the default collector, as a [`Shield`].
///
/// ```
/// use scalemem::reclaim::{Ebr, Reclaim};
///
/// let shield = Ebr.shield();
/// assert!(scalemem::epoch::is_pinned());
/// drop(shield);
/// assert!(!scalemem::epoch::is_pinned());
/// ```
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
///
/// ```
/// use scalemem::ds::TreiberStack;
/// use scalemem::hazard::Domain;
/// use scalemem::reclaim::{Hazard, Reclaim};
///
/// let stack = TreiberStack::<u64, Hazard>::new();
/// stack.push(1);
/// assert_eq!(stack.pop(), Some(1)); // its node is retired to the global domain
/// let before = Domain::global().stats().reclaimed;
/// Hazard.flush(); // a scan of the global domain: nothing protects the node
/// assert_eq!(Domain::global().stats().reclaimed, before + 1);
/// ```
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
