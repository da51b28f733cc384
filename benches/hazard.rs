//! `scalemem::hazard` beside haphazard (and crossbeam-epoch and seize for the read side),
//! and `AtomicArc` beside arc-swap and `RwLock<Arc<T>>`, in the same run.
//!
//! Run with `cargo bench --bench hazard` (a filter narrows it:
//! `cargo bench --bench hazard -- atomic_arc`). Groups, each with every peer side by side:
//!
//! - `hazard/protect_reset`: protect a shared pointer, read the node, reset, with a
//!   hazard pointer taken once outside the loop (`*_new_each`: taken and dropped every
//!   time); crossbeam-epoch and seize do pin, load, read, unpin.
//! - `hazard/protect_reset_threads`: the same on 1, 2, 4, 8 and 16 threads at once.
//! - `hazard/retire`: swap a freshly boxed node into a slot and retire the old one
//!   (`retire_ptr` / haphazard's `retire_ptr`), plus `scalemem_intrusive` (the node's
//!   embedded link: no allocation by the scheme).
//! - `hazard/retire_with_reader`: the same while one background thread protects and
//!   reads the slot in a loop.
//! - `atomic_arc/load`: `AtomicArc::load` and read, `load_full`; arc-swap's `load()` and
//!   `load_full()`; `RwLock<Arc<T>>` read and clone.
//! - `atomic_arc/load_threads`: the guard loads on 1, 2, 4, 8 and 16 threads.
//! - `atomic_arc/store_with_reader`: a store while one background thread loads.
//! - `atomic_arc/store_after_64_loaders`: a store while 64 parked threads have each loaded
//!   once (arc-swap's store walks every thread's debt slots; ours does not).
//!
//! The run prints the load average and a two-thread parallelism check before and after,
//! and the stalled-reader bound: one thread holds a hazard pointer while this one retires
//! for two seconds, with the largest unreclaimed count seen beside `R = max(C, 2H)`.

use std::hint::black_box;
use std::ptr::NonNull;
use std::sync::atomic::AtomicPtr;
use std::sync::atomic::Ordering::{AcqRel, Acquire};
use std::sync::{Arc, Barrier, RwLock};
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main, measurement::WallTime};
use scalemem::hazard::{AtomicArc, Domain, HazardPointer, Retired};
use seize::Guard as _;

mod common;

/// The node every scheme publishes and retires: 40 bytes for all of them.
#[repr(C)]
struct Node {
    /// The intrusive link; first, so that a `*mut Retired` is a `*mut Node`. Used only by
    /// `ScalememIntrusive`.
    link: Retired,
    /// What readers read.
    value: u64,
}

fn boxed(value: u64) -> *mut Node {
    Box::into_raw(Box::new(Node { link: Retired::new(), value }))
}

/// Frees a boxed `Node` from its embedded link.
///
/// # Safety
/// `link` is the `link` field of a boxed `Node`, freed once, used by nobody.
unsafe fn reclaim_node(link: NonNull<Retired>) {
    // SAFETY: the link is the first field of a repr(C) Node from a Box.
    drop(unsafe { Box::from_raw(link.cast::<Node>().as_ptr()) });
}

/// A slot every scheme can use: a std `AtomicPtr` to a boxed node, never null.
struct Slot(AtomicPtr<Node>);

