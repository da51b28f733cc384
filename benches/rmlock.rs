//! `scalemem::rmlock::RmLock` beside `std::sync::RwLock`, `parking_lot::RwLock` and
//! `crossbeam_utils::sync::ShardedLock`, in the same run.
//!
//! Run with `cargo bench --bench rmlock` (a filter narrows it:
//! `cargo bench --bench rmlock -- read_threads`). Groups, each with every lock side by
//! side:
//!
//! - `rmlock/read`: read acquire, load the value, release, on one thread; plus
//!   `load_store`, the floor: a plain load and store of the thread's own word.
//! - `rmlock/read_threads`: the same on 1, 2, 4, 8 and 16 threads at once, all on one
//!   lock; the time is per operation per thread, the throughput the sum over threads.
//! - `rmlock/write_with_reader`: write acquire, increment, release, while one
//!   background thread loops reads of the same lock (criterion's mean).
//!
//! After criterion, the binary times 2000 single writes per lock with one background
//! reader and prints mean, median, 99th percentile and maximum (criterion reports means
//! only). The run prints the load average and a two-thread parallelism check before and
//! after.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, Throughput, measurement::WallTime};

mod common;

/// A reader-writer lock over a `u64`, as the benches drive it.
trait Lock: Sync + Sized {
    /// The bench id.
    const NAME: &'static str;
    fn new(value: u64) -> Self;
    /// Read acquire, load the value, release.
    fn read(&self) -> u64;
    /// Write acquire, increment the value, release.
    fn write(&self);
}

struct Scalemem(scalemem::rmlock::RmLock<u64>);
struct Std(std::sync::RwLock<u64>);
struct ParkingLot(parking_lot::RwLock<u64>);
struct Sharded(crossbeam_utils::sync::ShardedLock<u64>);

impl Lock for Scalemem {
    const NAME: &'static str = "scalemem_rmlock";
    fn new(value: u64) -> Self {
        Self(scalemem::rmlock::RmLock::new(value))
    }
    #[inline]
    fn read(&self) -> u64 {
        *self.0.read()
    }
    fn write(&self) {
        *self.0.write() += 1;
    }
}

impl Lock for Std {
    const NAME: &'static str = "std_rwlock";
    fn new(value: u64) -> Self {
        Self(std::sync::RwLock::new(value))
    }
    #[inline]
    fn read(&self) -> u64 {
        *self.0.read().unwrap()
    }
    fn write(&self) {
        *self.0.write().unwrap() += 1;
    }
}

impl Lock for ParkingLot {
    const NAME: &'static str = "parking_lot_rwlock";
    fn new(value: u64) -> Self {
        Self(parking_lot::RwLock::new(value))
    }
    #[inline]
    fn read(&self) -> u64 {
        *self.0.read()
    }
    fn write(&self) {
        *self.0.write() += 1;
    }
}

impl Lock for Sharded {
    const NAME: &'static str = "crossbeam_sharded_lock";
    fn new(value: u64) -> Self {
        Self(crossbeam_utils::sync::ShardedLock::new(value))
    }
    #[inline]
    fn read(&self) -> u64 {
        *self.0.read().unwrap()
    }
    fn write(&self) {
        *self.0.write().unwrap() += 1;
    }
}

/// The runs every group shares, kept short: the whole binary takes about three minutes.
fn config() -> Criterion {
    Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(2)).sample_size(30)
}

