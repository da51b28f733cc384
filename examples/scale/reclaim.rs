//! The reclamation groups: the read side, updates with readers, and the garbage a
//! stalled reader lets pile up.
//!
//! - `reclaim-read`: every thread repeats one protected read of one shared slot: pin (or
//!   protect), load, read the node's value, unpin (or reset). scalemem epoch and
//!   crossbeam-epoch use their default collectors; seize one `Collector`; scalemem hazard
//!   and haphazard their global domains with a hazard pointer kept by each thread;
//!   `AtomicArc::load` and arc-swap's `load` read an `Arc<u64>` through a guard.
//! - `reclaim-update`: thread 0 swaps a fresh node into the slot and retires the old one
//!   (`AtomicArc::store`, arc-swap `store`), while threads 1..T read as above. The table
//!   is the updater's rate; a second table gives the readers' total.
//! - `stalled-garbage`: one thread protects the slot's node and stops; another retires
//!   for the cell time (or until [`RETIRE_CAP`]). Each node counts its own drop, so the
//!   retired-but-unreclaimed count is the same measure for every scheme. Each scheme gets
//!   a domain or collector of its own, dropped after the cell (haphazard: its global
//!   domain, whose `unique_domain!` may run once per program), then the count of nodes
//!   still alive shows whether teardown freed everything.

use std::hint::black_box;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
use std::sync::atomic::{AtomicPtr, AtomicUsize};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use scalemem::epoch::Retired;
use seize::Guard as _;

use crate::Ctx;
use crate::harness::{self, Measure, Run};
use crate::model::{self, GroupReport, RateTable, StalledRow};

/// Peers in the read and update groups.
pub const READ_PEERS: usize = 7;
/// Peers in the stalled-garbage group.
pub const STALLED_PEERS: usize = 5;
/// A stalled-reader cell stops retiring here even if time is left: with an epoch scheme
/// every retired node stays allocated, and the machine is shared.
pub const RETIRE_CAP: u64 = 2_000_000;

/// The node schemes publish and retire: 40 bytes, as in `benches/epoch.rs` (the link is
/// unused here; it keeps the allocator's requests the same as the benches').
#[repr(C)]
pub struct Node {
    _link: Retired,
    value: u64,
}

fn node(value: u64) -> Node {
    Node { _link: Retired::new(), value }
}

fn boxed(value: u64) -> *mut Node {
    Box::into_raw(Box::new(node(value)))
}

/// A slot of a raw `AtomicPtr` to a boxed node, never null; frees the last node on drop.
pub struct PtrSlot<T = Node>(AtomicPtr<T>);

impl<T> PtrSlot<T> {
    fn new(value: Box<T>) -> Self {
        Self(AtomicPtr::new(Box::into_raw(value)))
    }
}

impl<T> Drop for PtrSlot<T> {
    fn drop(&mut self) {
        // SAFETY: the cell's threads are done; the slot's node is boxed, never retired
        // (only nodes swapped out are), so it is ours to free.
        drop(unsafe { Box::from_raw(*self.0.get_mut()) });
    }
}

/// One reclamation scheme as the groups drive it.
pub trait Scheme: Sync {
    const NAME: &'static str;
    /// A reader thread's state (a hazard pointer), made on that thread.
    type Reader;
    type Slot: Sync;
    fn reader(&self) -> Self::Reader;
    fn slot(&self, value: u64) -> Self::Slot;
    /// Protect, load, read the value, release.
    fn read(&self, reader: &mut Self::Reader, slot: &Self::Slot) -> u64;
    /// Swap a fresh node in, retire the old one.
    fn replace(&self, slot: &Self::Slot, value: u64);
}

pub struct ScalememEpoch;

impl Scheme for ScalememEpoch {
    const NAME: &'static str = "scalemem epoch";
    type Reader = ();
    type Slot = EpochSlot;

    fn reader(&self) {}

    fn slot(&self, value: u64) -> EpochSlot {
        EpochSlot(scalemem::epoch::Atomic::new(node(value)))
    }

    #[inline]
    fn read(&self, _: &mut (), slot: &EpochSlot) -> u64 {
        let guard = scalemem::epoch::pin();
        let node = slot.0.load(Acquire, &guard);
        // SAFETY: the slot never holds null, and a node is retired only after a swap
        // unlinked it, so one loaded under `guard` lives while `guard` pins.
        unsafe { node.deref() }.value
    }

