//! [`RmLock`] and its guards: the value and the typed API over [`RawRmLock`], which
//! holds the protocol (see the module doc of [`crate::rmlock`]).

use core::fmt;
use core::marker::PhantomData;
use core::ops::{Deref, DerefMut};

use super::raw::{RawRmLock, Ticket};
use crate::sync::UnsafeCell;
use crate::util::AllocError;

/// A read-mostly lock: a read acquire and release write only the current CPU's own
/// counter (no shared cache line, no `lock`-prefixed instruction where the thread has
/// rseq); a write acquire is expensive (one `membarrier`, 10-35 us with other threads
/// running, then a wait for the readers inside to leave).
///
/// The API follows `std::sync::RwLock` without poisoning (as `parking_lot`'s):
/// [`read`](Self::read), [`try_read`](Self::try_read), [`write`](Self::write),
/// [`try_write`](Self::try_write), [`get_mut`](Self::get_mut),
/// [`into_inner`](Self::into_inner). The protocol, the orderings and the costs are in
/// the [module documentation](crate::rmlock).
///
/// ```
/// use scalemem::rmlock::RmLock;
///
/// let limits = RmLock::new(vec![10, 20, 30]);
/// {
///     let r1 = limits.read();
///     let r2 = limits.read(); // recursive reads never deadlock, even with a writer waiting
///     assert_eq!(r1[0] + r2[2], 40);
/// }
/// limits.write().push(40);
/// assert_eq!(limits.read().len(), 4);
/// assert_eq!(limits.into_inner(), [10, 20, 30, 40]);
/// ```
///
/// Like `std::sync::RwLock`, it is `Send` if `T: Send` and `Sync` if `T: Send + Sync`
/// (readers share `&T`):
///
/// ```compile_fail
/// fn shared<T: Sync>(_: &T) {}
/// shared(&scalemem::rmlock::RmLock::new(std::cell::Cell::new(0)));
/// ```
pub struct RmLock<T: ?Sized> {
    raw: RawRmLock,
    data: UnsafeCell<T>,
}

// SAFETY: `RmLock<T>` owns its `T` and its per-CPU counts (memory it maps and unmaps).
// - Send: sending the lock sends the `T` (so `T: Send`); the counts hold only atomics.
// - Sync: `&RmLock<T>` lets many threads share `&T` at once through read guards
//   (`T: Sync`) and lets any thread get `&mut T` through a write guard, which can move
//   values in and out of it (`T: Send`). The same bounds as `std::sync::RwLock`.
unsafe impl<T: ?Sized + Send> Send for RmLock<T> {}
// SAFETY: see the Send impl.
unsafe impl<T: ?Sized + Send + Sync> Sync for RmLock<T> {}

/// Shared access to an [`RmLock`]'s value; the read lock is released when it drops.
///
/// Not `Send`: the release must run on the thread that acquired (it updates that
/// thread's reader slot).
///
/// ```compile_fail
/// let lock = scalemem::rmlock::RmLock::new(0);
/// let guard = lock.read();
/// std::thread::scope(|s| {
///     s.spawn(move || drop(guard)); // error: `*const ()` cannot be sent between threads
/// });
/// ```
#[must_use = "the read lock is released as soon as the guard is dropped"]
pub struct RmReadGuard<'a, T: ?Sized> {
    lock: &'a RmLock<T>,
    /// How this thread's hold is recorded (its reader slot, or the per-CPU counts).
    ticket: Ticket,
    _not_send: PhantomData<*const ()>,
}

// SAFETY: sharing `&RmReadGuard` shares only `&T` (Deref), so `T: Sync` suffices, as for
// `std::sync::RwLockReadGuard`. Dropping (which must happen on the owning thread) needs
// the guard by value, which `&RmReadGuard` does not give.
unsafe impl<T: ?Sized + Sync> Sync for RmReadGuard<'_, T> {}

/// Exclusive access to an [`RmLock`]'s value; the write lock is released (and waiting
/// readers and writers are woken) when it drops. Not `Send`, like the read guard.
///
/// ```compile_fail
/// let lock = scalemem::rmlock::RmLock::new(0);
/// let guard = lock.write();
/// std::thread::scope(|s| {
///     s.spawn(move || drop(guard)); // error: `*const ()` cannot be sent between threads
/// });
/// ```
#[must_use = "the write lock is released as soon as the guard is dropped"]
pub struct RmWriteGuard<'a, T: ?Sized> {
    lock: &'a RmLock<T>,
    _not_send: PhantomData<*const ()>,
}

