//! The timed cell, the parallelism probe and the statistics over repetitions.
//!
//! A cell runs `T` threads: each builds its operation on itself (`setup(index)`, not
//! timed), runs it once (registration with a collector, first-touch of thread-locals),
//! waits on a barrier with the coordinator, then repeats the operation in batches of
//! [`BATCH`] (or of the batch given to [`run_batched`]) until the coordinator raises the
//! stop flag `secs` after the barrier. Every thread takes its own timestamps: on an
//! oversubscribed machine the coordinator may be woken late, and a thread preempted at
//! the stop flag finishes late; both only widen the span, so rates are never overstated.

use std::hint::black_box;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// Operations between two looks at the stop flag: long enough that the flag's load is
/// noise beside a 0.3 ns increment, short enough (microseconds for the slowest
/// operation here) that stopping is prompt.
pub const BATCH: u64 = 64;

/// What one thread of a cell did.
#[derive(Clone, Copy, Debug)]
pub struct ThreadRun {
    pub ops: u64,
    pub start: Instant,
    pub end: Instant,
}

impl ThreadRun {
    pub fn secs(&self) -> f64 {
        (self.end - self.start).as_secs_f64()
    }
}

/// One repetition of a cell: what each thread did, in thread-index order.
#[derive(Debug)]
pub struct Run {
    pub threads: Vec<ThreadRun>,
}

impl Run {
    /// From the earliest start to the latest end.
    pub fn span(&self) -> f64 {
        let start = self.threads.iter().map(|t| t.start).min().expect("at least one thread");
        let end = self.threads.iter().map(|t| t.end).max().expect("at least one thread");
        (end - start).as_secs_f64()
    }

    pub fn total_ops(&self) -> u64 {
        self.threads.iter().map(|t| t.ops).sum()
    }

    /// Total operations per second over all threads, in millions.
    pub fn mops(&self) -> f64 {
        self.total_ops() as f64 / self.span() / 1e6
    }

    /// Nanoseconds per operation as one thread sees it: threads x span / operations.
    pub fn ns_per_op_thread(&self) -> f64 {
        self.threads.len() as f64 * self.span() * 1e9 / self.total_ops().max(1) as f64
    }
}

/// Raises a stop flag when dropped, so that a panicking coordinator does not leave the
/// workers (and the scope joining them) spinning forever.
pub struct StopOnDrop<'a>(pub &'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        // Relaxed: the flag orders nothing; joining the threads publishes their results.
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Runs the operation `setup(index)` returns on each of `threads` threads for `secs`.
pub fn run<S, Op>(threads: usize, secs: f64, setup: S) -> Run
where
    S: Fn(usize) -> Op + Sync,
    Op: FnMut(),
{
    run_batched(threads, secs, BATCH, setup)
}

/// [`run`] with `batch` operations between two looks at the stop flag: 1 for an
/// operation of microseconds or more (the allocator group's batch of 100 blocks), where
/// 64 of them would overrun the cell.
pub fn run_batched<S, Op>(threads: usize, secs: f64, batch: u64, setup: S) -> Run
where
    S: Fn(usize) -> Op + Sync,
    Op: FnMut(),
{
    assert!(batch > 0, "a batch needs at least one operation");
    assert!(threads > 0, "a cell needs at least one thread");
    let stop = AtomicBool::new(false);
    let start_line = Barrier::new(threads + 1);
    thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|index| {
                let (setup, stop, start_line) = (&setup, &stop, &start_line);
                scope.spawn(move || {
                    let mut op = setup(index);
                    op();
                    start_line.wait();
                    let start = Instant::now();
                    let mut ops = 0u64;
                    loop {
                        for _ in 0..batch {
                            op();
                        }
                        ops += batch;
                        // Relaxed: see StopOnDrop.
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                    }
                    ThreadRun { ops, start, end: Instant::now() }
                })
            })
            .collect();
        let stopper = StopOnDrop(&stop);
        start_line.wait();
        thread::sleep(Duration::from_secs_f64(secs));
        drop(stopper);
        Run { threads: workers.into_iter().map(|w| w.join().expect("a worker thread panicked")).collect() }
    })
}

/// One probe reading: how many threads' worth of independent spinning the machine gave
/// to `threads` spinning threads (their total rate over one thread's rate).
#[derive(Clone, Copy, Debug)]
pub struct Probe {
    pub threads: usize,
    pub speedup: f64,
}

impl Probe {
    /// Whether `threads` threads really ran in parallel: no more threads than CPUs this
    /// process may use, and at least 90% of the ideal speedup. (BENCHMARKING.md counts a
    /// two-thread run at 1.8x and up. The CPU bound matters on a noisy host: a depressed
    /// one-thread baseline can make 4 loops on 2 CPUs read above 3x.)
    pub fn parallel(&self) -> bool {
        let cpus = thread::available_parallelism().map_or(1, usize::from);
        self.threads == 1 || (self.threads <= cpus && self.speedup >= 0.9 * self.threads as f64)
    }
}

/// Independent spin loops (no shared line written) on 1 thread and on each count in
/// `counts`, each the best of `tries` runs of `secs` (a preempted run only looks slower).
/// The one-thread runs are interleaved with the others, so that the baseline comes from
/// the same stretch of time as the figures it divides.
pub fn probe(counts: &[usize], secs: f64, tries: usize) -> Vec<Probe> {
    let spin = |_| {
        let mut x = 0u64;
        move || x = black_box(x.wrapping_add(1))
    };
    let mut one = 0.0f64;
    let mut best = vec![0.0f64; counts.len()];
    for _ in 0..tries {
        one = one.max(run(1, secs, spin).mops());
        for (best, &threads) in best.iter_mut().zip(counts) {
            if threads > 1 {
                *best = best.max(run(threads, secs, spin).mops());
            }
        }
    }
    counts
        .iter()
        .zip(best)
        .map(|(&threads, best)| Probe { threads, speedup: if threads == 1 { 1.0 } else { best / one } })
        .collect()
}

/// The median and range of a measurement's repetitions.
#[derive(Clone, Debug, Default)]
pub struct Measure {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub reps: Vec<f64>,
}

impl Measure {
    pub fn of(reps: Vec<f64>) -> Self {
        let mut sorted = reps.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = match n {
            0 => f64::NAN,
            _ if n % 2 == 1 => sorted[n / 2],
            _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
        };
        Self {
            median,
            min: sorted.first().copied().unwrap_or(f64::NAN),
            max: sorted.last().copied().unwrap_or(f64::NAN),
            reps,
        }
    }

    /// The largest distance from the median to either end of the range, as a percentage
    /// of the median.
    pub fn spread_pct(&self) -> f64 {
        if self.median == 0.0 {
            return 0.0;
        }
        100.0 * (self.max - self.median).max(self.median - self.min) / self.median
    }
}
