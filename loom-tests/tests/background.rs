//! loom models of `umem::background`, the life of the global heap's maintenance thread:
//! a start racing a stop, two starts racing, and the children of a `fork` taking over a
//! lock a parent thread held, with a stale thread id in the copied state. The kernel is
//! a stand-in: each model thread has a process id (a thread-local), spawning a
//! maintenance thread marks its id live in the "thread group", and the id is unlinked
//! only after the thread's body has returned; `tgkill(pid, tid, 0)` looks that up. The
//! futex's timed sleep never times out under loom, so a stop must wake the thread
//! itself.
//!
//! ```text
//! ci/loom.sh background
//! ```
#![cfg(scalemem_loom)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize};
use loom::thread::{self, JoinHandle};
use std::cell::Cell;
use std::sync::Mutex;
use std::sync::atomic::Ordering::SeqCst;

use scalemem::umem::background::{Background, Control, Kernel};
use scalemem_loom_tests::run_model;

/// Kernel thread ids the model hands out: 1..TIDS.
const TIDS: usize = 4;

loom::thread_local! {
    /// The model thread's process id (the parent is 1, a `fork`ed child 2).
    static PID: Cell<i32> = Cell::new(1);
    /// The model thread's kernel thread id (0 for the threads that only start and stop).
    static TID: Cell<i32> = Cell::new(0);
}

/// The stand-in kernel's thread table: which thread ids are in which process's group.
struct Threads {
    /// Whether thread id `i` is still linked into its group.
    live: [AtomicBool; TIDS],
    /// The process of thread id `i`.
    pid: [AtomicI32; TIDS],
    /// The next thread id to hand out.
    next: AtomicUsize,
    /// The model's maintenance threads, joined at the end of each model. A plain mutex
    /// never held across a loom operation.
    handles: Mutex<Vec<JoinHandle<()>>>,
}

impl Threads {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            live: std::array::from_fn(|_| AtomicBool::new(false)),
            pid: std::array::from_fn(|_| AtomicI32::new(0)),
            next: AtomicUsize::new(1),
            handles: Mutex::new(Vec::new()),
        })
    }

    /// How many maintenance threads process `pid` has in its group.
    fn live_in(&self, pid: i32) -> usize {
        (1..TIDS).filter(|&t| self.live[t].load(SeqCst) && self.pid[t].load(SeqCst) == pid).count()
    }

    /// A new thread id, linked into process `pid`'s group (as `clone` does, before the
    /// thread runs).
    fn link(&self, pid: i32) -> i32 {
        let tid = self.next.fetch_add(1, SeqCst);
        assert!(tid < TIDS, "more maintenance threads than the model allows");
        self.pid[tid].store(pid, SeqCst);
        self.live[tid].store(true, SeqCst);
        i32::try_from(tid).unwrap()
    }
}

/// The stand-in kernel over [`Threads`].
struct ModelKernel(Arc<Threads>);

impl Kernel for ModelKernel {
    fn pid(&self) -> i32 {
        PID.with(Cell::get)
    }

    fn tid(&self) -> i32 {
        let tid = TID.with(Cell::get);
        assert_ne!(tid, 0, "gettid from a thread the model gave no id");
        tid
    }

    fn thread_exists(&self, pid: i32, tid: i32) -> bool {
        let t = usize::try_from(tid).unwrap();
        // SeqCst: the kernel looks the thread up under its locks.
        self.0.live[t].load(SeqCst) && self.0.pid[t].load(SeqCst) == pid
    }

    fn pause(&self, _micros: u64) {
        thread::yield_now();
    }
}

type Bg = Background<ModelKernel>;

/// What `spawn_maintenance_thread` does, with a model thread for the maintenance thread:
/// returns whether it spawned one.
fn start(bg: &Arc<Bg>, threads: &Arc<Threads>) -> bool {
    let control: Control<'_, ModelKernel> = bg.control();
    if control.running() {
        return false;
    }
    let generation = control.prepare();
    let pid = PID.with(Cell::get);
    let tid = threads.link(pid);
    let handle = {
        let (bg, threads) = (bg.clone(), threads.clone());
        thread::spawn(move || {
            PID.with(|p| p.set(pid));
            TID.with(|t| t.set(tid));
            bg.started();
            // No timeout fires in the model: only a stop ends the sleep.
            while bg.sleep(generation, 10_000_000) {}
            // The body has returned; the kernel then unlinks the thread.
            threads.live[usize::try_from(tid).unwrap()].store(false, SeqCst);
        })
    };
    threads.handles.lock().unwrap().push(handle);
    control.spawned();
    true
}