// SAFETY: sharing `&RmWriteGuard` shares only `&T` (Deref; DerefMut needs `&mut`), so
// `T: Sync` suffices, as for `std::sync::RwLockWriteGuard`.
unsafe impl<T: ?Sized + Sync> Sync for RmWriteGuard<'_, T> {}

impl<T> RmLock<T> {
    /// A lock holding `value`, unlocked.
    ///
    /// Maps one page (more with over 32 possible CPUs) for the per-CPU counts; not
    /// `const`, so a `static` lock goes in a `LazyLock`.
    ///
    /// # Panics
    /// If the kernel refuses that memory (as `Box::new` aborts when the allocator fails);
    /// [`try_new`](Self::try_new) returns the error instead.
    ///
    /// ```
    /// let lock = scalemem::rmlock::RmLock::new(5);
    /// assert_eq!(*lock.read(), 5);
    /// ```
    pub fn new(value: T) -> Self {
        match Self::try_new(value) {
            Ok(lock) => lock,
            Err(_) => panic!("RmLock::new: the kernel refused memory for the per-CPU reader counts"),
        }
    }

    /// A lock holding `value`, or an error (and `value` dropped) if the kernel refuses
    /// memory for the per-CPU counts. Never allocates through the global allocator.
    ///
    /// ```
    /// let lock = scalemem::rmlock::RmLock::try_new([0u64; 4]).expect("a page for the counts");
    /// assert_eq!(lock.read()[3], 0);
    /// ```
    pub fn try_new(value: T) -> Result<Self, AllocError> {
        Ok(Self { raw: RawRmLock::try_new()?, data: UnsafeCell::new(value) })
    }

    /// Consumes the lock and returns its value. No guard can exist (they borrow the
    /// lock), so this never waits.
    ///
    /// ```
    /// let lock = scalemem::rmlock::RmLock::new(String::from("v1"));
    /// assert_eq!(lock.into_inner(), "v1");
    /// ```
    pub fn into_inner(self) -> T {
        let Self { data, .. } = self;
        crate::sync::into_inner(data)
    }
}

