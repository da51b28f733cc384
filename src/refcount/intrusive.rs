//! Refcache counts for objects the caller places itself: [`RcHeader`] embedded in the
//! object, [`Refcache::inc`]/[`Refcache::dec`] on a raw pointer, and an [`RcRelease`]
//! callback that runs when the count has stayed zero, untouched, for two epochs. Nothing
//! is boxed: this is the form the allocator's own metadata uses (a region header that
//! counts the region's live slabs, and goes back to the kernel only once the count has
//! stayed zero; see `DESIGN.md`).
//!
//! The protocol is the one of the [`refcache`](super::refcache) module documentation,
//! unchanged: the header is the same header [`RcRef`](super::RcRef) objects carry, and
//! [`Refcache::try_revive`] is the weak upgrade (one SeqCst RMW that adds to the global
//! count and clears the dying bit, so that of a revival and the reviewer's free exactly
//! one wins).
//!
//! # The release step
//!
//! A boxed object's header is freed in two steps (drop the value, then deallocate when
//! the last weak unit goes). An intrusive object has no weak handles: its header holds
//! only the strong side's unit, so both steps happen back to back on the reviewing
//! thread, and [`RcRelease::release`] runs in the second, after which the domain never
//! touches the header again. The callback may therefore unmap the memory the header
//! lives in.
//!
//! # Reviving
//!
//! A structure that keeps zero-count objects for reuse (a list of empty regions) must
//! make sure that the header it revives has not been released, and will not be while it
//! looks: the usual way is a lock that both the reviver and the release callback take
//! (the callback unlinks the object under it; a reviver that finds it still linked calls
//! [`Refcache::try_revive`], which fails if the free won the race, and the object then
//! stays unlinked-to-be until the callback runs).

use core::ptr::NonNull;

use super::Refcache;
use super::rcref::{FreeStep, Header, add_count};
use crate::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// What runs when an intrusively counted object is freed.
///
/// ```
/// use core::ptr::NonNull;
/// use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
/// use scalemem::refcount::{Config, RcHeader, RcRelease, Refcache};
///
/// #[repr(C)]
/// struct Region {
///     header: RcHeader, // first field: the header's address is the region's
///     pages: usize,
/// }
/// static PAGES_FREED: AtomicUsize = AtomicUsize::new(0);
/// struct FreeRegion;
/// impl RcRelease for FreeRegion {
///     unsafe fn release(header: NonNull<RcHeader>) {
///         // SAFETY: every header released here is the first field of a boxed repr(C)
///         // Region, cast from the box's pointer; the domain releases it once and never
///         // touches it again.
///         let region = unsafe { Box::from_raw(header.cast::<Region>().as_ptr()) };
///         PAGES_FREED.fetch_add(region.pages, SeqCst);
///     }
/// }
///
/// let cache = Refcache::with_config(Config::manual()).unwrap();
/// let region = Box::into_raw(Box::new(Region { header: RcHeader::new::<FreeRegion>(), pages: 16 }));
/// let obj = NonNull::new(region).unwrap().cast::<RcHeader>();
/// // SAFETY: a fresh header, registered once, valid until FreeRegion frees the region.
/// unsafe { cache.register(obj) };
/// // SAFETY: gives up the creator's reference; registered.
/// unsafe { cache.dec(obj) };
/// let mut ticks = 0;
/// while PAGES_FREED.load(SeqCst) == 0 {
///     cache.tick(); // zero for two whole epochs, untouched: FreeRegion runs
///     ticks += 1;
///     assert!(ticks <= 8, "never released");
/// }
/// assert_eq!(PAGES_FREED.load(SeqCst), 16);
/// ```
pub trait RcRelease {
    /// Called once, on the thread that reviews the object, when its count has stayed
    /// zero and untouched for two whole epochs (or when the domain is dropped with the
    /// count at zero). After it returns, nothing touches `header` again: the callback may
    /// free or unmap the memory that holds it.
    ///
    /// # Safety
    /// Called by the domain only, once per object, with the header of a freed object.
    unsafe fn release(header: NonNull<RcHeader>);
}