/// Stops this process's thread, and checks that when it says it did, no maintenance
/// thread of this process is left in the kernel's group.
fn stop(bg: &Bg, threads: &Threads) -> bool {
    let stopped = bg.control().stop();
    if stopped {
        assert_eq!(threads.live_in(PID.with(Cell::get)), 0, "stop returned while the thread was still linked");
    }
    stopped
}

/// Two threads of process `pid` start at once: how many maintenance threads they spawned.
fn two_starts(bg: &Arc<Bg>, threads: &Arc<Threads>, pid: i32) -> usize {
    let starts: Vec<_> = (0..2)
        .map(|_| {
            let (bg, threads) = (bg.clone(), threads.clone());
            thread::spawn(move || {
                PID.with(|p| p.set(pid));
                start(&bg, &threads)
            })
        })
        .collect();
    starts.into_iter().map(|h| h.join().unwrap()).filter(|&s| s).count()
}

/// Joins every maintenance thread the model spawned.
fn join_all(threads: &Threads) {
    let handles = std::mem::take(&mut *threads.handles.lock().unwrap());
    for h in handles {
        h.join().unwrap();
    }
}

/// A start and a stop at once: whichever order they take the lock in, one thread is
/// started, a stop that says it stopped it waited for it to leave the group, and a stop
/// after both stops it if the first did not.
#[test]
fn start_against_stop() {
    run_model("background: start against stop", || {
        let threads = Threads::new();
        let bg = Arc::new(Background::new(ModelKernel(threads.clone())));
        let starter = {
            let (bg, threads) = (bg.clone(), threads.clone());
            thread::spawn(move || start(&bg, &threads))
        };
        let stopper = {
            let (bg, threads) = (bg.clone(), threads.clone());
            thread::spawn(move || stop(&bg, &threads))
        };
        assert!(starter.join().unwrap(), "a start with no thread running started none");
        let stopped_first = stopper.join().unwrap();
        // Exactly one of the two stops finds the thread.
        assert_eq!(stop(&bg, &threads), !stopped_first);
        assert_eq!(threads.live_in(1), 0);
        join_all(&threads);
    });
}

/// Two starts at once start one thread; a stop then stops it.
#[test]
fn two_starts_one_thread() {
    run_model("background: two starts, one thread", || {
        let threads = Threads::new();
        let bg = Arc::new(Background::new(ModelKernel(threads.clone())));
        let started = two_starts(&bg, &threads, 1);
        assert_eq!(started, 1, "two starts spawned {started} threads");
        assert_eq!(threads.live_in(1), 1);
        assert!(stop(&bg, &threads));
        assert!(!stop(&bg, &threads));
        join_all(&threads);
    });
}

/// The parent had a maintenance thread (its id published in the state) and one of its
/// threads held the lock when it forked. In the child (a copy of that memory with none
/// of those threads), two threads start at once: one takes the lock over from the
/// parent's holder, neither takes the parent's thread for the child's, one thread is
/// started, and a stop waits for that thread, not for the parent's stale id.
#[test]
fn forked_child_takes_over() {
    run_model("background: a forked child takes the lock over", || {
        let threads = Threads::new();
        let bg = Arc::new(Background::new(ModelKernel(threads.clone())));
        // The parent (pid 1): its maintenance thread, which the child's memory records
        // but the child does not have (no model thread: it is not in the child), ...
        {
            let control = bg.control();
            let _generation = control.prepare();
            let tid = threads.link(1);
            TID.with(|t| t.set(tid));
            bg.started();
            control.spawned();
        }
        // ... and a parent thread holding the lock at the fork.
        std::mem::forget(bg.control());
        // The fork: from here on this thread is the child's, pid 2.
        PID.with(|p| p.set(2));
        TID.with(|t| t.set(0));
        let started = two_starts(&bg, &threads, 2);
        assert_eq!(started, 1, "the child's two starts spawned {started} threads");
        assert_eq!(threads.live_in(2), 1);
        assert!(stop(&bg, &threads));
        join_all(&threads);
    });
}
