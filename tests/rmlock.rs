//! `rmlock`: the API, recursion with a waiting writer, self-deadlock diagnosis, the
//! reader slots' limit, leaked guards and thread exit, writer starvation under a constant stream of readers, a
//! 16-thread stress with migrating readers that checks an invariant under the lock, the
//! symmetric-fence fallback (in child processes, so this binary's other tests keep the
//! mode the environment chose), and that the read path never allocates.

mod common;

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Barrier, mpsc};
use std::thread;
use std::time::Duration;

use common::counting_alloc::{Counting, allocations_in};
use scalemem::cpu::fence::{self, Mode};
use scalemem::rmlock::{RmLock, RmReadGuard, RmWriteGuard};

// --- A counting allocator: what the no-allocation test reads (per thread) ---

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Waits (yielding) until `cond` holds; panics after a minute, which only a hang takes.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..60_000 {
        if cond() {
            return;
        }
        thread::sleep(Duration::from_millis(1));
    }
    panic!("timed out waiting until {what}");
}

// --- API ---

#[test]
fn api_follows_std_rwlock() {
    let lock = RmLock::new(vec![1, 2]);
    assert_eq!(*lock.read(), [1, 2]);
    lock.write().push(3);
    assert_eq!(lock.try_read().map(|v| v.len()), Some(3));
    lock.try_write().expect("no one holds it").push(4);
    assert_eq!(format!("{:?}", lock), "RmLock { data: [1, 2, 3, 4], .. }");
    {
        let w = lock.write();
        assert!(lock.is_write_locked());
        assert_eq!(format!("{:?}", lock), "RmLock { data: <locked>, .. }");
        assert_eq!(format!("{:?}", w), "[1, 2, 3, 4]");
    }
    assert!(!lock.is_write_locked());

    let mut lock = lock;
    lock.get_mut().clear();
    assert!(lock.into_inner().is_empty());

    let from: RmLock<u32> = 7.into();
    assert_eq!(format!("{}", from.read()), "7");
    assert_eq!(format!("{}", from.write()), "7");
    let default: RmLock<String> = RmLock::default();
    assert!(default.read().is_empty());
    assert!(RmLock::try_new(()).is_ok());

    // Unsized values, through an unsizing coercion as with std's RwLock.
    let slice: Box<RmLock<[u8]>> = Box::new(RmLock::new([1u8, 2, 3]));
    slice.write()[0] = 9;
    assert_eq!(&*slice.read(), &[9, 2, 3]);

    // Values with destructors are dropped exactly once, by into_inner or the lock.
    let value = Arc::new(());
    let lock = RmLock::new(value.clone());
    assert_eq!(Arc::strong_count(&value), 2);
    drop(lock.into_inner());
    drop(RmLock::new(value.clone()));
    assert_eq!(Arc::strong_count(&value), 1);
}

#[test]
fn send_and_sync_like_std() {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    send::<RmLock<Vec<u8>>>();
    sync::<RmLock<Vec<u8>>>();
    send::<RmLock<Cell<u8>>>(); // Send + !Sync value: the lock is Send, not Sync
    sync::<RmReadGuard<'static, Vec<u8>>>();
    sync::<RmWriteGuard<'static, Vec<u8>>>();
}

#[test]
fn try_write_fails_while_a_reader_is_inside_and_the_lock_stays_usable() {
    let lock = Arc::new(RmLock::new(0u64));
    let guard = lock.read();
    let other = {
        let lock = lock.clone();
        thread::spawn(move || {
            assert!(lock.try_write().is_none(), "a writer got in beside a reader");
            // A failed try_write leaves readers free to enter.
            assert!(lock.try_read().is_some());
        })
    };
    other.join().unwrap();
    drop(guard);
    *lock.try_write().expect("no reader is inside any more") += 1;
    assert_eq!(*lock.read(), 1);
}

