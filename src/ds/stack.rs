//! [`TreiberStack`].

use core::fmt;
use core::marker::PhantomData;
use core::mem::ManuallyDrop;
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
    /// Moved out by the pop that unlinks the node; the node itself is freed later.
    value: ManuallyDrop<T>,
    next: AtomicPtr<Node<T>>,
    /// Lets loom check that no pop reads a freed node.
    canary: Canary,
}

/// A Treiber stack: a linked list whose head is swung by compare-exchange. Popped nodes
/// are retired through `R`, so a concurrent pop still reading one never touches freed
/// memory, and (under hazard pointers) a protected head cannot be freed and reused at
/// the same address, which rules out ABA on the head.
///
/// ```
/// use scalemem::ds::TreiberStack;
/// use scalemem::reclaim::Hazard;
///
/// let stack = TreiberStack::<_, Hazard>::new();
/// stack.push(1);
/// stack.push(2);
/// assert_eq!(stack.pop(), Some(2));
/// assert_eq!(stack.pop(), Some(1));
/// assert_eq!(stack.pop(), None);
/// ```
pub struct TreiberStack<T, R: Reclaim = Ebr> {
    head: AtomicPtr<Node<T>>,
    reclaim: R,
    _owns: PhantomData<T>,
}

// SAFETY: the stack owns its values and hands them out by value to any thread.
// - Send: moving the stack moves the values (T: Send) and the scheme (R: Send).
// - Sync: push and pop through &self move values between threads (T: Send); nothing
//   hands out &T.
unsafe impl<T: Send, R: Reclaim + Send> Send for TreiberStack<T, R> {}
// SAFETY: see the Send impl.
unsafe impl<T: Send, R: Reclaim> Sync for TreiberStack<T, R> {}

impl<T, R: Reclaim + Default> TreiberStack<T, R> {
    /// An empty stack, with the scheme's default instance.
    ///
    /// ```
    /// use scalemem::ds::TreiberStack;
    /// use scalemem::reclaim::Hazard;
    ///
    /// let ebr: TreiberStack<&str> = TreiberStack::new(); // epoch-based, the default
    /// let hp = TreiberStack::<&str, Hazard>::new(); // the global hazard domain
    /// assert!(ebr.is_empty() && hp.is_empty());
    /// ebr.push("a");
    /// hp.push("b");
    /// assert_eq!((ebr.pop(), hp.pop()), (Some("a"), Some("b")));
    /// ```
    pub fn new() -> Self {
        Self::new_in(R::default())
    }
}

impl<T, R: Reclaim + Default> Default for TreiberStack<T, R> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T, R: Reclaim> TreiberStack<T, R> {
    /// An empty stack reclaiming through `reclaim` (a hazard domain, say).
    ///
    /// ```
    /// use scalemem::ds::TreiberStack;
    ///
    /// let domain = scalemem::unique_domain!();
    /// let stack = TreiberStack::new_in(&domain);
    /// stack.push(7);
    /// assert_eq!(stack.pop(), Some(7));
    /// assert_eq!(domain.stats().retired, 1); // the popped node waits in this domain
    /// domain.reclaim(); // a scan: no hazard pointer holds it
    /// assert_eq!((domain.stats().retired, domain.stats().reclaimed), (0, 1));
    /// ```
    pub fn new_in(reclaim: R) -> Self {
        Self { head: AtomicPtr::new(ptr::null_mut()), reclaim, _owns: PhantomData }
    }

