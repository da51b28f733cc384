//! [`Domain`]: a set of hazard pointers and the objects they protect; retire and
//! reclaim; statistics.

use core::fmt;
use core::marker::PhantomData;
use core::ptr::NonNull;

use super::local::with_block;
use super::record::{Block, DomainInner, cfg, threshold_for};
use crate::epoch::{ReclaimFn, Retired};
use crate::util::AllocError;

/// The family of the global domain. Its constructor is private, so the only
/// `Domain<Global>` is [`Domain::global`]: a user domain always has another family type,
/// and a hazard pointer of one cannot be passed where the other's is expected.
///
/// ```
/// use scalemem::hazard::{Domain, Global, HazardPointer};
///
/// let global: &'static Domain<Global> = Domain::global();
/// let hp: HazardPointer<'static, Global> = HazardPointer::new();
/// assert!(hp.is_in(global)); // `HazardPointer::new` takes a slot of the global domain
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Global {
    _private: (),
}

/// A hazard-pointer domain: objects retired to it are freed once no hazard pointer *of
/// this domain* protects them. Most code uses [`Domain::global`] (through
/// [`HazardPointer::new`](super::HazardPointer::new)); a separate domain isolates a
/// subsystem, whose scans then read only its own hazard pointers.
///
/// The type parameter `F` is the domain's *family*, a marker type. A hazard pointer
/// carries its domain's family ([`HazardPointer<'d, F>`](super::HazardPointer)), so code
/// generic over a family cannot protect with one domain's pointers and retire to another
/// by accident; [`unique_domain!`](crate::unique_domain) makes a domain of a fresh family
/// each time it is expanded. Debug builds also check, at each retire, that the object is
/// not protected by the calling thread through a hazard pointer of another domain.
///
/// A domain lives until its last handle (clones included) is dropped: then every object
/// still retired to it is freed (no hazard pointer can exist: they borrow a handle), and
/// its memory returns to the kernel once the threads that cached a record of it have
/// moved on or exited.
///
/// ```
/// use scalemem::hazard::{Domain, HazardPointer};
/// use std::sync::atomic::{AtomicPtr, Ordering};
///
/// let domain = scalemem::unique_domain!();
/// let slot = AtomicPtr::new(Box::into_raw(Box::new(7u32)));
/// let mut hp = HazardPointer::new_in(&domain);
/// // SAFETY: the slot's objects are boxes retired to `domain` after being unlinked.
/// assert_eq!(unsafe { hp.protect(&slot) }, Some(&7));
/// let old = slot.swap(Box::into_raw(Box::new(8)), Ordering::AcqRel);
/// // SAFETY: `old` is unlinked, came from a Box, and is retired once.
/// unsafe { domain.retire_ptr(old, scalemem::hazard::drop_box) };
/// drop(hp);
/// assert_eq!(domain.reclaim(), 1); // nothing protects it any more
/// # // SAFETY: boxes of this example, freed once; nothing retired them.
/// # unsafe { drop(Box::from_raw(slot.into_inner())) };
/// ```
pub struct Domain<F = Global> {
    pub(crate) inner: NonNull<DomainInner>,
    _family: PhantomData<fn() -> F>,
}

// SAFETY: a Domain is a counted reference to a DomainInner, whose shared state is atomics
// and whose per-thread state is reached only through blocks claimed by one thread.
// - Send: the reference may be released from any thread (release_handle is atomic RMWs;
//   the sweep it may run frees objects whose reclaim functions may run on any thread, a
//   requirement of every retire).
// - Sync: &Domain creates hazard pointers and retires on the calling thread's own block.
unsafe impl<F> Send for Domain<F> {}
// SAFETY: see the Send impl.
unsafe impl<F> Sync for Domain<F> {}

#[cfg(not(scalemem_loom))]
mod global {
    use super::{Domain, DomainInner, Global, NonNull, PhantomData};

    static INNER: DomainInner = DomainInner::new_static();

    pub(super) static GLOBAL: Domain<Global> = Domain {
        // SAFETY: the address of a static is never null.
        inner: unsafe { NonNull::new_unchecked(&INNER as *const DomainInner as *mut DomainInner) },
        _family: PhantomData,
    };
}

#[cfg(scalemem_loom)]
mod global {
    crate::sync::lazy_static! {
        pub(super) static ref GLOBAL: super::Domain<super::Global> =
            super::Domain::new(super::Global { _private: () });
    }
}

/// The global domain's shared state.
#[inline]
pub(crate) fn global_inner() -> NonNull<DomainInner> {
    global::GLOBAL.inner
}

