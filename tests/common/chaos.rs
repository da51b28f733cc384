//! The "chaos" stress harness: worker threads (oversubscribing our 2-CPU machines) that
//! keep migrating themselves between CPUs while a signal thread keeps interrupting them
//! with `SIGUSR1`, which is what makes the kernel abort and restart rseq critical sections.

use std::sync::Once;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::time::{Duration, Instant};

use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};

/// The knobs of one kind of stress run.
pub struct Config {
    /// Worker threads.
    pub threads: usize,
    /// Operations between two self-migrations of a worker.
    pub migrate_every: usize,
    /// Wall-clock cap of one stress run.
    pub time_limit: Duration,
    /// Pause of the signal thread between two rounds of signals.
    pub signal_interval: Duration,
}

/// What a stress run observed besides the workers' results.
pub struct Chaos {
    pub signals: usize,
    pub migrations: usize,
}

/// True where the critical sections must be the path under test: x86_64 glibc (2.36 on
/// our machines) with rseq not switched off by the environment.
pub fn rseq_expected() -> bool {
    // SCALEMEM_EXPECT_REFUSED: ci/modes.sh runs the suite under a seccomp filter that
    // refuses the rseq and membarrier system calls.
    let turned_off = std::env::var("SCALEMEM_RSEQ").as_deref() == Ok("0")
        || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("rseq=0"))
        || std::env::var_os("SCALEMEM_EXPECT_REFUSED").is_some();
    cfg!(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu")) && !turned_off
}

extern "C" fn on_sigusr1(_signal: libc::c_int) {}

fn install_sigusr1_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: a zeroed sigaction is a valid starting point; we set a handler that
        // does nothing (async-signal-safe), with SA_RESTART so interrupted syscalls
        // resume, and an empty mask.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigusr1 as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut()), 0);
        }
    });
}

/// Moves the calling worker between the CPUs of the original affinity mask.
pub struct Migrator {
    original: CpuSet,
    cpus: Vec<usize>,
    next: usize,
    every: usize,
    moves: usize,
}

impl Migrator {
    fn new(offset: usize, every: usize) -> Self {
        let original = sched_getaffinity(None).unwrap();
        let cpus: Vec<usize> = (0..CpuSet::MAX_CPU).filter(|&c| original.is_set(c)).collect();
        assert!(!cpus.is_empty());
        Self { original, cpus, next: offset, every, moves: 0 }
    }

    /// Called once per operation; every `migrate_every` operations pins the thread to the
    /// next CPU (the kernel migrates it before the call returns).
    pub fn tick(&mut self, op: usize) {
        if op % self.every == self.every - 1 {
            let mut set = CpuSet::new();
            set.set(self.cpus[self.next % self.cpus.len()]);
            self.next += 1;
            sched_setaffinity(None, &set).unwrap();
            self.moves += 1;
        }
    }
}

impl Drop for Migrator {
    fn drop(&mut self) {
        let _ = sched_setaffinity(None, &self.original);
    }
}

impl Config {
    /// Runs `work(thread, &mut migrator, deadline)` on `threads` threads while a signal
    /// thread sends them SIGUSR1 until all have finished; returns their results in thread
    /// order.
    pub fn stress<R: Send>(&self, work: impl Fn(usize, &mut Migrator, Instant) -> R + Sync) -> (Vec<R>, Chaos) {
        self.run(work, None::<fn(Instant)>)
    }

    /// As [`Config::stress`], and runs `side(deadline)` on one more thread meanwhile.
    pub fn stress_with_side<R: Send>(
        &self,
        work: impl Fn(usize, &mut Migrator, Instant) -> R + Sync,
        side: impl FnOnce(Instant) + Send,
    ) -> (Vec<R>, Chaos) {
        self.run(work, Some(side))
    }

    fn run<R: Send>(
        &self,
        work: impl Fn(usize, &mut Migrator, Instant) -> R + Sync,
        side: Option<impl FnOnce(Instant) + Send>,
    ) -> (Vec<R>, Chaos) {
        install_sigusr1_handler();
        let deadline = Instant::now() + self.time_limit;
        // Each worker's pthread_t, 0 until it has started: one atomic slot per worker (no
        // std Mutex, whose futex paths ThreadSanitizer does not see into).
        let targets: Vec<AtomicUsize> = (0..self.threads).map(|_| AtomicUsize::new(0)).collect();
        let finished = AtomicUsize::new(0);
        let signals_stopped = AtomicBool::new(false);
        let mut signals = 0;
        let migrations = AtomicUsize::new(0);
        let results = std::thread::scope(|s| {
            let workers: Vec<_> = (0..self.threads)
                .map(|t| {
                    let (work, targets, finished, signals_stopped, migrations) =
                        (&work, &targets, &finished, &signals_stopped, &migrations);
                    s.spawn(move || {
                        // SAFETY: pthread_self has no preconditions.
                        let me = unsafe { libc::pthread_self() };
                        // Release: pairs with the signal thread's Acquire load.
                        targets[t].store(me as usize, Release);
                        let mut migrator = Migrator::new(t, self.migrate_every);
                        let result = work(t, &mut migrator, deadline);
                        migrations.fetch_add(migrator.moves, Relaxed);
                        drop(migrator); // restores the original affinity
                        finished.fetch_add(1, Release);
                        // Stay alive until the signal thread stops: it may still hold our
                        // pthread_t, which must not dangle.
                        while !signals_stopped.load(Acquire) {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        result
                    })
                })
                .collect();
            // Joined below, not left to the scope's end: ThreadSanitizer sees a join
            // (pthread_join) but not the scope's own wait for its threads.
            let side = side.map(|side| s.spawn(move || side(deadline)));
            // This thread is the signal thread.
            while finished.load(Acquire) < self.threads {
                // Acquire: pairs with the worker's Release store of its pthread_t.
                for thread in targets.iter().map(|slot| slot.load(Acquire)).filter(|&t| t != 0) {
                    // SAFETY: `thread` is a worker that cannot exit before
                    // `signals_stopped` is set below; SIGUSR1 has a no-op handler.
                    assert_eq!(unsafe { libc::pthread_kill(thread as libc::pthread_t, libc::SIGUSR1) }, 0);
                    signals += 1;
                }
                std::thread::sleep(self.signal_interval);
            }
            signals_stopped.store(true, Release);
            let results = workers.into_iter().map(|w| w.join().unwrap()).collect();
            if let Some(side) = side {
                side.join().unwrap();
            }
            results
        });
        (results, Chaos { signals, migrations: migrations.into_inner() })
    }
}
