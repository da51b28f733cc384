//! loom models of `rmlock` (symmetric fences: loom checks the SeqCst-fence mode, which is
//! also the run-time fallback; the asymmetric mode's extra argument is in the module doc
//! of `scalemem::rmlock`). Under loom waiters sleep at once (no spinning), sleeping is a
//! `Condvar` wait that mirrors the futex check, and every per-CPU count update moves the
//! thread to the other modelled CPU, so each model also covers readers that migrate
//! between arriving and departing.
//!
//! The lock's value lives in a loom `UnsafeCell`: a guard's access that is not ordered
//! against a writer's is reported as a causality violation, and a sleep nobody ends as a
//! deadlock.
#![cfg(scalemem_loom)]

use loom::sync::atomic::{AtomicBool, AtomicUsize};
use loom::sync::{Arc, Notify};
use loom::thread;
use std::sync::atomic::Ordering::SeqCst;

use scalemem::rmlock::RmLock;
use scalemem_loom_tests::run_model;

/// Spins (yielding to loom's scheduler) until `flag` is set.
fn wait_for(flag: &AtomicBool) {
    while !flag.load(SeqCst) {
        thread::yield_now();
    }
}

/// A one-shot event that one thread may wait for by sleeping (no spinning, which in a
/// model with three threads multiplies the interleavings beyond loom's branch limit).
struct Event {
    set: AtomicBool,
    notify: Notify,
}

impl Event {
    fn new() -> Self {
        Self { set: AtomicBool::new(false), notify: Notify::new() }
    }

    fn set(&self) {
        self.set.store(true, SeqCst);
        self.notify.notify();
    }

    fn wait(&self) {
        while !self.set.load(SeqCst) {
            self.notify.wait();
        }
    }
}

/// A writer and a reader that reads twice: the reader never sees a half-made update,
/// and the writer gets in.
#[test]
fn reader_and_writer_exclude_each_other() {
    run_model("rmlock: reader vs writer", || {
        let lock = Arc::new(RmLock::new((0usize, 0usize)));
        let reader = {
            let lock = lock.clone();
            thread::spawn(move || {
                for _ in 0..2 {
                    let (a, b) = *lock.read();
                    assert_eq!(a, b, "a reader saw a writer's update half made");
                }
            })
        };
        {
            let mut pair = lock.write();
            pair.0 += 1;
            pair.1 += 1;
        }
        reader.join().unwrap();
        assert_eq!(*lock.read(), (1, 1));
    });
}

/// Progress: a writer gets in while a reader keeps coming back.
#[test]
fn writer_gets_in_despite_a_stream_of_reads() {
    run_model("rmlock: writer vs a stream of reads", || {
        let lock = Arc::new(RmLock::new(0usize));
        let done = Arc::new(AtomicBool::new(false));
        let reader = {
            let (lock, done) = (lock.clone(), done.clone());
            thread::spawn(move || {
                let mut seen = 0;
                for _ in 0..3 {
                    let finished = done.load(SeqCst);
                    let value = *lock.read();
                    assert!(value >= seen, "a reader went back in time");
                    seen = value;
                    if finished {
                        assert_eq!(value, 1, "the writer finished but its update is invisible");
                    }
                }
            })
        };
        *lock.write() += 1;
        done.store(true, SeqCst);
        reader.join().unwrap();
    });
}

/// No lost wake-up on `drain`: the reader is inside before the writer starts, so the
/// writer sleeps until the reader's departure wakes it.
#[test]
fn writer_sleeping_on_readers_is_woken() {
    run_model("rmlock: writer sleeps on drain", || {
        let lock = Arc::new(RmLock::new(0usize));
        let inside = Arc::new(AtomicBool::new(false));
        let reader = {
            let (lock, inside) = (lock.clone(), inside.clone());
            thread::spawn(move || {
                let guard = lock.read();
                inside.store(true, SeqCst);
                assert_eq!(*guard, 0);
            })
        };
        wait_for(&inside);
        *lock.write() = 1;
        reader.join().unwrap();
    });
}

/// No lost wake-up on `state`: the writer holds the lock before the reader starts, so
/// the reader sleeps until the writer's release wakes it.
#[test]
fn reader_sleeping_on_writer_is_woken() {
    run_model("rmlock: reader sleeps on state", || {
        let lock = Arc::new(RmLock::new(0usize));
        let locked = Arc::new(AtomicBool::new(false));
        let reader = {
            let (lock, locked) = (lock.clone(), locked.clone());
            thread::spawn(move || {
                wait_for(&locked);
                assert_eq!(*lock.read(), 1);
            })
        };
        let mut guard = lock.write();
        locked.store(true, SeqCst);
        *guard = 1;
        drop(guard);
        reader.join().unwrap();
    });
}

/// Two writers exclude each other, and the one that sleeps on `state` is woken.
#[test]
fn writers_exclude_and_wake_each_other() {
    run_model("rmlock: two writers", || {
        let lock = Arc::new(RmLock::new(0usize));
        let other = {
            let lock = lock.clone();
            thread::spawn(move || {
                *lock.write() += 1;
            })
        };
        *lock.write() += 1;
        other.join().unwrap();
        assert_eq!(*lock.read(), 2);
    });
}

/// RM_RECURSE: a thread that holds the read lock reads it again while a writer waits
/// (the flag is set), drops its guards out of order, and nobody deadlocks.
#[test]
fn recursive_read_does_not_wait_for_a_waiting_writer() {
    run_model("rmlock: recursion with a waiting writer", || {
        let lock = Arc::new(RmLock::new(0usize));
        let holding = Arc::new(AtomicBool::new(false));
        let writer = {
            let (lock, holding) = (lock.clone(), holding.clone());
            thread::spawn(move || {
                wait_for(&holding);
                *lock.write() = 1;
            })
        };
        let outer = lock.read();
        holding.store(true, SeqCst);
        while !lock.is_write_locked() {
            thread::yield_now();
        }
        let inner = lock.read();
        assert!(lock.try_read().is_some(), "a nested try_read failed");
        drop(outer);
        assert_eq!(*inner, 0);
        drop(inner);
        writer.join().unwrap();
        assert_eq!(*lock.read(), 1);
    });
}

