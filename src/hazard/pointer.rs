//! [`HazardPointer`] (one slot) and [`HazardPointerArray`] (several, taken at once).

use core::fmt;
use core::marker::PhantomData;
use core::ptr::{self, NonNull};

use super::domain::{Domain, Global, with_thread_block};
use super::record::Block;
use crate::cpu::fence;
use crate::sync::atomic::{AtomicPtr, Ordering};

/// One hazard slot of the calling thread in a domain. While it holds an address, no
/// object retired to the domain at that address is freed.
///
/// Taking one and dropping it touch only the thread's own record (a thread-local load and
/// a bit in the record's free mask): no shared cache line. Protecting is a load, a store
/// to the thread's own slot, a compiler fence (the light side of the asymmetric fence)
/// and a validating re-load.
///
/// A hazard pointer belongs to its thread (`!Send`).
///
/// ```
/// use scalemem::hazard::HazardPointer;
/// use std::sync::atomic::AtomicPtr;
///
/// let slot = AtomicPtr::new(Box::into_raw(Box::new(String::from("config v1"))));
/// let mut hp = HazardPointer::new();
/// // SAFETY: objects in `slot` are retired to the global domain after being unlinked.
/// let config = unsafe { hp.protect(&slot) }.unwrap();
/// assert_eq!(config, "config v1");
/// hp.reset();
/// # // SAFETY: boxes of this example, freed once; nothing retired them.
/// # unsafe { drop(Box::from_raw(slot.into_inner())) };
/// ```
pub struct HazardPointer<'d, F = Global> {
    block: NonNull<Block>,
    index: usize,
    /// Borrows the domain (it outlives its hazard pointers) and is `!Send`/`!Sync`.
    _domain: PhantomData<(&'d Domain<F>, *mut ())>,
}

impl HazardPointer<'static, Global> {
    /// A hazard pointer in the global domain.
    ///
    /// ```
    /// use scalemem::hazard::{Domain, HazardPointer};
    /// use std::sync::atomic::AtomicPtr;
    ///
    /// let slot = AtomicPtr::new(Box::into_raw(Box::new(5)));
    /// let mut hp = HazardPointer::new();
    /// assert!(hp.is_in(Domain::global()));
    /// // SAFETY: (1) the box stays in `slot`, valid, until it is freed below, after `hp`
    /// // is dropped (it is never retired); (2) no `&mut` is taken to it meanwhile.
    /// assert_eq!(unsafe { hp.protect(&slot) }, Some(&5));
    /// drop(hp);
    /// // SAFETY: the box came from `Box::into_raw`, and nothing protects or frees it else.
    /// unsafe { drop(Box::from_raw(slot.into_inner())) };
    /// ```
    #[inline]
    pub fn new() -> Self {
        Self::new_in(Domain::global())
    }
}

