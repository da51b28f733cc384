#!/usr/bin/env bash
# loom models (loom-tests/), in release mode with debug assertions, 2 preemptions.
# Usage: ci/loom.sh [test-name...]   (default: every model)
#
# Every model: the test binaries are built once, then run as two streams of processes
# side by side, one per core: {epoch, hazard} and all the others (ds alone is the
# other half of the time; about 570 s, 430 s and 310 s here). Within a binary the
# models stay serial (--test-threads 1): some set process-wide model switches.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="--cfg scalemem_loom ${RUSTFLAGS:-}"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/loom}"
export CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true
# The release profile's whole-program LTO (Cargo.toml: for the LD_PRELOAD library) would
# only slow the link of every model binary: the models build as they did before it.
export CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16
if [ $# -gt 0 ]; then
    args=()
    for t in "$@"; do args+=(--test "$t"); done
    exec cargo test -p scalemem-loom-tests --release "${args[@]}" -- --test-threads 1
fi

# "Executable tests/NAME.rs (PATH)" for every test target.
list=$(cargo test -p scalemem-loom-tests --release --tests --no-run 2>&1 | tee /dev/stderr |
    sed -n 's/^ *Executable tests\/\([a-z_0-9]*\)\.rs (\(.*\))$/\1 \2/p')
first=()
second=()
while read -r name path; do
    case "$name" in
    epoch | hazard) first+=("$path") ;;
    *) second+=("$path") ;;
    esac
done <<<"$list"
if [ "${#first[@]}" -ne 2 ] || [ "${#second[@]}" -lt 1 ]; then
    echo "ci/loom.sh: unexpected test binaries:" >&2
    echo "$list" >&2
    exit 1
fi

# stream LOG BINARY...: runs each binary in turn; stops at the first failure.
stream() {
    local log=$1
    shift
    for bin in "$@"; do
        echo "     Running $bin"
        "$bin" --test-threads 1 || return 1
    done >"$log" 2>&1
}

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
stream "$dir/first.log" "${first[@]}" &
pid=$!
status=0
stream "$dir/second.log" "${second[@]}" || status=1
wait "$pid" || status=1
cat "$dir/second.log" "$dir/first.log"
if [ "$status" -ne 0 ]; then
    echo "ci/loom.sh: a loom model failed (see above)" >&2
fi
exit "$status"
