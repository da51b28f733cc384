#!/usr/bin/env bash
# AddressSanitizer (with LeakSanitizer): unit and integration tests, then the stress
# example. --cfg scalemem_asan registers our mmap'd regions as LSan root regions, so
# garbage waiting in epoch bags is not reported as leaked.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTC_BOOTSTRAP=1
export RUSTFLAGS="-Zsanitizer=address --cfg scalemem_asan"
export RUSTDOCFLAGS="$RUSTFLAGS"
export CARGO_TARGET_DIR=target/asan
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
target=x86_64-unknown-linux-gnu
cargo test --target "$target" --lib --tests
STRESS_SECS=5 cargo run --target "$target" --example stress
