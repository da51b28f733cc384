//! `scalemem::epoch` beside crossbeam-epoch and seize, in the same run.
//!
//! Run with `cargo bench --bench epoch` (a filter narrows it:
//! `cargo bench --bench epoch -- retire`). Groups, each with every scheme side by side:
//!
//! - `epoch/pin_unpin`: pin and unpin on one thread (seize: `Collector::enter` and drop
//!   of the `LocalGuard`).
//! - `epoch/pin_unpin_threads`: the same on 1, 2, 4, 8 and 16 threads at once; the time
//!   is per operation per thread, the throughput the sum over threads.
//! - `epoch/protected_load`: pin, load a shared pointer, read the pointee, unpin (seize:
//!   `Guard::protect`).
//! - `epoch/retire`: pin, swap a freshly boxed node into a shared slot, retire the old
//!   one, unpin (`defer_destroy`; seize: `defer_retire` with `reclaim::boxed`), plus
//!   `scalemem_intrusive`, which retires through the node's embedded [`Retired`] link.
//! - `epoch/retire_with_reader`: the same while one background thread loops the
//!   protected load on the same slot.
//!
//! Every scheme runs its normal path: the default collectors of scalemem and crossbeam,
//! one `seize::Collector` with its default batch size; no bench flushes. All nodes have
//! the same layout (the `Retired` link is unused outside `scalemem_intrusive`), so the
//! allocator sees the same requests for every scheme. Each scheme's bag or batch
//! holds 64 objects (seize: 32). The run prints the load average and a two-thread
//! parallelism check before and after, and after each retire bench the RSS and
//! scalemem's epoch advances and pending bags.

use std::hint::black_box;
use std::ptr::NonNull;
use std::sync::atomic::AtomicPtr;
use std::sync::atomic::Ordering::{AcqRel, Acquire};
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main, measurement::WallTime};
use scalemem::epoch::Retired;
use seize::Guard as _;

mod common;

/// The object every scheme publishes and retires: 40 bytes for all of them.
#[repr(C)]
struct Node {
    /// The intrusive link; first, so that a `*mut Retired` is a `*mut Node`. Used only by
    /// `ScalememIntrusive`.
    link: Retired,
    /// What readers read.
    value: u64,
}

impl Node {
    fn new(value: u64) -> Self {
        Self { link: Retired::new(), value }
    }
}

/// Frees a boxed `Node` from its embedded link (the `ReclaimFn` of `ScalememIntrusive`).
///
/// # Safety
/// 1. `link` is the `link` field of a `Node` allocated by `Box` (or `Owned`).
/// 2. Nothing uses the node any more, and it is freed once.
unsafe fn reclaim_node(link: NonNull<Retired>) {
    // SAFETY: (1) `link` is the first field of a `repr(C)` Node from a Box, so the cast
    // recovers the Box's pointer; (2) we own the node now.
    drop(unsafe { Box::from_raw(link.cast::<Node>().as_ptr()) });
}

/// One reclamation scheme as the benches drive it. Every method is one whole operation,
/// pin to unpin, so that the bench loops are the same for all schemes.
trait Scheme: Sync {
    /// The bench id of the scheme.
    const NAME: &'static str;
    /// What pinning returns.
    type Guard<'a>
    where
        Self: 'a;
    /// A shared pointer to a `Node`, never null.
    type Slot: Sync;

    /// Pins (enters a critical section); dropping the guard unpins.
    fn pin(&self) -> Self::Guard<'_>;
    /// A slot pointing to a fresh node.
    fn slot(&self, value: u64) -> Self::Slot;
    /// Pins, loads the slot, reads the node's value, unpins.
    fn read(&self, slot: &Self::Slot) -> u64;
    /// Pins, swaps a fresh node into the slot, retires the old node, unpins.
    fn replace(&self, slot: &Self::Slot, value: u64);
    /// Frees the slot's node. No other thread uses the slot any more.
    fn free(&self, slot: Self::Slot);
}