    #[inline]
    fn replace(&self, slot: &EpochSlot, value: u64) {
        let guard = scalemem::epoch::pin();
        // AcqRel: Release publishes the new node to readers' Acquire loads; Acquire
        // orders the old node's contents before its destruction.
        let old = slot.0.swap(scalemem::epoch::Owned::new(node(value)), AcqRel, &guard);
        // SAFETY: `old` came from an `Owned`, the swap unlinked it and only this swap
        // returned it, so it is destroyed once; `Node` is `Send`.
        unsafe { guard.defer_destroy(old) };
    }
}

/// scalemem's epoch `Atomic`, freeing its last node on drop.
pub struct EpochSlot(scalemem::epoch::Atomic<Node>);

impl Drop for EpochSlot {
    fn drop(&mut self) {
        // SAFETY: never null; the cell's threads are done and the node was never retired.
        drop(unsafe { std::mem::take(&mut self.0).into_owned() });
    }
}

pub struct ScalememHazard;

impl Scheme for ScalememHazard {
    const NAME: &'static str = "scalemem hazard";
    type Reader = scalemem::hazard::HazardPointer<'static>;
    type Slot = PtrSlot;

    fn reader(&self) -> Self::Reader {
        scalemem::hazard::HazardPointer::new()
    }

    fn slot(&self, value: u64) -> PtrSlot {
        PtrSlot::new(Box::new(node(value)))
    }

    #[inline]
    fn read(&self, hp: &mut Self::Reader, slot: &PtrSlot) -> u64 {
        // SAFETY: nodes are retired to the global domain only after a swap unlinked them.
        let value = unsafe { hp.protect(&slot.0) }.map_or(0, |node| node.value);
        hp.reset();
        value
    }

    #[inline]
    fn replace(&self, slot: &PtrSlot, value: u64) {
        // AcqRel: as in ScalememEpoch::replace.
        let old = slot.0.swap(boxed(value), AcqRel);
        // SAFETY: unlinked by the swap, from a Box, retired once.
        unsafe { scalemem::hazard::Domain::global().retire_ptr(old, scalemem::hazard::drop_box) };
    }
}

pub struct ScalememAtomicArc;

impl Scheme for ScalememAtomicArc {
    const NAME: &'static str = "scalemem AtomicArc::load";
    type Reader = ();
    type Slot = scalemem::hazard::AtomicArc<u64>;

    fn reader(&self) {}

    fn slot(&self, value: u64) -> Self::Slot {
        scalemem::hazard::AtomicArc::new(Arc::new(value))
    }

    #[inline]
    fn read(&self, _: &mut (), slot: &Self::Slot) -> u64 {
        *slot.load()
    }

    #[inline]
    fn replace(&self, slot: &Self::Slot, value: u64) {
        slot.store(Arc::new(value));
    }
}

pub struct Crossbeam;

impl Scheme for Crossbeam {
    const NAME: &'static str = "crossbeam-epoch";
    type Reader = ();
    type Slot = CrossbeamSlot;

    fn reader(&self) {}

    fn slot(&self, value: u64) -> CrossbeamSlot {
        CrossbeamSlot(crossbeam_epoch::Atomic::new(node(value)))
    }

    #[inline]
    fn read(&self, _: &mut (), slot: &CrossbeamSlot) -> u64 {
        let guard = crossbeam_epoch::pin();
        let node = slot.0.load(Acquire, &guard);
        // SAFETY: as in ScalememEpoch::read.
        unsafe { node.deref() }.value
    }

    #[inline]
    fn replace(&self, slot: &CrossbeamSlot, value: u64) {
        let guard = crossbeam_epoch::pin();
        // AcqRel: as in ScalememEpoch::replace.
        let old = slot.0.swap(crossbeam_epoch::Owned::new(node(value)), AcqRel, &guard);
        // SAFETY: unlinked by the swap, an `Owned` allocation only this swap returned.
        unsafe { guard.defer_destroy(old) };
    }
}

/// crossbeam-epoch's `Atomic`, freeing its last node on drop.
pub struct CrossbeamSlot(crossbeam_epoch::Atomic<Node>);

impl Drop for CrossbeamSlot {
    fn drop(&mut self) {
        // SAFETY: never null; the cell's threads are done and the node was never retired.
        drop(unsafe { std::mem::take(&mut self.0).into_owned() });
    }
}

/// seize with one `Collector` (default batch size) for the whole run.
pub struct Seize(pub seize::Collector);

impl Scheme for Seize {
    const NAME: &'static str = "seize";
    type Reader = ();
    type Slot = PtrSlot;

