//! [`OrderedList`]: Harris and Michael's lock-free sorted set.

use core::fmt;
use core::marker::PhantomData;
use core::ptr::{self, NonNull};

use super::free_node;
use crate::epoch::Retired;
use crate::reclaim::{Ebr, Reclaim, Shield};
use crate::sync::Canary;
use crate::sync::atomic::{AtomicPtr, Ordering};

/// The low bit of a node's `next`: the node is logically deleted.
const MARK: usize = 1;

#[repr(C)]
struct Node<K> {
    /// First field: the node's address is its link's.
    link: Retired,
    key: K,
    /// The successor, with [`MARK`] set once the node is deleted (then never changed).
    next: AtomicPtr<Node<K>>,
    /// Lets loom check that no traversal reads a freed node.
    canary: Canary,
}

#[inline]
fn marked<K>(p: *mut Node<K>) -> bool {
    p.addr() & MARK != 0
}

#[inline]
fn unmarked<K>(p: *mut Node<K>) -> *mut Node<K> {
    p.map_addr(|a| a & !MARK)
}

/// A sorted set of keys as a linked list (Harris's algorithm with Michael's changes for
/// hazard pointers). `remove` first marks the node's `next` (logical deletion), then
/// unlinks it; any traversal that meets a marked node unlinks it and retires it. A
/// traversal holds three shields (previous, current, next) and re-checks, after
/// protecting each successor, that the predecessor still links to the current node.
///
/// Lock-free; operations are O(n) in the list's length, as for any list.
///
/// ```
/// use scalemem::ds::OrderedList;
/// use scalemem::reclaim::Hazard;
///
/// let set = OrderedList::<u32, Hazard>::new();
/// assert!(set.insert(3));
/// assert!(set.insert(1));
/// assert!(!set.insert(3));
/// assert!(set.contains(&1));
/// assert!(set.remove(&1));
/// assert!(!set.contains(&1));
/// assert_eq!(set.to_vec(), vec![3]);
/// ```
pub struct OrderedList<K, R: Reclaim = Ebr> {
    head: AtomicPtr<Node<K>>,
    reclaim: R,
    _owns: PhantomData<K>,
}

// SAFETY: the list owns its keys; threads read them through &self (K: Sync) and drop them
// wherever reclamation runs (K: Send).
// - Send: moving the list moves its keys and scheme.
// - Sync: &self operations compare keys from any thread and retire nodes to any thread.
unsafe impl<K: Send + Sync, R: Reclaim + Send> Send for OrderedList<K, R> {}
// SAFETY: see the Send impl.
unsafe impl<K: Send + Sync, R: Reclaim> Sync for OrderedList<K, R> {}

/// Where a search stopped: the link that points to `cur` (the head or a protected node's
/// `next`), and `cur`, the first node whose key is not less than the key (or null).
struct Position<K> {
    prev: *const AtomicPtr<Node<K>>,
    cur: *mut Node<K>,
    found: bool,
}

impl<K: Ord, R: Reclaim + Default> OrderedList<K, R> {
    /// An empty set, with the scheme's default instance.
    ///
    /// ```
    /// use scalemem::ds::OrderedList;
    /// use scalemem::reclaim::Hazard;
    ///
    /// let ebr: OrderedList<i32> = OrderedList::new(); // epoch-based, the default
    /// let hp = OrderedList::<i32, Hazard>::new(); // the global hazard domain
    /// assert!(ebr.to_vec().is_empty() && hp.to_vec().is_empty());
    /// assert!(ebr.insert(1) && hp.insert(1));
    /// assert!(ebr.contains(&1) && hp.contains(&1));
    /// ```
    pub fn new() -> Self {
        Self::new_in(R::default())
    }
}