/// Calls `f` with this thread's primary block in `inner`; aborts if the kernel refuses
/// memory for a new block, like `Box::new`.
#[inline]
pub(crate) fn with_thread_block<R>(inner: NonNull<DomainInner>, f: impl FnOnce(NonNull<Block>) -> R) -> R {
    match with_block(inner, global_inner(), f) {
        Ok(r) => r,
        Err(AllocError) => std::alloc::handle_alloc_error(std::alloc::Layout::new::<Block>()),
    }
}

impl Domain<Global> {
    /// The process-wide default domain.
    ///
    /// ```
    /// let stats = scalemem::hazard::Domain::global().stats();
    /// assert!(stats.hazards >= stats.threads);
    /// ```
    #[inline]
    pub fn global() -> &'static Domain<Global> {
        &global::GLOBAL
    }
}

impl<F> Domain<F> {
    /// A new domain of family `F`. Aborts if the kernel refuses a page of memory, like
    /// `Box::new`; see [`try_new`](Domain::try_new). Prefer
    /// [`unique_domain!`](crate::unique_domain), which makes the family unique.
    ///
    /// ```
    /// use scalemem::hazard::{Domain, HazardPointer};
    ///
    /// struct Sessions; // the family: a marker type of the subsystem
    /// let domain = Domain::new(Sessions);
    /// let hp = HazardPointer::new_in(&domain);
    /// assert!(hp.is_in(&domain));
    /// assert_eq!(domain.stats().threads, 1); // only this thread holds a record of it
    /// ```
    pub fn new(family: F) -> Self {
        Self::try_new(family).unwrap_or_else(|_| std::alloc::handle_alloc_error(std::alloc::Layout::new::<Block>()))
    }

    /// A new domain, or `Err` if the kernel refuses the memory.
    ///
    /// ```
    /// use scalemem::hazard::{Domain, drop_box};
    ///
    /// struct Sessions;
    /// let domain = Domain::try_new(Sessions)?;
    /// // SAFETY: (1) the box was never shared; (2) it is retired once; (3) `drop_box`
    /// // frees a box, on any thread.
    /// unsafe { domain.retire_ptr(Box::into_raw(Box::new(1)), drop_box) };
    /// assert_eq!(domain.reclaim(), 1);
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub fn try_new(family: F) -> Result<Self, AllocError> {
        drop(family);
        Ok(Self { inner: DomainInner::new_mapped()?, _family: PhantomData })
    }

    pub(crate) fn inner(&self) -> &DomainInner {
        // SAFETY: this handle keeps the domain alive.
        unsafe { self.inner.as_ref() }
    }

    /// Retires `ptr`: `deleter(ptr)` runs once no hazard pointer of this domain protects
    /// it. Allocates one small node per call (use [`retire`](Domain::retire) with an
    /// embedded link to avoid it). May run a scan, which frees other objects.
    ///
    /// # Safety
    /// 1. `ptr` is unreachable for any thread that protects from now on: it has been
    ///    unlinked from every `AtomicPtr` through which hazard pointers of this domain
    ///    reach it, and it is not linked again.
    /// 2. It is retired once (to one domain), and stays valid until `deleter` runs.
    /// 3. `deleter(ptr)` frees it correctly, and may run on any thread (as if `T: Send`).
    ///
    /// ```
    /// use scalemem::hazard::HazardPointer;
    /// use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
    ///
    /// static DELETED: AtomicUsize = AtomicUsize::new(0);
    /// unsafe fn delete(ptr: *mut u32) {
    ///     // SAFETY: the only pointers retired with `delete` come from `Box::into_raw`.
    ///     drop(unsafe { Box::from_raw(ptr) });
    ///     DELETED.fetch_add(1, Ordering::Relaxed);
    /// }
    ///
    /// let domain = scalemem::unique_domain!();
    /// let slot = AtomicPtr::new(Box::into_raw(Box::new(1u32)));
    /// let mut hp = HazardPointer::new_in(&domain);
    /// // SAFETY: (1) the slot's boxes are retired to `domain` after being unlinked; (2) no
    /// // `&mut` is taken to them.
    /// assert_eq!(unsafe { hp.protect(&slot) }, Some(&1));
    /// let old = slot.swap(core::ptr::null_mut(), Ordering::AcqRel);
    /// // SAFETY: (1) `old` is unlinked from `slot`, its only link; (2) retired once;
    /// // (3) `delete` frees a box, on any thread.
    /// unsafe { domain.retire_ptr(old, delete) };
    /// domain.reclaim();
    /// assert_eq!(DELETED.load(Ordering::Relaxed), 0); // `hp` still protects it
    /// drop(hp);
    /// domain.reclaim();
    /// assert_eq!(DELETED.load(Ordering::Relaxed), 1);
    /// ```
    pub unsafe fn retire_ptr<T>(&self, ptr: *mut T, deleter: unsafe fn(*mut T)) {
        #[repr(C)]
        struct Node {
            link: Retired,
            ptr: *mut u8,
            deleter: unsafe fn(*mut u8),
        }
        /// # Safety
        /// `link` is the link of a boxed `Node` whose pointer may now be deleted.
        unsafe fn reclaim_node(link: NonNull<Retired>) {
            // SAFETY: every link retired with this function is the first field of a
            // boxed Node (below); the node is ours now.
            let node = unsafe { Box::from_raw(link.cast::<Node>().as_ptr()) };
            // SAFETY: the retire contract: nothing protects `ptr` any more.
            unsafe { (node.deleter)(node.ptr) };
        }
        // SAFETY: `unsafe fn(*mut T)` and `unsafe fn(*mut u8)` are ABI-compatible (thin
        // raw pointers of sized types); the deleter is only ever called with `ptr`.
        let deleter = unsafe { core::mem::transmute::<unsafe fn(*mut T), unsafe fn(*mut u8)>(deleter) };
        #[cfg(debug_assertions)]
        self.check_not_protected_elsewhere(ptr as usize);
        let node = Box::into_raw(Box::new(Node { link: Retired::new(), ptr: ptr.cast(), deleter }));
        // SAFETY: (1)-(3) are the caller's for `ptr`; the node is ours and freed by
        // reclaim_node. The protected address is `ptr`, the link the node's.
        unsafe { self.retire_link(ptr as usize, NonNull::new_unchecked(node).cast(), reclaim_node) };
    }

