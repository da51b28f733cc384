//! loom models of umem's magazine layer (`CpuCaches`) in locked mode (the only mode
//! under loom: there is no rseq), with magazines of 2 rounds on loom's 2 CPUs (model
//! thread index modulo 2: the main thread and thread 2 share CPU 0, thread 1 is on CPU
//! 1). Every round handed in must come out exactly once: allocated by some thread,
//! handed back by a refused free, drained by a reconfiguration, or in the final drain.
//! The depot's pops pin the (loom) epoch; magazines freed by drains are retired.
//!
//! ```text
//! ci/loom.sh magazine
//! ```
#![cfg(scalemem_loom)]

use std::ptr::NonNull;

use loom::sync::Arc;
use loom::thread;
use scalemem::umem::{Config, CpuCaches};
use scalemem_loom_tests::run_model;

/// Magazines of 2 rounds, no resizing.
const TINY: Config = Config { initial_rounds: 2, min_rounds: 2, max_rounds: 2, grow_contention: 2, shrink_idle: 8 };

/// A fake, never dereferenced, non-null address.
fn token(n: usize) -> NonNull<u8> {
    NonNull::new(std::ptr::without_provenance_mut::<u8>(n << 4)).unwrap()
}

fn addr(p: NonNull<u8>) -> usize {
    p.as_ptr().addr() >> 4
}

/// Asserts that `seen` holds each of the tokens `1..=count` exactly once.
fn assert_each_once(mut seen: Vec<usize>, count: usize) {
    seen.sort_unstable();
    assert_eq!(seen, (1..=count).collect::<Vec<_>>(), "lost or duplicated rounds");
}

/// Frees `items` (keeping the refused ones), then allocates up to `allocs` rounds;
/// returns what the thread ends up holding.
fn free_then_alloc(caches: &CpuCaches, items: &[usize], allocs: usize) -> Vec<usize> {
    let mut hand = Vec::new();
    for &item in items {
        if let Err(back) = caches.free(token(item)) {
            assert_eq!(back, token(item));
            hand.push(item);
        }
    }
    for _ in 0..allocs {
        if let Some(round) = caches.alloc() {
            hand.push(addr(round));
        }
    }
    hand
}

/// Drains the layer once every other handle is gone.
fn drain_all(caches: Arc<CpuCaches>, seen: &mut Vec<usize>) {
    let caches = Arc::try_unwrap(caches).unwrap_or_else(|_| panic!("caches still shared"));
    caches.assert_valid();
    caches.drain(|round| seen.push(addr(round)));
    let stats = caches.stats();
    assert_eq!((stats.cpu_rounds, stats.depot_full, stats.depot_empty), (0, 0, 0));
}

#[test]
fn depot_exchange_between_two_cpus() {
    run_model("magazine: CPU 0 swaps and exchanges while CPU 1 takes the depot's full magazine", || {
        let caches = Arc::new(CpuCaches::new(TINY).unwrap());
        // Main thread, CPU 0: 5 frees leave 3 rounds on CPU 0 (loaded 1, previous full)
        // and one full magazine (rounds 1, 2) in the depot.
        let mut seen = free_then_alloc(&caches, &[1, 2, 3, 4, 5], 0);
        assert!(seen.is_empty());
        assert_eq!(caches.stats().depot_full, 1);
        // Thread 1, CPU 1: nothing loaded: its alloc exchanges for the depot's magazine.
        let other = {
            let caches = caches.clone();
            thread::spawn(move || free_then_alloc(&caches, &[], 2))
        };
        // CPU 0 meanwhile: pop, swap with the full previous, pop, pop, then exchange for
        // the depot's magazine if it is still there, else miss.
        seen.extend(free_then_alloc(&caches, &[], 4));
        seen.extend(other.join().unwrap());
        drain_all(caches, &mut seen);
        assert_each_once(seen, 5);
    });
}

#[test]
fn three_threads_two_sharing_a_cpu() {
    run_model("magazine: threads 0 and 2 share CPU 0's slot lock, thread 1 is on CPU 1", || {
        let caches = Arc::new(CpuCaches::new(TINY).unwrap());
        // Thread 1 (CPU 1) frees 3: its loaded magazine fills, then a free-side exchange.
        // Thread 2 (CPU 0) frees 2 and allocates 1, racing the main thread for CPU 0.
        let others: Vec<_> = [(vec![1, 2, 3], 1), (vec![4, 5], 1)]
            .into_iter()
            .map(|(items, allocs)| {
                let caches = caches.clone();
                thread::spawn(move || free_then_alloc(&caches, &items, allocs))
            })
            .collect();
        // Main thread (CPU 0): allocates twice (a hit, a swap or a depot exchange, or a
        // miss, depending on the interleaving and on a busy lock).
        let mut seen = free_then_alloc(&caches, &[], 2);
        for other in others {
            seen.extend(other.join().unwrap());
        }
        drain_all(caches, &mut seen);
        assert_each_once(seen, 5);
    });
}

