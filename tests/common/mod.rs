//! Helpers shared by the integration tests (each file under `tests/` is its own crate and
//! declares `mod common;`). Not every binary uses every helper.

#![allow(dead_code)]

pub mod chaos;
pub mod counting_alloc;

/// Runs one test of this binary, `test`, alone in a child process with `env` set (for
/// process-wide state: fence modes, address-space limits, RSS), and fails unless it
/// passed.
pub fn run_child(test: &str, env: &[(&str, &str)]) {
    let exe = std::env::current_exe().expect("the test binary");
    let mut command = std::process::Command::new(exe);
    command.args(["--exact", test, "--test-threads", "1", "--nocapture"]);
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().expect("spawn the child test process");
    assert!(
        output.status.success(),
        "child `{test}` with {env:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("1 passed"), "the child ran no test");
}

/// Waits for the `fork`ed child `pid` and returns its exit code; fails if it did not
/// exit normally, or if it is still running after 30 s (a child that inherited a lock
/// held by a thread it does not have hangs: it is killed and the test fails).
pub fn wait_child(pid: libc::pid_t, what: &str) -> i32 {
    let mut status = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        // SAFETY: polls our child.
        let waited = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if waited == pid {
            break;
        }
        assert_eq!(waited, 0, "waitpid failed");
        if std::time::Instant::now() > deadline {
            // SAFETY: our child; reaped below.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            panic!("{what} hung after fork (a lock held across fork?)");
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(libc::WIFEXITED(status), "{what}: status {status:#x}");
    libc::WEXITSTATUS(status)
}

/// The largest free gap the model leaves inside `spans`.
pub fn largest_gap(spans: &[(usize, usize)], live: &std::collections::BTreeMap<usize, usize>) -> usize {
    let mut best = 0;
    for &(base, size) in spans {
        let mut cursor = base;
        for (&a, &n) in live.range(base..base + size) {
            best = best.max(a - cursor);
            cursor = a + n;
        }
        best = best.max(base + size - cursor);
    }
    best
}
