//! `scalemem::refcount` beside `Arc` and a shared `AtomicUsize`, in the same run.
//!
//! Run with `cargo bench --bench refcount` (a filter narrows it:
//! `cargo bench --bench refcount -- one_object`). One operation is a get and a put (an
//! increment and a decrement), so an object's count is back where it started after each.
//! Groups:
//!
//! - `refcount/one_object`: every thread on the same object, on 1, 2, 4, 8 and 16
//!   threads. `percpu_ref`: `PercpuRef::get` + `put` in per-CPU mode;
//!   `percpu_ref_killed`: the same after `switch_to_atomic` (what gets and puts cost once
//!   an owner has killed it); `percpu_arc`: `PercpuArc` clone + drop while its owner
//!   lives; `refcache`: `RcRef` clone + drop in a `Refcache` whose epochs a background
//!   thread advances every 10 ms; `arc`: `Arc` clone + drop on one shared `Arc`;
//!   `atomic_usize`: `fetch_add` + `fetch_sub` on one shared `AtomicUsize`.
//! - `refcount/own_object`: each thread on its own object: `arc` (an `Arc` per thread,
//!   the uncontended floor of an atomic count) and `percpu_ref` (a `PercpuRef` per
//!   thread).
//!
//! The time criterion reports is per operation per thread; with `Throughput::Elements`
//! set to the thread count it also prints the aggregate rate (operations per second over
//! all threads). The run prints the load average and a two-thread parallelism check
//! before and after.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use scalemem::refcount::{PercpuOwner, PercpuRef, Refcache};

mod common;

/// Runs `op` (returned by `setup(thread)`) on `threads` threads for criterion.
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

fn one_object(c: &mut Criterion) {
    let mut group = c.benchmark_group("refcount/one_object");
    group.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    for threads in common::THREADS {
        let percpu = PercpuRef::new(|| {}).unwrap();
        bench_threads(&mut group, "percpu_ref", threads, |_| {
            || {
                percpu.get();
                percpu.put();
            }
        });

        let killed = PercpuRef::new(|| {}).unwrap();
        killed.switch_to_atomic_sync();
        bench_threads(&mut group, "percpu_ref_killed", threads, |_| {
            || {
                killed.get();
                killed.put();
            }
        });

        let owner = PercpuOwner::new(42u64).unwrap();
        let handle = owner.share();
        bench_threads(&mut group, "percpu_arc", threads, |_| {
            let handle = &handle;
            move || drop(black_box(handle.clone()))
        });

        let cache = Refcache::new().unwrap();
        let object = cache.alloc(42u64);
        bench_threads(&mut group, "refcache", threads, |_| {
            let object = &object;
            move || drop(black_box(object.clone()))
        });
        drop(object);

        let arc = Arc::new(42u64);
        bench_threads(&mut group, "arc", threads, |_| {
            let arc = &arc;
            move || drop(black_box(arc.clone()))
        });

        let shared = AtomicUsize::new(1);
        bench_threads(&mut group, "atomic_usize", threads, |_| {
            || {
                // Relaxed/Release: what Arc's clone and drop use.
                black_box(shared.fetch_add(1, Relaxed));
                black_box(shared.fetch_sub(1, Release));
            }
        });
    }
    group.finish();
}

fn own_object(c: &mut Criterion) {
    let mut group = c.benchmark_group("refcount/own_object");
    group.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    for threads in common::THREADS {
        bench_threads(&mut group, "arc", threads, |_| {
            let arc = Arc::new(42u64);
            move || drop(black_box(arc.clone()))
        });
        bench_threads(&mut group, "percpu_ref", threads, |_| {
            let r = PercpuRef::new(|| {}).unwrap();
            move || {
                r.get();
                r.put();
            }
        });
    }
    group.finish();
}

fn environment_before(_: &mut Criterion) {
    common::report_environment("before");
}

fn environment_after(_: &mut Criterion) {
    common::report_environment("after");
}

criterion_group!(benches, environment_before, one_object, own_object, environment_after);
criterion_main!(benches);
