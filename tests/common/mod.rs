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