    /// Retires an object that embeds a [`Retired`] link, without allocating: `reclaim`
    /// is called with the link once no hazard pointer of this domain protects `object`
    /// (the address hazard pointers hold, which need not be the link's). This is the path
    /// for an allocator's own metadata. May run a scan.
    ///
    /// # Safety
    /// 1. As for [`retire_ptr`](Domain::retire_ptr) (1) and (2), for `object`.
    /// 2. `link` is embedded in the object (or otherwise valid until `reclaim` runs) and
    ///    is not touched by anyone else until then.
    /// 3. `reclaim` frees the object correctly from its link, and may run on any thread.
    ///
    /// ```
    /// use scalemem::hazard::{HazardPointer, Retired};
    /// use std::ptr::NonNull;
    /// use std::sync::atomic::{AtomicPtr, Ordering};
    ///
    /// #[repr(C)]
    /// struct Node {
    ///     link: Retired, // first field, so a *Retired is a *Node
    ///     value: u64,
    /// }
    /// unsafe fn free_node(link: NonNull<Retired>) {
    ///     // SAFETY: every link retired with `free_node` is the first field of a boxed Node.
    ///     drop(unsafe { Box::from_raw(link.cast::<Node>().as_ptr()) });
    /// }
    ///
    /// let domain = scalemem::unique_domain!();
    /// let slot = AtomicPtr::new(Box::into_raw(Box::new(Node { link: Retired::new(), value: 7 })));
    /// let mut hp = HazardPointer::new_in(&domain);
    /// // SAFETY: (1) the slot's nodes are retired to `domain` after being unlinked; (2) no
    /// // `&mut` is taken to them.
    /// assert_eq!(unsafe { hp.protect(&slot) }.map(|node| node.value), Some(7));
    /// let node = slot.swap(core::ptr::null_mut(), Ordering::AcqRel);
    /// // SAFETY: (1) `node` is unlinked from `slot`, its only link, and retired once;
    /// // (2) `link` is its own, untouched by others; (3) `free_node` frees it, on any thread.
    /// unsafe { domain.retire(node, NonNull::new(node).unwrap().cast(), free_node) };
    /// assert_eq!(domain.reclaim(), 0); // `hp` protects the node's address
    /// hp.reset();
    /// assert_eq!(domain.reclaim(), 1);
    /// ```
    pub unsafe fn retire<T>(&self, object: *const T, link: NonNull<Retired>, reclaim: ReclaimFn) {
        let address = object as *const u8 as usize;
        #[cfg(debug_assertions)]
        self.check_not_protected_elsewhere(address);
        // SAFETY: (1)-(3) are the caller's.
        unsafe { self.retire_link(address, link, reclaim) };
    }

