//! Stress run of everything that exists: a Treiber stack on `epoch` and a Michael-Scott
//! queue on hazard pointers hammered by 16 threads (oversubscribed on small machines, so
//! threads are preempted inside pinned and protected sections), an `AtomicArc` updated by
//! read-copy-update from every thread, threads created and destroyed while they retire,
//! and per-CPU counters fed from every thread. Every value must come out exactly once
//! (and in order per producer from the queue), every retired object must be dropped
//! exactly once, every `rcu` must count, and the counters must sum exactly.
//!
//! ```text
//! cargo run --release --example stress            # 3 seconds, 16 threads
//! STRESS_SECS=30 STRESS_THREADS=64 cargo run --release --example stress
//! SCALEMEM_FENCE=symmetric cargo run --release --example stress   # SeqCst-fence mode
//! ```
//!
//! The same code runs as `tests/epoch_stress.rs` (and under AddressSanitizer in CI).

#[path = "treiber_stack.rs"]
#[allow(dead_code)]
mod treiber_stack;

use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, SeqCst};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use scalemem::cpu::{self, PerCpuCounter, fence};
use scalemem::ds::MsQueue;
use scalemem::epoch::{self, Atomic, Owned};
use scalemem::hazard::{AtomicArc, Domain};
use scalemem::reclaim::Hazard;
use treiber_stack::TreiberStack;

/// A value whose drops are counted.
pub struct Tracked {
    /// A unique id (per stack run) or a small number (thread churn).
    pub id: usize,
    drops: Arc<AtomicUsize>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Relaxed);
    }
}

/// What a run did; `run` has already checked it.
#[derive(Debug)]
pub struct Report {
    /// Threads on the Treiber stack.
    pub threads: usize,
    /// Wall time of the whole run, checks included.
    pub elapsed: Duration,
    /// Pushes plus pops.
    pub stack_ops: usize,
    /// Enqueues plus dequeues on the hazard-pointer queue.
    pub queue_ops: usize,
    /// Read-copy-updates of the `AtomicArc` (and as many guarded loads).
    pub arc_updates: usize,
    /// Short-lived threads created (and exited) meanwhile.
    pub churned_threads: usize,
    /// Objects those threads retired.
    pub churn_retired: usize,
    /// Increments of the per-CPU counter.
    pub counter_adds: usize,
    /// Epoch advances during the run.
    pub advances: usize,
}