impl<K: Ord, R: Reclaim + Default> Default for OrderedList<K, R> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Ord, R: Reclaim> OrderedList<K, R> {
    /// An empty set reclaiming through `reclaim`.
    ///
    /// ```
    /// use scalemem::ds::OrderedList;
    ///
    /// let domain = scalemem::unique_domain!();
    /// let set = OrderedList::new_in(&domain);
    /// assert!(set.insert(1) && set.insert(2));
    /// assert!(set.remove(&1));
    /// assert_eq!(domain.stats().retired, 1); // the unlinked node waits in this domain
    /// domain.reclaim(); // a scan: no hazard pointer holds it
    /// assert_eq!((domain.stats().retired, domain.stats().reclaimed), (0, 1));
    /// assert_eq!(set.to_vec(), [2]);
    /// ```
    pub fn new_in(reclaim: R) -> Self {
        Self { head: AtomicPtr::new(ptr::null_mut()), reclaim, _owns: PhantomData }
    }

    /// Finds the position of `key`, unlinking (and retiring) marked nodes on the way.
    /// On return `shields[1]` protects `cur` and `shields[0]` the node owning `prev`.
    fn find(&self, key: &K, shields: &mut [R::Shield<'_>; 3]) -> Position<K> {
        'retry: loop {
            // (previous, current, next) shield indices; rotated as the walk moves on.
            let (mut p, mut c, mut n) = (0, 1, 2);
            let mut prev: *const AtomicPtr<Node<K>> = &self.head;
            // SAFETY: list nodes are valid until unlinked and retired through R; `prev`
            // is the head. The head is never marked.
            let mut cur = unsafe { shields[c].protect_masked(&*prev, MARK) };
            loop {
                if cur.is_null() {
                    return Position { prev, cur, found: false };
                }
                // SAFETY: `cur` is protected by shields[c] and was linked from `prev`
                // after the protection was published.
                let cur_ref = unsafe { &*cur };
                cur_ref.canary.touch();
                // SAFETY: as above, for the successor (read from a protected node; the
                // re-check below makes sure `cur` was still linked when we read it).
                let next = unsafe { shields[n].protect_masked(&cur_ref.next, MARK) };
                // Acquire: the re-check; pairs with the Release CASes that change links.
                // SAFETY: `prev` is the head or the `next` of the node shields[p] protects.
                if unsafe { &*prev }.load(Ordering::Acquire) != cur {
                    continue 'retry;
                }
                if marked(next) {
                    // `cur` is deleted: unlink it. Release: passes on what protecting
                    // `next` acquired (the successor's initialisation) to traversals
                    // that reach it through `prev` with Acquire.
                    let succ = unmarked(next);
                    // SAFETY: as above.
                    let unlinked =
                        unsafe { &*prev }.compare_exchange(cur, succ, Ordering::Release, Ordering::Relaxed).is_ok();
                    if !unlinked {
                        continue 'retry;
                    }
                    shields[c].reset();
                    // SAFETY: our CAS unlinked `cur` (a marked node is never re-linked),
                    // and only the unlinking CAS's winner retires it, its link projected
                    // from `cur` (free_node's contract).
                    unsafe {
                        self.reclaim.retire(cur, NonNull::new_unchecked(&raw mut (*cur).link), free_node::<Node<K>>)
                    };
                    cur = succ;
                    core::mem::swap(&mut c, &mut n);
                    continue;
                }
                if cur_ref.key >= *key {
                    let found = cur_ref.key == *key;
                    // Leave the protected pair in slots 0 (prev's node) and 1 (cur).
                    shields.swap(0, p);
                    let c = if c == 0 { p } else { c };
                    shields.swap(1, c);
                    return Position { prev, cur, found };
                }
                prev = &cur_ref.next;
                cur = next;
                (p, c, n) = (c, n, p);
            }
        }
    }

    fn shields(&self) -> [R::Shield<'_>; 3] {
        [self.reclaim.shield(), self.reclaim.shield(), self.reclaim.shield()]
    }