/// `scalemem::epoch` with its default collector; retires with `defer_destroy`.
struct Scalemem;

impl Scheme for Scalemem {
    const NAME: &'static str = "scalemem";
    type Guard<'a> = scalemem::epoch::Guard;
    type Slot = scalemem::epoch::Atomic<Node>;

    #[inline]
    fn pin(&self) -> Self::Guard<'_> {
        scalemem::epoch::pin()
    }

    fn slot(&self, value: u64) -> Self::Slot {
        scalemem::epoch::Atomic::new(Node::new(value))
    }

    #[inline]
    fn read(&self, slot: &Self::Slot) -> u64 {
        let guard = scalemem::epoch::pin();
        let node = slot.load(Acquire, &guard);
        // SAFETY: the slot never holds null; a node is retired only after a swap has
        // unlinked it, so one loaded under `guard` stays alive while `guard` pins; nobody
        // takes `&mut` to a published node.
        unsafe { node.deref() }.value
    }

    #[inline]
    fn replace(&self, slot: &Self::Slot, value: u64) {
        let guard = scalemem::epoch::pin();
        // AcqRel: Release publishes the new node's contents to readers' Acquire loads;
        // Acquire orders the old node's contents before its eventual destruction.
        let old = slot.swap(scalemem::epoch::Owned::new(Node::new(value)), AcqRel, &guard);
        // SAFETY: (1) `old` came from an `Owned` and the swap unlinked it; (2) only this
        // swap returned it, so it is destroyed once; (3) `Node` is `Send`.
        unsafe { guard.defer_destroy(old) };
    }

    fn free(&self, slot: Self::Slot) {
        // SAFETY: the slot never holds null, and the bench's threads have finished.
        drop(unsafe { slot.into_owned() });
    }
}

/// `scalemem::epoch` retiring through the node's embedded `Retired` link
/// (`Guard::retire`): no deferred closure, no allocation by the scheme.
struct ScalememIntrusive;

impl Scheme for ScalememIntrusive {
    const NAME: &'static str = "scalemem_intrusive";
    type Guard<'a> = scalemem::epoch::Guard;
    type Slot = scalemem::epoch::Atomic<Node>;

    #[inline]
    fn pin(&self) -> Self::Guard<'_> {
        Scalemem.pin()
    }

    fn slot(&self, value: u64) -> Self::Slot {
        Scalemem.slot(value)
    }

    #[inline]
    fn read(&self, slot: &Self::Slot) -> u64 {
        Scalemem.read(slot)
    }

    #[inline]
    fn replace(&self, slot: &Self::Slot, value: u64) {
        let guard = scalemem::epoch::pin();
        // AcqRel: as in `Scalemem::replace`.
        let old = slot.swap(scalemem::epoch::Owned::new(Node::new(value)), AcqRel, &guard);
        let link = NonNull::new(old.as_raw().cast_mut()).expect("the slot never holds null").cast::<Retired>();
        // SAFETY: (1) the swap unlinked the node, and `link` is its first field
        // (`repr(C)`); the Box stays allocated until `reclaim_node` runs; (2) only this
        // swap returned it, so it is retired once and nobody else touches its link;
        // (3) `reclaim_node` frees a boxed `Node` from its link on any thread (`Node` is
        // `Send`).
        unsafe { guard.retire(link, reclaim_node) };
    }

    fn free(&self, slot: Self::Slot) {
        Scalemem.free(slot);
    }
}

/// crossbeam-epoch with its default collector.
struct Crossbeam;

impl Scheme for Crossbeam {
    const NAME: &'static str = "crossbeam";
    type Guard<'a> = crossbeam_epoch::Guard;
    type Slot = crossbeam_epoch::Atomic<Node>;

