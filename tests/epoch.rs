//! Behaviour of `scalemem::epoch`: reclamation happens, exactly once, never early; thread
//! exit (normal, pinned, inside TLS destructors) loses nothing; records are reused; work
//! per call is bounded.
//!
//! Tests that hold a pin for a long time use a collector of their own, so they do not
//! stall the default collector that the other tests of this binary share.

use std::ptr::NonNull;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, SeqCst};
use std::sync::{Arc, Barrier, mpsc};
use std::thread;

use scalemem::epoch::{self, Atomic, Collector, LocalHandle, Owned, Retired, Shared};

mod common;

/// Counts its drops in a shared counter.
struct Counted {
    drops: Arc<AtomicUsize>,
    value: u64,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.drops.fetch_add(1, SeqCst);
    }
}

fn counted(drops: &Arc<AtomicUsize>, value: u64) -> Counted {
    Counted { drops: drops.clone(), value }
}

/// Retires `n` counted objects through `handle` (each swapped out of a slot).
fn retire_counted(handle: &LocalHandle, drops: &Arc<AtomicUsize>, n: usize) {
    let slot = Atomic::new(counted(drops, 0));
    for i in 0..n {
        let guard = handle.pin();
        let old = slot.swap(Owned::new(counted(drops, i as u64 + 1)), AcqRel, &guard);
        // SAFETY: `old` was unlinked by the swap and is retired once.
        unsafe { guard.defer_destroy(old) };
    }
    // Retire the last one too, so exactly n + 1 objects exist and all are retired.
    let guard = handle.pin();
    let last = slot.swap(Shared::null(), AcqRel, &guard);
    // SAFETY: unlinked, retired once.
    unsafe { guard.defer_destroy(last) };
}

/// Flushes through `handle` until `done()` or a bound on attempts; returns attempts.
fn drive_until(handle: &LocalHandle, mut done: impl FnMut() -> bool) -> usize {
    for attempt in 0..100_000 {
        if done() {
            return attempt;
        }
        handle.pin().flush();
        if attempt % 64 == 63 {
            thread::yield_now();
        }
    }
    panic!("reclamation made no progress");
}

#[test]
fn deferred_destruction_runs_exactly_once() {
    let collector = Collector::new();
    let handle = collector.register();
    let drops = Arc::new(AtomicUsize::new(0));
    retire_counted(&handle, &drops, 1000);
    drive_until(&handle, || drops.load(SeqCst) == 1001);
    for _ in 0..100 {
        handle.pin().flush();
    }
    assert_eq!(drops.load(SeqCst), 1001);
}

