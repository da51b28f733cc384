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
    #[inline]
    pub fn protect_raw<T>(&mut self, ptr: *mut T) {
        self.publish(ptr.cast());
    }

    /// Clears the slot: the previously protected object may now be freed.
    #[inline]
    pub fn reset(&mut self) {
        // Release: the reader's accesses to the object happen before any scan that reads
        // the null (Acquire) and then frees it.
        self.slot().store(ptr::null_mut(), Ordering::Release);
    }

    /// Whether this hazard pointer belongs to `domain` (for debug checks in data
    /// structures that hold both).
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
/// # unsafe { drop(Box::from_raw(a.into_inner())); drop(Box::from_raw(b.into_inner())) };
/// ```
pub struct HazardPointerArray<'d, const N: usize, F = Global> {
    hazards: [HazardPointer<'d, F>; N],
}

impl<const N: usize> HazardPointerArray<'static, N, Global> {
    /// `N` hazard pointers in the global domain.
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
    pub fn pointers_mut(&mut self) -> &mut [HazardPointer<'d, F>; N] {
        &mut self.hazards
    }

    /// Clears every slot.
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