/// Runs the stress for about `secs` seconds on `threads` threads and checks every
/// invariant, panicking on the first violation.
pub fn run(secs: f64, threads: usize) -> Report {
    let start = Instant::now();
    let advances_before = epoch::default_collector().advances();
    let deadline = start + Duration::from_secs_f64(secs * 0.8);

    // 1. The Treiber stack: push unique ids, pop, record what came out.
    let drops = Arc::new(AtomicUsize::new(0));
    let stack = Arc::new(TreiberStack::new());
    let next_id = Arc::new(AtomicUsize::new(0));
    let counter = Arc::new(PerCpuCounter::new().expect("per-CPU counter memory"));
    let queue = Arc::new(MsQueue::<(usize, usize), Hazard>::new());
    let arc = Arc::new(AtomicArc::new(Arc::new(0usize)));
    let barrier = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (stack, next_id, drops, counter, barrier) =
                (stack.clone(), next_id.clone(), drops.clone(), counter.clone(), barrier.clone());
            let (queue, arc) = (queue.clone(), arc.clone());
            thread::spawn(move || {
                let mut popped = Vec::new();
                let mut adds = 0usize;
                // Per producer, the last sequence number this thread dequeued: a queue
                // hands one producer's values to one consumer in order.
                let mut last_seq = vec![None::<usize>; threads];
                let (mut enqueued, mut dequeued, mut updates, mut last_seen) = (0usize, 0usize, 0usize, 0usize);
                barrier.wait();
                let mut round = 0usize;
                while !round.is_multiple_of(64) || Instant::now() < deadline {
                    let burst = 1 + (round + t) % 8;
                    for _ in 0..burst {
                        let id = next_id.fetch_add(1, Relaxed);
                        stack.push(Tracked { id, drops: drops.clone() });
                    }
                    for _ in 0..burst {
                        if let Some(v) = stack.pop() {
                            popped.push(v.id);
                        }
                    }
                    for _ in 0..burst {
                        queue.push((t, enqueued));
                        enqueued += 1;
                    }
                    for _ in 0..burst {
                        if let Some((producer, seq)) = queue.pop() {
                            assert!(last_seq[producer].is_none_or(|last| last < seq), "queue reordered a producer");
                            last_seq[producer] = Some(seq);
                            dequeued += 1;
                        }
                    }
                    if round.is_multiple_of(4) {
                        arc.rcu(|v| v + 1);
                        updates += 1;
                    }
                    let seen = *arc.load();
                    assert!(seen >= last_seen, "AtomicArc went back from {last_seen} to {seen}");
                    last_seen = seen;
                    counter.add(1);
                    adds += 1;
                    round += 1;
                }
                (popped, adds, enqueued, dequeued, updates)
            })
        })
        .collect();

    // 2. Meanwhile, thread churn: short-lived threads retire objects and exit, some of
    // them while other threads read the same slot.
    let churn_drops = Arc::new(AtomicUsize::new(0));
    let churn_slot = Arc::new(Atomic::new(Tracked { id: 0, drops: churn_drops.clone() }));
    let mut churned = 0usize;
    let mut churn_retired = 0usize;
    while Instant::now() < deadline {
        let batch: Vec<_> = (0..4)
            .map(|k| {
                let (slot, drops) = (churn_slot.clone(), churn_drops.clone());
                thread::spawn(move || {
                    let mut retired = 0;
                    for i in 0..50 {
                        let guard = epoch::pin();
                        if (i + k) % 3 == 0 {
                            let old = slot.swap(Owned::new(Tracked { id: i, drops: drops.clone() }), AcqRel, &guard);
                            // SAFETY: unlinked by the swap, retired once.
                            unsafe { guard.defer_destroy(old) };
                            retired += 1;
                        } else {
                            // SAFETY: loaded under `guard`.
                            let v = unsafe { slot.load(Acquire, &guard).deref() };
                            assert!(v.id < 50);
                        }
                    }
                    retired
                })
            })
            .collect();
        churned += batch.len();
        churn_retired += batch.into_iter().map(|t| t.join().expect("churn thread")).sum::<usize>();
    }

    let mut seen = Vec::new();
    let (mut counter_adds, mut enqueued, mut dequeued, mut arc_updates) = (0, 0, 0, 0);
    for w in workers {
        let (popped, adds, enq, deq, updates) = w.join().expect("stack worker panicked");
        seen.extend(popped);
        counter_adds += adds;
        enqueued += enq;
        dequeued += deq;
        arc_updates += updates;
    }
    while let Some(v) = stack.pop() {
        seen.push(v.id);
    }
    while queue.pop().is_some() {
        dequeued += 1;
    }
    // The queue lost and duplicated nothing; every rcu counted once.
    assert_eq!(dequeued, enqueued, "hazard-pointer queue: {enqueued} enqueued, {dequeued} dequeued");
    assert_eq!(*arc.load(), arc_updates, "AtomicArc lost a read-copy-update");
    // Every hazard-pointer retire is freed once no hazard holds it: nothing does now.
    Domain::global().reclaim();

    // Every id pushed came out exactly once.
    let pushed = next_id.load(SeqCst);
    let mut once = vec![false; pushed];
    for id in seen.iter().copied() {
        assert!(!once[id], "id {id} popped twice");
        once[id] = true;
    }
    assert!(once.iter().all(|&b| b), "an id was lost: {} of {pushed} came out", seen.len());
    // Every value was dropped exactly once (popped values are dropped by the poppers).
    assert_eq!(drops.load(SeqCst), pushed, "values dropped != values pushed");
    // The per-CPU counter lost nothing.
    assert_eq!(counter.sum(), counter_adds as isize, "per-CPU counter lost increments");

    // Every object the churning threads retired is freed once the epoch moves on,
    // although those threads are gone (their garbage was adopted at exit).
    let wait = Instant::now();
    while churn_drops.load(SeqCst) < churn_retired {
        epoch::pin().flush();
        assert!(
            wait.elapsed() < Duration::from_secs(30),
            "garbage of exited threads was lost: {} of {churn_retired} freed, {:?}",
            churn_drops.load(SeqCst),
            epoch::default_collector().stats()
        );
        thread::yield_now();
    }
    assert_eq!(churn_drops.load(SeqCst), churn_retired, "an object was freed twice");
    // The object still in the slot was never retired: free it ourselves.
    let guard = epoch::pin();
    // SAFETY: every other user of the slot has exited; the object is ours alone.
    drop(unsafe { churn_slot.swap(epoch::Shared::null(), AcqRel, &guard).into_owned() });
    drop(guard);
    assert_eq!(churn_drops.load(SeqCst), churn_retired + 1);

    Report {
        threads,
        elapsed: start.elapsed(),
        stack_ops: 2 * pushed,
        queue_ops: 2 * enqueued,
        arc_updates,
        churned_threads: churned,
        churn_retired,
        counter_adds,
        advances: epoch::default_collector().advances() - advances_before,
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[allow(dead_code)]
fn main() {
    let secs = env_or("STRESS_SECS", 3.0);
    let threads = env_or("STRESS_THREADS", 16);
    println!(
        "stress: {threads} threads on {} CPUs for {secs} s; fences {:?}, rseq {}",
        thread::available_parallelism().map_or(1, |n| n.get()),
        fence::mode(),
        if cpu::rseq_enabled() { "on" } else { "off" },
    );
    let r = run(secs, threads);
    let s = r.elapsed.as_secs_f64();
    println!(
        "ok in {s:.2} s: {} Treiber push/pop on epoch ({:.2} M/s), {} queue enqueue/dequeue on hazard \
         pointers, {} AtomicArc rcu, {} short-lived threads retired {} objects, {} per-CPU counter adds, \
         {} epoch advances; every value and object accounted for exactly once",
        r.stack_ops,
        r.stack_ops as f64 / s / 1e6,
        r.queue_ops,
        r.arc_updates,
        r.churned_threads,
        r.churn_retired,
        r.counter_adds,
        r.advances,
    );
}