    #[inline]
    fn pin(&self) -> Self::Guard<'_> {
        crossbeam_epoch::pin()
    }

    fn slot(&self, value: u64) -> Self::Slot {
        crossbeam_epoch::Atomic::new(Node::new(value))
    }

    #[inline]
    fn read(&self, slot: &Self::Slot) -> u64 {
        let guard = crossbeam_epoch::pin();
        let node = slot.load(Acquire, &guard);
        // SAFETY: as in `Scalemem::read`.
        unsafe { node.deref() }.value
    }

    #[inline]
    fn replace(&self, slot: &Self::Slot, value: u64) {
        let guard = crossbeam_epoch::pin();
        // AcqRel: as in `Scalemem::replace`.
        let old = slot.swap(crossbeam_epoch::Owned::new(Node::new(value)), AcqRel, &guard);
        // SAFETY: the swap unlinked `old`, an `Owned` allocation that only this swap
        // returned, so no thread pinning later reaches it and it is destroyed once.
        unsafe { guard.defer_destroy(old) };
    }

    fn free(&self, slot: Self::Slot) {
        // SAFETY: the slot never holds null, and the bench's threads have finished.
        drop(unsafe { slot.into_owned() });
    }
}

/// seize with one `Collector` (default batch size).
struct Seize(seize::Collector);

impl Scheme for Seize {
    const NAME: &'static str = "seize";
    type Guard<'a> = seize::LocalGuard<'a>;
    type Slot = AtomicPtr<Node>;

    #[inline]
    fn pin(&self) -> Self::Guard<'_> {
        self.0.enter()
    }

    fn slot(&self, value: u64) -> Self::Slot {
        AtomicPtr::new(Box::into_raw(Box::new(Node::new(value))))
    }

    #[inline]
    fn read(&self, slot: &Self::Slot) -> u64 {
        let guard = self.0.enter();
        let node = guard.protect(slot, Acquire);
        // SAFETY: the slot never holds null; a protected load stays valid while `guard`
        // lives, since nodes are retired only after a swap unlinked them.
        unsafe { (*node).value }
    }

    #[inline]
    fn replace(&self, slot: &Self::Slot, value: u64) {
        let guard = self.0.enter();
        let new = Box::into_raw(Box::new(Node::new(value)));
        // AcqRel: as in `Scalemem::replace`.
        let old = guard.swap(slot, new, AcqRel);
        // SAFETY: the swap unlinked `old`, so threads that enter later cannot reach it;
        // it came from `Box::into_raw`, as `reclaim::boxed` requires, and only this swap
        // returned it, so it is retired once.
        unsafe { guard.defer_retire(old, seize::reclaim::boxed) };
    }

    fn free(&self, slot: Self::Slot) {
        // SAFETY: the pointer came from `Box::into_raw` and, the bench's threads having
        // finished, it is ours alone.
        drop(unsafe { Box::from_raw(slot.into_inner()) });
    }
}

fn seize() -> Seize {
    Seize(seize::Collector::new())
}

/// The runs every group shares, kept short: the whole binary takes about three minutes.
fn config() -> Criterion {
    Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3)).sample_size(40)
}

/// How many times scalemem's default collector has advanced so far.
fn scalemem_advances() -> usize {
    scalemem::epoch::default_collector().advances()
}

/// Prints the memory held after a retire bench, and scalemem's epoch advances during it
/// and sealed bags or batches still pending (both zero for the peers; for scalemem, a
/// growing RSS with few advances or many pending bags means garbage is not reclaimed).
fn report_garbage(group: &str, scheme: &str, advances_before: usize) {
    let stats = scalemem::epoch::default_collector().stats();
    eprintln!(
        "[after {group}/{scheme}] {} | scalemem advances +{}, pending bags {}",
        common::memory_summary(),
        stats.advances - advances_before,
        stats.pending,
    );
}

fn environment_before(_: &mut Criterion) {
    common::report_environment("before");
}

fn environment_after(_: &mut Criterion) {
    common::report_environment("after");
}