    /// Queues `link` (protected address `address`) on this thread's list.
    ///
    /// # Safety
    /// As for [`retire`](Domain::retire).
    unsafe fn retire_link(&self, address: usize, link: NonNull<Retired>, reclaim: ReclaimFn) {
        with_thread_block(self.inner, |block| {
            // SAFETY: the block is this thread's primary block in this domain; the rest is
            // the caller's contract.
            unsafe { Block::retire(block, address, link, reclaim) }
        });
    }

    /// Debug check against mixing domains: the object must not be protected by one of
    /// this thread's hazard pointers of *another* domain (which this domain's scans do
    /// not read).
    #[cfg(debug_assertions)]
    fn check_not_protected_elsewhere(&self, address: usize) {
        use crate::sync::atomic::Ordering;
        super::local::for_each_cached(|block| {
            // SAFETY: cached blocks are this thread's and alive.
            let block = unsafe { block.as_ref() };
            if core::ptr::eq(block.domain(), self.inner()) {
                return;
            }
            for slot in &block.slots {
                // Relaxed: our own thread's stores.
                assert!(
                    slot.load(Ordering::Relaxed) as usize != address,
                    "an object protected by a hazard pointer of another domain was retired to this one"
                );
            }
        });
    }

    /// Scans now: frees every object this thread retired to the domain (and any that
    /// exited threads left behind) that no hazard pointer protects. Returns how many were
    /// freed. Costs one heavy fence (a `membarrier`).
    ///
    /// ```
    /// use scalemem::hazard::HazardPointer;
    /// use std::sync::atomic::AtomicPtr;
    ///
    /// let domain = scalemem::unique_domain!();
    /// let p = Box::into_raw(Box::new(5u32));
    /// let slot = AtomicPtr::new(p);
    /// let mut hp = HazardPointer::new_in(&domain);
    /// // SAFETY: `slot` holds a live box until it is retired below.
    /// assert_eq!(unsafe { hp.protect(&slot) }, Some(&5));
    /// slot.store(std::ptr::null_mut(), std::sync::atomic::Ordering::Release);
    /// // SAFETY: (1) unlinked from `slot`; (2) retired once; (3) `drop_box` frees a box.
    /// unsafe { domain.retire_ptr(p, scalemem::hazard::drop_box::<u32>) };
    /// assert_eq!(domain.reclaim(), 0); // still protected
    /// hp.reset();
    /// assert_eq!(domain.reclaim(), 1);
    /// ```
    pub fn reclaim(&self) -> usize {
        with_thread_block(self.inner, |block| {
            // SAFETY: the block is this thread's primary block in this domain.
            unsafe { self.inner().scan(block) }
        })
    }

    /// A snapshot of the domain's counters (walks the records: not for hot paths).
    ///
    /// ```
    /// let domain = scalemem::unique_domain!();
    /// let stats = domain.stats();
    /// assert_eq!(stats.retired, 0);
    /// assert!(stats.threshold() >= scalemem::hazard::SCAN_THRESHOLD_MIN);
    /// ```
    pub fn stats(&self) -> DomainStats {
        let counts = self.inner().counts();
        DomainStats {
            hazards: counts.blocks * cfg::SLOTS,
            records: counts.blocks,
            threads: counts.claimed,
            retired: counts.retired,
            scans: counts.scans,
            reclaimed: counts.reclaimed,
        }
    }
}

/// `C` in the scan threshold `R = max(C, K * H)` (see the [module doc](super)).
pub const SCAN_THRESHOLD_MIN: usize = cfg::THRESHOLD_MIN;
/// `K` in the scan threshold `R = max(C, K * H)`.
pub const SCAN_THRESHOLD_FACTOR: usize = cfg::THRESHOLD_FACTOR;
/// Hazard slots per record (a thread holding more hazard pointers in a domain at once
/// claims further records).
pub const SLOTS_PER_RECORD: usize = cfg::SLOTS;

/// What [`Domain::stats`] reports.
///
/// ```
/// use scalemem::hazard::drop_box;
///
/// let domain = scalemem::unique_domain!();
/// // SAFETY: (1) the box was never shared; (2) it is retired once; (3) `drop_box` frees
/// // a box, on any thread.
/// unsafe { domain.retire_ptr(Box::into_raw(Box::new(1)), drop_box) };
/// let before = domain.stats();
/// assert_eq!((before.retired, before.scans, before.reclaimed), (1, 0, 0));
/// domain.reclaim();
/// let after = domain.stats();
/// assert_eq!((after.retired, after.scans, after.reclaimed), (0, 1, 1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DomainStats {
    /// `H`: hazard slots in the domain (every record's, taken or not).
    pub hazards: usize,
    /// Records mapped (reused after thread exit, so this follows the peak of `threads`;
    /// threads that find no free record at the same moment map a page of 15 each).
    pub records: usize,
    /// Records claimed now (threads that use the domain, plus overflow records).
    pub threads: usize,
    /// Objects retired and not yet reclaimed, on every record's list.
    pub retired: usize,
    /// Scans run so far.
    pub scans: usize,
    /// Objects reclaimed so far.
    pub reclaimed: usize,
}

