//! [`GarbageQueue`]: where sealed garbage waits for its epoch to expire.
//!
//! # Protocol
//! - Sealing threads push onto a lock-free **inbox** (a Treiber stack: push with a
//!   Release CAS; push has no ABA problem).
//! - One collector at a time (the holder of the collector's `collecting` try-lock) owns
//!   the **FIFO**: it takes the whole inbox (an Acquire swap), reverses it into arrival
//!   order, appends it to the FIFO, and pops expired nodes from the front. Seal epochs
//!   grow along the FIFO (a node sealed later read a later or equal epoch, except for the
//!   microseconds between a seal and its push), so the first unexpired node ends the
//!   scan; stopping early is always safe, merely late.
//!
//! Each node is reversed once and popped once: O(1) amortised work per node, and a call
//! pops at most its budget. A collector that finds the try-lock busy skips collecting;
//! the holder frees the garbage, nothing waits on it.

use core::ptr::{self, NonNull};

use super::bag::Bag;
use super::internal::expired;
use super::retired::Retired;
use crate::sync::UnsafeCell;
use crate::sync::atomic::{AtomicPtr, Ordering};

/// A node of garbage: a bag of deferred functions or a batch of retired objects.
pub(crate) trait Garbage: Sized {
    /// The link used both in the inbox and in the FIFO.
    ///
    /// # Safety
    /// The caller owns `node` (it is not published, or it holds the collector lock).
    unsafe fn next(node: NonNull<Self>) -> *mut Self;

    /// Sets the link.
    ///
    /// # Safety
    /// As for [`next`](Garbage::next).
    unsafe fn set_next(node: NonNull<Self>, next: *mut Self);

    /// The epoch the node was sealed in.
    ///
    /// # Safety
    /// As for [`next`](Garbage::next).
    unsafe fn sealed(node: NonNull<Self>) -> usize;

    /// Frees the node's contents (and recycles the node).
    ///
    /// # Safety
    /// The caller owns the node and its epoch has expired (or no thread can be pinned).
    unsafe fn reclaim(node: NonNull<Self>);
}

impl Garbage for Bag {
    unsafe fn next(node: NonNull<Self>) -> *mut Self {
        // SAFETY: the caller owns the bag.
        unsafe { (*node.as_ptr()).next.with(|n| *n) }
    }

    unsafe fn set_next(node: NonNull<Self>, next: *mut Self) {
        // SAFETY: the caller owns the bag.
        unsafe { (*node.as_ptr()).next.with_mut(|n| *n = next) }
    }

    unsafe fn sealed(node: NonNull<Self>) -> usize {
        // SAFETY: the caller owns the bag.
        unsafe { (*node.as_ptr()).epoch.with(|e| *e) }
    }

    unsafe fn reclaim(node: NonNull<Self>) {
        // SAFETY: per the contract: we own the bag and its epoch expired.
        unsafe {
            Bag::run(node);
            super::internal::Local::give_back_bag(node);
        }
    }
}

impl Garbage for Retired {
    unsafe fn next(node: NonNull<Self>) -> *mut Self {
        // SAFETY: the caller owns the batch.
        unsafe { *(*node.as_ptr()).batch_next.get() }
    }

    unsafe fn set_next(node: NonNull<Self>, next: *mut Self) {
        // SAFETY: the caller owns the batch.
        unsafe { *(*node.as_ptr()).batch_next.get() = next }
    }

    unsafe fn sealed(node: NonNull<Self>) -> usize {
        // SAFETY: the caller owns the batch.
        unsafe { *(*node.as_ptr()).epoch.get() }
    }

    unsafe fn reclaim(node: NonNull<Self>) {
        let mut cursor = node.as_ptr();
        while let Some(object) = NonNull::new(cursor) {
            // SAFETY: we own the batch; read the link before the object is freed. Each
            // object was retired once with its reclaim function (Guard::retire).
            unsafe {
                let (next, reclaim) = (*(*object.as_ptr()).next.get(), *(*object.as_ptr()).reclaim.get());
                cursor = next;
                if let Some(reclaim) = reclaim {
                    reclaim(object);
                }
            }
        }
    }
}

/// The inbox and FIFO of one kind of garbage.
pub(crate) struct GarbageQueue<T> {
    inbox: AtomicPtr<T>,
    /// (front, back) of the FIFO; only the collector-lock holder touches it.
    fifo: UnsafeCell<(*mut T, *mut T)>,
}

// SAFETY: the inbox is an atomic pointer; the FIFO is touched only by the holder of the
// collector's `collecting` lock (every access is an `unsafe fn` that REQUIRES it), which
// hands the FIFO from thread to thread with Acquire/Release. The nodes themselves are
// plain memory owned by whichever party the protocol says.
// - Send: the queue owns no thread-bound state.
// - Sync: shared access is serialised as above.
unsafe impl<T> Send for GarbageQueue<T> {}
// SAFETY: see the Send impl.
unsafe impl<T> Sync for GarbageQueue<T> {}