#[test]
fn pinned_reader_blocks_reclamation_until_it_unpins() {
    let collector = Collector::new();
    let drops = Arc::new(AtomicUsize::new(0));
    let slot = Arc::new(Atomic::new(counted(&drops, 42)));
    let (pinned_tx, pinned_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();

    let reader = {
        let collector = collector.clone();
        let slot = slot.clone();
        thread::spawn(move || {
            let handle = collector.register();
            let guard = handle.pin();
            let p = slot.load(Acquire, &guard);
            pinned_tx.send(()).unwrap();
            // Keep reading the object while the writer retires it and drives the epoch.
            loop {
                // SAFETY: loaded under `guard`, which is still alive.
                assert_eq!(unsafe { p.deref() }.value, 42);
                if release_rx.try_recv().is_ok() {
                    break;
                }
                thread::yield_now();
            }
            drop(guard);
        })
    };

    pinned_rx.recv().unwrap();
    let writer = collector.register();
    let epoch_at_pin = collector.epoch();
    {
        let guard = writer.pin();
        let old = slot.swap(Shared::null(), AcqRel, &guard);
        // SAFETY: unlinked, retired once.
        unsafe { guard.defer_destroy(old) };
    }
    for _ in 0..2000 {
        writer.pin().flush();
    }
    assert_eq!(drops.load(SeqCst), 0, "freed while a reader held it");
    // The reader pinned in `epoch_at_pin` (or one earlier): the epoch can pass it by one.
    assert!(collector.epoch() <= epoch_at_pin + 1);

    release_tx.send(()).unwrap();
    reader.join().unwrap();
    drive_until(&writer, || drops.load(SeqCst) == 1);
}

#[test]
fn garbage_of_an_exiting_thread_is_adopted() {
    let collector = Collector::new();
    let drops = Arc::new(AtomicUsize::new(0));
    {
        let collector = collector.clone();
        let drops = drops.clone();
        // 10 objects: fewer than a bag, so they are still in the thread's own bag.
        thread::spawn(move || retire_counted(&collector.register(), &drops, 9)).join().unwrap();
    }
    assert_eq!(collector.stats().threads, 0);
    let handle = collector.register();
    drive_until(&handle, || drops.load(SeqCst) == 10);
}

#[test]
fn default_collector_releases_records_at_thread_exit() {
    // The default collector's thread records are released by a pthread-key destructor.
    let drops = Arc::new(AtomicUsize::new(0));
    let before = epoch::default_collector().stats();
    for _ in 0..8 {
        let drops = drops.clone();
        thread::spawn(move || {
            let slot = Atomic::new(counted(&drops, 1));
            let guard = epoch::pin();
            let old = slot.swap(Shared::null(), AcqRel, &guard);
            // SAFETY: unlinked, retired once.
            unsafe { guard.defer_destroy(old) };
        })
        .join()
        .unwrap();
    }
    let after = epoch::default_collector().stats();
    // Exited threads gave their records back: the sequential threads reused them.
    assert!(after.records <= before.records + 31, "records not reused: {before:?} -> {after:?}");
    for _ in 0..100_000 {
        if drops.load(SeqCst) == 8 {
            return;
        }
        epoch::pin().flush();
        thread::yield_now();
    }
    panic!("garbage of exited threads was lost: {} of 8 freed", drops.load(SeqCst));
}

static LEAKED_GUARD: std::sync::atomic::AtomicPtr<epoch::Guard> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

#[test]
fn thread_exiting_while_pinned_keeps_its_objects_alive() {
    let collector = Collector::new();
    let drops = Arc::new(AtomicUsize::new(0));
    let leaked: &'static Counted = {
        let collector = collector.clone();
        let drops = drops.clone();
        thread::spawn(move || {
            let handle = collector.register();
            // A guard that outlives the thread: its record must stay pinned forever. (Kept
            // reachable from a static, so leak checkers see it is deliberate.)
            let guard: &'static epoch::Guard = Box::leak(Box::new(handle.pin()));
            LEAKED_GUARD.store(guard as *const epoch::Guard as *mut epoch::Guard, SeqCst);
            let slot = Atomic::new(counted(&drops, 7));
            let p = slot.load(Acquire, guard);
            // SAFETY: p is protected by the leaked guard, which lives forever.
            let escaped: &'static Counted = unsafe { p.deref() };
            let old = slot.swap(Shared::null(), AcqRel, guard);
            // SAFETY: unlinked, retired once.
            unsafe { guard.defer_destroy(old) };
            escaped
        })
        .join()
        .unwrap()
    };
    assert_eq!(collector.stats().threads, 1, "the pinned record must stay claimed");
    let handle = collector.register();
    let before = collector.epoch();
    retire_counted(&handle, &drops, 200);
    for _ in 0..2000 {
        handle.pin().flush();
    }
    assert_eq!(drops.load(SeqCst), 0, "an object was freed while a leaked guard protects it");
    assert_eq!(leaked.value, 7);
    assert!(collector.epoch() <= before + 1);
}

#[test]
fn dropping_the_collector_runs_what_is_left() {
    let drops = Arc::new(AtomicUsize::new(0));
    let collector = Collector::new();
    let handle = collector.register();
    let reader = collector.register();
    let pinned = reader.pin(); // holds everything back
    retire_counted(&handle, &drops, 299);
    assert_eq!(drops.load(SeqCst), 0);
    drop(pinned);
    drop(reader);
    drop(handle);
    assert!(drops.load(SeqCst) <= 300);
    drop(collector);
    assert_eq!(drops.load(SeqCst), 300);
}

#[test]
fn collector_lives_until_its_last_handle() {
    let drops = Arc::new(AtomicUsize::new(0));
    let collector = Collector::new();
    let handle = collector.register();
    let guard = handle.pin();
    drop(collector);
    drop(handle);
    // The guard still pins: deferring through it must work and run at teardown.
    let d = drops.clone();
    guard.defer(move || d.fetch_add(1, SeqCst));
    assert_eq!(drops.load(SeqCst), 0);
    drop(guard);
    assert_eq!(drops.load(SeqCst), 1);
}

#[test]
fn records_are_reused_after_thread_exit() {
    let collector = Collector::new();
    for _ in 0..100 {
        let collector = collector.clone();
        thread::spawn(move || {
            let handle = collector.register();
            let _guard = handle.pin();
        })
        .join()
        .unwrap();
    }
    let stats = collector.stats();
    assert_eq!(stats.threads, 0);
    assert_eq!(stats.records, 31, "one page of records serves sequential threads");
}