impl Default for HazardPointer<'static, Global> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'d, F> HazardPointer<'d, F> {
    /// A hazard pointer in `domain`. Aborts if the kernel refuses memory for a new
    /// record, like `Box::new`.
    ///
    /// ```
    /// use scalemem::hazard::HazardPointer;
    /// use std::sync::atomic::AtomicPtr;
    ///
    /// let domain = scalemem::unique_domain!();
    /// let slot = AtomicPtr::new(Box::into_raw(Box::new(1)));
    /// let mut hp = HazardPointer::new_in(&domain);
    /// assert!(hp.is_in(&domain));
    /// assert_eq!(domain.stats().threads, 1); // this thread's record in `domain`
    /// // SAFETY: (1) the box stays in `slot`, valid, until it is freed below, after `hp`
    /// // is dropped (it is never retired); (2) no `&mut` is taken to it meanwhile.
    /// assert_eq!(unsafe { hp.protect(&slot) }, Some(&1));
    /// drop(hp);
    /// // SAFETY: the box came from `Box::into_raw`, and nothing protects or frees it else.
    /// unsafe { drop(Box::from_raw(slot.into_inner())) };
    /// ```
    #[inline]
    pub fn new_in(domain: &'d Domain<F>) -> Self {
        let taken = with_thread_block(domain.inner, Block::take_slot);
        let (block, index) =
            taken.unwrap_or_else(|_| std::alloc::handle_alloc_error(std::alloc::Layout::new::<Block>()));
        Self { block, index, _domain: PhantomData }
    }

    #[inline]
    fn slot(&self) -> &AtomicPtr<u8> {
        // SAFETY: the block stays claimed by this thread while this hazard pointer holds
        // one of its slots (release_chain waits for the last one).
        unsafe { &self.block.as_ref().slots[self.index] }
    }

    /// Publishes `address` in the slot: a store, then the light fence.
    #[inline]
    fn publish(&self, address: *mut u8) {
        // Release: a reader that moves its hazard on (or resets it) has finished with the
        // previous object; a scan that reads this value (Acquire) sees those accesses.
        self.slot().store(address, Ordering::Release);
        // The light side of the publish protocol: the store above is ordered before the
        // validating load against every scan's heavy fence (module doc).
        fence::light();
    }

    /// Protects the object `src` points to and returns a reference to it (`None` if
    /// `src` is null). Loops until the published pointer is still in `src` after the
    /// fence. The reference lives until the hazard pointer is reset, reused or dropped.
    ///
    /// # Safety
    /// 1. Every non-null pointer stored in `src` points to a valid `T` until it is
    ///    retired to this hazard pointer's domain, after being unlinked from `src`.
    /// 2. Nobody takes `&mut` to an object while it is reachable or protected.
    ///
    /// ```
    /// use scalemem::hazard::{HazardPointer, drop_box};
    /// use std::sync::atomic::{AtomicPtr, Ordering};
    ///
    /// let domain = scalemem::unique_domain!();
    /// let slot = AtomicPtr::new(Box::into_raw(Box::new(String::from("a"))));
    /// let mut hp = HazardPointer::new_in(&domain);
    /// // SAFETY: (1) the slot's boxes are retired to `domain` after being unlinked; (2) no
    /// // `&mut` is taken to them.
    /// let value = unsafe { hp.protect(&slot) }.unwrap();
    /// let old = slot.swap(Box::into_raw(Box::new(String::from("b"))), Ordering::AcqRel);
    /// // SAFETY: (1) `old` is unlinked from `slot`, its only link; (2) retired once;
    /// // (3) `drop_box` frees a box, on any thread.
    /// unsafe { domain.retire_ptr(old, drop_box) };
    /// assert_eq!(domain.reclaim(), 0);
    /// assert_eq!(value, "a"); // unlinked and retired, but protected: still valid
    /// hp.reset();
    /// assert_eq!(domain.reclaim(), 1);
    /// // SAFETY: the last box came from `Box::into_raw` and was never retired.
    /// unsafe { drop(Box::from_raw(slot.into_inner())) };
    /// ```
    #[inline]
    pub unsafe fn protect<'h, T>(&'h mut self, src: &AtomicPtr<T>) -> Option<&'h T> {
        // SAFETY: (1) the returned pointer was in `src` after our hazard was published,
        // so it is not freed before the hazard moves (module doc); (2) no &mut aliases.
        unsafe { self.protect_ptr(src).as_ref() }
    }

    /// Like [`protect`](HazardPointer::protect), returning the raw pointer (for data
    /// structures that follow it further).
    ///
    /// # Safety
    /// As for [`protect`](HazardPointer::protect) (1), for the returned pointer to be
    /// dereferenceable until the hazard moves.
    ///
    /// ```
    /// use scalemem::hazard::HazardPointer;
    /// use std::sync::atomic::{AtomicPtr, Ordering};
    ///
    /// let domain = scalemem::unique_domain!();
    /// let slot = AtomicPtr::new(Box::into_raw(Box::new(3u64)));
    /// let mut hp = HazardPointer::new_in(&domain);
    /// // SAFETY: (1) the box stays in `slot`, valid, until it is freed below, after `hp`
    /// // is reset (it is never retired).
    /// let ptr = unsafe { hp.protect_ptr(&slot) };
    /// assert_eq!(ptr, slot.load(Ordering::Relaxed));
    /// // SAFETY: `ptr` is protected by `hp`, which has not moved since.
    /// assert_eq!(unsafe { *ptr }, 3);
    /// hp.reset();
    /// // SAFETY: the box came from `Box::into_raw`, and nothing protects or frees it else.
    /// unsafe { drop(Box::from_raw(slot.into_inner())) };
    /// ```
    #[inline]
    pub unsafe fn protect_ptr<T>(&mut self, src: &AtomicPtr<T>) -> *mut T {
        // Relaxed: only a guess; the Acquire re-load in try_protect_ptr validates it.
        let mut ptr = src.load(Ordering::Relaxed);
        loop {
            match self.try_protect_ptr(ptr, src) {
                Ok(ptr) => return ptr,
                Err(now) => ptr = now,
            }
        }
    }

    /// Like [`protect_ptr`](HazardPointer::protect_ptr) for pointers that carry tag bits:
    /// publishes the address with the bits of `mask` cleared, validates the whole word,
    /// and returns it tags included.
    ///
    /// # Safety
    /// As for [`protect_ptr`](HazardPointer::protect_ptr), for the untagged address.
    ///
    /// ```
    /// use scalemem::hazard::{HazardPointer, drop_box};
    /// use std::sync::atomic::{AtomicPtr, Ordering};
    ///
    /// const TAGS: usize = 0b111; // a u64 box is 8-aligned: its low 3 bits are free
    /// let domain = scalemem::unique_domain!();
    /// let slot = AtomicPtr::new(Box::into_raw(Box::new(9u64)).map_addr(|a| a | 1));
    /// let mut hp = HazardPointer::new_in(&domain);
    /// // SAFETY: (1) the slot's boxes (untagged) are retired to `domain` after being
    /// // unlinked; (2) no `&mut` is taken to them.
    /// let tagged = unsafe { hp.protect_masked(&slot, TAGS) };
    /// assert_eq!(tagged.addr() & TAGS, 1); // returned with its tag
    /// let untagged = tagged.map_addr(|a| a & !TAGS);
    /// // SAFETY: the untagged address is the one `hp` protects.
    /// assert_eq!(unsafe { *untagged }, 9);
    /// slot.store(core::ptr::null_mut(), Ordering::Release);
    /// // SAFETY: (1) unlinked from `slot`, its only link; (2) retired once; (3) `drop_box`
    /// // frees a box, on any thread.
    /// unsafe { domain.retire_ptr(untagged, drop_box) };
    /// assert_eq!(domain.reclaim(), 0); // the published hazard is the untagged address
    /// drop(hp);
    /// assert_eq!(domain.reclaim(), 1);
    /// ```
    #[inline]
    pub unsafe fn protect_masked<T>(&mut self, src: &AtomicPtr<T>, mask: usize) -> *mut T {
        // Relaxed: validated below.
        let mut ptr = src.load(Ordering::Relaxed);
        loop {
            self.publish(ptr.map_addr(|a| a & !mask).cast());
            // Acquire: pairs with the Release store that published the object.
            let now = src.load(Ordering::Acquire);
            if now == ptr {
                return ptr;
            }
            ptr = now;
        }
    }

    /// Publishes `ptr` and checks that `src` still holds it: `Ok` with the protected
    /// reference, or `Err` with what `src` holds now (the hazard then still holds `ptr`,
    /// which protects nothing useful).
    ///
    /// # Safety
    /// As for [`protect`](HazardPointer::protect).
    ///
    /// ```
    /// use scalemem::hazard::HazardPointer;
    /// use std::sync::atomic::AtomicPtr;
    ///
    /// let domain = scalemem::unique_domain!();
    /// let (a, b) = (Box::into_raw(Box::new(1)), Box::into_raw(Box::new(2)));
    /// let slot = AtomicPtr::new(a);
    /// let mut hp = HazardPointer::new_in(&domain);
    /// // SAFETY: (1) `a` and `b` are valid until freed below, after `hp` is dropped (they
    /// // are never retired); (2) no `&mut` is taken to them meanwhile.
    /// assert_eq!(unsafe { hp.try_protect(b, &slot) }, Err(a)); // `slot` holds `a`
    /// // SAFETY: as above.
    /// assert_eq!(unsafe { hp.try_protect(a, &slot) }, Ok(Some(&1)));
    /// drop(hp);
    /// // SAFETY: both came from `Box::into_raw`, and nothing protects or frees them else.
    /// unsafe { (drop(Box::from_raw(a)), drop(Box::from_raw(b))) };
    /// ```
    #[inline]
    pub unsafe fn try_protect<'h, T>(&'h mut self, ptr: *mut T, src: &AtomicPtr<T>) -> Result<Option<&'h T>, *mut T> {
        match self.try_protect_ptr(ptr, src) {
            // SAFETY: as in protect.
            Ok(ptr) => Ok(unsafe { ptr.as_ref() }),
            Err(now) => Err(now),
        }
    }

    #[inline]
    fn try_protect_ptr<T>(&mut self, ptr: *mut T, src: &AtomicPtr<T>) -> Result<*mut T, *mut T> {
        self.publish(ptr.cast());
        // Acquire: pairs with the Release store that published the object, so its
        // contents are visible; equality proves `ptr` was reachable after our publish.
        let now = src.load(Ordering::Acquire);
        if now == ptr { Ok(ptr) } else { Err(now) }
    }

    /// Publishes `ptr` without validating it: for callers that establish by other means
    /// that `ptr` was still reachable after this call returned (as
    /// [`try_protect`](HazardPointer::try_protect) does by re-loading).
    ///
    /// ```
    /// use scalemem::hazard::{HazardPointer, drop_box};
    ///
    /// let domain = scalemem::unique_domain!();
    /// let object = Box::into_raw(Box::new(4));
    /// let mut hp = HazardPointer::new_in(&domain);
    /// hp.protect_raw(object); // valid without a re-load: we own `object` until the retire
    /// // SAFETY: (1) the box was never shared; (2) it is retired once; (3) `drop_box`
    /// // frees a box, on any thread.
    /// unsafe { domain.retire_ptr(object, drop_box) };
    /// assert_eq!(domain.reclaim(), 0); // the hazard holds it back
    /// hp.reset();
    /// assert_eq!(domain.reclaim(), 1);
    /// ```
    #[inline]
    pub fn protect_raw<T>(&mut self, ptr: *mut T) {
        self.publish(ptr.cast());
    }

    /// Clears the slot: the previously protected object may now be freed.
    ///
    /// ```
    /// use scalemem::hazard::{HazardPointer, drop_box};
    /// use std::sync::atomic::{AtomicPtr, Ordering};
    ///
    /// let domain = scalemem::unique_domain!();
    /// let slot = AtomicPtr::new(Box::into_raw(Box::new(1)));
    /// let mut hp = HazardPointer::new_in(&domain);
    /// // SAFETY: (1) the slot's boxes are retired to `domain` after being unlinked; (2) no
    /// // `&mut` is taken to them.
    /// assert_eq!(unsafe { hp.protect(&slot) }, Some(&1));
    /// let old = slot.swap(core::ptr::null_mut(), Ordering::AcqRel);
    /// // SAFETY: (1) `old` is unlinked from `slot`, its only link; (2) retired once;
    /// // (3) `drop_box` frees a box, on any thread.
    /// unsafe { domain.retire_ptr(old, drop_box) };
    /// assert_eq!(domain.reclaim(), 0); // protected
    /// hp.reset();
    /// assert_eq!(domain.reclaim(), 1); // no longer
    /// ```
    #[inline]
    pub fn reset(&mut self) {
        // Release: the reader's accesses to the object happen before any scan that reads
        // the null (Acquire) and then frees it.
        self.slot().store(ptr::null_mut(), Ordering::Release);
    }

    /// Whether this hazard pointer belongs to `domain` (for debug checks in data
    /// structures that hold both).
    ///
    /// ```
    /// use scalemem::hazard::{Domain, HazardPointer};
    ///
    /// struct Family;
    /// let (a, b) = (Domain::new(Family), Domain::new(Family));
    /// let hp = HazardPointer::new_in(&a);
    /// assert!(hp.is_in(&a));
    /// assert!(hp.is_in(&a.clone())); // a clone is a handle of the same domain
    /// assert!(!hp.is_in(&b)); // same family, another domain
    /// ```
    pub fn is_in(&self, domain: &Domain<F>) -> bool {
        // SAFETY: see slot().
        core::ptr::eq(unsafe { self.block.as_ref() }.domain(), domain.inner())
    }
}