    /// Inserts `key`; false if it was already present.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    /// use scalemem::ds::OrderedList;
    /// use scalemem::reclaim::{Ebr, Hazard, Reclaim};
    ///
    /// /// Four threads insert the same 50 keys: each key goes in once.
    /// fn insert_all<R: Reclaim + Default>() {
    ///     let (set, inserted) = (OrderedList::<u32, R>::new(), AtomicUsize::new(0));
    ///     std::thread::scope(|s| {
    ///         for _ in 0..4 {
    ///             s.spawn(|| inserted.fetch_add((0..50).filter(|&k| set.insert(k)).count(), Relaxed));
    ///         }
    ///     });
    ///     assert_eq!(inserted.load(Relaxed), 50); // one `true` per key, the others `false`
    ///     assert_eq!(set.to_vec(), (0..50).collect::<Vec<_>>());
    /// }
    /// insert_all::<Ebr>();
    /// insert_all::<Hazard>();
    /// ```
    pub fn insert(&self, key: K) -> bool {
        let mut shields = self.shields();
        let node = Box::into_raw(Box::new(Node {
            link: Retired::new(),
            key,
            next: AtomicPtr::new(ptr::null_mut()),
            canary: Canary::new(),
        }));
        loop {
            // SAFETY: the node is ours until the CAS below publishes it.
            let pos = self.find(unsafe { &(*node).key }, &mut shields);
            if pos.found {
                // SAFETY: never published: ours to free.
                drop(unsafe { Box::from_raw(node) });
                return false;
            }
            // SAFETY: ours until published. Relaxed: the Release CAS below publishes it.
            unsafe { (*node).next.store(pos.cur, Ordering::Relaxed) };
            // Release: publishes the node's contents to traversals' Acquire loads.
            // SAFETY: `prev` is the head or a protected node's link.
            if unsafe { &*pos.prev }.compare_exchange(pos.cur, node, Ordering::Release, Ordering::Relaxed).is_ok() {
                return true;
            }
        }
    }

    /// Removes `key`; false if it was not present.
    ///
    /// ```
    /// use scalemem::ds::OrderedList;
    /// use scalemem::reclaim::{Ebr, Hazard, Reclaim};
    ///
    /// fn check<R: Reclaim + Default>() {
    ///     let set = OrderedList::<u32, R>::new();
    ///     assert!(set.insert(1) && set.insert(2));
    ///     assert!(set.remove(&1));
    ///     assert!(!set.remove(&1)); // already gone
    ///     assert!(!set.remove(&3)); // never there
    ///     assert_eq!(set.to_vec(), [2]);
    /// }
    /// check::<Ebr>();
    /// check::<Hazard>();
    /// ```
    pub fn remove(&self, key: &K) -> bool {
        let mut shields = self.shields();
        loop {
            let pos = self.find(key, &mut shields);
            if !pos.found {
                return false;
            }
            // SAFETY: `cur` is protected by shields[1].
            let cur_ref = unsafe { &*pos.cur };
            // Relaxed: the CAS below validates it.
            let next = cur_ref.next.load(Ordering::Relaxed);
            if marked(next) {
                continue; // someone else deleted it: find unlinks it, then reports absent
            }
            // The logical deletion, the linearisation point. Acquire: `next` may be a node
            // inserted after our find, whose insert CAS (Release) we have not synchronised
            // with yet; the unlink below publishes `next` through `prev`, and its Release
            // passes on only what this thread has acquired. A Relaxed mark let a traversal
            // that Acquire-loads `next` from `prev` read the new node's key and link with
            // no happens-before edge to their initialisation (a data race; ThreadSanitizer
            // reported it in tests/ds.rs list_concurrent).
            let marked_next = next.map_addr(|a| a | MARK);
            if cur_ref.next.compare_exchange(next, marked_next, Ordering::Acquire, Ordering::Relaxed).is_err() {
                continue;
            }
            // Try to unlink it ourselves; if that fails, a find does it. Release: passes on
            // what the Acquire mark acquired (`next`'s initialisation) to traversals.
            // SAFETY: `prev` is the head or a protected node's link.
            let unlinked =
                unsafe { &*pos.prev }.compare_exchange(pos.cur, next, Ordering::Release, Ordering::Relaxed).is_ok();
            if unlinked {
                shields[1].reset();
                // SAFETY: our CAS unlinked the marked node; it is retired once, its link
                // projected from `pos.cur` (free_node's contract).
                unsafe {
                    self.reclaim.retire(pos.cur, NonNull::new_unchecked(&raw mut (*pos.cur).link), free_node::<Node<K>>)
                };
            } else {
                let _ = self.find(key, &mut shields);
            }
            return true;
        }
    }

