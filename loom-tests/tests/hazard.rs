//! loom models of the hazard-pointer protocol (symmetric fences: loom checks the
//! SeqCst-fence mode, which is also the run-time fallback; the membarrier argument is in
//! the module doc of `scalemem::hazard`). Records hold 2 slots and chunks 2 records
//! under `scalemem_loom`, so overflow and new-chunk paths run in small models.
#![cfg(scalemem_loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicPtr, AtomicUsize};
use loom::thread;
use std::ptr::NonNull;
use std::sync::atomic::Ordering::{AcqRel, Acquire, SeqCst};

use scalemem::hazard::{AtomicArc, Domain, HazardPointer, Retired};
use scalemem_loom_tests::run_model;

/// A node whose destructor writes to a loom cell, so a free that is not ordered after a
/// reader's access is reported as a causality violation.
#[repr(C)]
struct Node {
    link: Retired,
    value: UnsafeCell<usize>,
    drops: Arc<AtomicUsize>,
}

impl Node {
    fn boxed(value: usize, drops: &Arc<AtomicUsize>) -> *mut Node {
        Box::into_raw(Box::new(Node { link: Retired::new(), value: UnsafeCell::new(value), drops: drops.clone() }))
    }

    fn read(&self) -> usize {
        // SAFETY: loom checks this access against every write (the destructor's).
        self.value.with(|v| unsafe { *v })
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // SAFETY: we are dropping the node: loom reports any access not ordered before.
        self.value.with_mut(|v| unsafe { *v = usize::MAX });
        self.drops.fetch_add(1, SeqCst);
    }
}

/// # Safety
/// `link` is the first field of a boxed `Node`, freed once.
unsafe fn reclaim_node(link: NonNull<Retired>) {
    // SAFETY: every link retired with this function is the first field of a boxed Node.
    drop(unsafe { Box::from_raw(link.cast::<Node>().as_ptr()) });
}

/// Swaps `new` into `slot` and retires the old node intrusively to `domain`.
fn replace<F>(domain: &Domain<F>, slot: &AtomicPtr<Node>, new: *mut Node) {
    let old = slot.swap(new, AcqRel);
    // SAFETY: unlinked by the swap, retired once; the link is the node's first field.
    unsafe { domain.retire(old, NonNull::new_unchecked(old).cast(), reclaim_node) };
}

/// Frees what is left in `slot` (every thread is done).
fn free_slot(slot: &AtomicPtr<Node>) {
    let last = slot.load(Acquire);
    if !last.is_null() {
        // SAFETY: every other thread is done; the node was never retired.
        drop(unsafe { Box::from_raw(last) });
    }
}

#[test]
fn protect_vs_retire_never_frees_what_a_reader_holds() {
    run_model("hazard: protect vs retire", || {
        let domain = Arc::new(scalemem::unique_domain!());
        let drops = Arc::new(AtomicUsize::new(0));
        let slot = Arc::new(AtomicPtr::new(Node::boxed(7, &drops)));

        let reader = {
            let (domain, slot) = (domain.clone(), slot.clone());
            thread::spawn(move || {
                let mut hp = HazardPointer::new_in(&*domain);
                // SAFETY: the slot's nodes are retired to `domain` after being unlinked.
                let node = unsafe { hp.protect(&slot) }.unwrap();
                assert_ne!(node.read(), usize::MAX);
            })
        };

        // The writer unlinks, retires and scans at once.
        replace(&domain, &slot, Node::boxed(8, &drops));
        domain.reclaim();
        reader.join().unwrap();
        domain.reclaim();
        assert_eq!(drops.load(SeqCst), 1, "the retired node is freed once the reader is done");
        free_slot(&slot);
    });
}

#[test]
fn scan_vs_publish_a_stale_pointer_never_validates() {
    // The reader publishes a pointer it loaded earlier (try_protect), racing with a
    // writer that unlinks it and scans. Either the scan sees the hazard, or the reader's
    // validation sees the unlink: never both missed.
    run_model("hazard: scan vs publish", || {
        let domain = Arc::new(scalemem::unique_domain!());
        let drops = Arc::new(AtomicUsize::new(0));
        let slot = Arc::new(AtomicPtr::new(Node::boxed(1, &drops)));

        let reader = {
            let (domain, slot) = (domain.clone(), slot.clone());
            thread::spawn(move || {
                let mut hp = HazardPointer::new_in(&*domain);
                let guess = slot.load(Acquire);
                // SAFETY: as above; only a validated pointer is dereferenced.
                if let Ok(Some(node)) = unsafe { hp.try_protect(guess, &slot) } {
                    assert_ne!(node.read(), usize::MAX);
                }
                // Move the hazard on to whatever is there now and read it too.
                // SAFETY: as above.
                let node = unsafe { hp.protect(&slot) }.unwrap();
                assert_ne!(node.read(), usize::MAX);
            })
        };

        replace(&domain, &slot, Node::boxed(2, &drops));
        domain.reclaim();
        reader.join().unwrap();
        domain.reclaim();
        assert_eq!(drops.load(SeqCst), 1);
        free_slot(&slot);
    });
}