impl<T: Garbage> GarbageQueue<T> {
    #[cfg(not(scalemem_loom))]
    pub(crate) const fn new() -> Self {
        Self { inbox: AtomicPtr::new(ptr::null_mut()), fifo: UnsafeCell::new((ptr::null_mut(), ptr::null_mut())) }
    }

    #[cfg(scalemem_loom)]
    pub(crate) fn new() -> Self {
        Self { inbox: AtomicPtr::new(ptr::null_mut()), fifo: UnsafeCell::new((ptr::null_mut(), ptr::null_mut())) }
    }

    /// Forgets the FIFO (its nodes are leaked, never run): for the child of a `fork`
    /// whose collecting-lock holder was another thread, stopped mid-update.
    ///
    /// # Safety
    /// REQUIRES: no other thread exists (the child of `fork`, in its handler).
    #[cfg(not(scalemem_loom))]
    pub(crate) unsafe fn abandon_fifo(&self) {
        // SAFETY: the only thread (contract).
        self.fifo.with_mut(|fifo| unsafe { *fifo = (ptr::null_mut(), ptr::null_mut()) });
    }

    /// Publishes a sealed node.
    pub(crate) fn push(&self, node: NonNull<T>) {
        // Relaxed: the CAS below re-validates the value.
        let mut head = self.inbox.load(Ordering::Relaxed);
        loop {
            // SAFETY: we own the node until the CAS publishes it.
            unsafe { T::set_next(node, head) };
            // Release: publishes the node's contents and seal epoch to the Acquire swap
            // of the collector that takes the inbox.
            match self.inbox.compare_exchange_weak(head, node.as_ptr(), Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(actual) => head = actual,
            }
        }
    }

    /// Moves the inbox to the back of the FIFO and unlinks up to `*budget` expired nodes
    /// from its front, returning them as a list (through `next`) for the caller to
    /// reclaim after releasing the lock.
    ///
    /// # Safety
    /// REQUIRES: the caller holds the collector's `collecting` lock.
    pub(crate) unsafe fn take_expired(&self, now: usize, budget: &mut usize) -> *mut T {
        // Acquire: take ownership of every pushed node (pairs with push's Release).
        let mut inbox = self.inbox.swap(ptr::null_mut(), Ordering::Acquire);
        self.fifo.with_mut(|fifo| {
            // SAFETY: the lock makes us the FIFO's only user; the inbox nodes are ours.
            let (front, back) = unsafe { &mut *fifo };
            // Reverse the inbox (newest first) into arrival order and append it.
            let mut arrivals: *mut T = ptr::null_mut();
            let arrivals_back = inbox;
            while let Some(node) = NonNull::new(inbox) {
                // SAFETY: we own the taken nodes.
                unsafe {
                    inbox = T::next(node);
                    T::set_next(node, arrivals);
                }
                arrivals = node.as_ptr();
            }
            if let Some(first) = NonNull::new(arrivals) {
                match NonNull::new(*back) {
                    // SAFETY: `back` is the FIFO's last node, ours under the lock.
                    Some(last) => unsafe { T::set_next(last, first.as_ptr()) },
                    None => *front = first.as_ptr(),
                }
                *back = arrivals_back;
            }
            // Unlink expired nodes from the front, in order, up to the budget.
            let expired_front = *front;
            let mut expired_back: *mut T = ptr::null_mut();
            while *budget > 0 {
                let Some(node) = NonNull::new(*front) else { break };
                // SAFETY: FIFO nodes are ours under the lock.
                if !expired(unsafe { T::sealed(node) }, now) {
                    break;
                }
                *budget -= 1;
                expired_back = node.as_ptr();
                // SAFETY: as above.
                *front = unsafe { T::next(node) };
            }
            match NonNull::new(expired_back) {
                None => ptr::null_mut(),
                Some(last) => {
                    if front.is_null() {
                        *back = ptr::null_mut();
                    }
                    // SAFETY: `last` is ours; cut the taken run off the FIFO.
                    unsafe { T::set_next(last, ptr::null_mut()) };
                    expired_front
                }
            }
        })
    }

    /// Everything still queued, inbox and FIFO, as one list (teardown).
    ///
    /// # Safety
    /// No other thread uses the queue any more.
    pub(crate) unsafe fn take_all(&self) -> *mut T {
        // SAFETY: at teardown nobody else can hold the collector lock. A zero budget
        // only moves the inbox into the FIFO.
        unsafe { self.take_expired(0, &mut 0) };
        self.fifo.with_mut(|fifo| {
            // SAFETY: as above.
            let (front, back) = unsafe { &mut *fifo };
            *back = ptr::null_mut();
            core::mem::replace(front, ptr::null_mut())
        })
    }
}

/// Reclaims every node of a list returned by the queue.
///
/// # Safety
/// The caller owns the list and every node's epoch expired (or teardown).
pub(crate) unsafe fn reclaim_list<T: Garbage>(mut list: *mut T) -> usize {
    let mut count = 0;
    while let Some(node) = NonNull::new(list) {
        // SAFETY: per the contract; read the link before the node is recycled.
        unsafe {
            list = T::next(node);
            T::reclaim(node);
        }
        count += 1;
    }
    count
}