#[test]
fn drain_against_the_fast_path() {
    run_model("magazine: a reconfiguration drains every CPU while CPU 1 frees and allocates", || {
        let caches = Arc::new(CpuCaches::new(TINY).unwrap());
        // Main thread (CPU 0) caches two rounds first.
        let mut seen = free_then_alloc(&caches, &[1, 2], 0);
        assert!(seen.is_empty());
        let other = {
            let caches = caches.clone();
            thread::spawn(move || free_then_alloc(&caches, &[3, 4, 5], 2))
        };
        // The reconfiguration: stops both slots (taking their locks), drains them and
        // the depot.
        caches.drain(|round| seen.push(addr(round)));
        seen.extend(other.join().unwrap());
        drain_all(caches, &mut seen);
        assert_each_once(seen, 5);
    });
}

#[test]
fn idle_drain_against_the_fast_path() {
    run_model("magazine: an idle drain stops and drains quiet CPUs while CPU 1 frees and allocates", || {
        let caches = Arc::new(CpuCaches::new(TINY).unwrap());
        // Main thread (CPU 0) caches two rounds; then the first call records every slot.
        let mut seen = free_then_alloc(&caches, &[1, 2], 0);
        assert!(seen.is_empty());
        assert_eq!(caches.drain_idle(1, |_| unreachable!()), 0, "the first call only looks");
        let other = {
            let caches = caches.clone();
            thread::spawn(move || free_then_alloc(&caches, &[3, 4, 5], 1))
        };
        // CPU 0 did nothing since: drained. CPU 1 is drained too if the call finds it
        // holding rounds with the state it had at the first call (here: never, it held
        // nothing then), and never while its lock is held.
        let drained = caches.drain_idle(1, |round| seen.push(addr(round)));
        assert!(drained >= 1, "CPU 0 sat idle with two rounds");
        seen.extend(other.join().unwrap());
        // A third call: CPU 1, if untouched since the second, is drained now.
        caches.drain_idle(1, |round| seen.push(addr(round)));
        drain_all(caches, &mut seen);
        assert_each_once(seen, 5);
    });
}

#[test]
fn resize_against_the_fast_path() {
    run_model("magazine: an update shrinks the magazines (a drain) while CPU 1 frees and allocates", || {
        // No contention and `shrink_idle: 0`: the first update shrinks 2 -> 1.
        let config = Config { initial_rounds: 2, min_rounds: 1, max_rounds: 2, grow_contention: 2, shrink_idle: 0 };
        let caches = Arc::new(CpuCaches::new(config).unwrap());
        let mut seen = free_then_alloc(&caches, &[1, 2, 3], 0);
        assert!(seen.is_empty());
        let other = {
            let caches = caches.clone();
            thread::spawn(move || free_then_alloc(&caches, &[4, 5], 2))
        };
        // Contention only comes from failed CASes or exchanges, which this interleaving
        // may produce: then no resize, else a resize to 1 that drains everything.
        let size = caches.update(|round| seen.push(addr(round)));
        assert!(size == 1 || caches.stats().contention > 0);
        seen.extend(other.join().unwrap());
        drain_all(caches, &mut seen);
        assert_each_once(seen, 5);
    });
}

#[test]
fn trim_against_the_free_path() {
    run_model(
        "magazine: a free-time trim empties the depot's full magazines while both CPUs free and allocate",
        || {
            let caches = Arc::new(CpuCaches::new(TINY).unwrap());
            // Main thread (CPU 0): 5 frees leave one full magazine (rounds 1, 2) in the depot.
            let mut seen = free_then_alloc(&caches, &[1, 2, 3, 4, 5], 0);
            assert!(seen.is_empty());
            assert_eq!(caches.depot_full(), 1);
            // Thread 1 (CPU 1) frees 3 (filling a magazine, then a free-side exchange that may
            // pop the trimmed, recycled magazine from the empty list) and allocates 1, which
            // may take the depot's full magazine before the trim does.
            let other = {
                let caches = caches.clone();
                thread::spawn(move || free_then_alloc(&caches, &[6, 7, 8], 1))
            };
            // The trim keeps no full magazine: its rounds leave the layer here.
            let mut trimmed = Vec::new();
            let rounds = caches.trim_depot(0, |round| trimmed.push(addr(round)));
            assert_eq!(rounds, trimmed.len());
            seen.extend(trimmed);
            seen.extend(other.join().unwrap());
            drain_all(caches, &mut seen);
            assert_each_once(seen, 8);
        },
    );
}