#[test]
fn a_panic_under_the_write_lock_releases_it_without_poisoning() {
    let lock = RmLock::new(1);
    let result = catch_unwind(AssertUnwindSafe(|| {
        let mut guard = lock.write();
        *guard = 2;
        panic!("while writing");
    }));
    assert!(result.is_err());
    assert!(!lock.is_write_locked());
    assert_eq!(*lock.read(), 2);
}

// --- Recursion (RM_RECURSE) ---

#[test]
fn recursive_reads_with_a_waiting_writer_do_not_deadlock() {
    let lock = Arc::new(RmLock::new(0u64));
    let outer = lock.read();
    let writer = {
        let lock = lock.clone();
        thread::spawn(move || *lock.write() += 1)
    };
    eventually("the writer has set its flag", || lock.is_write_locked());

    // Another thread is held back by the waiting writer...
    let blocked = {
        let lock = lock.clone();
        thread::spawn(move || lock.try_read().is_none())
    };
    assert!(blocked.join().unwrap(), "a new reader got in ahead of a waiting writer");

    // ...but this thread, which holds the lock, reads it again at once, in any order.
    let nested = lock.read();
    let nested_try = lock.try_read().expect("a nested try_read must not fail");
    drop(outer);
    assert_eq!(*nested + *nested_try, 0);
    let deeper = lock.read();
    drop(nested);
    drop(nested_try);
    assert!(lock.is_write_locked(), "the writer got in while a nested guard lives");
    drop(deeper);
    writer.join().unwrap();
    assert_eq!(*lock.read(), 1);
}

#[test]
#[should_panic(expected = "holds a read guard of this lock")]
fn write_while_holding_a_read_guard_panics() {
    let lock = RmLock::new(0);
    let _reading = lock.read();
    let _ = lock.write();
}

#[test]
#[should_panic(expected = "holds the write lock already")]
fn write_twice_on_one_thread_panics() {
    let lock = RmLock::new(0);
    let _writing = lock.write();
    let _ = lock.write();
}

#[test]
#[should_panic(expected = "holds the write lock")]
fn read_while_holding_the_write_lock_panics() {
    let lock = RmLock::new(0);
    let _writing = lock.write();
    let _ = lock.read();
}

#[test]
fn try_read_while_holding_the_write_lock_fails() {
    let lock = RmLock::new(0);
    let _writing = lock.write();
    assert!(lock.try_read().is_none());
}

/// Documented limit: recursion is tracked for 8 locks held at once per thread. A 9th
/// lock is read untracked: it works, but a nested read of it would wait for a waiting
/// writer (which waits for the outer read); `try_read` returns `None` instead.
#[test]
fn a_ninth_lock_is_read_untracked() {
    let tracked: Vec<RmLock<usize>> = (0..8).map(RmLock::new).collect();
    let held: Vec<_> = tracked.iter().map(RmLock::read).collect();
    let ninth = Arc::new(RmLock::new(8usize));
    let outer = ninth.read();
    assert_eq!(*outer, 8);
    let writer = {
        let ninth = ninth.clone();
        thread::spawn(move || *ninth.write() += 1)
    };
    eventually("the writer has set its flag", || ninth.is_write_locked());
    assert!(ninth.try_read().is_none(), "an untracked nested read passed a waiting writer");
    // Recursion on the 8 tracked locks still works.
    for (lock, guard) in tracked.iter().zip(&held) {
        assert_eq!(*lock.read(), **guard);
    }
    drop(outer);
    writer.join().unwrap();
    assert_eq!(*ninth.read(), 9);
    drop(held);
    // The table is free again: the ninth lock is tracked now.
    let _outer = ninth.read();
    let _nested = ninth.read();
}

/// A leaked guard keeps its lock read-locked (writers wait) but must never make another
/// lock, possibly at the same address, look held by this thread.
#[test]
fn a_leaked_guard_never_makes_another_lock_look_held() {
    // On a thread of its own: the leaked guards keep their recursion-table entries
    // until the thread exits.
    thread::spawn(leak_guards_then_read_fresh_locks).join().unwrap();
}