fn read(c: &mut Criterion) {
    fn one<L: Lock>(group: &mut BenchmarkGroup<'_, WallTime>) {
        let lock = L::new(7);
        group.bench_function(L::NAME, |b| b.iter(|| black_box(black_box(&lock).read())));
    }
    let mut group = c.benchmark_group("rmlock/read");
    group.throughput(Throughput::Elements(1));
    // The floor: what a read lock that only had to bump a word the thread owns would
    // cost (one load and one store, no fence).
    let word = AtomicU64::new(0);
    group.bench_function("load_store", |b| {
        b.iter(|| {
            let word = black_box(&word);
            // Relaxed: a thread-private word; this is the cost floor, not a protocol.
            word.store(word.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
        })
    });
    one::<Scalemem>(&mut group);
    one::<Std>(&mut group);
    one::<ParkingLot>(&mut group);
    one::<Sharded>(&mut group);
    group.finish();
}

fn read_threads(c: &mut Criterion) {
    fn one<L: Lock>(group: &mut BenchmarkGroup<'_, WallTime>, threads: usize) {
        let lock = L::new(7);
        group.bench_with_input(criterion::BenchmarkId::new(L::NAME, threads), &threads, |b, &threads| {
            b.iter_custom(|iters| {
                common::run_parallel(threads, iters, |_| {
                    || {
                        black_box(black_box(&lock).read());
                    }
                })
            })
        });
    }
    let mut group = c.benchmark_group("rmlock/read_threads");
    // Peers at the same thread count run back to back, so that drifting load affects
    // them alike.
    for threads in common::THREADS {
        group.throughput(Throughput::Elements(threads as u64));
        one::<Scalemem>(&mut group, threads);
        one::<Std>(&mut group, threads);
        one::<ParkingLot>(&mut group, threads);
        one::<Sharded>(&mut group, threads);
    }
    group.finish();
}

fn write_with_reader(c: &mut Criterion) {
    fn one<L: Lock>(group: &mut BenchmarkGroup<'_, WallTime>) {
        let lock = L::new(0);
        group.bench_function(L::NAME, |b| {
            b.iter_custom(|iters| {
                let reader = |_| {
                    || {
                        black_box(lock.read());
                    }
                };
                let (elapsed, _reads) = common::with_background(1, reader, || {
                    let start = Instant::now();
                    for _ in 0..iters {
                        lock.write();
                    }
                    start.elapsed()
                });
                elapsed
            })
        });
    }
    let mut group = c.benchmark_group("rmlock/write_with_reader");
    group.throughput(Throughput::Elements(1));
    one::<Scalemem>(&mut group);
    one::<Std>(&mut group);
    one::<ParkingLot>(&mut group);
    one::<Sharded>(&mut group);
    group.finish();
}

/// Single write latencies with one background reader: mean, median, p99, max.
fn write_latency_report() {
    const WRITES: usize = 2000;
    fn one<L: Lock>() {
        let lock = L::new(0);
        let reader = |_| {
            || {
                black_box(lock.read());
            }
        };
        let (mut latencies, reads) = common::with_background(1, reader, || {
            (0..WRITES)
                .map(|_| {
                    let start = Instant::now();
                    lock.write();
                    let elapsed = start.elapsed();
                    // Let the reader run between writes, as it would between rare writes.
                    std::thread::sleep(Duration::from_micros(50));
                    elapsed
                })
                .collect::<Vec<_>>()
        });
        latencies.sort_unstable();
        let mean = latencies.iter().sum::<Duration>() / WRITES as u32;
        let at = |q: f64| latencies[((WRITES as f64 * q) as usize).min(WRITES - 1)];
        eprintln!(
            "write latency with 1 reader | {:<24} mean {:>9.2?} p50 {:>9.2?} p99 {:>9.2?} max {:>9.2?} | reader ops {}",
            L::NAME,
            mean,
            at(0.5),
            at(0.99),
            latencies[WRITES - 1],
            reads,
        );
    }
    one::<Scalemem>();
    one::<Std>();
    one::<ParkingLot>();
    one::<Sharded>();
}

/// The report's name, as a filter sees it.
const LATENCY_REPORT: &str = "rmlock/write_latency";

/// Whether the command line asks for the write-latency report: not with `--list`,
/// `--test` or `--profile-time` (criterion's modes that run nothing or one benchmark),
/// and, when a filter is given, only if the filter's text is part of
/// [`LATENCY_REPORT`] (so `write`, `latency` or the whole name select it, and a filter
/// for other benchmarks skips it). Options such as `--noplot` or `--save-baseline NAME`
/// do not count as filters.
fn wants_latency_report(args: impl Iterator<Item = String>) -> bool {
    // Criterion's options that take a value: the next argument is that value.
    const WITH_VALUE: [&str; 14] = [
        "--save-baseline",
        "--baseline",
        "--baseline-lenient",
        "--load-baseline",
        "--sample-size",
        "--warm-up-time",
        "--measurement-time",
        "--nresamples",
        "--noise-threshold",
        "--confidence-level",
        "--significance-level",
        "--plotting-backend",
        "--output-format",
        "--color",
    ];
    let mut args = args.peekable();
    let mut filter = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--list" | "--test" | "--profile-time" => return false,
            a if WITH_VALUE.contains(&a) || a == "-c" => {
                args.next();
            }
            a if a.starts_with('-') => {}
            _ => filter = Some(arg),
        }
    }
    filter.is_none_or(|f| LATENCY_REPORT.contains(f.as_str()))
}

fn main() {
    common::report_environment("before");
    let mut criterion = config().configure_from_args();
    read(&mut criterion);
    read_threads(&mut criterion);
    write_with_reader(&mut criterion);
    criterion.final_summary();
    if wants_latency_report(std::env::args().skip(1)) {
        write_latency_report();
    }
    common::report_environment("after");
}