impl Slot {
    fn new(value: u64) -> Self {
        Self(AtomicPtr::new(boxed(value)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // SAFETY: the bench's threads are done; the node was never retired.
        drop(unsafe { Box::from_raw(*self.0.get_mut()) });
    }
}

/// One scheme's read and write sides as the benches drive them.
trait Scheme: Sync {
    const NAME: &'static str;
    /// Per-thread read state (a hazard pointer), made on the reading thread.
    type Reader;
    fn reader(&self) -> Self::Reader;
    /// Protects the slot's node, reads its value, gives the protection up.
    fn read(&self, reader: &mut Self::Reader, slot: &Slot) -> u64;
    /// Swaps a fresh node in and retires the old one.
    fn replace(&self, slot: &Slot, value: u64);
}

/// `scalemem::hazard` with a hazard pointer kept across reads; `retire_ptr`.
struct Scalemem;

impl Scheme for Scalemem {
    const NAME: &'static str = "scalemem";
    type Reader = HazardPointer<'static>;

    fn reader(&self) -> Self::Reader {
        HazardPointer::new()
    }

    #[inline]
    fn read(&self, hp: &mut Self::Reader, slot: &Slot) -> u64 {
        // SAFETY: nodes are retired to the global domain only after a swap unlinked them.
        let value = unsafe { hp.protect(&slot.0) }.map_or(0, |node| node.value);
        hp.reset();
        value
    }

    #[inline]
    fn replace(&self, slot: &Slot, value: u64) {
        let old = slot.0.swap(boxed(value), AcqRel);
        // SAFETY: unlinked by the swap, from a Box, retired once.
        unsafe { Domain::global().retire_ptr(old, scalemem::hazard::drop_box) };
    }
}

/// `scalemem::hazard` taking a hazard pointer for every read.
struct ScalememNewEach;

impl Scheme for ScalememNewEach {
    const NAME: &'static str = "scalemem_new_each";
    type Reader = ();

    fn reader(&self) {}

    #[inline]
    fn read(&self, _: &mut (), slot: &Slot) -> u64 {
        let mut hp = HazardPointer::new();
        // SAFETY: as in Scalemem::read.
        unsafe { hp.protect(&slot.0) }.map_or(0, |node| node.value)
    }

    fn replace(&self, slot: &Slot, value: u64) {
        Scalemem.replace(slot, value);
    }
}

/// `scalemem::hazard` retiring through the node's embedded link: no allocation.
struct ScalememIntrusive;

impl Scheme for ScalememIntrusive {
    const NAME: &'static str = "scalemem_intrusive";
    type Reader = HazardPointer<'static>;

    fn reader(&self) -> Self::Reader {
        HazardPointer::new()
    }

    fn read(&self, hp: &mut Self::Reader, slot: &Slot) -> u64 {
        Scalemem.read(hp, slot)
    }

    #[inline]
    fn replace(&self, slot: &Slot, value: u64) {
        let old = slot.0.swap(boxed(value), AcqRel);
        // SAFETY: unlinked by the swap, retired once; the link is the node's first field.
        unsafe { Domain::global().retire(old, NonNull::new_unchecked(old).cast(), reclaim_node) };
    }
}

/// haphazard 0.1 with its global domain.
struct Haphazard;

impl Scheme for Haphazard {
    const NAME: &'static str = "haphazard";
    type Reader = haphazard::HazardPointer<'static>;

    fn reader(&self) -> Self::Reader {
        haphazard::HazardPointer::new()
    }

    #[inline]
    fn read(&self, hp: &mut Self::Reader, slot: &Slot) -> u64 {
        // SAFETY: nodes are valid until retired to haphazard's global domain after a swap.
        let value = unsafe { hp.protect(&slot.0) }.map_or(0, |node| node.value);
        hp.reset_protection();
        value
    }

    #[inline]
    fn replace(&self, slot: &Slot, value: u64) {
        let old = slot.0.swap(boxed(value), AcqRel);
        // SAFETY: unlinked by the swap (no new hazard can reach it), retired once, from a Box.
        unsafe { haphazard::Domain::global().retire_ptr::<Node, Box<Node>>(old) };
    }
}

/// haphazard taking a hazard pointer for every read.
struct HaphazardNewEach;

impl Scheme for HaphazardNewEach {
    const NAME: &'static str = "haphazard_new_each";
    type Reader = ();

    fn reader(&self) {}

    #[inline]
    fn read(&self, _: &mut (), slot: &Slot) -> u64 {
        let mut hp = haphazard::HazardPointer::new();
        // SAFETY: as in Haphazard::read.
        unsafe { hp.protect(&slot.0) }.map_or(0, |node| node.value)
    }

    fn replace(&self, slot: &Slot, value: u64) {
        Haphazard.replace(slot, value);
    }
}

/// crossbeam-epoch's default collector: pin, load, read, unpin.
struct Crossbeam;

impl Scheme for Crossbeam {
    const NAME: &'static str = "crossbeam_epoch";
    type Reader = ();

    fn reader(&self) {}

    #[inline]
    fn read(&self, _: &mut (), slot: &Slot) -> u64 {
        let _guard = crossbeam_epoch::pin();
        let node = slot.0.load(Acquire);
        // SAFETY: only read-side groups use this scheme; the node is never freed meanwhile.
        unsafe { (*node).value }
    }

    fn replace(&self, _: &Slot, _: u64) {
        unreachable!("read side only");
    }
}

/// seize 0.5: enter, protect, read, leave.
struct Seize(seize::Collector);

impl Scheme for Seize {
    const NAME: &'static str = "seize";
    type Reader = ();

    fn reader(&self) {}

    #[inline]
    fn read(&self, _: &mut (), slot: &Slot) -> u64 {
        let guard = self.0.enter();
        let node = guard.protect(&slot.0, Acquire);
        // SAFETY: only read-side groups use this scheme; the node is never freed meanwhile.
        unsafe { (*node).value }
    }

    fn replace(&self, _: &Slot, _: u64) {
        unreachable!("read side only");
    }
}

/// The runs every group shares, kept short.
fn config() -> Criterion {
    Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3)).sample_size(40)
}

