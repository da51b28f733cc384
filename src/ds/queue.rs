//! [`MsQueue`].

use core::fmt;
use core::marker::PhantomData;
use core::mem::MaybeUninit;
use core::ptr::{self, NonNull};

use super::free_node;
use crate::epoch::Retired;
use crate::reclaim::{Ebr, Reclaim, Shield};
use crate::sync::Canary;
use crate::sync::atomic::{AtomicPtr, Ordering};

#[repr(C)]
struct Node<T> {
    /// First field: the node's address is its link's.
    link: Retired,
    /// Initialised in every node but the sentinel; moved out by the dequeue that makes
    /// the node the new sentinel.
    value: MaybeUninit<T>,
    next: AtomicPtr<Node<T>>,
    /// Lets loom check that no operation reads a freed node.
    canary: Canary,
}

impl<T> Node<T> {
    fn boxed(value: MaybeUninit<T>) -> *mut Node<T> {
        Box::into_raw(Box::new(Node {
            link: Retired::new(),
            value,
            next: AtomicPtr::new(ptr::null_mut()),
            canary: Canary::new(),
        }))
    }
}

/// Michael and Scott's lock-free FIFO queue. `head` points to a sentinel whose successor
/// holds the first value; `tail` points to the last node or lags one behind (any thread
/// that notices swings it forward). A dequeue moves `head` to the successor, takes the
/// value out of it, and retires the old sentinel.
///
/// ```
/// use scalemem::ds::MsQueue;
/// use scalemem::reclaim::{Ebr, Hazard};
///
/// let q = MsQueue::<_, Hazard>::new();
/// q.push(1);
/// q.push(2);
/// assert_eq!((q.pop(), q.pop(), q.pop()), (Some(1), Some(2), None));
/// let e = MsQueue::<_, Ebr>::new();
/// e.push("x");
/// assert_eq!(e.pop(), Some("x"));
/// ```
pub struct MsQueue<T, R: Reclaim = Ebr> {
    head: AtomicPtr<Node<T>>,
    tail: AtomicPtr<Node<T>>,
    reclaim: R,
    _owns: PhantomData<T>,
}

// SAFETY: as for TreiberStack: values move between threads by value (T: Send).
// - Send: moving the queue moves its values and scheme.
// - Sync: push and pop through &self move values between threads; no &T is handed out.
unsafe impl<T: Send, R: Reclaim + Send> Send for MsQueue<T, R> {}
// SAFETY: see the Send impl.
unsafe impl<T: Send, R: Reclaim> Sync for MsQueue<T, R> {}

impl<T, R: Reclaim + Default> MsQueue<T, R> {
    /// An empty queue, with the scheme's default instance.
    ///
    /// ```
    /// use scalemem::ds::MsQueue;
    /// use scalemem::reclaim::Hazard;
    ///
    /// let ebr: MsQueue<u32> = MsQueue::new(); // epoch-based, the default
    /// let hp = MsQueue::<u32, Hazard>::new(); // the global hazard domain
    /// assert!(ebr.is_empty() && hp.is_empty());
    /// ebr.push(1);
    /// hp.push(2);
    /// assert_eq!((ebr.pop(), hp.pop()), (Some(1), Some(2)));
    /// ```
    pub fn new() -> Self {
        Self::new_in(R::default())
    }
}

impl<T, R: Reclaim + Default> Default for MsQueue<T, R> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T, R: Reclaim> MsQueue<T, R> {
    /// An empty queue reclaiming through `reclaim`.
    ///
    /// ```
    /// use scalemem::ds::MsQueue;
    ///
    /// let domain = scalemem::unique_domain!();
    /// let q = MsQueue::new_in(&domain);
    /// q.push("job");
    /// assert_eq!(q.pop(), Some("job"));
    /// assert_eq!(domain.stats().retired, 1); // the old sentinel waits in this domain
    /// domain.reclaim(); // a scan: no hazard pointer holds it
    /// assert_eq!((domain.stats().retired, domain.stats().reclaimed), (0, 1));
    /// ```
    pub fn new_in(reclaim: R) -> Self {
        let sentinel = Node::boxed(MaybeUninit::uninit());
        Self { head: AtomicPtr::new(sentinel), tail: AtomicPtr::new(sentinel), reclaim, _owns: PhantomData }
    }

    /// Appends `value`.
    ///
    /// ```
    /// use scalemem::ds::MsQueue;
    /// use scalemem::reclaim::{Ebr, Hazard, Reclaim};
    ///
    /// /// Two producers push 100 values each, concurrently; then the queue is drained.
    /// fn produce<R: Reclaim + Default>() {
    ///     let q = MsQueue::<(usize, u32), R>::new();
    ///     std::thread::scope(|s| {
    ///         for producer in 0..2 {
    ///             let q = &q;
    ///             s.spawn(move || (0..100).for_each(|i| q.push((producer, i))));
    ///         }
    ///     });
    ///     let mut next = [0, 0]; // each producer's values come out in the order it pushed them
    ///     while let Some((producer, i)) = q.pop() {
    ///         assert_eq!(i, next[producer]);
    ///         next[producer] += 1;
    ///     }
    ///     assert_eq!(next, [100, 100]);
    /// }
    /// produce::<Ebr>();
    /// produce::<Hazard>();
    /// ```
    pub fn push(&self, value: T) {
        let node = Node::boxed(MaybeUninit::new(value));
        let mut shield = self.reclaim.shield();
        loop {
            // SAFETY: the queue's nodes are valid until dequeued and retired through R.
            let tail = unsafe { shield.protect(&self.tail) };
            // SAFETY: protected; the tail is never null (there is always a sentinel).
            let tail_ref = unsafe { &*tail };
            tail_ref.canary.touch();
            // Acquire: pairs with the Release CAS that linked the successor.
            let next = tail_ref.next.load(Ordering::Acquire);
            if !next.is_null() {
                // The tail lags: help it along, then retry. Release: as below.
                let _ = self.tail.compare_exchange(tail, next, Ordering::Release, Ordering::Relaxed);
                continue;
            }
            // Release: publishes the node's contents to whoever follows the link.
            if tail_ref.next.compare_exchange(ptr::null_mut(), node, Ordering::Release, Ordering::Relaxed).is_ok() {
                // Release: publishes the node to threads that load the tail (Acquire).
                let _ = self.tail.compare_exchange(tail, node, Ordering::Release, Ordering::Relaxed);
                return;
            }
        }
    }

