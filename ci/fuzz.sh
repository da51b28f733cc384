#!/usr/bin/env bash
# cargo-fuzz (fuzz/): builds the three targets (alloc_api, vmem, preload_c) and runs each
# for FUZZ_SECS seconds (default 60) over a scratch copy of its committed corpus
# (fuzz/corpus/<target>), so a run never writes into the repository and leftovers from
# an earlier one cannot matter. Fails on any crash, panic, timeout or RSS past 4 GiB
# (the input lands in fuzz/artifacts/<target>/; replay it with
# `RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer none <target> <file>` in fuzz/). Prints
# one line per target, also appended to $CI_SUMMARY when set.
# The committed corpus is a set-cover minimisation of longer runs; to refresh it, run a
# target into a scratch directory, then in fuzz/:
#   cargo fuzz run --sanitizer none <t> corpus/<t> <scratch> -- -set_cover_merge=1
# All targets are built without a sanitizer: preload_c must be (its malloc is the
# process's, which AddressSanitizer would have to own), and umem's blocks and vmem's
# records live in mmap'd memory that ASan does not track anyway; debug assertions and
# overflow checks are on (cargo-fuzz's default). One build serves all three.
# About 3.5 minutes on 2 cores from a cold fuzz/target (crates already downloaded):
# cargo-fuzz install ~45 s, build ~30 s (up to 2 min with downloads), then the runs, two
# targets at a time: 2 x 60 s.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${FUZZ_SECS:-60}"
targets=(alloc_api vmem preload_c)
# cargo-fuzz passes nightly flags (-Z sanitizer, sancov); this lets stable take them.
export RUSTC_BOOTSTRAP=1

command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked

cd fuzz
cargo fuzz build --sanitizer none

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run_target T: fuzzes T for $secs seconds; its status is the fuzzer's.
run_target() {
    local t=$1
    if ! cargo fuzz run --sanitizer none "$t" "$work/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=4096 -timeout=60 >"$work/$t.log" 2>&1; then
        return 1
    fi
}

for t in "${targets[@]}"; do
    mkdir -p "$work/$t"
    if [[ -d corpus/$t ]]; then
        cp -R "corpus/$t/." "$work/$t/"
    fi
    echo "fuzz $t: $secs s from $(find "$work/$t" -type f | wc -l) committed inputs"
done

# Two targets at a time, one per core (each fuzzer is one single-threaded process, so
# each still gets a whole core for its $secs seconds).
summary=()
failed=()
for ((i = 0; i < ${#targets[@]}; i += 2)); do
    pids=()
    batch=("${targets[@]:i:2}")
    for t in "${batch[@]}"; do
        run_target "$t" &
        pids+=($!)
    done
    for j in "${!batch[@]}"; do
        if ! wait "${pids[$j]}"; then failed+=("${batch[$j]}"); fi
    done
done
for t in "${failed[@]}"; do
    tail -n 80 "$work/$t.log"
    echo "fuzz $t: FAILED (input in fuzz/artifacts/$t/)"
done
if ((${#failed[@]})); then exit 1; fi

for t in "${targets[@]}"; do
    runs=$(grep -oE '^Done [0-9]+ runs' "$work/$t.log" | awk '{print $2}' | tail -n 1)
    corpus=$(find "$work/$t" -type f | wc -l)
    summary+=("fuzz $t: $secs s, ${runs:-?} runs, corpus $corpus")
done

for line in "${summary[@]}"; do
    echo "$line"
    if [[ -n ${CI_SUMMARY:-} ]]; then echo "$line" >>"$CI_SUMMARY"; fi
done
