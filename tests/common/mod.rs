//! Helpers shared by the integration tests (each file under `tests/` is its own crate and
//! declares `mod common;`). Not every binary uses every helper.

#![allow(dead_code)]

pub mod chaos;
pub mod counting_alloc;

/// The threads of this process whose name (`comm`, at most 15 bytes) starts with
/// `prefix`: each one's name and the text of its `/proc/self/task/<tid>/status`. A
/// thread that exits while being read is left out.
pub fn threads_named(prefix: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let Ok(task) = task else { continue };
        let dir = task.path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else { continue };
        let comm = comm.trim();
        if !comm.starts_with(prefix) {
            continue;
        }
        if let Ok(status) = std::fs::read_to_string(dir.join("status")) {
            found.push((comm.to_string(), status));
        }
    }
    found
}

/// The value of the `field:` line of a `/proc` status text, trimmed.
pub fn status_field<'a>(status: &'a str, field: &str) -> Option<&'a str> {
    status.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':')).map(str::trim)
}

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

/// Runs test `test` of this binary alone in a child process (see [`run_child`]) and
/// returns false, or returns true when called in that child: a test that measures
/// process-wide state (footprint, address space, a resource limit, the epoch) starts
/// with `if !common::alone("its_name") { return; }`, so that the other tests of the
/// binary, which the harness runs on other threads, are not in its figures.
///
/// In the child glibc's own `malloc` (the harness's, and what glibc allocates for each
/// thread, such as its thread-local destructor list) keeps to one arena: a thread that
/// finds the arenas busy makes another and reserves 64 MiB of address space for it, up
/// to 8 per core, which a measure of the address space would count as the test's. The
/// setting is appended to any `GLIBC_TUNABLES` the lane sets.
pub fn alone(test: &str) -> bool {
    const VAR: &str = "SCALEMEM_CHILD_TEST";
    if std::env::var(VAR).as_deref() == Ok(test) {
        return true;
    }
    let tunables = match std::env::var("GLIBC_TUNABLES") {
        Ok(set) if !set.is_empty() => format!("{set}:glibc.malloc.arena_max=1"),
        _ => "glibc.malloc.arena_max=1".to_string(),
    };
    run_child(test, &[(VAR, test), ("GLIBC_TUNABLES", &tunables)]);
    false
}

/// The body of a `fork`ed child: runs `body` and ends the process with `_exit` (0 if it
/// returned true, 1 if false), never returning. A panic must not unwind into the test
/// harness, whose channels and locks other threads of the parent may have held at the
/// fork (the child would hang there, with the message lost in the harness's captured
/// output): it is written straight to standard error and the child exits with 2.
pub fn forked_child(body: impl FnOnce() -> bool) -> ! {
    let code = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let line = format!("forked child panicked: {msg}\n");
            // SAFETY: writes a live buffer to standard error.
            unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
            2
        }
    };
    // SAFETY: ends the child without running the parent's atexit handlers.
    unsafe { libc::_exit(code) }
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
            // Where it hangs, for the failure report (if gdb is installed).
            if let Ok(out) = std::process::Command::new("gdb")
                .args(["-p", &pid.to_string(), "-batch", "-ex", "thread apply all bt"])
                .output()
            {
                eprintln!("{what}: the hung child's stacks:\n{}", String::from_utf8_lossy(&out.stdout));
            }
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

/// `n` blocks of `size` bytes from `umem::global::malloc`, block `i` filled with
/// `i | 1`: their addresses.
pub fn global_blocks(n: usize, size: usize) -> Vec<usize> {
    (0..n)
        .map(|i| {
            let p = scalemem::umem::global::malloc(size);
            assert!(!p.is_null());
            // SAFETY: `size` writable bytes of ours.
            unsafe { p.write_bytes(i as u8 | 1, size) };
            p as usize
        })
        .collect()
}
