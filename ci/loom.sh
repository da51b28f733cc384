#!/usr/bin/env bash
# loom models (loom-tests/), in release mode with debug assertions, 2 preemptions.
# Usage: ci/loom.sh [test-name...]   (default: every model)
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="--cfg scalemem_loom ${RUSTFLAGS:-}"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/loom}"
export CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true
args=()
for t in "$@"; do args+=(--test "$t"); done
cargo test -p scalemem-loom-tests --release "${args[@]}" -- --test-threads 1