/// The header an object embeds to be counted by a [`Refcache`] through raw pointers: 40
/// bytes, 8-byte aligned, anywhere in the object (the callback receives its address).
///
/// ```
/// use core::ptr::NonNull;
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use scalemem::refcount::{Config, RcHeader, RcRelease, Refcache};
///
/// static RELEASED: AtomicUsize = AtomicUsize::new(0);
/// struct CountRelease;
/// impl RcRelease for CountRelease {
///     unsafe fn release(header: NonNull<RcHeader>) {
///         // SAFETY: the header is the `Box` below, released once and not used after.
///         drop(unsafe { Box::from_raw(header.as_ptr()) });
///         RELEASED.fetch_add(1, Ordering::Relaxed);
///     }
/// }
///
/// let cache = Refcache::with_config(Config::manual()).unwrap();
/// let obj = NonNull::from(Box::leak(Box::new(RcHeader::new::<CountRelease>())));
/// // SAFETY: a fresh header (count 1) that stays valid until released.
/// unsafe {
///     cache.register(obj);
///     cache.inc(obj); // 2
///     cache.dec(obj); // 1
///     cache.dec(obj); // 0: freed two epochs later, unless revived
/// }
/// let mut ticks = 0;
/// while RELEASED.load(Ordering::Relaxed) == 0 {
///     cache.tick(); // zero for two whole epochs, untouched: released
///     ticks += 1;
///     assert!(ticks <= 8, "never released");
/// }
/// ```
#[repr(transparent)]
pub struct RcHeader(Header);

impl RcHeader {
    /// A header with a count of one (the creator's reference), whose release runs
    /// `R::release`. Register it with [`Refcache::register`] before counting through it.
    ///
    /// ```
    /// use core::ptr::NonNull;
    /// use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    /// use scalemem::refcount::{Config, RcHeader, RcRelease, Refcache};
    ///
    /// static RELEASED: AtomicBool = AtomicBool::new(false);
    /// struct FreeBox;
    /// impl RcRelease for FreeBox {
    ///     unsafe fn release(header: NonNull<RcHeader>) {
    ///         // SAFETY: the header released here came from `Box::new`, and the domain
    ///         // releases it once and never touches it again.
    ///         drop(unsafe { Box::from_raw(header.as_ptr()) });
    ///         RELEASED.store(true, SeqCst);
    ///     }
    /// }
    ///
    /// let header = RcHeader::new::<FreeBox>();
    /// assert_eq!(header.global_count(), 1); // the creator's reference
    /// let cache = Refcache::with_config(Config::manual()).unwrap();
    /// let obj = NonNull::from(Box::leak(Box::new(header)));
    /// // SAFETY: a fresh header, registered once, valid until FreeBox frees it.
    /// unsafe { cache.register(obj) };
    /// // SAFETY: gives up the creator's reference; registered.
    /// unsafe { cache.dec(obj) };
    /// drop(cache); // the count is zero: the domain releases it on its way out
    /// assert!(RELEASED.load(SeqCst));
    /// ```
    pub fn new<R: RcRelease>() -> Self {
        Self(Header {
            state: AtomicUsize::new(add_count(0, 1)),
            // The strong side's unit only: there are no weak handles.
            weak: AtomicUsize::new(1),
            review_epoch: AtomicUsize::new(0),
            next: AtomicPtr::new(core::ptr::null_mut()),
            free: release_shim::<R>,
        })
    }

    /// The global count (without the deltas cached on CPUs, so not the true count): for
    /// statistics and tests.
    ///
    /// ```
    /// use core::ptr::NonNull;
    /// use scalemem::refcount::{Config, RcHeader, RcRelease, Refcache};
    ///
    /// struct FreeBox;
    /// impl RcRelease for FreeBox {
    ///     unsafe fn release(header: NonNull<RcHeader>) {
    ///         // SAFETY: the header released here came from `Box::new`, and the domain
    ///         // releases it once and never touches it again.
    ///         drop(unsafe { Box::from_raw(header.as_ptr()) });
    ///     }
    /// }
    ///
    /// let cache = Refcache::with_config(Config::manual()).unwrap();
    /// let obj = NonNull::from(Box::leak(Box::new(RcHeader::new::<FreeBox>())));
    /// // SAFETY: a fresh header, registered once, valid until FreeBox frees it.
    /// unsafe { cache.register(obj) };
    /// // SAFETY: we hold the creator's reference, so the count is not zero; registered.
    /// unsafe { cache.inc(obj) }; // a +1 delta, cached on this CPU
    /// cache.tick();
    /// cache.tick(); // every CPU's cache flushed into the header
    /// // SAFETY: our two references keep the header alive (FreeBox has not run).
    /// assert_eq!(unsafe { obj.as_ref() }.global_count(), 2);
    /// // SAFETY: gives up both our references; registered.
    /// unsafe {
    ///     cache.dec(obj);
    ///     cache.dec(obj);
    /// }
    /// drop(cache); // flushes the -2 and releases the header (count zero)
    /// ```
    pub fn global_count(&self) -> isize {
        // Relaxed: a statistic.
        super::rcref::count_of(self.0.state.load(Ordering::Relaxed))
    }
}

impl core::fmt::Debug for RcHeader {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RcHeader").field("global_count", &self.global_count()).finish_non_exhaustive()
    }
}