    fn reader(&self) {}

    fn slot(&self, value: u64) -> PtrSlot {
        PtrSlot::new(Box::new(node(value)))
    }

    #[inline]
    fn read(&self, _: &mut (), slot: &PtrSlot) -> u64 {
        let guard = self.0.enter();
        let node = guard.protect(&slot.0, Acquire);
        // SAFETY: never null; a protected load stays valid while `guard` lives, since
        // nodes are retired only after a swap unlinked them.
        unsafe { (*node).value }
    }

    #[inline]
    fn replace(&self, slot: &PtrSlot, value: u64) {
        let guard = self.0.enter();
        // AcqRel: as in ScalememEpoch::replace.
        let old = guard.swap(&slot.0, boxed(value), AcqRel);
        // SAFETY: unlinked by the swap, from `Box::into_raw` as `reclaim::boxed` wants,
        // retired once.
        unsafe { guard.defer_retire(old, seize::reclaim::boxed) };
    }
}

pub struct Haphazard;

impl Scheme for Haphazard {
    const NAME: &'static str = "haphazard";
    type Reader = haphazard::HazardPointer<'static>;
    type Slot = PtrSlot;

    fn reader(&self) -> Self::Reader {
        haphazard::HazardPointer::new()
    }

    fn slot(&self, value: u64) -> PtrSlot {
        PtrSlot::new(Box::new(node(value)))
    }

    #[inline]
    fn read(&self, hp: &mut Self::Reader, slot: &PtrSlot) -> u64 {
        // SAFETY: nodes are valid until retired to haphazard's global domain after a swap.
        let value = unsafe { hp.protect(&slot.0) }.map_or(0, |node| node.value);
        hp.reset_protection();
        value
    }

    #[inline]
    fn replace(&self, slot: &PtrSlot, value: u64) {
        // AcqRel: as in ScalememEpoch::replace.
        let old = slot.0.swap(boxed(value), AcqRel);
        // SAFETY: unlinked by the swap (no new hazard can reach it), retired once, boxed.
        unsafe { haphazard::Domain::global().retire_ptr::<Node, Box<Node>>(old) };
    }
}

pub struct ArcSwap;

impl Scheme for ArcSwap {
    const NAME: &'static str = "arc-swap load";
    type Reader = ();
    type Slot = arc_swap::ArcSwap<u64>;

    fn reader(&self) {}

    fn slot(&self, value: u64) -> Self::Slot {
        arc_swap::ArcSwap::from_pointee(value)
    }

    #[inline]
    fn read(&self, _: &mut (), slot: &Self::Slot) -> u64 {
        **slot.load()
    }

    #[inline]
    fn replace(&self, slot: &Self::Slot, value: u64) {
        slot.store(Arc::new(value));
    }
}

/// Every thread reads one shared slot.
fn read_cell<S: Scheme>(scheme: &S, threads: usize, secs: f64) -> Run {
    let slot = scheme.slot(42);
    harness::run(threads, secs, |_| {
        let mut reader = scheme.reader();
        let slot = &slot;
        move || {
            black_box(scheme.read(&mut reader, slot));
        }
    })
}

/// Thread 0 replaces and retires; the others read.
fn update_cell<S: Scheme>(scheme: &S, threads: usize, secs: f64) -> Run {
    let slot = scheme.slot(0);
    harness::run(threads, secs, |index| {
        let mut reader = (index != 0).then(|| scheme.reader());
        let slot = &slot;
        let mut value = 0u64;
        move || match &mut reader {
            None => {
                value = value.wrapping_add(1);
                scheme.replace(slot, black_box(value));
            }
            Some(reader) => {
                black_box(scheme.read(reader, slot));
            }
        }
    })
}

const NAMES: [&str; READ_PEERS] = [
    ScalememEpoch::NAME,
    ScalememHazard::NAME,
    ScalememAtomicArc::NAME,
    Crossbeam::NAME,
    Seize::NAME,
    Haphazard::NAME,
    ArcSwap::NAME,
];

/// Runs the cell function `f` on the peer with index `peer` of [`NAMES`].
macro_rules! on_peer {
    ($peer:expr, $seize:expr, $f:ident, $threads:expr, $secs:expr) => {
        match $peer {
            0 => $f(&ScalememEpoch, $threads, $secs),
            1 => $f(&ScalememHazard, $threads, $secs),
            2 => $f(&ScalememAtomicArc, $threads, $secs),
            3 => $f(&Crossbeam, $threads, $secs),
            4 => $f($seize, $threads, $secs),
            5 => $f(&Haphazard, $threads, $secs),
            _ => $f(&ArcSwap, $threads, $secs),
        }
    };
}

