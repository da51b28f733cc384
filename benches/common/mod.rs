//! The threaded harness the benches share.
//!
//! - [`run_parallel`] holds `T` threads on a [`Barrier`] and runs `iters` operations on
//!   each; it returns the span from the first thread's start to the last thread's end,
//!   the figure criterion's `iter_custom` wants. Criterion divides it by `iters`, so a
//!   bench reports *time per operation per thread*; with
//!   `Throughput::Elements(T)` criterion also prints the aggregate rate.
//! - [`with_background`] runs a measured closure on the calling thread while background
//!   threads loop an operation (a concurrent reader, say) until it returns.
//! - [`report_environment`] prints the load average and whether two spin loops really
//!   run in parallel, which BENCHMARKING.md asks for before any multi-thread figure.
//!
//! Each bench builds its per-thread operation in a `setup(index)` closure that runs on
//! the thread itself, before the start line: registration with a collector, warm
//! thread-locals and the like are not timed.

// Each bench binary uses a subset of the harness.
#![allow(dead_code)]

use std::hint::black_box;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// Thread counts of the multi-thread benches (BENCHMARKING.md). On a 2-core machine, 4
/// and up are oversubscribed, which is a case worth measuring too.
pub const THREADS: [usize; 5] = [1, 2, 4, 8, 16];

/// Runs `iters` operations on each of `threads` threads released together, and returns
/// the wall time from the earliest start to the latest finish.
///
/// Each thread takes its own timestamps (the calling thread only joins): a coordinator
/// woken from a barrier may be scheduled late on an oversubscribed machine, so its
/// clock would miss part of the run. `setup(index)` runs on thread `index` before the
/// start line and returns the operation to repeat.
///
/// A panic in `setup` leaves the other threads at the start line: keep setups trivial.
pub fn run_parallel<S, Op>(threads: usize, iters: u64, setup: S) -> Duration
where
    S: Fn(usize) -> Op + Sync,
    Op: FnMut(),
{
    assert!(threads > 0, "run_parallel needs at least one thread");
    let start_line = Barrier::new(threads);
    thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|index| {
                let (setup, start_line) = (&setup, &start_line);
                scope.spawn(move || {
                    let mut op = setup(index);
                    start_line.wait();
                    let start = Instant::now();
                    for _ in 0..iters {
                        op();
                    }
                    (start, Instant::now())
                })
            })
            .collect();
        let spans: Vec<(Instant, Instant)> =
            workers.into_iter().map(|worker| worker.join().expect("a bench thread panicked")).collect();
        let first_start = spans.iter().map(|&(start, _)| start).min().expect("at least one thread");
        let last_end = spans.iter().map(|&(_, end)| end).max().expect("at least one thread");
        last_end - first_start
    })
}

/// Runs `measured` on the calling thread while `background` threads each repeat the
/// operation that `setup(index)` returns, and stops them once `measured` returns (or
/// panics). `measured` starts only after every background thread has completed one
/// operation, so the two really overlap.
///
/// Returns `measured`'s result and the number of background operations done in all.
pub fn with_background<S, Op, R>(background: usize, setup: S, measured: impl FnOnce() -> R) -> (R, u64)
where
    S: Fn(usize) -> Op + Sync,
    Op: FnMut(),
{
    /// Raises the stop flag when dropped, so a panicking `measured` does not leave the
    /// background threads (and the scope joining them) running forever.
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            // Relaxed: the flag orders nothing; the join publishes the threads' results.
            self.0.store(true, Ordering::Relaxed);
        }
    }

    let stop = AtomicBool::new(false);
    let running = AtomicUsize::new(0);
    thread::scope(|scope| {
        let threads: Vec<_> = (0..background)
            .map(|index| {
                let (setup, stop, running) = (&setup, &stop, &running);
                scope.spawn(move || {
                    let mut op = setup(index);
                    op();
                    // Relaxed: a counter only; nothing is published through it.
                    running.fetch_add(1, Ordering::Relaxed);
                    let mut ops = 1u64;
                    // Relaxed: see StopOnDrop.
                    while !stop.load(Ordering::Relaxed) {
                        op();
                        ops += 1;
                    }
                    ops
                })
            })
            .collect();
        let stopper = StopOnDrop(&stop);
        // Relaxed: see the fetch_add above.
        while running.load(Ordering::Relaxed) < background {
            // Yield rather than spin: on an oversubscribed machine the background
            // threads may need this core to get started.
            thread::yield_now();
        }
        let result = measured();
        drop(stopper);
        let ops = threads.into_iter().map(|thread| thread.join().expect("a background thread panicked")).sum();
        (result, ops)
    })
}

/// Prints the load average and the ratio of two concurrent spin loops' rate to one
/// loop's: near 2.0 when two CPUs are really available, near 1.0 when the machine is
/// busy elsewhere (then multi-thread figures are not worth recording).
pub fn report_environment(when: &str) {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    eprintln!(
        "[{when}] loadavg {} | available_parallelism {} | 2-thread spin speedup: {:.2}",
        load.join(" "),
        thread::available_parallelism().map_or(0, usize::from),
        parallel_speedup(),
    );
}

/// Two threads' combined spin-loop rate over one thread's, from the best of five runs
/// of each (a preempted run only ever looks slower).
fn parallel_speedup() -> f64 {
    // Long enough (about 0.1 s) that waking an idle vCPU, which can take milliseconds on
    // a VM, does not pass for a lack of parallelism.
    const SPINS: u64 = 200_000_000;
    const TRIES: usize = 5;
    let spin = |_| {
        let mut x = 0u64;
        move || x = black_box(x.wrapping_add(1))
    };
    let best = |threads| (0..TRIES).map(|_| run_parallel(threads, SPINS, spin)).min().expect("TRIES > 0");
    2.0 * best(1).as_secs_f64() / best(2).as_secs_f64()
}

/// This process's resident and peak resident set sizes (from `/proc/self/status`), to
/// show whether a bench that retires memory reclaims it.
pub fn memory_summary() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map_or_else(|| "?".to_owned(), |value| value.trim().to_owned())
    };
    format!("VmRSS {} | VmHWM {}", field("VmRSS:"), field("VmHWM:"))
}
