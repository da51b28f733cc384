#!/usr/bin/env bash
# valgrind (memcheck) over the examples, and over a C program with libscalemem.so
# preloaded: each must run to the end with no error reported. What it proves is mostly that the crate runs under valgrind at all (its
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

# libscalemem.so under memcheck: memcheck replaces the malloc family by symbol in every
# object, ours too, but has no `reallocarray`, `pvalloc`, `free_sized`, ... of its own;
# ours must go through the names it replaces (preload/tests/replaced.c), or a program run
# as `LD_PRELOAD=libscalemem.so valgrind prog` gets false "Invalid free" reports and
# leaks (it did before 2026-12-07: `reallocarray` and `pvalloc` used our heap directly).
cargo build --release -p scalemem-preload
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O2 -Wall -Wextra -Werror -o "$work/replaced" preload/tests/replaced.c -ldl
if ! LD_PRELOAD=$PWD/target/release/libscalemem.so timeout 300 valgrind -q --leak-check=full --show-leak-kinds=definite \
    --errors-for-leak-kinds=definite --error-exitcode=99 "$work/replaced"; then
    echo "valgrind: preload/tests/replaced.c under LD_PRELOAD: FAILED"
    exit 1
fi
echo "valgrind: preload/tests/replaced.c under LD_PRELOAD: no errors"
if [[ -n ${CI_SUMMARY:-} ]]; then
    echo "valgrind: ${#examples[@]} examples (${examples[*]}) and replaced.c under LD_PRELOAD ran under memcheck with no error" >>"$CI_SUMMARY"
fi
