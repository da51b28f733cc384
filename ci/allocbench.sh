#!/usr/bin/env bash
# Smoke run of the allocator benchmarks. bench/alloc/run.sh --quick builds workloads.c,
# runs every workload briefly under glibc, jemalloc, mimalloc, tcmalloc and libscalemem.so
# (when preload/ exists), and writes target/alloc-bench/report.md; then
# bench/alloc/global.sh runs its four #[global_allocator] examples once, briefly. It checks
# that everything builds and runs, that LD_PRELOAD really swaps malloc, and that every
# global allocator's table row has figures; it asserts no timing. Extra arguments go to
# run.sh (e.g. --allocators glibc,scalemem).
set -euo pipefail
cd "$(dirname "$0")/.."
bench/alloc/run.sh --quick "$@"

out=$(bench/alloc/global.sh --reps 1 --secs 0.05 --threads 1,2 --sizes 256,65536)
echo "$out"
for allocator in "scalemem Umem" mimalloc jemalloc "glibc (System)"; do
    rows=$(grep -c "^| $allocator | [0-9]" <<<"$out" || true)
    if [ "$rows" != 2 ]; then
        echo "allocbench: bench/alloc/global.sh gave $rows of 2 rows with figures for $allocator" >&2
        exit 1
    fi
done
echo "allocbench: bench/alloc/global.sh: every global allocator measured"