pub fn read_group(ctx: &Ctx) -> GroupReport {
    let seize = Seize(seize::Collector::new());
    let runs = ctx.measure("reclaim-read", &NAMES, &ctx.threads, |peer, threads| {
        on_peer!(peer, &seize, read_cell, threads, ctx.secs)
    });
    let rows = NAMES.iter().zip(&runs).map(|(name, runs)| model::rate_row(name, &ctx.threads, runs, model::whole));
    GroupReport {
        id: "reclaim-read",
        title: "reclaim-read: protected reads of one shared slot",
        about: "one op = pin/protect + load + read the value + unpin/reset, every thread on one shared slot \
                (hazard schemes keep one hazard pointer per thread; AtomicArc and arc-swap load an Arc<u64> \
                through a guard)"
            .to_owned(),
        rates: vec![RateTable { title: "reads, Mops/s over all threads".to_owned(), rows: rows.collect() }],
        ..GroupReport::default()
    }
}

pub fn update_group(ctx: &Ctx) -> GroupReport {
    let seize = Seize(seize::Collector::new());
    let runs = ctx.measure("reclaim-update", &NAMES, &ctx.threads, |peer, threads| {
        on_peer!(peer, &seize, update_cell, threads, ctx.secs)
    });
    // The updater's rate, and the readers' total (none at one thread).
    let updater = |run: &Run| {
        let t = &run.threads[0];
        Some((t.ops as f64 / t.secs() / 1e6, t.secs() * 1e9 / t.ops.max(1) as f64))
    };
    let readers = |run: &Run| {
        let readers = &run.threads[1..];
        let ops: u64 = readers.iter().map(|t| t.ops).sum();
        (!readers.is_empty()).then(|| {
            let span = run.span();
            (ops as f64 / span / 1e6, readers.len() as f64 * span * 1e9 / ops.max(1) as f64)
        })
    };
    let table = |title: &str, metric: &dyn Fn(&Run) -> Option<(f64, f64)>| RateTable {
        title: title.to_owned(),
        rows: NAMES.iter().zip(&runs).map(|(name, runs)| model::rate_row(name, &ctx.threads, runs, metric)).collect(),
    };
    GroupReport {
        id: "reclaim-update",
        title: "reclaim-update: one updater retiring while T-1 threads read",
        about: "thread 0 swaps a fresh node into the shared slot and retires the old one (AtomicArc/arc-swap: \
                store of a new Arc); threads 1..T do the reclaim-read operation on the same slot"
            .to_owned(),
        rates: vec![
            table("updates (thread 0), Mops/s; ns = per update", &updater),
            table("reads by the T-1 readers, Mops/s over the readers; ns = per read per reader", &readers),
        ],
        ..GroupReport::default()
    }
}

/// A node that counts its own drop in its cell's counter.
struct Counted {
    value: u64,
    freed: &'static AtomicUsize,
}

impl Drop for Counted {
    fn drop(&mut self) {
        // Relaxed: a statistic; the writer reads it as an approximate count.
        self.freed.fetch_add(1, Relaxed);
    }
}

/// What one stalled-reader repetition saw.
struct StallRun {
    retired: u64,
    max: u64,
    end: u64,
    after_teardown: u64,
    capped: bool,
    timeline: Vec<(f64, f64)>,
}