#[test]
fn one_collect_call_does_bounded_work() {
    let collector = Collector::new();
    let drops = Arc::new(AtomicUsize::new(0));
    let blocker = collector.register();
    let pinned = blocker.pin();
    let retirer = collector.register();
    retire_counted(&retirer, &drops, 64 * 20 - 1); // 20 full bags
    drop(pinned);
    let mut max_step = 0;
    let mut last = drops.load(SeqCst);
    drive_until(&retirer, || {
        let now = drops.load(SeqCst);
        max_step = max_step.max(now - last);
        last = now;
        now == 64 * 20
    });
    assert!(max_step > 0);
    // The documented bound: 8 bags of 64 per call.
    assert!(max_step <= 8 * 64, "a single call freed {max_step} objects");
}

#[test]
fn repin_lets_the_epoch_move_on() {
    let collector = Collector::new();
    let long_lived = collector.register();
    let other = collector.register();
    let mut guard = long_lived.pin();
    let start = collector.epoch();
    for _ in 0..10 {
        other.pin().flush();
    }
    assert!(collector.epoch() <= start + 1, "advanced past a pinned thread");
    for _ in 0..10 {
        guard.repin();
        other.pin().flush();
    }
    assert!(collector.epoch() >= start + 5, "repin did not release the epoch");

    let inside = guard.repin_after(|| long_lived.is_pinned());
    assert!(!inside);
    assert!(long_lived.is_pinned());
}

#[test]
fn nested_pins_count() {
    let collector = Collector::new();
    let handle = collector.register();
    let outer = handle.pin();
    let inner = handle.pin();
    drop(outer);
    assert!(handle.is_pinned());
    drop(inner);
    assert!(!handle.is_pinned());
    assert!(epoch::pin().collector() == Some(epoch::default_collector()));
}

#[repr(C)]
struct IntrusiveNode {
    link: Retired,
    drops: &'static AtomicUsize,
}

unsafe fn reclaim_intrusive(link: NonNull<Retired>) {
    // SAFETY: every link retired in these tests is the first field of a boxed node.
    let node = unsafe { Box::from_raw(link.as_ptr().cast::<IntrusiveNode>()) };
    node.drops.fetch_add(1, SeqCst);
}

#[test]
fn intrusive_retire_frees_each_object_once() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    let collector = Collector::new();
    let handle = collector.register();
    for _ in 0..1000 {
        let node = Box::into_raw(Box::new(IntrusiveNode { link: Retired::new(), drops: &DROPS }));
        let guard = handle.pin();
        // SAFETY: never shared, retired once, freed by reclaim_intrusive.
        unsafe { guard.retire(NonNull::new(node).unwrap().cast(), reclaim_intrusive) };
    }
    drive_until(&handle, || DROPS.load(SeqCst) == 1000);
    for _ in 0..50 {
        handle.pin().flush();
    }
    assert_eq!(DROPS.load(SeqCst), 1000);
}

#[test]
fn unprotected_runs_deferred_work_at_once() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    // SAFETY: nothing here is shared.
    let guard = unsafe { epoch::unprotected() };
    guard.defer(|| DROPS.fetch_add(1, SeqCst));
    assert_eq!(DROPS.load(SeqCst), 1);
    let node = Box::into_raw(Box::new(IntrusiveNode { link: Retired::new(), drops: &DROPS }));
    // SAFETY: never shared.
    unsafe { guard.retire(NonNull::new(node).unwrap().cast(), reclaim_intrusive) };
    assert_eq!(DROPS.load(SeqCst), 2);
    assert!(guard.collector().is_none());
}

#[test]
fn pin_inside_a_thread_local_destructor_after_exit() {
    static RAN: AtomicUsize = AtomicUsize::new(0);
    struct PinsOnDrop;
    impl Drop for PinsOnDrop {
        fn drop(&mut self) {
            let guard = epoch::pin();
            guard.defer(|| RAN.fetch_add(1, SeqCst));
            guard.flush();
        }
    }
    thread_local! { static LATE: PinsOnDrop = const { PinsOnDrop }; }
    thread::spawn(|| {
        let _ = epoch::pin(); // registers through the pthread key first
        LATE.with(|_| {});
    })
    .join()
    .unwrap();
    for _ in 0..100_000 {
        if RAN.load(SeqCst) == 1 {
            return;
        }
        epoch::pin().flush();
        thread::yield_now();
    }
    panic!("a function deferred from a TLS destructor never ran");
}