    /// Whether `key` is present.
    ///
    /// ```
    /// use scalemem::ds::OrderedList;
    /// use scalemem::reclaim::{Ebr, Hazard, Reclaim};
    ///
    /// fn check<R: Reclaim + Default>() {
    ///     let set = OrderedList::<&str, R>::new();
    ///     set.insert("pear");
    ///     assert!(set.contains(&"pear"));
    ///     assert!(!set.contains(&"apple"));
    ///     set.remove(&"pear");
    ///     assert!(!set.contains(&"pear"));
    /// }
    /// check::<Ebr>();
    /// check::<Hazard>();
    /// ```
    pub fn contains(&self, key: &K) -> bool {
        let mut shields = self.shields();
        self.find(key, &mut shields).found
    }

    /// The keys present (a snapshot taken by one traversal; concurrent updates may or may
    /// not show).
    ///
    /// ```
    /// use scalemem::ds::OrderedList;
    /// use scalemem::reclaim::{Ebr, Hazard, Reclaim};
    ///
    /// fn sorted<R: Reclaim + Default>() -> Vec<u32> {
    ///     let set = OrderedList::<u32, R>::new();
    ///     for k in [5, 1, 4, 1, 3] {
    ///         set.insert(k);
    ///     }
    ///     set.remove(&4);
    ///     set.to_vec()
    /// }
    /// assert_eq!(sorted::<Ebr>(), [1, 3, 5]); // in key order, each key once
    /// assert_eq!(sorted::<Hazard>(), [1, 3, 5]);
    /// ```
    pub fn to_vec(&self) -> Vec<K>
    where
        K: Clone,
    {
        let mut shields = self.shields();
        let mut keys = Vec::new();
        'retry: loop {
            keys.clear();
            let (mut p, mut c, mut n) = (0, 1, 2);
            let mut prev: *const AtomicPtr<Node<K>> = &self.head;
            // SAFETY: as in find.
            let mut cur = unsafe { shields[c].protect_masked(&*prev, MARK) };
            while let Some(node) = NonNull::new(cur) {
                // SAFETY: protected by shields[c], linked from `prev` after publication.
                let node = unsafe { node.as_ref() };
                // SAFETY: as in find.
                let next = unsafe { shields[n].protect_masked(&node.next, MARK) };
                // Acquire: the re-check of find: `node` was still linked when `next` was
                // read. SAFETY: `prev` is the head or a protected node's link.
                if unsafe { &*prev }.load(Ordering::Acquire) != cur {
                    continue 'retry;
                }
                if marked(next) {
                    // A deleted node: let find unlink it (it is protected meanwhile, so
                    // its key is readable), then start over.
                    let _ = self.find(&node.key, &mut self.shields());
                    continue 'retry;
                }
                keys.push(node.key.clone());
                prev = &node.next;
                cur = next;
                (p, c, n) = (c, n, p);
            }
            let _ = p;
            return keys;
        }
    }
}

impl<K, R: Reclaim> Drop for OrderedList<K, R> {
    fn drop(&mut self) {
        // Relaxed: we own the list; no other thread can reach it.
        let mut cursor = self.head.load(Ordering::Relaxed);
        while let Some(node) = NonNull::new(unmarked(cursor)) {
            // SAFETY: nodes still linked (marked or not) are ours; each is freed once.
            let node = unsafe { Box::from_raw(node.as_ptr()) };
            cursor = node.next.load(Ordering::Relaxed);
        }
    }
}

impl<K, R: Reclaim> fmt::Debug for OrderedList<K, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OrderedList").finish_non_exhaustive()
    }
}