fn leak_guards_then_read_fresh_locks() {
    for _ in 0..4 {
        let leaky = RmLock::new(0u8);
        std::mem::forget(leaky.read());
        assert!(leaky.try_write().is_none(), "a leaked read guard must keep writers out");
        drop(leaky);
        let fresh = Arc::new(RmLock::new(1u8));
        let guard = fresh.read();
        let probe = {
            let fresh = fresh.clone();
            thread::spawn(move || fresh.try_write().is_none())
        };
        assert!(probe.join().unwrap(), "a read of a fresh lock was not counted");
        drop(guard);
        assert!(fresh.try_write().is_some());
    }
}

/// A thread that exits while a leaked guard still holds its reader slot must not give
/// the slot's record back: a later thread claiming it would clear or reuse the slot, and
/// the leaked hold (which keeps writers out, as with `std`) would vanish.
#[test]
fn a_guard_leaked_by_an_exited_thread_keeps_writers_out() {
    let lock = Arc::new(RmLock::new(0u32));
    {
        let lock = lock.clone();
        thread::spawn(move || std::mem::forget(lock.read())).join().unwrap();
    }
    assert!(lock.try_write().is_none(), "the leaked hold vanished at thread exit");
    // Threads come and go, claiming and giving back records (including any the
    // exited thread could have given back).
    for round in 0..64u32 {
        let other = Arc::new(RmLock::new(round));
        let reader = {
            let other = other.clone();
            thread::spawn(move || {
                let _nested = (other.read(), other.read());
                *other.read()
            })
        };
        assert_eq!(reader.join().unwrap(), round);
        assert!(other.try_write().is_some(), "a reader that left still looks inside");
        assert!(lock.try_write().is_none(), "a later thread cleared the leaked hold");
    }
}

