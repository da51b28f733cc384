//! The `rwlock` group: `RmLock` beside `std::sync::RwLock`, `parking_lot::RwLock` and
//! `crossbeam_utils::sync::ShardedLock`.
//!
//! - Reads: every thread repeats read acquire, load the value, release, on one lock.
//! - Writer latency: thread 0 times single writes (acquire, increment, release), one
//!   every 50 us, while threads 1..T loop reads of the same lock; mean and 99th
//!   percentile in nanoseconds. At one thread there are no readers: the baseline.

use std::hint::black_box;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::Ctx;
use crate::harness::{self, Measure, Run, StopOnDrop};
use crate::model::{self, GroupReport, LatencyCell, LatencyRow, RateTable};

pub const PEERS: usize = 4;

/// A reader-writer lock over a `u64`, as the group drives it.
trait Lock: Sync {
    const NAME: &'static str;
    fn new(value: u64) -> Self;
    fn read(&self) -> u64;
    fn write(&self);
}

struct Rm(scalemem::rmlock::RmLock<u64>);
struct Std(std::sync::RwLock<u64>);
struct ParkingLot(parking_lot::RwLock<u64>);
struct Sharded(crossbeam_utils::sync::ShardedLock<u64>);

impl Lock for Rm {
    const NAME: &'static str = "scalemem RmLock";
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
    const NAME: &'static str = "std RwLock";
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
    const NAME: &'static str = "parking_lot RwLock";
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
    const NAME: &'static str = "crossbeam ShardedLock";
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

const NAMES: [&str; PEERS] = [Rm::NAME, Std::NAME, ParkingLot::NAME, Sharded::NAME];

fn read_cell<L: Lock>(threads: usize, secs: f64) -> Run {
    let lock = L::new(7);
    harness::run(threads, secs, |_| {
        let lock = &lock;
        move || {
            black_box(black_box(lock).read());
        }
    })
}

/// What one writer-latency repetition saw.
pub struct Latency {
    mean_ns: f64,
    p99_ns: f64,
    max_ns: f64,
    writes: usize,
}

fn latency_cell<L: Lock>(threads: usize, secs: f64) -> Latency {
    let lock = L::new(0);
    let readers = threads - 1;
    let stop = AtomicBool::new(false);
    let start_line = Barrier::new(threads);
    let mut latencies: Vec<f64> = std::thread::scope(|s| {
        for _ in 0..readers {
            let (lock, stop, start_line) = (&lock, &stop, &start_line);
            s.spawn(move || {
                black_box(lock.read());
                start_line.wait();
                // Relaxed: see StopOnDrop.
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..harness::BATCH {
                        black_box(lock.read());
                    }
                }
            });
        }
        let _stopper = StopOnDrop(&stop);
        start_line.wait();
        let (start, deadline) = (Instant::now(), Duration::from_secs_f64(secs));
        let mut latencies = Vec::new();
        while start.elapsed() < deadline {
            let write = Instant::now();
            lock.write();
            latencies.push(write.elapsed().as_nanos() as f64);
            // Let the readers run between writes, as between rare writes.
            std::thread::sleep(Duration::from_micros(50));
        }
        latencies
    });
    latencies.sort_by(f64::total_cmp);
    let writes = latencies.len().max(1);
    Latency {
        mean_ns: latencies.iter().sum::<f64>() / writes as f64,
        p99_ns: latencies.get(((writes as f64 * 0.99) as usize).min(writes - 1)).copied().unwrap_or(f64::NAN),
        max_ns: latencies.last().copied().unwrap_or(f64::NAN),
        writes: latencies.len(),
    }
}

pub fn group(ctx: &Ctx) -> GroupReport {
    let secs = ctx.secs;
    let reads = ctx.measure("rwlock reads", &NAMES, &ctx.threads, |peer, threads| match peer {
        0 => read_cell::<Rm>(threads, secs),
        1 => read_cell::<Std>(threads, secs),
        2 => read_cell::<ParkingLot>(threads, secs),
        _ => read_cell::<Sharded>(threads, secs),
    });
    let writes = ctx.measure("rwlock writer latency", &NAMES, &ctx.threads, |peer, threads| match peer {
        0 => latency_cell::<Rm>(threads, secs),
        1 => latency_cell::<Std>(threads, secs),
        2 => latency_cell::<ParkingLot>(threads, secs),
        _ => latency_cell::<Sharded>(threads, secs),
    });
    let latency = NAMES
        .iter()
        .zip(writes)
        .map(|(name, per_threads)| LatencyRow {
            name: (*name).to_owned(),
            cells: ctx
                .threads
                .iter()
                .zip(per_threads)
                .map(|(&threads, reps)| LatencyCell {
                    threads,
                    mean_ns: Measure::of(reps.iter().map(|r| r.mean_ns).collect()),
                    p99_ns: Measure::of(reps.iter().map(|r| r.p99_ns).collect()),
                    max_ns: Measure::of(reps.iter().map(|r| r.max_ns).collect()),
                    writes: Measure::of(reps.iter().map(|r| r.writes as f64).collect()),
                    parallel: true,
                })
                .collect(),
        })
        .collect();
    GroupReport {
        id: "rwlock",
        title: "rwlock: read acquire + release on one lock",
        about: "one op = read acquire + load the value + release, every thread on one lock".to_owned(),
        rates: vec![RateTable {
            title: "reads, Mops/s over all threads".to_owned(),
            rows: NAMES
                .iter()
                .zip(&reads)
                .map(|(name, runs)| model::rate_row(name, &ctx.threads, runs, model::whole))
                .collect(),
        }],
        latency,
        ..GroupReport::default()
    }
}
