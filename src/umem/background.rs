//! The life of the global heap's maintenance thread: how it is started, how it is
//! stopped, and who may do either, in a process that may `fork`.
//!
//! [`global::spawn_maintenance_thread`](super::global::spawn_maintenance_thread) and
//! [`global::stop_maintenance_thread`](super::global::stop_maintenance_thread) drive one
//! static [`Background`]; this module holds its protocol, written over a [`Kernel`] (the
//! process and thread ids, `tgkill(pid, tid, 0)`, a pause) so that the loom model
//! `loom-tests/tests/background.rs` can stand in for the kernel, a thread's exit and a
//! `fork`.
//!
//! # Protocol
//!
//! State: the futex word `stop` (the generation a running thread was started with;
//! bumped to stop it), `pid` (the process whose thread runs, 0 for none), `tid` (the
//! running thread's kernel id, published by the thread itself, 0 until then) and `lock`
//! (0, or the pid of the process one of whose threads holds the lock).
//!
//! 1. **The lock** ([`Background::control`]). A thread takes it by a compare-exchange
//!    (Acquire) from the owner it loaded to its own pid, when that owner is not its own
//!    pid: 0 (free), or another pid, which can only be the parent of this `fork`ed
//!    process (a child gets a copy of the parent's memory, and none of its threads):
//!    that holder does not exist here, so the lock is taken over. It is released by a
//!    Release store of 0. Starting and stopping happen only under it ([`Control`]).
//! 2. **Start** ([`Control::running`] false): `tid` is cleared, the generation is the
//!    current `stop`, the thread is spawned, and `pid` is set to this process. The
//!    thread's first act is to publish its id in `tid` (Release, [`Background::started`]);
//!    it then sleeps on `stop` while the word holds its generation
//!    ([`Background::sleep`], a futex wait with a timeout: the maintenance tick), and
//!    leaves its loop when it does not.
//! 3. **Stop** ([`Control::stop`]): `stop` is bumped and every sleeper woken (so a
//!    sleeping thread wakes at once, and one not yet asleep finds the word changed and
//!    does not sleep: the kernel checks the word under its bucket lock); the stopper
//!    then waits until `tid` is published (Acquire) and until `tgkill(pid, tid, 0)`
//!    fails: the kernel has unlinked the thread from the group. `pid` goes back to 0.
//!
//! # Invariants
//!
//! - At most one maintenance thread runs per process: start and stop run under the
//!   lock, and `pid` names this process exactly while its thread runs.
//! - When [`Control::stop`] returns `true` the thread has left the kernel's thread
//!   group, not only its loop: `pthread_join` would not do, since glibc wakes a joiner
//!   when the kernel clears the thread's id word, which happens before the thread lets
//!   go of its filesystem context and leaves the group, and `unshare(CLONE_NEWUSER)`
//!   checks both.
//! - A stop needs no timeout to reach a sleeping thread: it changes the word before it
//!   wakes (the model runs the sleep without one).
//! - In a `fork`ed child, the copied `pid` names the parent, so [`Control::running`] is
//!   false (the child has no maintenance thread until it starts one), and a lock the
//!   parent held at the fork is taken over.

use crate::sync::Futex;
use crate::sync::atomic::{AtomicI32, Ordering};

/// What the protocol asks of the kernel: the real one ([`Os`]), or a model's stand-in.
pub trait Kernel {
    /// The calling thread's process id (`getpid`, never 0).
    fn pid(&self) -> i32;
    /// The calling thread's kernel thread id (`gettid`, never 0).
    fn tid(&self) -> i32;
    /// Whether thread `tid` is still in the thread group of process `pid`:
    /// `tgkill(pid, tid, 0)` succeeds.
    fn thread_exists(&self, pid: i32, tid: i32) -> bool;
    /// Waits a little before trying again: `micros` microseconds on the real kernel, a
    /// yield for 0 (a model yields).
    fn pause(&self, micros: u64);
}

/// The real kernel, through `rustix` and `libc::syscall`.
#[cfg(not(scalemem_loom))]
#[derive(Debug, Clone, Copy, Default)]
pub struct Os;

#[cfg(not(scalemem_loom))]
impl Kernel for Os {
    fn pid(&self) -> i32 {
        rustix::process::getpid().as_raw_nonzero().get()
    }

    fn tid(&self) -> i32 {
        rustix::thread::gettid().as_raw_nonzero().get()
    }

    fn thread_exists(&self, pid: i32, tid: i32) -> bool {
        // The `tgkill` that ends a stop's wait fails with ESRCH: the caller's errno stays.
        let _errno = crate::os::KeepErrno::new();
        // SAFETY: `tgkill` with signal 0 sends nothing; it only looks the thread up.
        unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, 0) == 0 }
    }

    fn pause(&self, micros: u64) {
        if micros == 0 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(core::time::Duration::from_micros(micros));
        }
    }
}