/// Reads from a thread-local destructor (which may run after the lock's thread-exit
/// hook gave this thread's reader record back) still count, and writes still exclude
/// them.
#[test]
fn reads_from_thread_local_destructors_still_count() {
    static LOCK: std::sync::LazyLock<RmLock<u64>> = std::sync::LazyLock::new(|| RmLock::new(0));
    struct ReadOnExit;
    impl Drop for ReadOnExit {
        fn drop(&mut self) {
            let guard = LOCK.read();
            let before = *guard;
            assert!(LOCK.try_write().is_none(), "a read in a thread-local destructor was not counted");
            assert_eq!(*guard, before);
            drop(guard);
            *LOCK.write() += 1;
        }
    }
    thread_local! {
        static ON_EXIT: ReadOnExit = const { ReadOnExit };
    }
    let threads: Vec<_> = (0..8)
        .map(|_| {
            thread::spawn(|| {
                ON_EXIT.with(|_| {});
                let _ = *LOCK.read();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(*LOCK.read(), 8);
}

// --- Writer starvation ---

/// Two readers hand the lock to each other so that one of them is always inside: a
/// lock without writer preference would starve the writer forever. Once a reader has
/// seen the writer pending, its next read must wait until the writer is done.
#[test]
fn a_constant_stream_of_readers_cannot_starve_a_writer() {
    let lock = Arc::new(RmLock::new(0u64));
    let writer_done = Arc::new(AtomicBool::new(false));
    let late_entries = Arc::new(AtomicUsize::new(0));
    let reads = Arc::new(AtomicU64::new(0));
    let baton = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|me| {
            let (lock, writer_done, late_entries, reads, baton, stop) =
                (lock.clone(), writer_done.clone(), late_entries.clone(), reads.clone(), baton.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(SeqCst) {
                    let pending = lock.is_write_locked();
                    let guard = lock.read();
                    if pending && !writer_done.load(SeqCst) {
                        late_entries.fetch_add(1, SeqCst);
                    }
                    reads.fetch_add(1, SeqCst);
                    // Hand over: release only once the other reader is inside (or the
                    // writer is pending, or the test is over).
                    baton.store(me + 1, SeqCst);
                    while baton.load(SeqCst) == me + 1 && !lock.is_write_locked() && !stop.load(SeqCst) {
                        std::hint::spin_loop();
                    }
                    drop(guard);
                }
            })
        })
        .collect();
    eventually("the readers overlap", || reads.load(SeqCst) > 200);
    let (done_tx, done_rx) = mpsc::channel();
    {
        let (lock, writer_done) = (lock.clone(), writer_done.clone());
        thread::spawn(move || {
            let mut guard = lock.write();
            *guard += 1;
            writer_done.store(true, SeqCst);
            drop(guard);
            done_tx.send(()).unwrap();
        });
    }
    done_rx.recv_timeout(Duration::from_secs(120)).expect("the writer was starved by the readers");
    stop.store(true, SeqCst);
    for reader in readers {
        reader.join().unwrap();
    }
    assert_eq!(late_entries.load(SeqCst), 0, "readers that saw the writer pending got in before it");
    assert_eq!(*lock.read(), 1);
}

// --- Stress ---

/// The value under the lock: writers keep `a == b` and bump `writes`; readers check it.
#[derive(Default)]
struct Pair {
    a: u64,
    b: u64,
    writes: u64,
}

struct Stress {
    lock: RmLock<Pair>,
    readers_inside: AtomicUsize,
    writers_inside: AtomicUsize,
    reads: AtomicU64,
    writes: AtomicU64,
}

/// Every invariant the lock promises, checked from inside a read guard.
fn check_read(stress: &Stress, pair: &Pair) {
    stress.readers_inside.fetch_add(1, SeqCst);
    assert_eq!(stress.writers_inside.load(SeqCst), 0, "a writer is inside with a reader");
    assert_eq!(pair.a, pair.b, "a reader saw a half-made update");
    stress.readers_inside.fetch_sub(1, SeqCst);
    stress.reads.fetch_add(1, Relaxed);
}

fn write(stress: &Stress, pair: &mut Pair) {
    assert_eq!(stress.writers_inside.fetch_add(1, SeqCst), 0, "two writers inside");
    assert_eq!(stress.readers_inside.load(SeqCst), 0, "a reader is inside with a writer");
    pair.a += 1;
    std::hint::black_box(&mut *pair);
    pair.b = pair.a;
    pair.writes += 1;
    stress.writers_inside.fetch_sub(1, SeqCst);
    stress.writes.fetch_add(1, Relaxed);
}

/// Moves the calling thread to the other of CPUs 0 and 1 (if allowed): what a reader
/// that migrates between its acquire and its release looks like.
fn hop_cpu(step: usize) {
    if std::thread::available_parallelism().map_or(1, usize::from) < 2 {
        return;
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(step % 2, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

/// 16 threads (on however few cores) mixing reads, nested reads, try_reads and rare
/// writes; a quarter of the readers hop between CPUs inside their critical sections.
fn stress(threads: usize, per_thread: usize) -> (u64, u64) {
    let stress = Stress {
        lock: RmLock::new(Pair::default()),
        readers_inside: AtomicUsize::new(0),
        writers_inside: AtomicUsize::new(0),
        reads: AtomicU64::new(0),
        writes: AtomicU64::new(0),
    };
    let start = Barrier::new(threads);
    thread::scope(|s| {
        for t in 0..threads {
            let (stress, start) = (&stress, &start);
            s.spawn(move || {
                let hopper = t % 4 == 3;
                start.wait();
                for i in 0..per_thread {
                    match (i + t) % 500 {
                        0 => write(stress, &mut stress.lock.write()),
                        250 => {
                            if let Some(mut guard) = stress.lock.try_write() {
                                write(stress, &mut guard);
                            }
                        }
                        k if k % 7 == 0 => {
                            let outer = stress.lock.read();
                            let nested = stress.lock.read();
                            check_read(stress, &nested);
                            drop(outer);
                            check_read(stress, &nested);
                        }
                        k if k % 11 == 0 => {
                            if let Some(guard) = stress.lock.try_read() {
                                check_read(stress, &guard);
                            }
                        }
                        _ => {
                            let guard = stress.lock.read();
                            if hopper && i % 16 == 0 {
                                hop_cpu(i / 16);
                            }
                            check_read(stress, &guard);
                        }
                    }
                }
            });
        }
    });
    let mut lock = stress.lock;
    assert!(lock.try_write().is_some(), "a reader count was left behind");
    let pair = lock.get_mut();
    assert_eq!(pair.writes, stress.writes.load(SeqCst));
    assert_eq!(pair.a, pair.writes);
    (stress.reads.load(SeqCst), stress.writes.load(SeqCst))
}

fn stress_size() -> usize {
    if cfg!(debug_assertions) { 50_000 } else { 500_000 }
}

#[test]
fn sixteen_threads_mixing_reads_and_rare_writes_keep_the_invariant() {
    let forced = std::env::var("SCALEMEM_FENCE").as_deref() == Ok("symmetric");
    if forced {
        assert_eq!(fence::mode(), Mode::Symmetric);
    }
    let started = std::time::Instant::now();
    let (reads, writes) = stress(16, stress_size());
    eprintln!("rmlock stress: 16 threads, {reads} reads, {writes} writes in {:?}", started.elapsed());
    assert!(reads > 0 && writes > 0);
}

// --- The symmetric-fence fallback, in child processes ---

/// Both sides fall back to SeqCst fences where membarrier is refused (forced here with
/// `SCALEMEM_FENCE=symmetric`), chosen at run time: the stress passes in that mode, and
/// across a switch from asymmetric to symmetric in the middle of a run. The fence mode is
/// process-wide, so each case runs in a child process: this same test, re-executed with
/// `RMLOCK_CHILD` saying which case to run.
#[test]
fn symmetric_fence_fallback_in_child_processes() {
    match std::env::var("RMLOCK_CHILD").as_deref() {
        Ok("symmetric") => return sixteen_threads_mixing_reads_and_rare_writes_keep_the_invariant(),
        Ok("switch") => return switch_to_symmetric_under_load(),
        _ => {}
    }
    let me = "symmetric_fence_fallback_in_child_processes";
    common::run_child(me, &[("SCALEMEM_FENCE", "symmetric"), ("RMLOCK_CHILD", "symmetric")]);
    common::run_child(me, &[("RMLOCK_CHILD", "switch")]);
}

fn switch_to_symmetric_under_load() {
    let started_in = fence::mode();
    let switched = AtomicBool::new(false);
    thread::scope(|s| {
        s.spawn(|| {
            thread::sleep(Duration::from_millis(50));
            fence::use_symmetric();
            switched.store(true, SeqCst);
        });
        let (reads, writes) = stress(8, stress_size());
        assert!(reads > 0 && writes > 0);
    });
    assert!(switched.load(SeqCst));
    assert_eq!(fence::mode(), Mode::Symmetric);
    if fence::membarrier_registered() && std::env::var_os("SCALEMEM_FENCE").is_none() {
        assert_eq!(started_in, Mode::Asymmetric);
    }
    // And the symmetric mode from here on.
    stress(8, stress_size() / 4);
}

// --- Allocation ---

#[test]
fn the_lock_never_allocates() {
    let lock = RmLock::try_new([0u64; 8]).expect("a page for the counts");
    let mut sum = 0;
    let allocations = allocations_in(|| {
        let other = RmLock::try_new(1u64).expect("a page for the counts");
        for _ in 0..10_000 {
            let guard = lock.read();
            let nested = lock.read();
            sum += guard[0] + nested[1] + *other.read();
        }
        for _ in 0..100 {
            sum += lock.try_read().map_or(0, |g| g[2]);
            lock.write()[3] += 1;
            if let Some(mut guard) = lock.try_write() {
                guard[4] += 1;
            }
        }
        drop(other);
    });
    assert_eq!(allocations, 0, "the lock allocated through the global allocator");
    assert_eq!(sum, 10_000);
    assert_eq!(lock.read()[3], 100);
}