    /// Pushes `value`.
    ///
    /// ```
    /// use scalemem::ds::TreiberStack;
    /// use scalemem::reclaim::{Ebr, Hazard, Reclaim};
    ///
    /// /// Four threads push 100 values each; then everything is popped.
    /// fn push_all<R: Reclaim + Default>() -> Vec<u32> {
    ///     let stack = TreiberStack::<u32, R>::new();
    ///     std::thread::scope(|s| {
    ///         for t in 0..4 {
    ///             let stack = &stack;
    ///             s.spawn(move || (0..100).for_each(|i| stack.push(t * 100 + i)));
    ///         }
    ///     });
    ///     let mut popped: Vec<u32> = std::iter::from_fn(|| stack.pop()).collect();
    ///     popped.sort();
    ///     popped
    /// }
    /// let all: Vec<u32> = (0..400).collect();
    /// assert_eq!(push_all::<Ebr>(), all); // no push lost, none duplicated
    /// assert_eq!(push_all::<Hazard>(), all);
    /// ```
    pub fn push(&self, value: T) {
        let node = Box::into_raw(Box::new(Node {
            link: Retired::new(),
            value: ManuallyDrop::new(value),
            next: AtomicPtr::new(ptr::null_mut()),
            canary: Canary::new(),
        }));
        // Relaxed: the CAS below validates it; we never dereference the head here.
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            // SAFETY: the node is ours until the CAS publishes it.
            unsafe { (*node).next.store(head, Ordering::Relaxed) };
            // Release: publishes the node's contents to the Acquire loads of pop.
            match self.head.compare_exchange_weak(head, node, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => head = now,
            }
        }
    }

    /// Pops the most recently pushed value.
    ///
    /// ```
    /// use scalemem::ds::TreiberStack;
    /// use scalemem::reclaim::{Ebr, Hazard, Reclaim};
    ///
    /// fn lifo<R: Reclaim + Default>() -> Vec<String> {
    ///     let stack = TreiberStack::<String, R>::new();
    ///     for word in ["one", "two", "three"] {
    ///         stack.push(word.to_string());
    ///     }
    ///     std::iter::from_fn(|| stack.pop()).collect() // pops until `None`
    /// }
    /// assert_eq!(lifo::<Ebr>(), ["three", "two", "one"]);
    /// assert_eq!(lifo::<Hazard>(), ["three", "two", "one"]);
    /// ```
    pub fn pop(&self) -> Option<T> {
        let mut shield = self.reclaim.shield();
        loop {
            // SAFETY: the head's nodes are valid until popped and retired through R.
            let head = unsafe { shield.protect(&self.head) };
            let node = NonNull::new(head)?;
            // SAFETY: protected by `shield`.
            unsafe { node.as_ref() }.canary.touch();
            // SAFETY: protected by `shield`. Relaxed: `next` was written before the
            // push's Release CAS, which protect's Acquire load synchronised with.
            let next = unsafe { node.as_ref() }.next.load(Ordering::Relaxed);
            // Relaxed: the node's contents were acquired by protect; the unlink is
            // ordered before the retire below by program order.
            if self.head.compare_exchange(head, next, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                // SAFETY: we unlinked the node: we alone take its value, once; then it is
                // retired once (its value is ManuallyDrop, so freeing drops only the node),
                // its link projected from `head` (free_node's contract).
                unsafe {
                    let value = ptr::read(&*node.as_ref().value);
                    shield.reset();
                    self.reclaim.retire(head, NonNull::new_unchecked(&raw mut (*head).link), free_node::<Node<T>>);
                    return Some(value);
                }
            }
        }
    }

    /// Whether the stack is empty right now.
    ///
    /// ```
    /// use scalemem::ds::TreiberStack;
    /// use scalemem::reclaim::{Ebr, Hazard, Reclaim};
    ///
    /// fn check<R: Reclaim + Default>() {
    ///     let stack = TreiberStack::<u8, R>::new();
    ///     assert!(stack.is_empty());
    ///     stack.push(1);
    ///     assert!(!stack.is_empty());
    ///     assert_eq!(stack.pop(), Some(1));
    ///     assert!(stack.is_empty());
    /// }
    /// check::<Ebr>();
    /// check::<Hazard>();
    /// ```
    pub fn is_empty(&self) -> bool {
        // Relaxed: a snapshot; nothing is dereferenced.
        self.head.load(Ordering::Relaxed).is_null()
    }
}

impl<T, R: Reclaim> Drop for TreiberStack<T, R> {
    fn drop(&mut self) {
        // Relaxed: we own the stack; no other thread can reach it.
        let mut cursor = self.head.load(Ordering::Relaxed);
        while !cursor.is_null() {
            // SAFETY: the nodes still linked are ours; each is freed once.
            let mut node = unsafe { Box::from_raw(cursor) };
            cursor = node.next.load(Ordering::Relaxed);
            // SAFETY: the value of a linked node was never taken.
            unsafe { ManuallyDrop::drop(&mut node.value) };
        }
    }
}

impl<T, R: Reclaim> fmt::Debug for TreiberStack<T, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TreiberStack").field("empty", &self.is_empty()).finish_non_exhaustive()
    }
}