/// One maintenance thread's life (module documentation: the protocol).
#[derive(Debug)]
pub struct Background<K> {
    /// The generation the running thread (if any) was started with; bumped to stop it.
    stop: Futex,
    /// The process whose maintenance thread runs (0: none). Written under the lock.
    pid: AtomicI32,
    /// The running thread's kernel thread id, published by the thread itself (0 until then).
    tid: AtomicI32,
    /// The lock: 0, or the pid of the process one of whose threads holds it.
    lock: AtomicI32,
    kernel: K,
}

impl<K: Kernel> Background<K> {
    /// No thread, the lock free.
    #[cfg(not(scalemem_loom))]
    pub const fn new(kernel: K) -> Self {
        Self { stop: Futex::new(0), pid: AtomicI32::new(0), tid: AtomicI32::new(0), lock: AtomicI32::new(0), kernel }
    }

    /// No thread, the lock free.
    #[cfg(scalemem_loom)]
    pub fn new(kernel: K) -> Self {
        Self { stop: Futex::new(0), pid: AtomicI32::new(0), tid: AtomicI32::new(0), lock: AtomicI32::new(0), kernel }
    }

    /// Takes the lock that serialises starting and stopping (protocol, step 1),
    /// waiting while another thread of this process holds it.
    pub fn control(&self) -> Control<'_, K> {
        let me = self.kernel.pid();
        loop {
            // Relaxed: the compare-exchange below orders what the lock guards.
            let owner = self.lock.load(Ordering::Relaxed);
            // Acquire: pairs with the Release in `Control::drop` (the previous holder's
            // writes of `pid` and `tid`).
            if owner != me && self.lock.compare_exchange(owner, me, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return Control { background: self };
            }
            self.kernel.pause(50);
        }
    }

    /// The maintenance thread's first act: publishes its thread id (step 2).
    pub fn started(&self) {
        // Release: pairs with the Acquire in `Control::stop`, which then waits on this id.
        self.tid.store(self.kernel.tid(), Ordering::Release);
    }

    /// In the maintenance thread: sleeps up to `ns` nanoseconds, or until stopped, and
    /// returns whether to go on (the word still holds the thread's `generation`).
    pub fn sleep(&self, generation: u32, ns: u64) -> bool {
        self.stop.wait_timeout(generation, core::time::Duration::from_nanos(ns));
        // Relaxed: the word carries only the request to stop, no data.
        self.stop.load(Ordering::Relaxed) == generation
    }
}

/// The lock of a [`Background`], held: what may start and stop its thread. Released
/// on drop.
#[derive(Debug)]
pub struct Control<'a, K: Kernel> {
    background: &'a Background<K>,
}

impl<K: Kernel> Control<'_, K> {
    /// Whether this process has a maintenance thread.
    pub fn running(&self) -> bool {
        let b = self.background;
        // Relaxed: written only under the lock, which orders it.
        b.pid.load(Ordering::Relaxed) == b.kernel.pid()
    }

    /// Before spawning a thread (not [`running`](Self::running)): the generation to
    /// hand it, for [`Background::sleep`].
    pub fn prepare(&self) -> u32 {
        let b = self.background;
        debug_assert!(!self.running());
        // Relaxed: read by the new thread only after the spawn, which synchronises.
        b.tid.store(0, Ordering::Relaxed);
        // Relaxed: bumped only under the lock.
        b.stop.load(Ordering::Relaxed)
    }

    /// After the thread was spawned: this process now has one.
    pub fn spawned(&self) {
        let b = self.background;
        // Relaxed: as in `running`.
        b.pid.store(b.kernel.pid(), Ordering::Relaxed);
    }

    /// Stops this process's thread, if it has one, and waits until the kernel has
    /// unlinked it from the thread group (protocol, step 3); returns whether there was
    /// one.
    pub fn stop(&self) -> bool {
        if !self.running() {
            return false;
        }
        let b = self.background;
        // Relaxed: the futex's own check orders the word against the wake that follows
        // (the kernel reads it under the bucket lock the wake takes); the thread reads
        // no data through it.
        b.stop.fetch_add(1, Ordering::Relaxed);
        b.stop.wake_all();
        let me = b.kernel.pid();
        let tid = loop {
            // Acquire: pairs with the Release in `Background::started`.
            let tid = b.tid.load(Ordering::Acquire);
            if tid != 0 {
                break tid;
            }
            // Not yet run: it will find the new generation before it first sleeps.
            b.kernel.pause(0);
        };
        while b.kernel.thread_exists(me, tid) {
            b.kernel.pause(20);
        }
        // Relaxed: as in `running`.
        b.pid.store(0, Ordering::Relaxed);
        true
    }
}

impl<K: Kernel> Drop for Control<'_, K> {
    fn drop(&mut self) {
        // Release: pairs with the Acquire in `Background::control`.
        self.background.lock.store(0, Ordering::Release);
    }
}