fn environment_before(_: &mut Criterion) {
    common::report_environment("before");
}

fn environment_after(_: &mut Criterion) {
    common::report_environment("after");
}

fn protect_reset(c: &mut Criterion) {
    fn one<S: Scheme>(group: &mut BenchmarkGroup<'_, WallTime>, scheme: &S) {
        let slot = Slot::new(42);
        let mut reader = scheme.reader();
        group.bench_function(S::NAME, |b| b.iter(|| scheme.read(&mut reader, black_box(&slot))));
    }
    let seize = Seize(seize::Collector::new());
    let mut group = c.benchmark_group("hazard/protect_reset");
    group.throughput(Throughput::Elements(1));
    one(&mut group, &Scalemem);
    one(&mut group, &Haphazard);
    one(&mut group, &ScalememNewEach);
    one(&mut group, &HaphazardNewEach);
    one(&mut group, &Crossbeam);
    one(&mut group, &seize);
    group.finish();
}

fn protect_reset_threads(c: &mut Criterion) {
    fn one<S: Scheme>(group: &mut BenchmarkGroup<'_, WallTime>, scheme: &S, threads: usize) {
        let slot = Slot::new(42);
        group.bench_with_input(criterion::BenchmarkId::new(S::NAME, threads), &threads, |b, &threads| {
            b.iter_custom(|iters| {
                common::run_parallel(threads, iters, |_| {
                    let mut reader = scheme.reader();
                    let slot = &slot;
                    move || {
                        black_box(scheme.read(&mut reader, slot));
                    }
                })
            })
        });
    }
    let seize = Seize(seize::Collector::new());
    let mut group = c.benchmark_group("hazard/protect_reset_threads");
    group.measurement_time(Duration::from_secs(2)).sample_size(30);
    for threads in common::THREADS {
        group.throughput(Throughput::Elements(threads as u64));
        one(&mut group, &Scalemem, threads);
        one(&mut group, &Haphazard, threads);
        one(&mut group, &Crossbeam, threads);
        one(&mut group, &seize, threads);
    }
    group.finish();
}

fn retire(c: &mut Criterion) {
    fn one<S: Scheme>(group: &mut BenchmarkGroup<'_, WallTime>, scheme: &S) -> bool {
        let slot = Slot::new(0);
        let mut value = 0u64;
        let mut ran = false;
        group.bench_function(S::NAME, |b| {
            ran = true;
            b.iter(|| {
                value = value.wrapping_add(1);
                scheme.replace(&slot, black_box(value));
            })
        });
        ran
    }
    let mut group = c.benchmark_group("hazard/retire");
    group.throughput(Throughput::Elements(1));
    let ran = [one(&mut group, &Scalemem), one(&mut group, &ScalememIntrusive), one(&mut group, &Haphazard)];
    group.finish();
    if ran.contains(&true) {
        report_domain("hazard/retire");
    }
}

