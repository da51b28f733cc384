//! The global heap's maintenance thread can be stopped and started again
//! (`stop_maintenance_thread`, `spawn_maintenance_thread`): stopped, it is gone from the
//! kernel's thread group on return (what `unshare(CLONE_NEWUSER)` checks; the
//! `LD_PRELOAD` library's `unshare` and `setns` rely on it, and `ci/preload.sh` runs
//! `preload/tests/namespaces.c` for that); a `fork`ed child has none of its parent's
//! and may start its own. A binary of its own: other tests would see the thread come
//! and go.

mod common;

use scalemem::umem::global::{self, spawn_maintenance_thread, stop_maintenance_thread};

fn maintenance_threads() -> usize {
    common::threads_named("umem-maintain").len()
}

/// `maintenance_threads()` once a just-started thread has named itself (std names a
/// thread from inside it, when it first runs): waits up to 10 s for `n`.
fn settled_maintenance_threads(n: usize) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while maintenance_threads() != n && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    maintenance_threads()
}

/// This process's thread count, as the kernel's thread group has it.
fn threads() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    common::status_field(&status, "Threads").unwrap().parse().unwrap()
}

fn errno() -> i32 {
    // SAFETY: the calling thread's errno, a valid int for the thread's life.
    unsafe { *libc::__errno_location() }
}

fn set_errno(value: i32) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = value };
}

#[test]
fn stopped_maintenance_thread_leaves_the_thread_group_and_can_start_again() {
    // Nothing to stop before one was started.
    assert!(!stop_maintenance_thread());
    let alone = threads();
    spawn_maintenance_thread().unwrap();
    spawn_maintenance_thread().unwrap();
    assert_eq!(threads(), alone + 1, "a second spawn started a second thread");
    assert_eq!(settled_maintenance_threads(1), 1);

    for round in 0..20 {
        let before = threads();
        set_errno(1234);
        assert!(stop_maintenance_thread(), "round {round}: the running thread was not found");
        assert_eq!(errno(), 1234, "stopping changed errno");
        // At once, with no waiting: the kernel no longer counts it.
        assert_eq!(maintenance_threads(), 0, "round {round}: umem-maintain still listed");
        assert_eq!(threads(), before - 1, "round {round}: the thread group did not shrink");
        assert!(!stop_maintenance_thread(), "round {round}: a stopped thread was stopped twice");
        // The heap works without it (piggy-backed maintenance), and with it again.
        let p = global::malloc(100 + round);
        assert!(!p.is_null());
        // SAFETY: from `malloc`, freed once.
        unsafe { global::free(p) };
        spawn_maintenance_thread().unwrap();
        assert_eq!(threads(), before, "round {round}: not started again");
        if round % 2 == 0 {
            // Stop it sometimes before it has run at all.
            continue;
        }
        std::thread::sleep(std::time::Duration::from_millis(15));
    }
    global::maintain();
    global::assert_valid();

    // A forked child has none of its parent's thread: nothing to stop, no hang; it may
    // start one of its own and stop that.
    // SAFETY: the child runs only `forked_child`'s body and `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        common::forked_child(|| {
            let alone = threads();
            !stop_maintenance_thread()
                && maintenance_threads() == 0
                && spawn_maintenance_thread().is_ok()
                && threads() == alone + 1
                && stop_maintenance_thread()
                && threads() == alone
        });
    }
    assert_eq!(common::wait_child(pid, "the forked child"), 0, "the child's stop/spawn went wrong");
    // The parent's thread is untouched by the child's.
    assert_eq!(settled_maintenance_threads(1), 1);
    assert!(stop_maintenance_thread());
}
