//! The library's background threads (the global heap's maintenance thread, the object
//! caches' reaper, the Refcache ticker) block every signal, so that a process-directed
//! signal the program blocks in all of its own threads (to take it with `sigwait` or a
//! `signalfd`) stays pending for the program instead of being delivered to one of ours.
//! `ci/preload.sh` checks the same for a C program under `LD_PRELOAD`
//! (`preload/tests/signals.c`).

mod common;

use std::time::{Duration, Instant};

use scalemem::refcount::Refcache;
use scalemem::umem::cache::ObjectCache;
use scalemem::umem::global;

/// The blocked-signal mask of each thread of this process whose name starts with one of
/// `names`, from `/proc/self/task/*/status`.
fn masks_of(names: &[&str]) -> Vec<(String, u64)> {
    names
        .iter()
        .flat_map(|name| common::threads_named(name))
        .map(|(comm, status)| {
            let blocked = common::status_field(&status, "SigBlk").expect("SigBlk");
            (comm, u64::from_str_radix(blocked, 16).unwrap())
        })
        .collect()
}

#[test]
fn background_threads_block_every_signal() {
    global::spawn_maintenance_thread().unwrap();
    // A cache with the default configuration starts the reaper, and the process-wide
    // regions start their Refcache ticker; a Refcache of its own starts another ticker.
    let cache = ObjectCache::new("signals", 64, 8, None, None).unwrap();
    let refcache = Refcache::new().unwrap();
    let names = ["umem-maintain", "umem-reaper", "scalemem-refcac"];
    let deadline = Instant::now() + Duration::from_secs(10);
    let masks = loop {
        let masks = masks_of(&names);
        if names.iter().all(|n| masks.iter().any(|(c, _)| c.starts_with(n))) || Instant::now() > deadline {
            break masks;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    for name in names {
        assert!(masks.iter().any(|(c, _)| c.starts_with(name)), "no thread named {name}: {masks:?}");
    }
    // Signal n is bit n - 1. Every signal a program may send or block (SIGKILL and
    // SIGSTOP cannot be blocked; glibc keeps its two internal ones, 32 and 33, open).
    let must: u64 = [
        libc::SIGHUP,
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGPIPE,
        libc::SIGALRM,
        libc::SIGTERM,
        libc::SIGCHLD,
        libc::SIGWINCH,
        libc::SIGRTMIN() + 2,
        libc::SIGRTMAX(),
    ]
    .iter()
    .fold(0, |m, &s| m | 1 << (s - 1));
    for (comm, blocked) in &masks {
        assert_eq!(blocked & must, must, "{comm} leaves signals open: SigBlk {blocked:016x}");
    }
    // The spawning thread got its own mask back.
    let mine = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    let mine = common::status_field(&mine, "SigBlk").unwrap();
    assert_eq!(u64::from_str_radix(mine, 16).unwrap() & must, 0, "the caller's mask changed: {mine}");
    drop(refcache);
    drop(cache);
}
