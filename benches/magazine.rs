//! `scalemem::umem::CpuCaches` (the magazine layer) beside the alternatives a cache
//! front end could use, in the same run.
//!
//! Run with `cargo bench --bench magazine`. One operation is a free followed by an
//! allocation of one object (opaque pointers; nothing is dereferenced). Groups:
//!
//! - `magazine/pair`: the hit path, on 1, 2, 4, 8 and 16 threads. `rseq`: `CpuCaches` in
//!   rseq mode; `locked`: `CpuCaches` in its try-lock fallback; `mutex_stack`: one shared
//!   `Mutex<Vec>` free list (a cache without a per-CPU layer); `malloc`: glibc's
//!   `malloc(64)`/`free` (what a hit saves, with its own per-thread tcache).
//! - `magazine/burst`: 32 frees then 32 allocations per operation with magazines of 7
//!   rounds, so every operation exchanges magazines with the depot several times
//!   (`rseq` and `locked`).
//!
//! The time criterion reports is per operation per thread; `Throughput::Elements` set to
//! the thread count makes it print the aggregate rate too.

use std::hint::black_box;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use scalemem::umem::{Config, CpuCaches};

mod common;

/// A fake, never dereferenced, non-null object address.
fn token(thread: usize, index: usize) -> NonNull<u8> {
    NonNull::new(std::ptr::without_provenance_mut::<u8>(((thread + 1) << 32) | (index << 4))).unwrap()
}

fn bench_threads<S, Op>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, threads: usize, setup: S)
where
    S: Fn(usize) -> Op + Sync,
    Op: FnMut(),
{
    group.throughput(Throughput::Elements(threads as u64));
    group.bench_with_input(BenchmarkId::new(name, threads), &threads, |b, &threads| {
        b.iter_custom(|iters| common::run_parallel(threads, iters, &setup));
    });
}

/// A free and an allocation on `caches`, keeping one object in hand.
fn pair_op(caches: &CpuCaches, thread: usize) -> impl FnMut() + '_ {
    let mut created = 1;
    let mut held = token(thread, 0);
    move || {
        let spare = caches.free(held).err();
        held = match caches.alloc() {
            Some(p) => {
                if let Some(spare) = spare {
                    black_box(spare); // the slab layer would take it back
                }
                p
            }
            None => spare.unwrap_or_else(|| {
                created += 1;
                token(thread, created)
            }),
        };
        black_box(held);
    }
}

fn burst_op(caches: &CpuCaches, thread: usize) -> impl FnMut() + '_ {
    let mut created = 0;
    let mut hand: Vec<NonNull<u8>> = (0..32).map(|i| token(thread, i)).collect();
    created += hand.len();
    move || {
        let mut refused = 0;
        for p in hand.drain(..) {
            if caches.free(p).is_err() {
                refused += 1;
            }
        }
        black_box(refused);
        for _ in 0..32 {
            hand.push(caches.alloc().unwrap_or_else(|| {
                created += 1;
                token(thread, created)
            }));
        }
    }
}

fn pair(c: &mut Criterion) {
    let mut group = c.benchmark_group("magazine/pair");
    group.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    let config = Config::default();
    for threads in common::THREADS {
        let rseq = CpuCaches::new(config).unwrap();
        if rseq.uses_rseq() {
            bench_threads(&mut group, "rseq", threads, |t| pair_op(&rseq, t));
        }
        let locked = CpuCaches::new_locked(config).unwrap();
        bench_threads(&mut group, "locked", threads, |t| pair_op(&locked, t));
        let stack = Mutex::new(Vec::<usize>::with_capacity(1 << 16));
        bench_threads(&mut group, "mutex_stack", threads, |t| {
            let stack = &stack;
            let mut held = token(t, 0).as_ptr().addr();
            move || {
                let mut s = stack.lock().unwrap();
                s.push(held);
                held = s.pop().unwrap();
                drop(s);
                black_box(held);
            }
        });
        bench_threads(&mut group, "malloc", threads, |_| {
            || {
                // SAFETY: malloc/free of a fresh block.
                unsafe { libc::free(black_box(libc::malloc(64))) };
            }
        });
        rseq.drain(|_| {});
        locked.drain(|_| {});
    }
    group.finish();
}

fn burst(c: &mut Criterion) {
    let mut group = c.benchmark_group("magazine/burst");
    group.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    let config = Config { initial_rounds: 7, min_rounds: 7, max_rounds: 7, ..Config::default() };
    for threads in common::THREADS {
        let rseq = CpuCaches::new(config).unwrap();
        if rseq.uses_rseq() {
            bench_threads(&mut group, "rseq", threads, |t| burst_op(&rseq, t));
        }
        let locked = CpuCaches::new_locked(config).unwrap();
        bench_threads(&mut group, "locked", threads, |t| burst_op(&locked, t));
        rseq.drain(|_| {});
        locked.drain(|_| {});
    }
    group.finish();
}

fn main() {
    common::report_environment("before");
    let mut criterion = Criterion::default().configure_from_args();
    pair(&mut criterion);
    burst(&mut criterion);
    criterion.final_summary();
    common::report_environment("after");
}