fn pin_unpin(c: &mut Criterion) {
    fn one<S: Scheme>(group: &mut BenchmarkGroup<'_, WallTime>, scheme: &S) {
        group.bench_function(S::NAME, |b| b.iter(|| scheme.pin()));
    }
    let seize = seize();
    let mut group = c.benchmark_group("epoch/pin_unpin");
    group.throughput(Throughput::Elements(1));
    one(&mut group, &Scalemem);
    one(&mut group, &Crossbeam);
    one(&mut group, &seize);
    group.finish();
}

fn pin_unpin_threads(c: &mut Criterion) {
    fn one<S: Scheme>(group: &mut BenchmarkGroup<'_, WallTime>, scheme: &S, threads: usize) {
        group.bench_with_input(criterion::BenchmarkId::new(S::NAME, threads), &threads, |b, &threads| {
            b.iter_custom(|iters| common::run_parallel(threads, iters, |_| || drop(black_box(scheme.pin()))))
        });
    }
    let seize = seize();
    let mut group = c.benchmark_group("epoch/pin_unpin_threads");
    group.measurement_time(Duration::from_secs(2)).sample_size(30);
    // Peers at the same thread count run back to back, so that drifting load affects
    // them alike.
    for threads in common::THREADS {
        group.throughput(Throughput::Elements(threads as u64));
        one(&mut group, &Scalemem, threads);
        one(&mut group, &Crossbeam, threads);
        one(&mut group, &seize, threads);
    }
    group.finish();
}

fn protected_load(c: &mut Criterion) {
    fn one<S: Scheme>(group: &mut BenchmarkGroup<'_, WallTime>, scheme: &S) {
        let slot = scheme.slot(42);
        group.bench_function(S::NAME, |b| b.iter(|| scheme.read(black_box(&slot))));
        scheme.free(slot);
    }
    let seize = seize();
    let mut group = c.benchmark_group("epoch/protected_load");
    group.throughput(Throughput::Elements(1));
    one(&mut group, &Scalemem);
    one(&mut group, &Crossbeam);
    one(&mut group, &seize);
    group.finish();
}

fn retire(c: &mut Criterion) {
    fn one<S: Scheme>(group: &mut BenchmarkGroup<'_, WallTime>, scheme: &S) {
        let advances = scalemem_advances();
        let slot = scheme.slot(0);
        let mut value = 0u64;
        let mut ran = false;
        group.bench_function(S::NAME, |b| {
            ran = true;
            b.iter(|| {
                value = value.wrapping_add(1);
                scheme.replace(&slot, black_box(value));
            })
        });
        scheme.free(slot);
        if ran {
            report_garbage("epoch/retire", S::NAME, advances);
        }
    }
    let seize = seize();
    let mut group = c.benchmark_group("epoch/retire");
    group.throughput(Throughput::Elements(1));
    one(&mut group, &Scalemem);
    one(&mut group, &ScalememIntrusive);
    one(&mut group, &Crossbeam);
    one(&mut group, &seize);
    group.finish();
}

fn retire_with_reader(c: &mut Criterion) {
    fn one<S: Scheme>(group: &mut BenchmarkGroup<'_, WallTime>, scheme: &S) {
        let advances = scalemem_advances();
        let slot = scheme.slot(0);
        let mut ran = false;
        group.bench_function(S::NAME, |b| {
            ran = true;
            b.iter_custom(|iters| {
                let reader = |_| {
                    || {
                        black_box(scheme.read(&slot));
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
        scheme.free(slot);
        if ran {
            report_garbage("epoch/retire_with_reader", S::NAME, advances);
        }
    }
    let seize = seize();
    let mut group = c.benchmark_group("epoch/retire_with_reader");
    group.throughput(Throughput::Elements(1));
    one(&mut group, &Scalemem);
    one(&mut group, &ScalememIntrusive);
    one(&mut group, &Crossbeam);
    one(&mut group, &seize);
    group.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = environment_before, pin_unpin, pin_unpin_threads, protected_load, retire,
        retire_with_reader, environment_after
}
criterion_main!(benches);