    /// Removes the oldest value.
    ///
    /// ```
    /// use scalemem::ds::MsQueue;
    /// use scalemem::reclaim::{Ebr, Hazard, Reclaim};
    ///
    /// fn fifo<R: Reclaim + Default>() -> Vec<String> {
    ///     let q = MsQueue::<String, R>::new();
    ///     for word in ["one", "two", "three"] {
    ///         q.push(word.to_string());
    ///     }
    ///     std::iter::from_fn(|| q.pop()).collect() // pops until `None`
    /// }
    /// assert_eq!(fifo::<Ebr>(), ["one", "two", "three"]);
    /// assert_eq!(fifo::<Hazard>(), ["one", "two", "three"]);
    /// ```
    pub fn pop(&self) -> Option<T> {
        let mut head_shield = self.reclaim.shield();
        let mut next_shield = self.reclaim.shield();
        loop {
            // SAFETY: as in push.
            let head = unsafe { head_shield.protect(&self.head) };
            // SAFETY: protected; the head is never null.
            let head_ref = unsafe { &*head };
            head_ref.canary.touch();
            // SAFETY: `next` belongs to a protected node; its successors are valid until
            // retired, and the head re-check below rules out a `next` read from a node
            // already unlinked (whose successor may be retired already).
            let next = unsafe { next_shield.protect(&head_ref.next) };
            // Acquire: the re-check; pairs with the Release CAS that moved the head.
            if self.head.load(Ordering::Acquire) != head {
                continue;
            }
            let next = NonNull::new(next)?;
            // Relaxed: only compared; a lagging tail equal to the head is swung first, so
            // that the head never passes the tail.
            let tail = self.tail.load(Ordering::Relaxed);
            if tail == head {
                // Release: as in push.
                let _ = self.tail.compare_exchange(tail, next.as_ptr(), Ordering::Release, Ordering::Relaxed);
                continue;
            }
            // Release: the new head's removal (and the value we take) is ordered before
            // the next dequeuer's accesses through the Acquire loads above.
            if self.head.compare_exchange(head, next.as_ptr(), Ordering::Release, Ordering::Relaxed).is_ok() {
                // SAFETY: `next` is protected; winning the CAS made us the one dequeuer
                // that takes its value (it becomes the sentinel, whose value is never
                // read again). The old sentinel is unlinked and retired once, its link
                // projected from `head` (free_node's contract).
                unsafe {
                    next.as_ref().canary.touch();
                    let value = (*next.as_ptr()).value.assume_init_read();
                    head_shield.reset();
                    self.reclaim.retire(head, NonNull::new_unchecked(&raw mut (*head).link), free_node::<Node<T>>);
                    return Some(value);
                }
            }
        }
    }

    /// Whether the queue is empty right now.
    ///
    /// ```
    /// use scalemem::ds::MsQueue;
    /// use scalemem::reclaim::{Ebr, Hazard, Reclaim};
    ///
    /// fn check<R: Reclaim + Default>() {
    ///     let q = MsQueue::<u8, R>::new();
    ///     assert!(q.is_empty()); // only the sentinel
    ///     q.push(1);
    ///     assert!(!q.is_empty());
    ///     assert_eq!(q.pop(), Some(1));
    ///     assert!(q.is_empty());
    /// }
    /// check::<Ebr>();
    /// check::<Hazard>();
    /// ```
    pub fn is_empty(&self) -> bool {
        let mut shield = self.reclaim.shield();
        // SAFETY: as in pop.
        let head = unsafe { shield.protect(&self.head) };
        // SAFETY: protected. Relaxed: a snapshot.
        unsafe { &*head }.next.load(Ordering::Relaxed).is_null()
    }
}

impl<T, R: Reclaim> Drop for MsQueue<T, R> {
    fn drop(&mut self) {
        // Relaxed: we own the queue; no other thread can reach it.
        let mut cursor = self.head.load(Ordering::Relaxed);
        let mut sentinel = true;
        while !cursor.is_null() {
            // SAFETY: the linked nodes are ours; each is freed once.
            let mut node = unsafe { Box::from_raw(cursor) };
            cursor = node.next.load(Ordering::Relaxed);
            if !sentinel {
                // SAFETY: every node after the sentinel holds a value.
                unsafe { node.value.assume_init_drop() };
            }
            sentinel = false;
        }
    }
}

impl<T, R: Reclaim> fmt::Debug for MsQueue<T, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MsQueue").field("empty", &self.is_empty()).finish_non_exhaustive()
    }
}
