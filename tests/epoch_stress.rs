//! Stress and steady-state tests of `epoch`: the example `stress` run as a test (16
//! threads on however few cores, every value and object accounted for), and the
//! garbage backlog under sustained retirement. The tests of this file run one at a
//! time, so their threads compete only with each other's.

#[path = "../examples/stress.rs"]
#[allow(dead_code)]
mod stress;

use std::sync::Mutex;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{AcqRel, SeqCst};
use std::sync::{Arc, Barrier};
use std::thread;

use scalemem::epoch::{Atomic, Collector, Owned, Shared};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn stress_secs() -> f64 {
    std::env::var("STRESS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(3.0)
}

#[test]
fn treiber_stack_and_thread_churn_with_16_threads() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let report = stress::run(stress_secs(), 16);
    assert!(report.stack_ops > 0 && report.churned_threads > 0 && report.advances > 0, "{report:?}");
}

#[test]
fn a_backlog_drains_at_the_full_budget_per_call() {
    // Two threads retire while a third stays pinned, so nothing can expire and a backlog
    // builds. Once the blocker unpins, every collect call must free a full budget (8 bags
    // or batches) until the backlog is gone: no call may waste itself re-walking garbage
    // it cannot free, and nothing may be left behind.
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    const THREADS: usize = 2;
    let per_thread = if cfg!(debug_assertions) { 64 * 500 } else { 64 * 2500 };
    let collector = Collector::new();
    let drops = Arc::new(AtomicUsize::new(0));
    let blocker = collector.register();
    let pinned = blocker.pin();
    let barrier = Arc::new(Barrier::new(THREADS));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (collector, drops, barrier) = (collector.clone(), drops.clone(), barrier.clone());
            thread::spawn(move || {
                let handle = collector.register();
                let slot = Atomic::new(0u64);
                barrier.wait();
                for i in 0..per_thread {
                    let guard = handle.pin();
                    let old = slot.swap(Owned::new(i as u64), AcqRel, &guard);
                    let d = drops.clone();
                    // SAFETY: unlinked by the swap, retired once.
                    unsafe {
                        guard.defer_unchecked(move || {
                            drop(old.into_owned());
                            d.fetch_add(1, SeqCst);
                        })
                    };
                }
                let guard = handle.pin();
                // SAFETY: the last value is ours alone.
                drop(unsafe { slot.swap(Shared::null(), AcqRel, &guard).into_owned() });
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(drops.load(SeqCst), 0, "freed while a thread was pinned");
    let backlog = collector.stats().pending;
    assert_eq!(backlog, THREADS * per_thread / 64, "every full bag is queued");
    drop(pinned);

    let handle = collector.register();
    let mut calls = 0;
    while drops.load(SeqCst) < THREADS * per_thread {
        handle.pin().flush();
        calls += 1;
        assert!(calls <= backlog / 8 + 4, "{calls} calls have freed only {} objects", drops.load(SeqCst));
    }
    assert_eq!(collector.stats().pending, 0);
}
