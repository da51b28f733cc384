//! loom models of the epoch protocol (symmetric fences: loom checks the SeqCst-fence
//! mode, which is also the run-time fallback; the asymmetric mode's extra argument is in
//! the module doc of `scalemem::epoch`). Bags hold 2 entries and batches 2 objects under
//! `scalemem_loom`, so sealing, new-bag and budget paths all run.
#![cfg(scalemem_loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::AtomicUsize;
use loom::thread;
use std::sync::atomic::Ordering::{AcqRel, Acquire, SeqCst};

use scalemem::epoch::{self, Atomic, Collector, Owned, Shared};
use scalemem_loom_tests::run_model;

/// A node whose destructor writes to a loom cell, so a free that is not ordered after a
/// reader's access is reported as a causality violation.
struct Node {
    value: UnsafeCell<usize>,
    drops: Arc<AtomicUsize>,
}

impl Node {
    fn new(value: usize, drops: &Arc<AtomicUsize>) -> Self {
        Self { value: UnsafeCell::new(value), drops: drops.clone() }
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

/// Flushes until `drops` reaches `expected` (each flush may advance and collect once).
fn drain(handle: &epoch::LocalHandle, drops: &AtomicUsize, expected: usize) {
    for _ in 0..8 {
        if drops.load(SeqCst) == expected {
            return;
        }
        handle.pin().flush();
    }
    assert_eq!(drops.load(SeqCst), expected, "garbage left behind");
}

#[test]
fn pin_vs_advance_never_frees_what_a_reader_sees() {
    run_model("pin vs advance", || {
        let collector = Collector::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let slot = Arc::new(Atomic::new(Node::new(7, &drops)));

        let reader = {
            let (collector, slot) = (collector.clone(), slot.clone());
            thread::spawn(move || {
                let handle = collector.register();
                let guard = handle.pin();
                let p = slot.load(Acquire, &guard);
                // SAFETY: loaded under `guard`.
                if let Some(node) = unsafe { p.as_ref() } {
                    assert_eq!(node.read(), 7);
                }
            })
        };

        // The writer unlinks, retires and then drives the epoch as hard as it can.
        let handle = collector.register();
        {
            let guard = handle.pin();
            let old = slot.swap(Shared::null(), AcqRel, &guard);
            // SAFETY: unlinked, retired once.
            unsafe { guard.defer_destroy(old) };
        }
        handle.pin().flush();
        handle.pin().flush();
        handle.pin().flush();
        reader.join().unwrap();
        drain(&handle, &drops, 1);
    });
}

#[test]
fn seal_races_with_an_advance_by_another_thread() {
    // The case the seal's fence exists for (module doc, case 2): the retirer seals while a
    // third thread advances the epoch and a reader pins in the new epoch. The bag's epoch
    // must never be so stale that the second advance after it frees what the reader holds.
    run_model("seal vs concurrent advance", || {
        let collector = Collector::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let slot = Arc::new(Atomic::new(Node::new(5, &drops)));

        let retirer = {
            let (collector, slot) = (collector.clone(), slot.clone());
            thread::spawn(move || {
                let handle = collector.register();
                let guard = handle.pin();
                let old = slot.swap(Shared::null(), AcqRel, &guard);
                // SAFETY: unlinked, retired once.
                unsafe { guard.defer_destroy(old) };
                guard.flush(); // seals the bag
            })
        };
        let reader = {
            let (collector, slot) = (collector.clone(), slot.clone());
            thread::spawn(move || {
                let handle = collector.register();
                let guard = handle.pin();
                // SAFETY: loaded under `guard`.
                if let Some(node) = unsafe { slot.load(Acquire, &guard).as_ref() } {
                    assert_eq!(node.read(), 5);
                }
            })
        };
        // The main thread is the third party that keeps advancing.
        let handle = collector.register();
        handle.pin().flush();
        handle.pin().flush();
        retirer.join().unwrap();
        reader.join().unwrap();
        drain(&handle, &drops, 1);
    });
}

#[test]
fn retire_vs_reclaim_frees_every_object_once() {
    run_model("retire vs reclaim", || {
        let collector = Collector::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let slot = Arc::new(Atomic::new(Node::new(0, &drops)));

        let threads: Vec<_> = (1..=2)
            .map(|t| {
                let (collector, slot, drops) = (collector.clone(), slot.clone(), drops.clone());
                thread::spawn(move || {
                    let handle = collector.register();
                    let guard = handle.pin();
                    // Read what is there, then replace it and retire the old node.
                    let seen = slot.load(Acquire, &guard);
                    // SAFETY: loaded under `guard`.
                    let _ = unsafe { seen.as_ref() }.map(Node::read);
                    let old = slot.swap(Owned::new(Node::new(t, &drops)), AcqRel, &guard);
                    // SAFETY: unlinked by the swap, retired once.
                    unsafe { guard.defer_destroy(old) };
                    guard.flush();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let handle = collector.register();
        drain(&handle, &drops, 2);
        drop(handle);
        drop(collector);
        // SAFETY: every thread is done.
        drop(unsafe { Arc::try_unwrap(slot).ok().unwrap().into_owned() });
        assert_eq!(drops.load(SeqCst), 3);
    });
}

#[test]
fn garbage_of_an_exiting_thread_is_adopted() {
    run_model("thread exit with garbage", || {
        let drops = Arc::new(AtomicUsize::new(0));
        let slot = Arc::new(Atomic::new(Node::new(1, &drops)));
        let collector = Collector::new();
        let exiting = {
            let (collector, slot) = (collector.clone(), slot.clone());
            // Retires one object (its bag is not full) and exits without flushing.
            thread::spawn(move || {
                let handle = collector.register();
                let guard = handle.pin();
                let old = slot.swap(Shared::null(), AcqRel, &guard);
                // SAFETY: unlinked, retired once.
                unsafe { guard.defer_destroy(old) };
            })
        };
        // Meanwhile another thread reads the slot.
        let reader = {
            let (collector, slot) = (collector.clone(), slot.clone());
            thread::spawn(move || {
                let handle = collector.register();
                let guard = handle.pin();
                // SAFETY: loaded under `guard`.
                if let Some(node) = unsafe { slot.load(Acquire, &guard).as_ref() } {
                    assert_eq!(node.read(), 1);
                }
            })
        };
        exiting.join().unwrap();
        reader.join().unwrap();
        let handle = collector.register();
        drain(&handle, &drops, 1);
    });
}

#[test]
fn default_collector_thread_exit_through_thread_local() {
    // The default collector registers threads through a thread-local whose destructor
    // hands the thread's garbage over. loom runs TLS destructors *after* `join` returns
    // (std runs them before), so here the hand-off also races with the main thread's
    // flushes: nothing may be freed early, and the garbage must still be freed.
    run_model("default collector, TLS handle", || {
        let drops = Arc::new(AtomicUsize::new(0));
        let slot = Arc::new(Atomic::new(Node::new(3, &drops)));
        let t = {
            let slot = slot.clone();
            thread::spawn(move || {
                let guard = epoch::pin();
                let old = slot.swap(Shared::null(), AcqRel, &guard);
                // SAFETY: unlinked, retired once.
                unsafe { guard.defer_destroy(old) };
            })
        };
        {
            let guard = epoch::pin();
            // SAFETY: loaded under `guard`.
            if let Some(node) = unsafe { slot.load(Acquire, &guard).as_ref() } {
                assert_eq!(node.read(), 3);
            }
        }
        t.join().unwrap();
        // Yield so the exiting thread's hand-off can finish, driving the collector.
        for _ in 0..16 {
            if drops.load(SeqCst) == 1 {
                break;
            }
            epoch::pin().flush();
            thread::yield_now();
        }
        assert_eq!(drops.load(SeqCst), 1);
    });
}