fn retire_with_reader(c: &mut Criterion) {
    fn one<S: Scheme>(group: &mut BenchmarkGroup<'_, WallTime>, scheme: &S) -> bool {
        let slot = Slot::new(0);
        let mut ran = false;
        group.bench_function(S::NAME, |b| {
            ran = true;
            b.iter_custom(|iters| {
                let reader = |_| {
                    let mut reader = scheme.reader();
                    let slot = &slot;
                    move || {
                        black_box(scheme.read(&mut reader, slot));
                    }
                };
                let (elapsed, _reads) = common::with_background(1, reader, || {
                    let start = Instant::now();
                    for value in 0..iters {
                        scheme.replace(&slot, black_box(value));
                    }
                    start.elapsed()
                });
                elapsed
            })
        });
        ran
    }
    let mut group = c.benchmark_group("hazard/retire_with_reader");
    group.throughput(Throughput::Elements(1));
    let ran = [one(&mut group, &Scalemem), one(&mut group, &ScalememIntrusive), one(&mut group, &Haphazard)];
    group.finish();
    if ran.contains(&true) {
        report_domain("hazard/retire_with_reader");
    }
}

/// Prints the global domain's garbage after a retire group, and the RSS.
fn report_domain(group: &str) {
    let stats = Domain::global().stats();
    eprintln!(
        "[after {group}] {} | scalemem: {} retired unreclaimed, {} scans, {} hazards",
        common::memory_summary(),
        stats.retired,
        stats.scans,
        stats.hazards
    );
}

/// One `Arc`-swapping cell as the benches drive it.
trait Cell: Sync {
    const NAME: &'static str;
    fn new(value: u64) -> Self;
    /// Loads and reads the value the cheapest way the cell offers.
    fn read(&self) -> u64;
    fn store(&self, value: u64);
}

impl Cell for AtomicArc<u64> {
    const NAME: &'static str = "scalemem";
    fn new(value: u64) -> Self {
        AtomicArc::new(Arc::new(value))
    }
    #[inline]
    fn read(&self) -> u64 {
        *self.load()
    }
    fn store(&self, value: u64) {
        AtomicArc::store(self, Arc::new(value));
    }
}

impl Cell for arc_swap::ArcSwap<u64> {
    const NAME: &'static str = "arc_swap";
    fn new(value: u64) -> Self {
        arc_swap::ArcSwap::from_pointee(value)
    }
    #[inline]
    fn read(&self) -> u64 {
        **self.load()
    }
    fn store(&self, value: u64) {
        arc_swap::ArcSwap::store(self, Arc::new(value));
    }
}

impl Cell for RwLock<Arc<u64>> {
    const NAME: &'static str = "rwlock_arc";
    fn new(value: u64) -> Self {
        RwLock::new(Arc::new(value))
    }
    #[inline]
    fn read(&self) -> u64 {
        *self.read().unwrap().clone()
    }
    fn store(&self, value: u64) {
        *self.write().unwrap() = Arc::new(value);
    }
}

fn atomic_arc_load(c: &mut Criterion) {
    let mut group = c.benchmark_group("atomic_arc/load");
    group.throughput(Throughput::Elements(1));
    let ours = AtomicArc::new(Arc::new(7u64));
    group.bench_function("scalemem", |b| b.iter(|| *black_box(&ours).load()));
    let swap = arc_swap::ArcSwap::from_pointee(7u64);
    group.bench_function("arc_swap", |b| b.iter(|| **black_box(&swap).load()));
    group.bench_function("scalemem_load_full", |b| b.iter(|| black_box(&ours).load_full()));
    group.bench_function("arc_swap_load_full", |b| b.iter(|| black_box(&swap).load_full()));
    let lock = RwLock::new(Arc::new(7u64));
    group.bench_function("rwlock_arc", |b| b.iter(|| <RwLock<Arc<u64>> as Cell>::read(black_box(&lock))));
    group.finish();
}

fn atomic_arc_load_threads(c: &mut Criterion) {
    fn one<C: Cell>(group: &mut BenchmarkGroup<'_, WallTime>, threads: usize) {
        let cell = C::new(7);
        group.bench_with_input(criterion::BenchmarkId::new(C::NAME, threads), &threads, |b, &threads| {
            b.iter_custom(|iters| {
                common::run_parallel(threads, iters, |_| {
                    let cell = &cell;
                    move || {
                        black_box(cell.read());
                    }
                })
            })
        });
    }
    let mut group = c.benchmark_group("atomic_arc/load_threads");
    group.measurement_time(Duration::from_secs(2)).sample_size(30);
    for threads in common::THREADS {
        group.throughput(Throughput::Elements(threads as u64));
        one::<AtomicArc<u64>>(&mut group, threads);
        one::<arc_swap::ArcSwap<u64>>(&mut group, threads);
        one::<RwLock<Arc<u64>>>(&mut group, threads);
    }
    group.finish();
}

