//! [`Guard`]: proof that the thread is pinned, and the door to deferred reclamation.

use core::fmt;
use core::mem::ManuallyDrop;
use core::ptr::{self, NonNull};

use super::atomic::Shared;
use super::collector::{Collector, collector_of};
use super::deferred::Deferred;
use super::internal::Local;
use super::retired::{ReclaimFn, Retired};

/// A pinned section. While any guard of a thread is alive, objects that were reachable
/// when the thread pinned are not freed; pointers loaded through `&Guard` borrow it.
///
/// Guards are `!Send`: a pin belongs to its thread. Pins nest; only the outermost one
/// touches the thread's record (one load, one store to a line only this thread
/// writes, and a compiler fence).
///
/// ```
/// use scalemem::epoch::{self, Atomic};
/// use std::sync::atomic::Ordering::Acquire;
///
/// let shared = Atomic::new(41);
/// let guard = epoch::pin();
/// let p = shared.load(Acquire, &guard);
/// // SAFETY: p was loaded under `guard` and nothing frees it while we are pinned.
/// assert_eq!(unsafe { p.deref() } + 1, 42);
/// # drop(guard);
/// # // SAFETY: no other thread can reach `shared`, and nothing else frees it.
/// # unsafe { drop(shared.into_owned()) };
/// ```
pub struct Guard {
    /// The pinned record, or null for [`unprotected`].
    pub(crate) local: *const Local,
}

impl Guard {
    /// Pins `local` and returns its guard.
    ///
    /// # Safety
    /// `local` is a claimed record of the calling thread that stays claimed while the
    /// guard lives (a handle or an enclosing guard keeps it).
    #[inline]
    pub(crate) unsafe fn enter(local: NonNull<Local>) -> Guard {
        // SAFETY: per the contract the record is claimed by this thread.
        unsafe { local.as_ref() }.pin();
        Guard { local: local.as_ptr() }
    }

    fn local(&self) -> Option<&Local> {
        // SAFETY: a guard pins its record, which keeps it claimed (unpin finalises only
        // after the last guard), so the pointer is valid while `self` lives.
        unsafe { self.local.as_ref() }
    }

    /// Runs `f` once no thread pinned now (in this guard's collector) is still pinned.
    /// On the [`unprotected`] guard, runs it at once.
    ///
    /// Closures of up to three words are stored inline; larger ones are boxed.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    /// let runs = Arc::new(AtomicUsize::new(0));
    /// let guard = scalemem::epoch::pin();
    /// let r = runs.clone();
    /// guard.defer(move || r.fetch_add(1, SeqCst));
    /// drop(guard);
    /// for _ in 0..3 { scalemem::epoch::pin().flush(); } // runs it once quiescent
    /// assert_eq!(runs.load(SeqCst), 1);
    /// ```
    pub fn defer<F, R>(&self, f: F)
    where
        F: FnOnce() -> R + Send + 'static,
    {
        // SAFETY: F is Send + 'static, so running it later on any thread is sound.
        unsafe { self.defer_unchecked(f) }
    }

    /// Like [`defer`](Guard::defer) without the `Send + 'static` bounds.
    ///
    /// # Safety
    /// 1. `f` may run on another thread, later: everything it captures must be safe to
    ///    use from there (as if it were `Send`).
    /// 2. Everything `f` borrows outlives the moment it runs (at the latest, when the
    ///    collector is dropped).
    ///
    /// ```
    /// use scalemem::epoch::Collector;
    /// use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    ///
    /// let runs = AtomicUsize::new(0); // on the stack: borrowed, not 'static
    /// let collector = Collector::new();
    /// let handle = collector.register();
    /// let guard = handle.pin();
    /// let r = &runs;
    /// // SAFETY: (1) the closure only touches an AtomicUsize, usable from any thread;
    /// // (2) `runs` outlives the collector, which is dropped below.
    /// unsafe { guard.defer_unchecked(move || r.fetch_add(1, Relaxed)) };
    /// assert_eq!(runs.load(Relaxed), 0); // not yet: it waits for two advances
    /// drop((guard, handle));
    /// drop(collector); // the last reference: leftover garbage runs now
    /// assert_eq!(runs.load(Relaxed), 1);
    /// ```
    pub unsafe fn defer_unchecked<F, R>(&self, f: F)
    where
        F: FnOnce() -> R,
    {
        match self.local() {
            Some(local) => local.defer(Deferred::new(move || drop(f()))),
            None => drop(f()),
        }
    }