impl<T: ?Sized> RmLock<T> {
    /// Locks for reading, waiting while a writer holds the lock or waits for it.
    ///
    /// Cost without a writer: a load and a store of a slot in this thread's own reader
    /// record, a compiler fence and a load of the writer flag; the release is a load and
    /// a store of the slot, a compiler fence and a load of the flag. No shared cache
    /// line is written, nothing allocates (a thread's first read claims its record,
    /// mapping a page from the kernel when every record is taken). With the symmetric
    /// fence fallback each side adds a SeqCst fence.
    ///
    /// Recursion: a thread that already holds this lock for reading gets another guard
    /// at once, even while a writer waits (the writer waits for the outer guard anyway),
    /// for up to 8 different locks held at once per thread; guards may be dropped in
    /// any order. A thread reading a 9th lock while it
    /// holds 8 others is counted in the lock's per-CPU counts instead (as is a thread
    /// reading from a thread-local destructor after its exit hook ran), and a nested
    /// read of *that* lock may deadlock against a waiting writer, as nested reads of
    /// `std::sync::RwLock` may (use [`try_read`](Self::try_read) there).
    ///
    /// # Panics
    /// If this thread holds the write lock: waiting for itself would never end.
    ///
    /// ```
    /// let lock = scalemem::rmlock::RmLock::new(1);
    /// let a = lock.read();
    /// let b = lock.read();
    /// drop(a); // any order
    /// assert_eq!(*b, 1);
    /// ```
    #[inline]
    pub fn read(&self) -> RmReadGuard<'_, T> {
        let ticket = self.raw.read_lock();
        RmReadGuard { lock: self, ticket, _not_send: PhantomData }
    }

    /// Locks for reading if no writer holds the lock or waits for it (or this thread
    /// already holds it for reading); never waits.
    ///
    /// This is what a per-CPU fast path wants that must never sleep (an allocator's
    /// magazine access, say): on `None` a reconfiguration is in progress; take a slow
    /// path that does not need the lock.
    ///
    /// ```
    /// let lock = scalemem::rmlock::RmLock::new(0);
    /// assert!(lock.try_read().is_some());
    /// let w = lock.write();
    /// assert!(lock.try_read().is_none());
    /// drop(w);
    /// assert!(lock.try_read().is_some());
    /// ```
    #[inline]
    pub fn try_read(&self) -> Option<RmReadGuard<'_, T>> {
        let ticket = self.raw.try_read_lock()?;
        Some(RmReadGuard { lock: self, ticket, _not_send: PhantomData })
    }

    /// Locks for writing: takes the writers' mutex (which is the writer flag), issues a
    /// heavy fence, and waits for the readers inside to leave. Waiting (for another
    /// writer, or for readers) spins briefly, then sleeps.
    ///
    /// Cost: one `membarrier` (about 0.1 us alone, 10-35 us with other threads of the
    /// process running; it interrupts every CPU running one of them), plus the wait for
    /// the readers already inside. New readers wait from the moment the flag is set, so
    /// a constant stream of readers cannot starve a writer.
    ///
    /// # Panics
    /// If this thread holds this lock already, for reading or for writing: it would wait
    /// for itself forever. (A read guard of a 9th lock, untracked, goes undetected.)
    ///
    /// ```
    /// let lock = scalemem::rmlock::RmLock::new(vec![1]);
    /// lock.write().push(2);
    /// assert_eq!(*lock.read(), [1, 2]);
    /// ```
    pub fn write(&self) -> RmWriteGuard<'_, T> {
        self.raw.write_lock();
        RmWriteGuard { lock: self, _not_send: PhantomData }
    }

    /// Locks for writing if no other writer holds the lock and no reader is inside;
    /// never waits. Costs a `membarrier` even when it fails (the readers inside cannot
    /// be counted without one).
    ///
    /// ```
    /// let lock = scalemem::rmlock::RmLock::new(0);
    /// let r = lock.read();
    /// assert!(lock.try_write().is_none());
    /// drop(r);
    /// *lock.try_write().unwrap() += 1;
    /// assert_eq!(*lock.read(), 1);
    /// ```
    pub fn try_write(&self) -> Option<RmWriteGuard<'_, T>> {
        self.raw.try_write_lock().then(|| RmWriteGuard { lock: self, _not_send: PhantomData })
    }

    /// True while a writer holds the lock or waits for readers to leave (new readers
    /// wait meanwhile). A snapshot: it may change at once.
    ///
    /// ```
    /// let lock = scalemem::rmlock::RmLock::new(());
    /// assert!(!lock.is_write_locked());
    /// let w = lock.write();
    /// assert!(lock.is_write_locked());
    /// # drop(w);
    /// ```
    pub fn is_write_locked(&self) -> bool {
        self.raw.is_write_locked()
    }

    /// The value, through an exclusive borrow: no locking (no guard can exist).
    ///
    /// ```
    /// let mut lock = scalemem::rmlock::RmLock::new(1);
    /// *lock.get_mut() += 1;
    /// assert_eq!(*lock.read(), 2);
    /// ```
    pub fn get_mut(&mut self) -> &mut T {
        // SAFETY: `&mut self` excludes every guard (they borrow the lock) and every
        // other access; the reference lives as long as that borrow.
        self.data.with_mut(|value| unsafe { &mut *value })
    }
}

impl<T: ?Sized> Drop for RmReadGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.raw.read_unlock(self.ticket);
    }
}

impl<T: ?Sized> Deref for RmReadGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: we are counted among the readers (or nested in a thread that is), so
        // no writer is inside until we depart, which needs this guard by value; the
        // reference borrows the guard.
        self.lock.data.with(|value| unsafe { &*value })
    }
}

impl<T: ?Sized> Drop for RmWriteGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.raw.write_unlock();
    }
}

impl<T: ?Sized> Deref for RmWriteGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: we hold the write lock and every reader has departed (W3); readers and
        // writers stay out until we release it, which needs this guard by value.
        self.lock.data.with(|value| unsafe { &*value })
    }
}

impl<T: ?Sized> DerefMut for RmWriteGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference through the
        // guard.
        self.lock.data.with_mut(|value| unsafe { &mut *value })
    }
}

impl<T: Default> Default for RmLock<T> {
    /// `RmLock::new(T::default())`; panics where [`RmLock::new`] does.
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T> From<T> for RmLock<T> {
    /// `RmLock::new(value)`; panics where [`RmLock::new`] does.
    fn from(value: T) -> Self {
        Self::new(value)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RmLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("RmLock");
        match self.try_read() {
            Some(guard) => d.field("data", &&*guard),
            None => d.field("data", &format_args!("<locked>")),
        };
        d.finish_non_exhaustive()
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RmReadGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

impl<T: ?Sized + fmt::Display> fmt::Display for RmReadGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RmWriteGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

impl<T: ?Sized + fmt::Display> fmt::Display for RmWriteGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}