/// `try_write` and `try_read` never wait, and never let a reader in beside a writer.
#[test]
fn try_write_and_try_read_exclude_each_other() {
    run_model("rmlock: try_write vs try_read", || {
        let lock = Arc::new(RmLock::new(0usize));
        let reads = Arc::new(AtomicUsize::new(0));
        let reader = {
            let (lock, reads) = (lock.clone(), reads.clone());
            thread::spawn(move || {
                if let Some(guard) = lock.try_read() {
                    reads.fetch_add(*guard + 1, SeqCst);
                }
            })
        };
        if let Some(mut guard) = lock.try_write() {
            *guard = 5;
        }
        reader.join().unwrap();
        let seen = reads.load(SeqCst);
        assert!(seen == 0 || seen == 1 || seen == 6, "try_read saw {seen}");
    });
}

/// A reader that arrives after the writer has read its CPU's counts, sees the flag and
/// backs out on the other CPU must not cancel the arrival of a reader still inside (the
/// reason for separate arrival and departure counts, read departures first). Both
/// readers use the per-CPU counts (the path of threads without a free reader slot).
#[test]
fn migrating_back_out_cannot_hide_a_reader() {
    run_model("rmlock: back-out on another CPU vs a reader inside", || {
        let lock = Arc::new(RmLock::new(0usize));
        let (to_writer, to_latecomer) = (Arc::new(Event::new()), Arc::new(Event::new()));
        let holder = {
            let (lock, to_writer, to_latecomer) = (lock.clone(), to_writer.clone(), to_latecomer.clone());
            thread::spawn(move || {
                scalemem::rmlock::loom_read_with_counts();
                let guard = lock.read();
                to_writer.set();
                to_latecomer.set();
                assert_eq!(*guard, 0, "the writer got in beside a reader");
            })
        };
        let latecomer = {
            let lock = lock.clone();
            thread::spawn(move || {
                scalemem::rmlock::loom_read_with_counts();
                to_latecomer.wait();
                let _ = *lock.read();
            })
        };
        to_writer.wait();
        *lock.write() = 1;
        holder.join().unwrap();
        latecomer.join().unwrap();
    });
}

/// Two reader threads, each running `reader(i, &lock)`, and a writer that raises both
/// halves of the pair: no reader sees half an update, the writer gets in, everyone ends.
fn two_readers_and_a_writer_model(name: &'static str, reader: fn(usize, &RmLock<(usize, usize)>)) {
    run_model(name, move || {
        let lock = Arc::new(RmLock::new((0usize, 0usize)));
        let readers: Vec<_> = (0..2)
            .map(|i| {
                let lock = lock.clone();
                thread::spawn(move || reader(i, &lock))
            })
            .collect();
        {
            let mut pair = lock.write();
            pair.0 += 1;
            pair.1 += 1;
        }
        for reader in readers {
            reader.join().unwrap();
        }
        assert_eq!(*lock.read(), (1, 1));
    });
}

/// Two readers (one nesting a read) and a writer: exclusion, progress and wake-ups with
/// more than one reader to wait for and to wake.
#[test]
fn two_readers_and_a_writer() {
    two_readers_and_a_writer_model("rmlock: two readers and a writer", |nesting, lock| {
        let outer = lock.read();
        let (a, b) = *outer;
        assert_eq!(a, b, "a reader saw a writer's update half made");
        if nesting == 1 {
            let inner = lock.read();
            drop(outer);
            assert_eq!(inner.0, a, "the value changed under a nested guard");
        }
    });
}

/// A reader in a slot and a reader in the per-CPU counts, and a writer: the writer waits
/// for both kinds (its check scans the slots and compares the counts), and wakes from
/// either's departure.
#[test]
fn a_slot_reader_and_a_counted_reader_and_a_writer() {
    two_readers_and_a_writer_model("rmlock: slot reader + counted reader + writer", |counted, lock| {
        if counted == 1 {
            scalemem::rmlock::loom_read_with_counts();
        }
        let (a, b) = *lock.read();
        assert_eq!(a, b, "a reader saw a writer's update half made");
    });
}

/// A thread leaves lock `a` and at once reuses the same slot for lock `b` (under loom
/// every lock's home is slot 0) while a writer of `a` scans: whatever value of the slot
/// the writer reads (`a`'s tag, 0, or `b`'s tag), the reader's access to `a` happens
/// before the writer's (every store to a slot is Release). A second reader thread
/// started after the first has ended claims its given-back record.
#[test]
fn a_slot_reused_for_another_lock_still_orders_the_first() {
    run_model("rmlock: slot reused by another lock vs a writer of the first", || {
        let a = Arc::new(RmLock::new(0usize));
        let b = Arc::new(RmLock::new(0usize));
        let reader = {
            let (a, b) = (a.clone(), b.clone());
            thread::spawn(move || {
                let seen = *a.read();
                assert!(seen == 0 || seen == 1);
                let guard = b.read();
                assert_eq!(*guard, 0);
            })
        };
        *a.write() = 1;
        reader.join().unwrap();
        let late = {
            let a = a.clone();
            thread::spawn(move || {
                let seen = *a.read();
                assert!(seen == 1 || seen == 2, "the late reader saw {seen}");
            })
        };
        *a.write() = 2;
        late.join().unwrap();
    });
}