    /// Drops the object behind `ptr` once no pinned thread can hold it.
    ///
    /// # Safety
    /// 1. `ptr` came from an [`Owned`](super::Owned) (a `Box`) and is unreachable for any
    ///    thread that pins from now on (it has been unlinked).
    /// 2. It is destroyed once: no other `defer_destroy`, `into_owned` or retire of it.
    /// 3. `T` may be dropped on another thread (as if `T: Send`).
    ///
    /// ```
    /// use scalemem::epoch::{Atomic, Collector, Owned};
    /// use std::sync::atomic::{AtomicUsize, Ordering::{AcqRel, Relaxed}};
    ///
    /// static DROPS: AtomicUsize = AtomicUsize::new(0);
    /// struct Node(u32);
    /// impl Drop for Node {
    ///     fn drop(&mut self) {
    ///         DROPS.fetch_add(1, Relaxed);
    ///     }
    /// }
    ///
    /// let collector = Collector::new();
    /// let handle = collector.register();
    /// let slot = Atomic::new(Node(1));
    /// {
    ///     let guard = handle.pin();
    ///     let old = slot.swap(Owned::new(Node(2)), AcqRel, &guard);
    ///     // SAFETY: (1) `old` came from an Owned and is unlinked; (2) it is destroyed
    ///     // only here; (3) a Node may be dropped on any thread.
    ///     unsafe { guard.defer_destroy(old) };
    /// }
    /// assert_eq!(DROPS.load(Relaxed), 0); // readers pinned earlier may still hold it
    /// for _ in 0..3 {
    ///     handle.pin().flush(); // seal, advance, collect
    /// }
    /// assert_eq!(DROPS.load(Relaxed), 1);
    /// // SAFETY: no other thread can reach `slot`, and it is not null.
    /// drop(unsafe { slot.into_owned() });
    /// assert_eq!(DROPS.load(Relaxed), 2);
    /// ```
    pub unsafe fn defer_destroy<T>(&self, ptr: Shared<'_, T>) {
        let raw = ptr.as_raw() as usize;
        // SAFETY: (1)-(3) are the caller's; the closure captures one word.
        unsafe {
            self.defer_unchecked(move || {
                let object = raw as *mut T;
                if !object.is_null() {
                    drop(Box::from_raw(object));
                }
            })
        }
    }

    /// Retires an object that embeds a [`Retired`] link, without allocating: `reclaim`
    /// is called with the link once no pinned thread can hold the object. This is the
    /// path the allocator uses for its own metadata. On the [`unprotected`] guard,
    /// `reclaim` runs at once.
    ///
    /// # Safety
    /// 1. `object` points to a `Retired` embedded in an object that is unreachable for any
    ///    thread that pins from now on, and that stays valid until `reclaim` runs.
    /// 2. The object is retired once, and its link is not touched by anyone else until
    ///    `reclaim` runs.
    /// 3. `reclaim` may run on any thread, and frees the object correctly from its link.
    ///
    /// ```
    /// use scalemem::epoch::{Collector, Retired};
    /// use std::ptr::NonNull;
    /// use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    ///
    /// #[repr(C)]
    /// struct Node {
    ///     link: Retired, // first field, so a *Retired is a *Node
    ///     value: u64,
    /// }
    /// static RECLAIMED: AtomicU64 = AtomicU64::new(0);
    ///
    /// unsafe fn reclaim(link: NonNull<Retired>) {
    ///     // SAFETY: (3) every link retired here is the first field of a boxed Node.
    ///     let node = unsafe { Box::from_raw(link.as_ptr().cast::<Node>()) };
    ///     RECLAIMED.fetch_add(node.value, Relaxed);
    /// }
    ///
    /// let collector = Collector::new();
    /// let handle = collector.register();
    /// let node = NonNull::from(Box::leak(Box::new(Node { link: Retired::new(), value: 7 })));
    /// // SAFETY: (1) the node was never shared, and stays valid until `reclaim` frees it;
    /// // (2) it is retired once; (3) `reclaim` frees a boxed Node from its first field.
    /// unsafe { handle.pin().retire(node.cast(), reclaim) };
    /// for _ in 0..3 {
    ///     handle.pin().flush(); // seal the batch, advance, collect
    /// }
    /// assert_eq!(RECLAIMED.load(Relaxed), 7);
    /// ```
    pub unsafe fn retire(&self, object: NonNull<Retired>, reclaim: ReclaimFn) {
        match self.local() {
            // SAFETY: (1)-(3) are passed on unchanged.
            Some(local) => unsafe { local.retire(object, reclaim) },
            // SAFETY: unprotected: the caller promised no other thread can hold it.
            None => unsafe { reclaim(object) },
        }
    }