/// The writer's side of a stalled cell: retires with `replace(node)` until `secs` pass or
/// [`RETIRE_CAP`], watching `freed`. `hold` runs on the reader thread: it protects, waits
/// on the first barrier (protection held), then on the second (release), then returns,
/// dropping its protection. The caller tears the scheme down and calls [`finish`].
fn stall(
    secs: f64,
    freed: &'static AtomicUsize,
    hold: impl FnOnce(&Barrier, &Barrier) + Send,
    mut replace: impl FnMut(Counted),
) -> StallRun {
    let (held, release) = (Barrier::new(2), Barrier::new(2));
    let (mut retired, mut max, mut end, mut capped) = (0u64, 0u64, 0u64, false);
    let mut timeline = Vec::new();
    std::thread::scope(|s| {
        let (held, release) = (&held, &release);
        s.spawn(move || hold(held, release));
        held.wait();
        let start = Instant::now();
        let deadline = Duration::from_secs_f64(secs);
        let mut next_sample = 0.0;
        loop {
            for _ in 0..256 {
                retired += 1;
                replace(Counted { value: retired, freed });
            }
            // Relaxed: see Counted::drop.
            let unreclaimed = retired.saturating_sub(freed.load(Relaxed) as u64);
            max = max.max(unreclaimed);
            let now = start.elapsed();
            let ms = now.as_secs_f64() * 1e3;
            if ms >= next_sample {
                timeline.push((ms, unreclaimed as f64));
                next_sample = ms + (secs * 1e3 / 200.0).max(0.05);
            }
            if now >= deadline || retired >= RETIRE_CAP {
                capped = retired >= RETIRE_CAP && now < deadline;
                end = unreclaimed;
                timeline.push((ms, unreclaimed as f64));
                break;
            }
        }
        release.wait();
    });
    StallRun { retired, max, end, after_teardown: 0, capped, timeline }
}

fn counted(value: u64, freed: &'static AtomicUsize) -> Counted {
    Counted { value, freed }
}

fn stall_scalemem_epoch(secs: f64, freed: &'static AtomicUsize) -> StallRun {
    let collector = scalemem::epoch::Collector::new();
    let slot = scalemem::epoch::Atomic::new(counted(0, freed));
    let writer = collector.register();
    let run = {
        let (collector, slot) = (&collector, &slot);
        stall(
            secs,
            freed,
            move |held, release| {
                let handle = collector.register();
                let guard = handle.pin();
                black_box(slot.load(Acquire, &guard));
                held.wait();
                release.wait();
            },
            |new| {
                let guard = writer.pin();
                // AcqRel: as in ScalememEpoch::replace.
                let old = slot.swap(scalemem::epoch::Owned::new(new), AcqRel, &guard);
                // SAFETY: unlinked by the swap, destroyed once; `Counted` is `Send`.
                unsafe { guard.defer_destroy(old) };
            },
        )
    };
    drop(writer);
    // SAFETY: never null; every thread is done and the node was never retired.
    drop(unsafe { slot.into_owned() });
    drop(collector);
    finish(run, freed)
}

fn stall_crossbeam(secs: f64, freed: &'static AtomicUsize) -> StallRun {
    let collector = crossbeam_epoch::Collector::new();
    let slot = crossbeam_epoch::Atomic::new(counted(0, freed));
    let writer = collector.register();
    let run = {
        let (collector, slot) = (&collector, &slot);
        stall(
            secs,
            freed,
            move |held, release| {
                let handle = collector.register();
                let guard = handle.pin();
                black_box(slot.load(Acquire, &guard));
                held.wait();
                release.wait();
            },
            |new| {
                let guard = writer.pin();
                // AcqRel: as in ScalememEpoch::replace.
                let old = slot.swap(crossbeam_epoch::Owned::new(new), AcqRel, &guard);
                // SAFETY: unlinked by the swap, an `Owned` allocation destroyed once.
                unsafe { guard.defer_destroy(old) };
            },
        )
    };
    drop(writer);
    // SAFETY: never null; every thread is done and the node was never retired.
    drop(unsafe { slot.into_owned() });
    drop(collector);
    finish(run, freed)
}

fn stall_seize(secs: f64, freed: &'static AtomicUsize) -> StallRun {
    let collector = seize::Collector::new();
    let slot = PtrSlot::new(Box::new(counted(0, freed)));
    let run = {
        let (collector, slot) = (&collector, &slot);
        stall(
            secs,
            freed,
            move |held, release| {
                let guard = collector.enter();
                black_box(guard.protect(&slot.0, Acquire));
                held.wait();
                release.wait();
            },
            |new| {
                let guard = collector.enter();
                // AcqRel: as in ScalememEpoch::replace.
                let old = guard.swap(&slot.0, Box::into_raw(Box::new(new)), AcqRel);
                // SAFETY: unlinked by the swap, from `Box::into_raw`, retired once.
                unsafe { guard.defer_retire(old, seize::reclaim::boxed) };
            },
        )
    };
    drop(slot);
    drop(collector);
    finish(run, freed)
}