fn atomic_arc_store_with_reader(c: &mut Criterion) {
    fn one<C: Cell>(group: &mut BenchmarkGroup<'_, WallTime>) {
        let cell = C::new(0);
        group.bench_function(C::NAME, |b| {
            b.iter_custom(|iters| {
                let reader = |_| {
                    let cell = &cell;
                    move || {
                        black_box(cell.read());
                    }
                };
                let (elapsed, _) = common::with_background(1, reader, || {
                    let start = Instant::now();
                    for value in 0..iters {
                        cell.store(black_box(value));
                    }
                    start.elapsed()
                });
                elapsed
            })
        });
    }
    let mut group = c.benchmark_group("atomic_arc/store_with_reader");
    group.throughput(Throughput::Elements(1));
    one::<AtomicArc<u64>>(&mut group);
    one::<arc_swap::ArcSwap<u64>>(&mut group);
    one::<RwLock<Arc<u64>>>(&mut group);
    group.finish();
}

fn atomic_arc_store_after_loaders(c: &mut Criterion) {
    const LOADERS: usize = 64;
    fn one<C: Cell>(group: &mut BenchmarkGroup<'_, WallTime>) {
        let cell = C::new(0);
        let (loaded, release) = (Barrier::new(LOADERS + 1), Barrier::new(LOADERS + 1));
        std::thread::scope(|s| {
            for _ in 0..LOADERS {
                s.spawn(|| {
                    black_box(cell.read());
                    loaded.wait();
                    release.wait(); // parked, alive, having loaded once
                });
            }
            loaded.wait();
            let mut value = 0u64;
            group.bench_function(C::NAME, |b| {
                b.iter(|| {
                    value = value.wrapping_add(1);
                    cell.store(black_box(value));
                })
            });
            release.wait();
        });
    }
    let mut group = c.benchmark_group("atomic_arc/store_after_64_loaders");
    group.throughput(Throughput::Elements(1));
    one::<AtomicArc<u64>>(&mut group);
    one::<arc_swap::ArcSwap<u64>>(&mut group);
    group.finish();
}

/// The stalled-reader bound, measured in the bench run: one thread holds a hazard pointer
/// on a node and never moves while this thread retires for two seconds.
fn stalled_reader_bound(_: &mut Criterion) {
    let domain = scalemem::unique_domain!();
    let slot = Slot::new(0);
    let (held, release) = (Barrier::new(2), Barrier::new(2));
    let (mut retired, mut worst, mut bound) = (0u64, 0usize, 0usize);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut hp = HazardPointer::new_in(&domain);
            // SAFETY: the slot's nodes are retired to `domain` after a swap unlinked them.
            black_box(unsafe { hp.protect(&slot.0) }.map(|n| n.value));
            held.wait();
            release.wait();
        });
        held.wait();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(2) {
            for _ in 0..1024 {
                retired += 1;
                let old = slot.0.swap(boxed(retired), AcqRel);
                // SAFETY: unlinked by the swap, retired once; the link is the node's own.
                unsafe { domain.retire(old, NonNull::new_unchecked(old).cast(), reclaim_node) };
            }
            let stats = domain.stats();
            worst = worst.max(stats.retired);
            bound = stats.bound(1);
        }
        release.wait();
    });
    let stats = domain.stats();
    eprintln!(
        "[stalled reader] {retired} retired in 2 s, at most {worst} unreclaimed (bound R = max(C, 2H) = {bound}, \
         H = {}): {}",
        stats.hazards,
        if worst <= bound { "holds" } else { "VIOLATED" }
    );
}

criterion_group! {
    name = benches;
    config = config();
    targets = environment_before, protect_reset, protect_reset_threads, retire, retire_with_reader,
        atomic_arc_load, atomic_arc_load_threads, atomic_arc_store_with_reader,
        atomic_arc_store_after_loaders, stalled_reader_bound, environment_after
}
criterion_main!(benches);