    /// Hands this thread's pending garbage to the collector, tries to advance the epoch
    /// and frees what has expired (a bounded amount).
    ///
    /// ```
    /// use scalemem::epoch::Collector;
    /// use std::sync::atomic::{AtomicBool, Ordering};
    ///
    /// static RAN: AtomicBool = AtomicBool::new(false);
    /// // A collector of our own: no other thread's pin holds its epoch back.
    /// let collector = Collector::new();
    /// let handle = collector.register();
    /// handle.pin().defer(|| RAN.store(true, Ordering::Relaxed));
    /// assert!(!RAN.load(Ordering::Relaxed)); // pending: two epochs must pass first
    /// for _ in 0..3 {
    ///     handle.pin().flush();
    /// }
    /// assert!(RAN.load(Ordering::Relaxed));
    /// ```
    pub fn flush(&self) {
        if let Some(local) = self.local() {
            local.flush();
        }
    }

    /// Moves the pin to the current epoch (if this is the thread's only guard), so a
    /// long-running pinned loop stops holding back reclamation. Pointers loaded before
    /// must not be used after: the `&mut self` borrow enforces it.
    ///
    /// ```
    /// use scalemem::epoch::Collector;
    ///
    /// let collector = Collector::new();
    /// let handle = collector.register();
    /// let mut guard = handle.pin();
    /// let start = collector.epoch();
    /// guard.flush(); // the epoch moves on once past this pin...
    /// guard.flush(); // ...and no further while the pin stays where it was
    /// assert_eq!(collector.epoch(), start + 1);
    /// guard.repin(); // now pinned in the current epoch
    /// guard.flush();
    /// assert_eq!(collector.epoch(), start + 2);
    /// ```
    pub fn repin(&mut self) {
        if let Some(local) = self.local() {
            local.repin();
        }
    }

    /// Unpins for the duration of `f` (a blocking call, say), then pins again.
    ///
    /// ```
    /// let mut guard = scalemem::epoch::pin();
    /// let n = guard.repin_after(|| 6 * 7); // not pinned in here
    /// assert_eq!(n, 42);
    /// assert!(scalemem::epoch::is_pinned());
    /// ```
    pub fn repin_after<F, R>(&mut self, f: F) -> R
    where
        F: FnOnce() -> R,
    {
        let Some(local) = self.local() else { return f() };
        // Keep the record registered while unpinned: a temporary handle.
        local.acquire_handle();
        local.unpin();
        struct Repin<'a>(&'a Local);
        impl Drop for Repin<'_> {
            fn drop(&mut self) {
                self.0.pin();
                // SAFETY: the temporary handle taken above; the guard's pin keeps the
                // record claimed afterwards.
                unsafe { Local::release_handle(NonNull::from(self.0)) };
            }
        }
        let _repin = Repin(local);
        f()
    }

    /// The collector this guard pins, or `None` for [`unprotected`].
    ///
    /// ```
    /// use scalemem::epoch::{self, Collector};
    ///
    /// let collector = Collector::new();
    /// let handle = collector.register();
    /// assert_eq!(handle.pin().collector(), Some(&collector));
    /// assert_eq!(epoch::pin().collector(), Some(epoch::default_collector()));
    /// // SAFETY: nothing is loaded, deferred or retired through this guard.
    /// assert!(unsafe { epoch::unprotected() }.collector().is_none());
    /// ```
    pub fn collector(&self) -> Option<&Collector> {
        self.local().map(collector_of)
    }
}

impl Drop for Guard {
    #[inline]
    fn drop(&mut self) {
        if let Some(local) = self.local() {
            local.unpin();
        }
    }
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard").field("unprotected", &self.local.is_null()).finish()
    }
}

/// A guard that protects nothing, for code that knows no other thread can reach the
/// data (a structure being built or dropped): loads need a guard, and deferred
/// functions on it run at once.
///
/// # Safety
/// Every pointer loaded through it must be one that no other thread can free while it
/// is used, and everything deferred or retired through it must be unreachable by every
/// other thread already.
///
/// ```
/// use scalemem::epoch::{self, Atomic};
/// use std::sync::atomic::Ordering::Relaxed;
/// let a = Atomic::new(5);
/// // SAFETY: `a` is ours alone.
/// let guard = unsafe { epoch::unprotected() };
/// let p = a.swap(epoch::Shared::null(), Relaxed, guard);
/// // SAFETY: unlinked, and no other thread ever saw it.
/// unsafe { guard.defer_destroy(p) }; // runs now
/// ```
#[inline]
pub unsafe fn unprotected() -> &'static Guard {
    struct Unprotected(ManuallyDrop<Guard>);
    // SAFETY: the unprotected guard has no record; all its methods are thread-safe
    // (they run deferred functions at once) and it is never dropped.
    unsafe impl Sync for Unprotected {}
    static UNPROTECTED: Unprotected = Unprotected(ManuallyDrop::new(Guard { local: ptr::null() }));
    &UNPROTECTED.0
}
