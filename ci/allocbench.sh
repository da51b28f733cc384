#!/usr/bin/env bash
# Smoke run of the field-workload allocator benchmark (bench/alloc/run.sh --quick): builds
# workloads.c, runs every workload briefly under glibc, jemalloc, mimalloc, tcmalloc and
# libscalemem.so (when preload/ exists), and writes target/alloc-bench/report.md. It checks
# that everything builds and runs and that LD_PRELOAD really swaps malloc; it asserts no
# timing. Extra arguments go to run.sh (e.g. --allocators glibc,scalemem).
set -euo pipefail
cd "$(dirname "$0")/.."
exec bench/alloc/run.sh --quick "$@"
