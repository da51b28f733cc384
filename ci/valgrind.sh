#!/usr/bin/env bash
# valgrind (memcheck) over the examples: each must run to the end with no error
# reported. What it proves is mostly that the crate runs under valgrind at all (its
# system calls go through libc: rustix's raw backend reads the vDSO image, which valgrind
# does not map, and crashed); memcheck sees our mmap'd memory as defined, so the
# sanitizer lanes are what check the allocator's own memory.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || {
    sudo=$( ((EUID == 0)) || echo sudo)
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq valgrind >/dev/null
}
examples=(object_cache refcounted_object rmlock_config treiber_stack)
cargo build --release $(printf -- '--example %s ' "${examples[@]}")
for e in "${examples[@]}"; do
    # --fair-sched=yes: valgrind runs one thread at a time, and its default lock hand-off
    # lets a spinning thread (refcounted_object's workers spin on tryget_live until the
    # owner kills the ref) take the lock back again and again while the thread that
    # would end the spin starves; one CI run hung that way inside pthread_create. The
    # timeout turns any other hang into a failure that names the example.
    if ! timeout 600 valgrind -q --fair-sched=yes --error-exitcode=99 "target/release/examples/$e" >/dev/null; then
        echo "valgrind: $e: FAILED (an error reported, a crash, or no end within 600 s)"
        exit 1
    fi
    echo "valgrind: $e: no errors"
done
if [[ -n ${CI_SUMMARY:-} ]]; then
    echo "valgrind: ${#examples[@]} examples (${examples[*]}) ran under memcheck with no error" >>"$CI_SUMMARY"
fi