fn stall_scalemem_hazard(secs: f64, freed: &'static AtomicUsize) -> StallRun {
    let domain = scalemem::unique_domain!();
    let slot = PtrSlot::new(Box::new(counted(0, freed)));
    let run = {
        let (domain, slot) = (&domain, &slot);
        stall(
            secs,
            freed,
            move |held, release| {
                let mut hp = scalemem::hazard::HazardPointer::new_in(domain);
                // SAFETY: the slot's nodes are retired to `domain` after a swap unlinked them.
                black_box(unsafe { hp.protect(&slot.0) }.map(|n| n.value));
                held.wait();
                release.wait();
            },
            |new| {
                // AcqRel: as in ScalememEpoch::replace.
                let old = slot.0.swap(Box::into_raw(Box::new(new)), AcqRel);
                // SAFETY: unlinked by the swap, from a Box, retired once.
                unsafe { domain.retire_ptr(old, scalemem::hazard::drop_box) };
            },
        )
    };
    drop(slot);
    drop(domain);
    finish(run, freed)
}

fn stall_haphazard(secs: f64, freed: &'static AtomicUsize) -> StallRun {
    let domain = haphazard::Domain::global();
    let slot = PtrSlot::new(Box::new(counted(0, freed)));
    let run = {
        let slot = &slot;
        stall(
            secs,
            freed,
            move |held, release| {
                let mut hp = haphazard::HazardPointer::new();
                // SAFETY: the slot's nodes are retired to the global domain after a swap.
                black_box(unsafe { hp.protect(&slot.0) }.map(|n| n.value));
                held.wait();
                release.wait();
            },
            |new| {
                // AcqRel: as in ScalememEpoch::replace.
                let old = slot.0.swap(Box::into_raw(Box::new(new)), AcqRel);
                // SAFETY: unlinked by the swap, boxed, retired once.
                unsafe { domain.retire_ptr::<Counted, Box<Counted>>(old) };
            },
        )
    };
    // The global domain stays: reclaim what nobody protects any more.
    domain.eager_reclaim();
    drop(slot);
    finish(run, freed)
}

/// Counts the nodes still alive once the scheme is torn down and the slot dropped: the
/// cell made `retired` nodes plus the slot's first one, all counting into `freed`.
fn finish(mut run: StallRun, freed: &'static AtomicUsize) -> StallRun {
    // Relaxed: every thread that could free is joined or this one.
    run.after_teardown = (run.retired + 1).saturating_sub(freed.load(Relaxed) as u64);
    run
}

pub fn stalled_group(ctx: &Ctx) -> GroupReport {
    type StallFn = fn(f64, &'static AtomicUsize) -> StallRun;
    let peers: [(&str, StallFn); STALLED_PEERS] = [
        ("scalemem epoch", stall_scalemem_epoch),
        ("scalemem hazard", stall_scalemem_hazard),
        ("crossbeam-epoch", stall_crossbeam),
        ("seize", stall_seize),
        ("haphazard", stall_haphazard),
    ];
    let names: Vec<&str> = peers.iter().map(|p| p.0).collect();
    // One column: one stalled reader and one writer, whatever --threads says.
    let runs = ctx.measure("stalled-garbage", &names, &[2], |peer, _| {
        // One counter per repetition, leaked (a few words per cell), so that a node of an
        // earlier cell freed late is never counted against this one.
        let freed: &'static AtomicUsize = Box::leak(Box::new(AtomicUsize::new(0)));
        (peers[peer].1)(ctx.secs, freed)
    });
    let rows = names
        .iter()
        .zip(runs)
        .map(|(name, mut runs)| {
            let reps = runs.pop().expect("one column");
            let of = |f: fn(&StallRun) -> u64| Measure::of(reps.iter().map(|r| f(r) as f64).collect());
            StalledRow {
                name: (*name).to_owned(),
                retired: of(|r| r.retired),
                max_unreclaimed: of(|r| r.max),
                end_unreclaimed: of(|r| r.end),
                after_teardown: of(|r| r.after_teardown),
                capped: reps.iter().any(|r| r.capped),
                timeline: reps.into_iter().next().map(|r| r.timeline).unwrap_or_default(),
            }
        })
        .collect();
    GroupReport {
        id: "stalled-garbage",
        title: "stalled-garbage: retired-but-unreclaimed objects behind a stalled reader",
        about: format!(
            "one thread protects (pins) the slot's node and stops; one writer swaps in a fresh 16-byte node and \
             retires the old one for {} s or {} retires, whichever comes first; each node counts its own drop. \
             Counts of objects, not rates. Own domain/collector per cell (haphazard: its global domain).",
            ctx.secs,
            crate::report::fmt_count(RETIRE_CAP as f64)
        ),
        stalled: rows,
        ..GroupReport::default()
    }
}