impl<F> Drop for HazardPointer<'_, F> {
    #[inline]
    fn drop(&mut self) {
        Block::put_slot(self.block, self.index);
    }
}

impl<F> fmt::Debug for HazardPointer<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Relaxed: our own thread's store.
        f.debug_struct("HazardPointer").field("protects", &self.slot().load(Ordering::Relaxed)).finish()
    }
}

/// `N` hazard pointers of one domain, taken with one look-up of the thread's record (for
/// structures that hold several pointers at once: a queue's head and next, a list's
/// previous, current and next nodes).
///
/// ```
/// use scalemem::hazard::HazardPointerArray;
/// use std::sync::atomic::AtomicPtr;
///
/// let a = AtomicPtr::new(Box::into_raw(Box::new(1)));
/// let b = AtomicPtr::new(Box::into_raw(Box::new(2)));
/// let mut hps = HazardPointerArray::<3>::new();
/// let [ha, hb, _] = hps.pointers_mut();
/// // SAFETY: nothing retires the boxes while we hold them.
/// let (x, y) = unsafe { (ha.protect(&a).unwrap(), hb.protect(&b).unwrap()) };
/// assert_eq!(x + y, 3);
/// # // SAFETY: boxes of this example, freed once; nothing retired them.
/// # unsafe { drop(Box::from_raw(a.into_inner())); drop(Box::from_raw(b.into_inner())) };
/// ```
pub struct HazardPointerArray<'d, const N: usize, F = Global> {
    hazards: [HazardPointer<'d, F>; N],
}

