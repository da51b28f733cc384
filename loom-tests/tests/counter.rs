//! loom model of `cpu::PerCpuCounter` in the mode loom can check (there is no rseq under
//! loom: every update is the `fetch_add` fallback on the current CPU's slot, which is
//! also what a thread without rseq runs). On loom's 2 CPUs three updating threads put
//! two of them on one slot, so updates share a slot as they do when threads outnumber
//! CPUs. No update may be lost: once the threads are joined the sum is exact, and a sum
//! taken while they run is one the slots passed through.
//!
//! ```text
//! ci/loom.sh counter
//! ```
#![cfg(scalemem_loom)]

use loom::sync::Arc;
use loom::thread;

use scalemem::cpu::PerCpuCounter;
use scalemem_loom_tests::run_model;

#[test]
fn updates_on_a_shared_slot_are_not_lost() {
    run_model("counter: three updaters on two CPUs, a concurrent sum", || {
        let counter = Arc::new(PerCpuCounter::new().unwrap());
        // Threads 1 and 2 (and the main thread, 0) map to CPUs 1, 0 and 0.
        let updaters: Vec<_> = [(1isize, 2isize), (10, -3), (100, 100)]
            .into_iter()
            .map(|(a, b)| {
                let counter = counter.clone();
                thread::spawn(move || {
                    counter.add(a);
                    counter.add(b);
                })
            })
            .collect();
        // Each updater's part of a racing sum is 0, its first delta or both of them; the
        // slots hold sums of those, so the total is one of the 27 combinations.
        let racing = counter.sum();
        let parts = [[0, 1, 3], [0, 10, 7], [0, 100, 200]];
        let possible = parts[0].iter().any(|a| parts[1].iter().any(|b| parts[2].iter().any(|c| a + b + c == racing)));
        assert!(possible, "a sum no interleaving of the updates gives: {racing}");
        for updater in updaters {
            updater.join().unwrap();
        }
        assert_eq!(counter.sum(), 3 + 7 + 200, "an update was lost");
        let (by_rseq, by_atomic) = counter.sum_by_path();
        assert_eq!((by_rseq, by_atomic), (0, 210), "under loom every update is the atomic fallback");
    });
}