impl DomainStats {
    /// `R = max(C, K * H)`: a thread scans when its list reaches this many objects.
    ///
    /// ```
    /// use scalemem::hazard::{HazardPointer, SCAN_THRESHOLD_FACTOR, SCAN_THRESHOLD_MIN};
    ///
    /// let domain = scalemem::unique_domain!();
    /// let _hp = HazardPointer::new_in(&domain); // maps this thread's first records
    /// let stats = domain.stats();
    /// assert!(stats.hazards > 0);
    /// assert_eq!(stats.threshold(), SCAN_THRESHOLD_MIN.max(SCAN_THRESHOLD_FACTOR * stats.hazards));
    /// ```
    pub fn threshold(&self) -> usize {
        threshold_for(self.hazards)
    }

    /// The bound on [`retired`](DomainStats::retired) when `retiring` records hold
    /// retired objects: `retiring * R` (module doc, "Bounded garbage"), saturating at
    /// `usize::MAX`.
    ///
    /// ```
    /// use scalemem::hazard::drop_box;
    ///
    /// let domain = scalemem::unique_domain!();
    /// for i in 0..3 {
    ///     // SAFETY: (1) the box was never shared; (2) it is retired once; (3) `drop_box`
    ///     // frees a box, on any thread.
    ///     unsafe { domain.retire_ptr(Box::into_raw(Box::new(i)), drop_box) };
    /// }
    /// let stats = domain.stats();
    /// assert_eq!(stats.bound(2), 2 * stats.threshold());
    /// assert!(stats.retired == 3 && stats.retired <= stats.bound(1)); // one retiring thread
    /// ```
    pub fn bound(&self, retiring: usize) -> usize {
        retiring.saturating_mul(self.threshold())
    }
}

impl<F> Clone for Domain<F> {
    fn clone(&self) -> Self {
        self.inner().acquire_handle();
        Self { inner: self.inner, _family: PhantomData }
    }
}

impl<F> Drop for Domain<F> {
    fn drop(&mut self) {
        // SAFETY: this handle is given up and `self` is not used again.
        unsafe { DomainInner::release_handle(self.inner) };
    }
}

impl<F> PartialEq for Domain<F> {
    /// Two handles are equal if they refer to the same domain.
    fn eq(&self, other: &Self) -> bool {
        self.inner == other.inner
    }
}

impl<F> Eq for Domain<F> {}

impl<F> fmt::Debug for Domain<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Domain").field("stats", &self.stats()).finish()
    }
}

/// Frees a `Box<T>` from its raw pointer: the usual `deleter` for
/// [`Domain::retire_ptr`].
///
/// # Safety
/// `ptr` came from `Box::into_raw` and is freed once.
///
/// ```
/// use scalemem::hazard::drop_box;
/// use std::sync::Arc;
///
/// let shared = Arc::new(());
/// let domain = scalemem::unique_domain!();
/// let boxed = Box::into_raw(Box::new(Arc::clone(&shared)));
/// // SAFETY: (1) the box was never shared; (2) it is retired once; (3) `drop_box` frees
/// // a box (its contents are `Send`), on any thread.
/// unsafe { domain.retire_ptr(boxed, drop_box) };
/// domain.reclaim();
/// assert_eq!(Arc::strong_count(&shared), 1); // the box and its contents were dropped
/// ```
pub unsafe fn drop_box<T>(ptr: *mut T) {
    // SAFETY: per the contract.
    drop(unsafe { Box::from_raw(ptr) });
}

/// A [`Domain`] of a fresh family type: each expansion of the macro names a different
/// type, so hazard pointers of one such domain do not type-check against another.
///
/// ```
/// let a = scalemem::unique_domain!();
/// let b = scalemem::unique_domain!();
/// // `a` and `b` have different types: `let _: [_; 2] = [a, b];` does not compile.
/// # drop((a, b));
/// ```
#[macro_export]
macro_rules! unique_domain {
    () => {{
        #[derive(Debug, Clone, Copy)]
        struct UniqueFamily;
        $crate::hazard::Domain::new(UniqueFamily)
    }};
}