/// The header's `free` for intrusive objects: nothing to drop; the release callback
/// runs in the deallocation step (the last weak unit, which is the strong side's).
///
/// # Safety
/// As for `Header::free`: called once per step by the domain.
unsafe fn release_shim<R: RcRelease>(this: NonNull<Header>, step: FreeStep) {
    if step == FreeStep::Dealloc {
        // SAFETY: RcHeader is repr(transparent) over Header; the object is freed (the
        // domain calls this once, after the value step) and nothing touches the header
        // afterwards (drop_weak_unit returns right after calling us).
        unsafe { R::release(this.cast()) };
    }
}

/// Counting objects that embed an [`RcHeader`], through raw pointers.
///
/// ```
/// use core::ptr::NonNull;
/// use scalemem::refcount::{Config, RcHeader, RcRelease, Refcache};
///
/// struct FreeBox; // frees a boxed header once its count has stayed zero
/// impl RcRelease for FreeBox {
///     unsafe fn release(header: NonNull<RcHeader>) {
///         // SAFETY: every header released here came from `Box::new`, and the domain
///         // never touches it again.
///         drop(unsafe { Box::from_raw(header.as_ptr()) });
///     }
/// }
///
/// let cache = Refcache::with_config(Config::manual()).unwrap();
/// let obj = NonNull::from(Box::leak(Box::new(RcHeader::new::<FreeBox>())));
/// // SAFETY: a fresh header, registered once, valid until FreeBox frees it.
/// unsafe { cache.register(obj) };
/// // SAFETY: we hold the creator's reference, so the count is not zero; registered.
/// unsafe { cache.inc(obj) }; // a second reference, cached on this CPU
/// // SAFETY: both references are ours to drop; registered.
/// unsafe { cache.dec(obj) };
/// unsafe { cache.dec(obj) };
/// let mut ticks = 0;
/// while cache.stats().freed == 0 {
///     cache.tick(); // zero for two whole epochs: FreeBox runs
///     ticks += 1;
///     assert!(ticks <= 8, "never freed");
/// }
/// assert_eq!(cache.stats().live, 0);
/// ```
impl Refcache {
    /// Adopts a fresh header (count one, from [`RcHeader::new`]) into this domain's
    /// statistics. Counting operations through a header must all use one domain.
    ///
    /// # Safety
    /// `obj` is a header made by `RcHeader::new`, not yet counted through, that stays
    /// valid until its release callback runs; it is registered once.
    ///
    /// ```
    /// use core::ptr::NonNull;
    /// use scalemem::refcount::{Config, RcHeader, RcRelease, Refcache};
    ///
    /// struct FreeBox; // frees a boxed header once its count has stayed zero
    /// impl RcRelease for FreeBox {
    ///     unsafe fn release(header: NonNull<RcHeader>) {
    ///         // SAFETY: every header released here came from `Box::new`, and the domain
    ///         // never touches it again.
    ///         drop(unsafe { Box::from_raw(header.as_ptr()) });
    ///     }
    /// }
    ///
    /// let cache = Refcache::with_config(Config::manual()).unwrap();
    /// let obj = NonNull::from(Box::leak(Box::new(RcHeader::new::<FreeBox>())));
    /// assert_eq!(cache.stats().live, 0);
    /// // SAFETY: a fresh header, registered once, valid until FreeBox frees it.
    /// unsafe { cache.register(obj) };
    /// assert_eq!(cache.stats().live, 1);
    /// // SAFETY: drops the creator's reference; registered.
    /// unsafe { cache.dec(obj) };
    /// drop(cache); // the count is zero: the domain frees it on its way out
    /// ```
    pub unsafe fn register(&self, obj: NonNull<RcHeader>) {
        let _ = obj;
        // Relaxed: a statistic.
        self.domain().allocated.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes one more reference: the current CPU's delta for the object goes up by one
    /// (an rseq section when its entry is cached here). Never allocates.
    ///
    /// # Safety
    /// The caller holds a reference to `obj` (or knows the count is not zero, which is
    /// the same thing), so the object is not being freed; `obj` is registered with this
    /// domain.
    ///
    /// ```
    /// use core::ptr::NonNull;
    /// use scalemem::refcount::{Config, RcHeader, RcRelease, Refcache};
    ///
    /// struct FreeBox; // frees a boxed header once its count has stayed zero
    /// impl RcRelease for FreeBox {
    ///     unsafe fn release(header: NonNull<RcHeader>) {
    ///         // SAFETY: every header released here came from `Box::new`, and the domain
    ///         // never touches it again.
    ///         drop(unsafe { Box::from_raw(header.as_ptr()) });
    ///     }
    /// }
    ///
    /// let cache = Refcache::with_config(Config::manual()).unwrap();
    /// let obj = NonNull::from(Box::leak(Box::new(RcHeader::new::<FreeBox>())));
    /// // SAFETY: a fresh header, registered once, valid until FreeBox frees it.
    /// unsafe { cache.register(obj) };
    /// // SAFETY: we hold the creator's reference, so the count is not zero; registered.
    /// unsafe { cache.inc(obj) };
    /// // SAFETY: gives up the creator's reference; registered.
    /// unsafe { cache.dec(obj) };
    /// for _ in 0..8 {
    ///     cache.tick();
    /// }
    /// assert_eq!(cache.stats().freed, 0); // the reference taken by `inc` keeps it
    /// // SAFETY: the count is one (ours), so FreeBox has not run: the header is valid.
    /// assert_eq!(unsafe { obj.as_ref() }.global_count(), 1); // every delta flushed
    /// // SAFETY: gives up the reference taken by `inc`; registered.
    /// unsafe { cache.dec(obj) };
    /// ```
    #[inline]
    pub unsafe fn inc(&self, obj: NonNull<RcHeader>) {
        self.domain().add(obj.cast(), 1);
    }

    /// Drops one reference. When the true count reaches zero, the object is freed two
    /// epochs later (its release callback runs) unless it is revived or counted again
    /// meanwhile. Never allocates.
    ///
    /// # Safety
    /// The caller gives up a reference it holds; `obj` is registered with this domain.
    ///
    /// ```
    /// use core::ptr::NonNull;
    /// use scalemem::refcount::{Config, RcHeader, RcRelease, Refcache};
    ///
    /// struct FreeBox; // frees a boxed header once its count has stayed zero
    /// impl RcRelease for FreeBox {
    ///     unsafe fn release(header: NonNull<RcHeader>) {
    ///         // SAFETY: every header released here came from `Box::new`, and the domain
    ///         // never touches it again.
    ///         drop(unsafe { Box::from_raw(header.as_ptr()) });
    ///     }
    /// }
    ///
    /// let cache = Refcache::with_config(Config::manual()).unwrap();
    /// let obj = NonNull::from(Box::leak(Box::new(RcHeader::new::<FreeBox>())));
    /// // SAFETY: a fresh header, registered once, valid until FreeBox frees it.
    /// unsafe { cache.register(obj) };
    /// // SAFETY: gives up the creator's reference; registered.
    /// unsafe { cache.dec(obj) };
    /// assert_eq!(cache.stats().freed, 0); // not at once: zero is detected by epochs
    /// let mut ticks = 0;
    /// while cache.stats().freed == 0 {
    ///     cache.tick();
    ///     ticks += 1;
    ///     assert!(ticks <= 8, "never freed");
    /// }
    /// ```
    #[inline]
    pub unsafe fn dec(&self, obj: NonNull<RcHeader>) {
        self.domain().add(obj.cast(), -1);
    }

    /// Takes a reference to an object whose count may be zero (one waiting to be
    /// freed), unless it has been freed already: `true` if the caller now holds a
    /// reference. One SeqCst RMW on the header (the weak upgrade of the paper).
    ///
    /// # Safety
    /// The header's memory is valid during the call: its release callback has not
    /// returned, and does not return while the call runs (see the module documentation
    /// for the usual lock).
    ///
    /// ```
    /// use core::ptr::NonNull;
    /// use scalemem::refcount::{Config, RcHeader, RcRelease, Refcache};
    ///
    /// struct FreeBox; // frees a boxed header once its count has stayed zero
    /// impl RcRelease for FreeBox {
    ///     unsafe fn release(header: NonNull<RcHeader>) {
    ///         // SAFETY: every header released here came from `Box::new`, and the domain
    ///         // never touches it again.
    ///         drop(unsafe { Box::from_raw(header.as_ptr()) });
    ///     }
    /// }
    ///
    /// let cache = Refcache::with_config(Config::manual()).unwrap();
    /// let obj = NonNull::from(Box::leak(Box::new(RcHeader::new::<FreeBox>())));
    /// // SAFETY: a fresh header, registered once, valid until FreeBox frees it.
    /// unsafe { cache.register(obj) };
    /// // SAFETY: gives up the creator's reference; registered.
    /// unsafe { cache.dec(obj) }; // zero: freed in a few epochs unless revived
    /// // SAFETY: no tick has run since the count reached zero, so FreeBox has not run and
    /// // cannot run during the call (only `tick` and the domain's drop free).
    /// assert!(unsafe { cache.try_revive(obj) });
    /// for _ in 0..8 {
    ///     cache.tick();
    /// }
    /// assert_eq!(cache.stats().freed, 0); // the revived reference keeps it
    /// // SAFETY: gives up the revived reference; registered.
    /// unsafe { cache.dec(obj) };
    /// ```
    pub unsafe fn try_revive(&self, obj: NonNull<RcHeader>) -> bool {
        // SAFETY: valid per the contract; RcHeader is repr(transparent) over Header.
        unsafe { obj.cast::<Header>().as_ref() }.try_upgrade()
    }
}
