//! Behaviour of `scalemem::hazard`: protected objects are never freed, unprotected ones
//! are, exactly once; records are reused after thread exit and exited threads' garbage is
//! adopted; a stalled reader holds back a bounded amount of garbage; the protect and
//! intrusive retire paths never allocate; `AtomicArc` keeps loaded values alive.
//!
//! Tests that count garbage use domains of their own (`unique_domain!`), so the other
//! tests of this binary, which share the global domain, do not disturb their counts.

mod common;

use std::ptr::NonNull;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize};
use std::sync::{Arc, Barrier, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use common::counting_alloc::{Counting, allocations_in};
use scalemem::hazard::{self, AtomicArc, Domain, HazardPointer, HazardPointerArray, Retired};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Serialises the tests that run many threads or measure for seconds.
static HEAVY: Mutex<()> = Mutex::new(());

fn heavy() -> std::sync::MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

/// A node with an embedded link (first field), a value that readers check, and a drop
/// counter. The drop poisons the value, so a read after free shows (and ASan reports it).
#[derive(Debug)]
#[repr(C)]
struct Node {
    link: Retired,
    value: AtomicUsize,
    drops: Arc<AtomicUsize>,
}

const POISON: usize = usize::MAX;

impl Node {
    fn boxed(value: usize, drops: &Arc<AtomicUsize>) -> *mut Node {
        Box::into_raw(Box::new(Node { link: Retired::new(), value: AtomicUsize::new(value), drops: drops.clone() }))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.value.store(POISON, SeqCst);
        self.drops.fetch_add(1, SeqCst);
    }
}

/// The `ReclaimFn` of nodes retired intrusively.
///
/// # Safety
/// `link` is the first field of a boxed `Node`, freed once.
unsafe fn reclaim_node(link: NonNull<Retired>) {
    // SAFETY: every link retired with this function is the first field of a boxed Node.
    drop(unsafe { Box::from_raw(link.cast::<Node>().as_ptr()) });
}

/// Swaps a fresh node into `slot` and retires the old one intrusively.
fn replace<F>(domain: &Domain<F>, slot: &AtomicPtr<Node>, value: usize, drops: &Arc<AtomicUsize>) {
    let old = slot.swap(Node::boxed(value, drops), AcqRel);
    // SAFETY: unlinked by the swap, retired once; the link is the node's own.
    unsafe { domain.retire(old, NonNull::new_unchecked(old).cast(), reclaim_node) };
}

#[test]
fn protected_objects_survive_scans_and_unprotected_ones_are_freed_once() {
    let domain = scalemem::unique_domain!();
    let drops = Arc::new(AtomicUsize::new(0));
    let slot = AtomicPtr::new(Node::boxed(1, &drops));
    let mut hp = HazardPointer::new_in(&domain);
    // SAFETY: the slot's nodes are retired to `domain` after being unlinked.
    let node = unsafe { hp.protect(&slot) }.unwrap();
    replace(&domain, &slot, 2, &drops);
    assert_eq!(domain.reclaim(), 0, "the protected node was freed");
    assert_eq!(node.value.load(SeqCst), 1);
    replace(&domain, &slot, 3, &drops);
    assert_eq!(domain.reclaim(), 1, "the unprotected node 2 is freed");
    hp.reset();
    assert_eq!(domain.reclaim(), 1, "node 1 is freed once its hazard is reset");
    assert_eq!(domain.reclaim(), 0);
    assert_eq!(drops.load(SeqCst), 2);
    assert_eq!(domain.stats().retired, 0);
    // SAFETY: no other thread uses the slot.
    drop(unsafe { Box::from_raw(slot.into_inner()) });
}

#[test]
fn try_protect_reports_a_moved_pointer() {
    let domain = scalemem::unique_domain!();
    let drops = Arc::new(AtomicUsize::new(0));
    let slot = AtomicPtr::new(Node::boxed(1, &drops));
    let stale = slot.load(Acquire);
    replace(&domain, &slot, 2, &drops);
    let mut hp = HazardPointer::new_in(&domain);
    // SAFETY: as above.
    let now = unsafe { hp.try_protect(stale, &slot) }.unwrap_err();
    assert_eq!(now, slot.load(Acquire));
    // SAFETY: as above.
    let node = unsafe { hp.try_protect(now, &slot) }.unwrap().unwrap();
    assert_eq!(node.value.load(SeqCst), 2);
    drop(hp);
    domain.reclaim();
    assert_eq!(drops.load(SeqCst), 1);
    // SAFETY: no other thread uses the slot.
    drop(unsafe { Box::from_raw(slot.into_inner()) });
}

#[test]
fn retire_ptr_runs_the_deleter_and_protect_of_null_is_none() {
    let domain = scalemem::unique_domain!();
    let null = AtomicPtr::<u64>::new(std::ptr::null_mut());
    let mut hp = HazardPointer::new_in(&domain);
    // SAFETY: the slot holds null only.
    assert!(unsafe { hp.protect(&null) }.is_none());
    let drops = Arc::new(AtomicUsize::new(0));
    for i in 0..10 {
        // SAFETY: a fresh box, never shared, retired once.
        unsafe { domain.retire_ptr(Node::boxed(i, &drops), hazard::drop_box) };
    }
    assert_eq!(domain.reclaim(), 10);
    assert_eq!(drops.load(SeqCst), 10);
}

#[test]
fn many_hazard_pointers_at_once_overflow_into_more_records() {
    let domain = scalemem::unique_domain!();
    let drops = Arc::new(AtomicUsize::new(0));
    const N: usize = 3 * hazard::SLOTS_PER_RECORD + 1;
    let slots: Vec<AtomicPtr<Node>> = (0..N).map(|i| AtomicPtr::new(Node::boxed(i, &drops))).collect();
    let mut hps: Vec<HazardPointer<'_, _>> = (0..N).map(|_| HazardPointer::new_in(&domain)).collect();
    for (hp, slot) in hps.iter_mut().zip(&slots) {
        // SAFETY: as above.
        unsafe { hp.protect_ptr(slot) };
    }
    for (i, slot) in slots.iter().enumerate() {
        replace(&domain, slot, N + i, &drops);
    }
    assert_eq!(domain.reclaim(), 0, "every old node is protected");
    assert!(domain.stats().records >= 4);
    drop(hps);
    assert_eq!(domain.reclaim(), N);
    let mut array = HazardPointerArray::<5, _>::new_in(&domain);
    for (hp, slot) in array.pointers_mut().iter_mut().zip(&slots) {
        // SAFETY: as above.
        let node = unsafe { hp.protect(slot) }.unwrap();
        assert!(node.value.load(SeqCst) >= N);
    }
    array.reset();
    for slot in slots {
        // SAFETY: no other thread uses the slots.
        drop(unsafe { Box::from_raw(slot.into_inner()) });
    }
}

#[test]
fn records_are_reused_after_thread_exit_and_garbage_is_adopted() {
    let domain = Arc::new(scalemem::unique_domain!());
    let drops = Arc::new(AtomicUsize::new(0));
    for round in 0..20 {
        let (domain, drops) = (domain.clone(), drops.clone());
        thread::spawn(move || {
            let slot = AtomicPtr::new(Node::boxed(round, &drops));
            let _hp = HazardPointer::new_in(&*domain);
            for i in 0..5 {
                replace(&*domain, &slot, i, &drops);
            }
            // Exit with 5 retired objects and the last one still in the slot.
            // SAFETY: only this thread used the slot.
            unsafe { domain.retire_ptr(slot.into_inner(), hazard::drop_box) };
        })
        .join()
        .unwrap();
    }
    let stats = domain.stats();
    assert!(stats.records <= 15, "one chunk of records suffices for one thread at a time: {stats:?}");
    assert_eq!(stats.threads, 0, "exited threads released their records: {stats:?}");
    // A scan by this thread adopts what the exited threads left.
    domain.reclaim();
    assert_eq!(drops.load(SeqCst), 20 * 6);
    assert_eq!(domain.stats().retired, 0);
}

#[test]
fn exiting_threads_garbage_stays_protected_until_released() {
    let domain = Arc::new(scalemem::unique_domain!());
    let drops = Arc::new(AtomicUsize::new(0));
    let slot = Arc::new(AtomicPtr::new(Node::boxed(7, &drops)));
    let mut hp = HazardPointer::new_in(&*domain);
    // SAFETY: as above.
    let node = unsafe { hp.protect(&slot) }.unwrap();
    {
        let (domain, slot, drops) = (domain.clone(), slot.clone(), drops.clone());
        thread::spawn(move || replace(&*domain, &slot, 8, &drops)).join().unwrap();
    }
    assert_eq!(domain.reclaim(), 0);
    assert_eq!(node.value.load(SeqCst), 7, "adopted garbage freed while protected");
    drop(hp);
    assert_eq!(domain.reclaim(), 1);
    // SAFETY: every other thread is done.
    drop(unsafe { Box::from_raw(slot.load(Acquire)) });
}

#[test]
fn dropping_a_domain_frees_what_is_left_even_if_threads_cached_its_records() {
    let drops = Arc::new(AtomicUsize::new(0));
    let domain = Arc::new(scalemem::unique_domain!());
    let (tx, rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let worker = {
        let (domain, drops) = (domain.clone(), drops.clone());
        thread::spawn(move || {
            for i in 0..10 {
                // SAFETY: fresh boxes, retired once.
                unsafe { domain.retire_ptr(Node::boxed(i, &drops), hazard::drop_box) };
            }
            drop(domain);
            done_tx.send(()).unwrap();
            rx.recv().unwrap(); // stays alive (its record cached) until told
        })
    };
    done_rx.recv().unwrap();
    assert_eq!(drops.load(SeqCst), 0);
    drop(Arc::try_unwrap(domain).expect("the last handle"));
    assert_eq!(drops.load(SeqCst), 10, "the last handle's drop sweeps every record");
    tx.send(()).unwrap();
    worker.join().unwrap();
}

#[test]
fn a_thread_scans_after_the_time_bound_even_below_the_threshold() {
    let domain = scalemem::unique_domain!();
    let drops = Arc::new(AtomicUsize::new(0));
    for i in 0..7 {
        // SAFETY: a fresh box, retired once.
        unsafe { domain.retire_ptr(Node::boxed(i, &drops), hazard::drop_box) };
    }
    assert_eq!(drops.load(SeqCst), 0, "far below the threshold, too early for the clock");
    thread::sleep(Duration::from_millis(30));
    // SAFETY: as above.
    unsafe { domain.retire_ptr(Node::boxed(7, &drops), hazard::drop_box) };
    assert_eq!(drops.load(SeqCst), 8, "the 8th retire looks at the clock and scans");
}

#[test]
fn the_threshold_scan_keeps_a_threads_list_under_r() {
    let domain = scalemem::unique_domain!();
    let drops = Arc::new(AtomicUsize::new(0));
    let threshold = domain.stats().threshold();
    for i in 0..3 * threshold {
        // SAFETY: fresh boxes, retired once.
        unsafe { domain.retire_ptr(Node::boxed(i, &drops), hazard::drop_box) };
        assert!(domain.stats().retired < threshold);
    }
    assert!(domain.stats().scans >= 2);
}

#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "another domain")]
fn debug_builds_catch_retiring_to_the_wrong_domain() {
    let a = scalemem::unique_domain!();
    let b = scalemem::unique_domain!();
    let drops = Arc::new(AtomicUsize::new(0));
    let slot = AtomicPtr::new(Node::boxed(1, &drops));
    let mut hp = HazardPointer::new_in(&a);
    // SAFETY: as above (the mistake is the retire below).
    unsafe { hp.protect_ptr(&slot) };
    let old = slot.swap(std::ptr::null_mut(), AcqRel);
    /// Frees the node when the expected panic unwinds (and if it does not, too: the
    /// deleter below only forgets it).
    struct FreeOnDrop(*mut Node);
    impl Drop for FreeOnDrop {
        fn drop(&mut self) {
            // SAFETY: the node is ours: the retire below either panicked before queuing it
            // or queued it with a deleter that does nothing.
            drop(unsafe { Box::from_raw(self.0) });
        }
    }
    /// # Safety
    /// None needed: it does nothing.
    unsafe fn forget(_: *mut Node) {}
    let _free = FreeOnDrop(old);
    // SAFETY: deliberately wrong domain: the debug check panics before anything is queued.
    unsafe { b.retire_ptr(old, forget) };
}

/// The bound of the module doc, measured: one reader protects one node and never moves;
/// one writer retires for a few seconds. The writer's list (the only one with garbage)
/// must never exceed `R = max(C, K * H)`, the stalled node must survive, and everything
/// else must keep being reclaimed.
#[test]
fn a_stalled_reader_holds_back_a_bounded_amount_of_garbage() {
    let _heavy = heavy();
    let secs: f64 = std::env::var("STRESS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let domain = Arc::new(scalemem::unique_domain!());
    let drops = Arc::new(AtomicUsize::new(0));
    let slot = Arc::new(AtomicPtr::new(Node::boxed(0, &drops)));
    let (stalled_tx, stalled_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let reader = {
        let (domain, slot) = (domain.clone(), slot.clone());
        thread::spawn(move || {
            let mut hp = HazardPointer::new_in(&*domain);
            // SAFETY: the slot's nodes are retired to `domain` after being unlinked.
            let node = unsafe { hp.protect(&slot) }.unwrap();
            stalled_tx.send(node as *const Node as usize).unwrap();
            release_rx.recv().unwrap(); // stalls here, holding the hazard
            assert_eq!(node.value.load(SeqCst), 0, "the stalled node was freed");
        })
    };
    let stalled = stalled_rx.recv().unwrap();
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let (mut retired, mut worst) = (0usize, 0usize);
    let mut bound = 0;
    while Instant::now() < deadline {
        for _ in 0..256 {
            replace(&*domain, &slot, retired + 1, &drops);
            retired += 1;
        }
        let stats = domain.stats();
        bound = stats.bound(1);
        worst = worst.max(stats.retired);
        assert!(stats.retired <= bound, "{} retired objects unreclaimed, bound {bound}: {stats:?}", stats.retired);
    }
    let stats = domain.stats();
    assert!(stats.reclaimed + 1 >= retired - bound, "reclamation stalled: {stats:?}");
    // SAFETY: the reader still protects the first node: reading it is what it checks.
    assert_eq!(unsafe { &*(stalled as *const Node) }.value.load(SeqCst), 0);
    release_tx.send(()).unwrap();
    reader.join().unwrap();
    domain.reclaim();
    assert_eq!(drops.load(SeqCst), retired, "everything retired is freed once the reader lets go");
    println!(
        "stalled reader: {retired} retired in {secs} s, at most {worst} unreclaimed (bound R = {bound}), {} scans",
        stats.scans
    );
    // SAFETY: every other thread is done.
    drop(unsafe { Box::from_raw(slot.load(Acquire)) });
}

/// 16 threads on however few cores: half replace nodes in a few shared slots, half
/// protect and read them. A read of a freed node sees the poison (and ASan reports it);
/// every node must be dropped exactly once.
#[test]
fn sixteen_threads_read_and_replace_without_use_after_free() {
    let _heavy = heavy();
    const THREADS: usize = 16;
    const SLOTS: usize = 4;
    let ops = if cfg!(debug_assertions) { 20_000 } else { 200_000 };
    let drops = Arc::new(AtomicUsize::new(0));
    let slots: Arc<Vec<AtomicPtr<Node>>> =
        Arc::new((0..SLOTS).map(|i| AtomicPtr::new(Node::boxed(i, &drops))).collect());
    let barrier = Arc::new(Barrier::new(THREADS));
    let created = Arc::new(AtomicUsize::new(SLOTS));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (slots, drops, barrier, created) = (slots.clone(), drops.clone(), barrier.clone(), created.clone());
            thread::spawn(move || {
                barrier.wait();
                let domain = Domain::global();
                let mut hp = HazardPointer::new();
                for i in 0..ops {
                    let slot = &slots[(t + i) % SLOTS];
                    if t % 2 == 0 {
                        let old = slot.swap(Node::boxed(i, &drops), AcqRel);
                        created.fetch_add(1, Relaxed);
                        if i % 2 == 0 {
                            // SAFETY: unlinked by the swap, retired once.
                            unsafe { domain.retire(old, NonNull::new_unchecked(old).cast(), reclaim_node) };
                        } else {
                            // SAFETY: as above.
                            unsafe { domain.retire_ptr(old, hazard::drop_box) };
                        }
                    } else {
                        // SAFETY: the slots' nodes are retired to the global domain.
                        let node = unsafe { hp.protect(slot) }.unwrap();
                        assert_ne!(node.value.load(SeqCst), POISON, "read a freed node");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for slot in slots.iter() {
        // SAFETY: every thread is done.
        drop(unsafe { Box::from_raw(slot.load(Acquire)) });
    }
    // Exited threads' garbage is adopted by our scans.
    for _ in 0..4 {
        Domain::global().reclaim();
    }
    assert_eq!(drops.load(SeqCst), created.load(SeqCst), "every node dropped exactly once");
}

#[test]
fn protect_take_and_intrusive_retire_do_not_allocate() {
    let domain = scalemem::unique_domain!();
    let drops = Arc::new(AtomicUsize::new(0));
    const N: usize = 5_000;
    let nodes: Vec<*mut Node> = (0..N).map(|i| Node::boxed(i, &drops)).collect();
    let slot = AtomicPtr::new(Node::boxed(0, &drops));
    // The first use claims the thread's record (mmap) and maps the scan buffer.
    drop(HazardPointer::new_in(&domain));
    domain.reclaim();
    let protects = allocations_in(|| {
        for _ in 0..10_000 {
            let mut hp = HazardPointer::new_in(&domain);
            // SAFETY: as above.
            assert_eq!(unsafe { hp.protect(&slot) }.unwrap().value.load(Relaxed), 0);
            let mut global = HazardPointer::new();
            // SAFETY: nothing retires the slot's node.
            unsafe { global.protect_ptr(&slot) };
        }
    });
    assert_eq!(protects, 0, "taking, protecting and dropping hazard pointers allocated");
    let retires = allocations_in(|| {
        for &node in &nodes {
            // SAFETY: each node is retired once and never shared.
            unsafe { domain.retire(node, NonNull::new_unchecked(node).cast(), reclaim_freeing_nothing) };
        }
        domain.reclaim();
    });
    assert_eq!(retires, 0, "intrusive retire and scans allocated");
    assert_eq!(FREED.load(SeqCst), N);
    for node in nodes {
        // SAFETY: reclaim_freeing_nothing only counted them.
        drop(unsafe { Box::from_raw(node) });
    }
    // SAFETY: no other thread uses the slot.
    drop(unsafe { Box::from_raw(slot.into_inner()) });
}

static FREED: AtomicUsize = AtomicUsize::new(0);

/// Counts instead of freeing (the nodes are freed by the test afterwards), so the
/// allocation count covers only scalemem's own work.
///
/// # Safety
/// None needed: it only counts.
unsafe fn reclaim_freeing_nothing(_: NonNull<Retired>) {
    FREED.fetch_add(1, SeqCst);
}

#[test]
fn atomic_arc_loads_keep_values_alive_and_every_value_is_dropped_once() {
    let drops = Arc::new(AtomicUsize::new(0));
    #[derive(Debug)]
    struct Value(usize, Arc<AtomicUsize>);
    impl Drop for Value {
        fn drop(&mut self) {
            self.1.fetch_add(1, SeqCst);
        }
    }
    let cell = AtomicArc::new(Arc::new(Value(0, drops.clone())));
    let guard = cell.load();
    cell.store(Arc::new(Value(1, drops.clone())));
    Domain::global().reclaim();
    assert_eq!(guard.0, 0);
    assert_eq!(drops.load(SeqCst), 0, "a loaded value was dropped");
    let full = Guard_to_arc(&guard);
    drop(guard);
    Domain::global().reclaim();
    assert_eq!(drops.load(SeqCst), 0, "an Arc from the guard keeps it");
    drop(full);
    assert_eq!(drops.load(SeqCst), 1);

    let old = cell.swap(Arc::new(Value(2, drops.clone())));
    assert_eq!(old.0, 1);
    let current = cell.load_full();
    let unrelated = Arc::new(Value(9, drops.clone()));
    let back = cell.compare_and_swap(&unrelated, Arc::new(Value(3, drops.clone()))).unwrap_err();
    assert_eq!(back.0, 3);
    let previous = cell.compare_and_swap(&current, back).ok().unwrap();
    assert_eq!(previous.0, 2);
    let replaced = cell.rcu(|v| Value(v.0 + 1, drops.clone()));
    assert_eq!((replaced.0, cell.load().0), (3, 4));
    drop((old, current, unrelated, previous, replaced));
    Domain::global().reclaim();
    drop(cell);
    // Values 0..=4, the rcu's value, and 9: every one dropped once.
    assert_eq!(drops.load(SeqCst), 6);
}

#[allow(non_snake_case)]
fn Guard_to_arc<T>(guard: &hazard::Guard<'_, T>) -> Arc<T> {
    hazard::Guard::to_arc(guard)
}

#[test]
fn atomic_arc_under_concurrent_rcu_counts_every_increment() {
    let _heavy = heavy();
    let cell = Arc::new(AtomicArc::new(Arc::new(0usize)));
    let stop = Arc::new(AtomicBool::new(false));
    let per_thread = if cfg!(debug_assertions) { 2_000 } else { 20_000 };
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (cell, stop) = (cell.clone(), stop.clone());
            thread::spawn(move || {
                let mut last = 0;
                while !stop.load(Relaxed) {
                    let v = *cell.load();
                    assert!(v >= last, "values went backwards");
                    last = v;
                }
            })
        })
        .collect();
    let writers: Vec<_> = (0..4)
        .map(|_| {
            let cell = cell.clone();
            thread::spawn(move || {
                for _ in 0..per_thread {
                    cell.rcu(|v| v + 1);
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    assert_eq!(*cell.load(), 4 * per_thread);
}