#[test]
fn two_writers_and_a_reader_free_each_node_once() {
    run_model("hazard: two retirers, one reader", || {
        let domain = Arc::new(scalemem::unique_domain!());
        let drops = Arc::new(AtomicUsize::new(0));
        let slot = Arc::new(AtomicPtr::new(Node::boxed(0, &drops)));

        let writers: Vec<_> = (1..=2)
            .map(|t| {
                let (domain, slot, drops) = (domain.clone(), slot.clone(), drops.clone());
                thread::spawn(move || {
                    replace(&domain, &slot, Node::boxed(t, &drops));
                    domain.reclaim();
                })
            })
            .collect();
        {
            let mut hp = HazardPointer::new_in(&*domain);
            // SAFETY: as above.
            let node = unsafe { hp.protect(&slot) }.unwrap();
            assert_ne!(node.read(), usize::MAX);
        }
        for w in writers {
            w.join().unwrap();
        }
        // The writers exited: their leftovers are adopted by this thread's scans (see
        // the record-reuse model for why it may take a few yields).
        for _ in 0..16 {
            if drops.load(SeqCst) == 2 {
                break;
            }
            domain.reclaim();
            thread::yield_now();
        }
        assert_eq!(drops.load(SeqCst), 2);
        free_slot(&slot);
    });
}

#[test]
fn records_are_reused_after_thread_exit_without_freeing_early() {
    // Thread A protects a node through the global domain's thread-local record and exits
    // (its record goes back FREE). Thread B claims a record (possibly A's) and retires the
    // node while A may still be reading it; main reclaims. Nothing is freed while A holds
    // it, and the node is freed exactly once.
    run_model("hazard: record reuse after thread exit", || {
        let drops = Arc::new(AtomicUsize::new(0));
        let slot = Arc::new(AtomicPtr::new(Node::boxed(3, &drops)));
        let a = {
            let slot = slot.clone();
            thread::spawn(move || {
                let mut hp = HazardPointer::new();
                // SAFETY: the slot's nodes are retired to the global domain.
                let node = unsafe { hp.protect(&slot) }.unwrap();
                assert_ne!(node.read(), usize::MAX);
            })
        };
        let b = {
            let (slot, drops) = (slot.clone(), drops.clone());
            thread::spawn(move || {
                replace(Domain::global(), &slot, Node::boxed(4, &drops));
                Domain::global().reclaim();
            })
        };
        a.join().unwrap();
        b.join().unwrap();
        // Whatever B left is adopted by a scan here once its record is released. loom
        // runs thread-local destructors *after* `join` returns (std runs them before), so
        // the release may still be on its way: yield to it.
        for _ in 0..16 {
            if drops.load(SeqCst) == 1 {
                break;
            }
            Domain::global().reclaim();
            thread::yield_now();
        }
        assert_eq!(drops.load(SeqCst), 1);
        free_slot(&slot);
    });
}

#[test]
fn adopted_garbage_is_scanned_against_concurrent_publishes() {
    // W retires a node (below the threshold, so no scan) and exits: its record goes back
    // FREE with the node on it. Main adopts and scans while R protects the node. The
    // adoption must come before main's heavy fence, or W's unlink would not be ordered
    // before it and R's hazard could be missed.
    run_model("hazard: adoption vs publish", || {
        let domain = Arc::new(scalemem::unique_domain!());
        let drops = Arc::new(AtomicUsize::new(0));
        let slot = Arc::new(AtomicPtr::new(Node::boxed(5, &drops)));
        let w = {
            let (domain, slot, drops) = (domain.clone(), slot.clone(), drops.clone());
            thread::spawn(move || replace(&domain, &slot, Node::boxed(6, &drops)))
        };
        let r = {
            let (domain, slot) = (domain.clone(), slot.clone());
            thread::spawn(move || {
                let mut hp = HazardPointer::new_in(&*domain);
                // SAFETY: as above.
                let node = unsafe { hp.protect(&slot) }.unwrap();
                assert_ne!(node.read(), usize::MAX);
            })
        };
        domain.reclaim();
        w.join().unwrap();
        r.join().unwrap();
        for _ in 0..16 {
            if drops.load(SeqCst) == 1 {
                break;
            }
            domain.reclaim();
            thread::yield_now();
        }
        assert_eq!(drops.load(SeqCst), 1);
        free_slot(&slot);
    });
}

/// A value whose drop writes a loom cell, for `AtomicArc`.
struct Value {
    cell: UnsafeCell<usize>,
    drops: Arc<AtomicUsize>,
}

// SAFETY: the cell is read through `&Value` only by `read` (loom checks those reads
// against the one write, in `drop`, which has `&mut`).
// - Sync: shared reads are checked by loom; the write is exclusive.
unsafe impl Sync for Value {}

impl Value {
    fn new(v: usize, drops: &Arc<AtomicUsize>) -> std::sync::Arc<Value> {
        std::sync::Arc::new(Value { cell: UnsafeCell::new(v), drops: drops.clone() })
    }

    fn read(&self) -> usize {
        // SAFETY: loom checks this access against the destructor's write.
        self.cell.with(|v| unsafe { *v })
    }
}

impl Drop for Value {
    fn drop(&mut self) {
        // SAFETY: dropping: loom reports any read not ordered before this write.
        self.cell.with_mut(|v| unsafe { *v = usize::MAX });
        self.drops.fetch_add(1, SeqCst);
    }
}

#[test]
fn atomic_arc_guard_outlives_a_concurrent_store() {
    // A reader's guard derefs the value without a reference count while a writer stores
    // a new value and scans: the old value is dropped only after the guard is gone.
    run_model("hazard: AtomicArc load vs store", || {
        let drops = Arc::new(AtomicUsize::new(0));
        let cell = Arc::new(AtomicArc::new(Value::new(1, &drops)));
        let reader = {
            let cell = cell.clone();
            thread::spawn(move || {
                let guard = cell.load();
                assert_ne!(guard.read(), usize::MAX);
            })
        };
        cell.store(Value::new(2, &drops));
        Domain::global().reclaim();
        reader.join().unwrap();
        for _ in 0..16 {
            if drops.load(SeqCst) == 1 {
                break;
            }
            Domain::global().reclaim();
            thread::yield_now();
        }
        assert_eq!(drops.load(SeqCst), 1);
    });
}