impl<const N: usize> HazardPointerArray<'static, N, Global> {
    /// `N` hazard pointers in the global domain.
    ///
    /// ```
    /// use scalemem::hazard::{Domain, HazardPointerArray};
    /// use std::sync::atomic::AtomicPtr;
    ///
    /// let slot = AtomicPtr::new(Box::into_raw(Box::new(5)));
    /// let mut hps = HazardPointerArray::<2>::new();
    /// let [a, b] = hps.pointers_mut();
    /// assert!(a.is_in(Domain::global()) && b.is_in(Domain::global()));
    /// // SAFETY: (1) the box stays in `slot`, valid, until it is freed below, after the
    /// // hazard pointers are dropped (it is never retired); (2) no `&mut` is taken to it.
    /// let (x, y) = unsafe { (a.protect(&slot), b.protect(&slot)) };
    /// assert_eq!((x, y), (Some(&5), Some(&5)));
    /// drop(hps);
    /// // SAFETY: the box came from `Box::into_raw`, and nothing protects or frees it else.
    /// unsafe { drop(Box::from_raw(slot.into_inner())) };
    /// ```
    pub fn new() -> Self {
        Self::new_in(Domain::global())
    }
}

impl<const N: usize> Default for HazardPointerArray<'static, N, Global> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'d, const N: usize, F> HazardPointerArray<'d, N, F> {
    /// `N` hazard pointers in `domain`.
    ///
    /// ```
    /// use scalemem::hazard::{HazardPointerArray, drop_box};
    /// use std::sync::atomic::{AtomicPtr, Ordering};
    ///
    /// let domain = scalemem::unique_domain!();
    /// let slots = [1, 2].map(|v| AtomicPtr::new(Box::into_raw(Box::new(v))));
    /// let mut hps = HazardPointerArray::<2, _>::new_in(&domain);
    /// let [ha, hb] = hps.pointers_mut();
    /// // SAFETY: (1) the slots' boxes are retired to `domain` after being unlinked; (2) no
    /// // `&mut` is taken to them.
    /// let (x, y) = unsafe { (ha.protect(&slots[0]), hb.protect(&slots[1])) };
    /// assert_eq!((x, y), (Some(&1), Some(&2)));
    /// for slot in &slots {
    ///     let old = slot.swap(core::ptr::null_mut(), Ordering::AcqRel);
    ///     // SAFETY: (1) `old` is unlinked from its only slot; (2) retired once;
    ///     // (3) `drop_box` frees a box, on any thread.
    ///     unsafe { domain.retire_ptr(old, drop_box) };
    /// }
    /// assert_eq!(domain.reclaim(), 0); // both protected
    /// drop(hps);
    /// assert_eq!(domain.reclaim(), 2);
    /// ```
    pub fn new_in(domain: &'d Domain<F>) -> Self {
        let hazards = with_thread_block(domain.inner, |block| {
            core::array::from_fn(|_| {
                let (block, index) = Block::take_slot(block)
                    .unwrap_or_else(|_| std::alloc::handle_alloc_error(std::alloc::Layout::new::<Block>()));
                HazardPointer { block, index, _domain: PhantomData }
            })
        });
        Self { hazards }
    }

    /// The hazard pointers, to protect through.
    ///
    /// ```
    /// use scalemem::hazard::HazardPointerArray;
    /// use std::sync::atomic::AtomicPtr;
    ///
    /// struct Node {
    ///     value: u32,
    ///     next: AtomicPtr<Node>,
    /// }
    /// let second = Box::into_raw(Box::new(Node { value: 2, next: AtomicPtr::default() }));
    /// let head = AtomicPtr::new(Box::into_raw(Box::new(Node { value: 1, next: AtomicPtr::new(second) })));
    /// let domain = scalemem::unique_domain!();
    /// let mut hps = HazardPointerArray::<2, _>::new_in(&domain);
    /// let [h1, h2] = hps.pointers_mut();
    /// // SAFETY: (1) the nodes stay linked and valid until freed below, after the hazard
    /// // pointers are dropped (they are never retired); (2) no `&mut` is taken to them.
    /// let first = unsafe { h1.protect(&head) }.unwrap();
    /// // SAFETY: as above; `first` stays protected by `h1` while `h2` follows its link.
    /// let next = unsafe { h2.protect(&first.next) }.unwrap();
    /// assert_eq!((first.value, next.value), (1, 2));
    /// drop(hps);
    /// // SAFETY: both nodes came from `Box::into_raw`, and nothing protects or frees them else.
    /// unsafe { (drop(Box::from_raw(head.into_inner())), drop(Box::from_raw(second))) };
    /// ```
    pub fn pointers_mut(&mut self) -> &mut [HazardPointer<'d, F>; N] {
        &mut self.hazards
    }

    /// Clears every slot.
    ///
    /// ```
    /// use scalemem::hazard::{HazardPointerArray, drop_box};
    /// use std::sync::atomic::{AtomicPtr, Ordering};
    ///
    /// let domain = scalemem::unique_domain!();
    /// let slot = AtomicPtr::new(Box::into_raw(Box::new(1)));
    /// let mut hps = HazardPointerArray::<2, _>::new_in(&domain);
    /// for hp in hps.pointers_mut() {
    ///     // SAFETY: (1) the slot's boxes are retired to `domain` after being unlinked;
    ///     // (2) no `&mut` is taken to them.
    ///     assert_eq!(unsafe { hp.protect(&slot) }, Some(&1));
    /// }
    /// let old = slot.swap(core::ptr::null_mut(), Ordering::AcqRel);
    /// // SAFETY: (1) `old` is unlinked from `slot`, its only link; (2) retired once;
    /// // (3) `drop_box` frees a box, on any thread.
    /// unsafe { domain.retire_ptr(old, drop_box) };
    /// assert_eq!(domain.reclaim(), 0); // protected twice
    /// hps.reset();
    /// assert_eq!(domain.reclaim(), 1);
    /// ```
    pub fn reset(&mut self) {
        for hazard in &mut self.hazards {
            hazard.reset();
        }
    }
}

impl<const N: usize, F> fmt::Debug for HazardPointerArray<'_, N, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.hazards).finish()
    }
}
