//! loom models of `umem::vmem`: two threads allocating and freeing in a tiny arena. They
//! check the arena's futex mutex (mutual exclusion, no lost wake-up: a sleeper nobody
//! wakes is a deadlock loom reports) and the quantum caches' locks and their hand-off
//! to the arena (a range freed into a cache by one thread and taken by the other; a
//! reap that returns cached ranges for an allocation that needs them). Under loom a
//! quantum cache holds 2 ranges and an arena has at most 2 caches, so the full-cache
//! path runs too. Each model ends with `assert_valid`.
#![cfg(scalemem_loom)]

use loom::sync::Arc;
use loom::sync::atomic::AtomicUsize;
use loom::thread;
use std::sync::atomic::Ordering::SeqCst;

use scalemem::umem::vmem::{Policy, Vmem, VmemError};
use scalemem_loom_tests::run_model;

const IF: Policy = Policy::InstantFit;

/// Marks units `[a, a + n)` as owned in `map` (one bit per unit); panics if one already is.
fn claim(map: &AtomicUsize, a: usize, n: usize) {
    let bits = ((1 << n) - 1) << a;
    let before = map.fetch_or(bits, SeqCst);
    assert_eq!(before & bits, 0, "vmem handed out a unit that is live");
}

fn unclaim(map: &AtomicUsize, a: usize, n: usize) {
    map.fetch_and(!(((1 << n) - 1) << a), SeqCst);
}

/// Both threads allocate a unit, free it (into the 1-unit quantum cache) and allocate
/// again, possibly the unit the other thread just cached. No unit is ever live twice.
#[test]
fn quantum_cache_hand_off_between_threads() {
    run_model("vmem: quantum cache hand-off", || {
        let arena = Arc::new(Vmem::builder("loom-qc").span(0, 4).qcache_max(1).checking(true).build().unwrap());
        let map = Arc::new(AtomicUsize::new(0));
        let worker = |arena: Arc<Vmem<'static>>, map: Arc<AtomicUsize>| {
            move || {
                let a = arena.alloc(1, IF).unwrap();
                claim(&map, a, 1);
                unclaim(&map, a, 1);
                arena.free(a, 1).unwrap();
                let b = arena.alloc(1, IF).unwrap();
                claim(&map, b, 1);
                b
            }
        };
        let other = thread::spawn(worker(arena.clone(), map.clone()));
        let mine = worker(arena.clone(), map.clone())();
        let theirs = other.join().unwrap();
        assert_ne!(mine, theirs);
        for x in [mine, theirs] {
            arena.free(x, 1).unwrap();
        }
        arena.assert_valid();
        let s = arena.stats();
        assert_eq!((s.in_use, s.qcached, s.allocations, s.frees), (2, 2, 4, 4));
        arena.reap();
        assert_eq!(arena.stats().segments, 2, "coalesced back to one free segment");
    });
}

/// Arena-lock contention: sizes above `qcache_max`, so both threads split and coalesce
/// the same free segment under the arena lock.
#[test]
fn arena_lock_excludes_split_and_coalesce() {
    run_model("vmem: arena lock", || {
        let arena = Arc::new(Vmem::new("loom-arena", 0, 4, 1, None, 0).unwrap());
        let map = Arc::new(AtomicUsize::new(0));
        let other = {
            let (arena, map) = (arena.clone(), map.clone());
            thread::spawn(move || {
                let a = arena.alloc(1, IF).unwrap();
                claim(&map, a, 1);
                unclaim(&map, a, 1);
                arena.free(a, 1).unwrap();
            })
        };
        let b = arena.alloc(3, Policy::BestFit).unwrap();
        claim(&map, b, 3);
        unclaim(&map, b, 3);
        arena.free(b, 3).unwrap();
        other.join().unwrap();
        arena.assert_valid();
        assert_eq!(arena.stats().segments, 2);
    });
}

/// A range parked in a quantum cache never makes an allocation fail for good: the
/// two-unit allocation either finds the other thread's unit live (and fails), or gets
/// the whole arena, reaping the cache if the unit sits there (or goes first, and the
/// other thread's allocation fails).
#[test]
fn reap_returns_cached_ranges_to_a_needy_allocation() {
    run_model("vmem: reap on exhaustion", || {
        let arena = Arc::new(Vmem::builder("loom-reap").span(0, 2).qcache_max(1).build().unwrap());
        let other = {
            let arena = arena.clone();
            thread::spawn(move || {
                // Fails only if the two-unit allocation took the whole arena first.
                if let Ok(a) = arena.alloc(1, IF) {
                    arena.free(a, 1).unwrap(); // into the cache
                }
            })
        };
        let got = arena.alloc(2, IF);
        other.join().unwrap();
        match got {
            Ok(a) => {
                assert_eq!(a, 0);
                arena.free(a, 2).unwrap();
            }
            Err(e) => assert_eq!(e, VmemError::Exhausted),
        }
        // Now nothing is live: the whole arena must be allocatable.
        let a = arena.alloc(2, IF).unwrap();
        arena.free(a, 2).unwrap();
        arena.assert_valid();
    });
}

/// Import and release nest the child's lock around the parent's: two threads on a child
/// that imports every span from a parent (one span per allocation: the parent's quantum
/// is the whole request) neither deadlock nor lose a span, and every span goes back.
#[test]
fn import_and_release_through_a_parent_arena() {
    run_model("vmem: import/release nesting", || {
        let parent: &'static Vmem<'static> = Box::leak(Box::new(Vmem::new("loom-parent", 0, 4, 2, None, 0).unwrap()));
        let child = Arc::new(Vmem::builder("loom-child").source(parent).build().unwrap());
        let map = Arc::new(AtomicUsize::new(0));
        let other = {
            let (child, map) = (child.clone(), map.clone());
            thread::spawn(move || {
                let a = child.alloc(2, IF).unwrap();
                claim(&map, a, 2);
                unclaim(&map, a, 2);
                child.free(a, 2).unwrap();
            })
        };
        let b = child.alloc(2, IF).unwrap();
        claim(&map, b, 2);
        unclaim(&map, b, 2);
        child.free(b, 2).unwrap();
        other.join().unwrap();
        child.assert_valid();
        parent.assert_valid();
        let s = child.stats();
        assert_eq!((s.total, s.imports), (0, s.releases));
        assert_eq!(parent.stats().in_use, 0);
        // The other thread's handle died with it (joined above), so this is the last.
        assert!(Arc::try_unwrap(child).is_ok(), "the last handle to the child");
        // SAFETY: the box was leaked above only to lend the parent to the child for
        // 'static; the child, its only borrower, has just been dropped.
        drop(unsafe { Box::from_raw(std::ptr::from_ref(parent).cast_mut()) });
    });
}
