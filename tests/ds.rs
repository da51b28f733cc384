//! The data structures of `scalemem::ds` under both reclamation schemes (epoch and hazard
//! pointers, the global domain and a user domain): sequential behaviour, then 16 threads
//! on however few cores with every value accounted for exactly once and every node freed.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use scalemem::ds::{MsQueue, OrderedList, TreiberStack};
use scalemem::hazard::Domain;
use scalemem::reclaim::{Ebr, Hazard, Reclaim};

/// Serialises the many-thread tests, so they compete only with the small ones.
static HEAVY: Mutex<()> = Mutex::new(());

fn heavy() -> std::sync::MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

const THREADS: usize = 16;

fn per_thread() -> usize {
    if cfg!(debug_assertions) { 2_000 } else { 20_000 }
}

/// A value that counts its drops, to show every value is dropped exactly once.
#[derive(Debug)]
struct Tracked {
    value: usize,
    drops: Arc<AtomicUsize>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.drops.fetch_add(1, SeqCst);
    }
}

fn stack_sequential<R: Reclaim>(stack: TreiberStack<Tracked, R>) {
    let drops = Arc::new(AtomicUsize::new(0));
    assert!(stack.is_empty());
    for value in 0..100 {
        stack.push(Tracked { value, drops: drops.clone() });
    }
    for expected in (50..100).rev() {
        assert_eq!(stack.pop().map(|t| t.value), Some(expected));
    }
    assert_eq!(drops.load(SeqCst), 50);
    drop(stack); // drops the 50 values still in it
    assert_eq!(drops.load(SeqCst), 100);
}

fn stack_concurrent<R: Reclaim + Send>(stack: TreiberStack<usize, R>) {
    let _heavy = heavy();
    let n = per_thread();
    let barrier = Barrier::new(THREADS);
    let popped: Vec<Vec<usize>> = thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (stack, barrier) = (&stack, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let mut got = Vec::new();
                    for i in 0..n {
                        stack.push(t * n + i);
                        if i % 2 == 1 {
                            got.extend(stack.pop());
                        }
                    }
                    got
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let mut seen = vec![false; THREADS * n];
    for v in popped.into_iter().flatten().chain(std::iter::from_fn(|| stack.pop())) {
        assert!(!seen[v], "value {v} popped twice");
        seen[v] = true;
    }
    assert!(seen.iter().all(|&s| s), "a value was lost");
}

fn queue_sequential<R: Reclaim>(queue: MsQueue<Tracked, R>) {
    let drops = Arc::new(AtomicUsize::new(0));
    assert!(queue.is_empty());
    assert!(queue.pop().is_none());
    for value in 0..100 {
        queue.push(Tracked { value, drops: drops.clone() });
    }
    for expected in 0..50 {
        assert_eq!(queue.pop().map(|t| t.value), Some(expected));
    }
    assert!(!queue.is_empty());
    drop(queue);
    assert_eq!(drops.load(SeqCst), 100);
}

/// Producers push (thread, sequence) pairs; consumers check that each producer's values
/// come out in order (FIFO per producer) and that every value comes out once.
fn queue_concurrent<R: Reclaim + Send>(queue: MsQueue<(usize, usize), R>) {
    let _heavy = heavy();
    let n = per_thread();
    let producers = THREADS / 2;
    let barrier = Barrier::new(THREADS);
    let done = AtomicUsize::new(0);
    let received: Vec<Vec<(usize, usize)>> = thread::scope(|s| {
        let mut handles = Vec::new();
        for t in 0..THREADS {
            let (queue, barrier, done) = (&queue, &barrier, &done);
            handles.push(s.spawn(move || {
                barrier.wait();
                let mut got = Vec::new();
                if t < producers {
                    for i in 0..n {
                        queue.push((t, i));
                    }
                    done.fetch_add(1, SeqCst);
                } else {
                    let mut last = vec![None; producers];
                    loop {
                        match queue.pop() {
                            Some((p, i)) => {
                                assert!(last[p].is_none_or(|l| l < i), "producer {p}'s values out of order");
                                last[p] = Some(i);
                                got.push((p, i));
                            }
                            None if done.load(SeqCst) == producers => break,
                            None => thread::yield_now(),
                        }
                    }
                }
                got
            }));
        }
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all: Vec<(usize, usize)> = received.into_iter().flatten().collect();
    all.extend(std::iter::from_fn(|| queue.pop()));
    all.sort_unstable();
    let expected: Vec<(usize, usize)> = (0..producers).flat_map(|p| (0..n).map(move |i| (p, i))).collect();
    assert_eq!(all, expected, "a value was lost or duplicated");
}

fn list_sequential<R: Reclaim>(list: OrderedList<u64, R>) {
    for k in [5, 1, 9, 3, 7] {
        assert!(list.insert(k));
    }
    assert!(!list.insert(3));
    assert_eq!(list.to_vec(), vec![1, 3, 5, 7, 9]);
    assert!(list.remove(&5));
    assert!(!list.remove(&5));
    assert!(!list.contains(&5));
    assert!(list.contains(&9));
    assert_eq!(list.to_vec(), vec![1, 3, 7, 9]);
}

/// Each thread inserts and removes keys of its own stripe while all threads read the
/// whole range; at the end the set holds exactly the keys each thread left in.
fn list_concurrent<R: Reclaim + Send>(list: OrderedList<u64, R>) {
    let _heavy = heavy();
    const KEYS_PER_THREAD: u64 = 16;
    let rounds = per_thread() / 10;
    let barrier = Barrier::new(THREADS);
    let kept: Vec<BTreeSet<u64>> = thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS as u64)
            .map(|t| {
                let (list, barrier) = (&list, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let mut mine = BTreeSet::new();
                    for r in 0..rounds as u64 {
                        let key = (r * 7 % KEYS_PER_THREAD) * THREADS as u64 + t;
                        if mine.contains(&key) {
                            assert!(list.remove(&key), "own key {key} missing");
                            mine.remove(&key);
                        } else {
                            assert!(list.insert(key), "own key {key} present twice");
                            mine.insert(key);
                        }
                        assert!(list.contains(&key) == mine.contains(&key));
                        let _ = list.contains(&(r % (KEYS_PER_THREAD * THREADS as u64)));
                    }
                    mine
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let expected: Vec<u64> = kept.into_iter().flatten().collect::<BTreeSet<_>>().into_iter().collect();
    assert_eq!(list.to_vec(), expected);
}

macro_rules! under_every_scheme {
    ($name:ident, $make:ident, $check:ident) => {
        mod $name {
            use super::*;

            #[test]
            fn epoch() {
                $check($make::<_, Ebr>::new());
            }

            #[test]
            fn hazard_global_domain() {
                $check($make::<_, Hazard>::new());
            }

            #[test]
            fn hazard_user_domain() {
                let domain = scalemem::unique_domain!();
                $check($make::new_in(&domain));
                // Everything the structure retired is freed by the domain.
                domain.reclaim();
                assert_eq!(domain.stats().retired, 0);
            }

            #[test]
            fn hazard_owned_domain() {
                $check($make::new_in(Domain::new(())));
            }
        }
    };
}

under_every_scheme!(stack_sequential_, TreiberStack, stack_sequential);
under_every_scheme!(stack_concurrent_, TreiberStack, stack_concurrent);
under_every_scheme!(queue_sequential_, MsQueue, queue_sequential);
under_every_scheme!(queue_concurrent_, MsQueue, queue_concurrent);
under_every_scheme!(list_sequential_, OrderedList, list_sequential);
under_every_scheme!(list_concurrent_, OrderedList, list_concurrent);