#[test]
fn tagged_pointers_and_compare_exchange() {
    let drops = Arc::new(AtomicUsize::new(0));
    let a = Atomic::new(counted(&drops, 1));
    let guard = &epoch::pin();
    let p = a.load(Acquire, guard);
    assert_eq!(p.tag(), 0);
    assert_eq!(a.fetch_or(1, AcqRel, guard).tag(), 0);
    let marked = a.load(Acquire, guard);
    assert_eq!(marked.tag(), 1);
    assert_eq!(marked.as_raw(), p.as_raw());
    // A CAS against the unmarked pointer fails and hands the Owned back.
    let err = a.compare_exchange(p, Owned::new(counted(&drops, 2)), AcqRel, Acquire, guard).unwrap_err();
    assert_eq!(err.current, marked);
    assert_eq!(err.new.value, 2);
    drop(err);
    assert_eq!(drops.load(SeqCst), 1);
    assert_eq!(a.fetch_and(0, AcqRel, guard).tag(), 1);
    assert_eq!(a.fetch_xor(1, AcqRel, guard).tag(), 0);
    assert_eq!(a.load(Relaxed, guard).with_tag(0), p);
    // SAFETY: the atomic is ours alone.
    drop(unsafe { a.into_owned() });
    assert_eq!(drops.load(SeqCst), 2);
}

#[test]
fn many_threads_retire_while_others_read() {
    // 8 readers and 8 writers over a small array of slots, on a collector of their own.
    const SLOTS: usize = 8;
    let collector = Collector::new();
    let drops = Arc::new(AtomicUsize::new(0));
    let created = Arc::new(AtomicUsize::new(SLOTS));
    let slots: Arc<Vec<Atomic<Counted>>> =
        Arc::new((0..SLOTS).map(|i| Atomic::new(counted(&drops, i as u64))).collect());
    let barrier = Arc::new(Barrier::new(16));
    let iterations = if cfg!(debug_assertions) { 3_000 } else { 30_000 };
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let (collector, drops, created, slots, barrier) =
                (collector.clone(), drops.clone(), created.clone(), slots.clone(), barrier.clone());
            thread::spawn(move || {
                let handle = collector.register();
                barrier.wait();
                for i in 0..iterations {
                    let guard = handle.pin();
                    let slot = &slots[(t + i) % SLOTS];
                    if t % 2 == 0 {
                        let p = slot.load(Acquire, &guard);
                        // SAFETY: loaded under `guard`.
                        let value = unsafe { p.deref() }.value;
                        assert!(value < (SLOTS + 16 * iterations) as u64 * 2);
                    } else {
                        created.fetch_add(1, SeqCst);
                        let fresh = Owned::new(counted(&drops, (t * iterations + i) as u64));
                        let old = slot.swap(fresh, AcqRel, &guard);
                        // SAFETY: unlinked by the swap, retired once.
                        unsafe { guard.defer_destroy(old) };
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let handle = collector.register();
    let retired = created.load(SeqCst) - SLOTS;
    drive_until(&handle, || drops.load(SeqCst) == retired);
    drop(handle);
    for slot in Arc::try_unwrap(slots).ok().unwrap() {
        // SAFETY: all threads are done; the remaining objects are ours.
        drop(unsafe { slot.into_owned() });
    }
    assert_eq!(drops.load(SeqCst), created.load(SeqCst));
}

/// A thread pinned while another forks does not exist in the child; the child's epoch
/// must still advance and free what the child retires (the fork handler unpins the
/// records of the threads the child does not have). Without it the child's garbage
/// would wait forever.
#[test]
fn a_forked_child_is_not_held_back_by_threads_it_does_not_have() {
    static CHILD_DROPS: AtomicUsize = AtomicUsize::new(0);
    // Register this thread first, so the handler is installed before the fork.
    epoch::pin().flush();
    let (pinned, release) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
    let (p, r) = (pinned.clone(), release.clone());
    let holder = thread::spawn(move || {
        let _guard = epoch::pin();
        p.wait();
        r.wait();
    });
    pinned.wait();
    // SAFETY: fork; the child pins, defers, collects and leaves with `_exit` through
    // `forked_child` (no unwinding into the test harness, no atexit handlers).
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        common::forked_child(|| {
            for _ in 0..10_000 {
                let guard = epoch::pin();
                guard.defer(|| CHILD_DROPS.fetch_add(1, SeqCst));
                guard.flush();
                drop(guard);
                if CHILD_DROPS.load(SeqCst) > 0 {
                    return true;
                }
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
            false
        });
    }
    assert!(pid > 0, "fork failed");
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    release.wait();
    holder.join().unwrap();
    assert!(libc::WIFEXITED(status), "child status {status:#x}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "the child's garbage was never freed: its epoch stalled");
}
