#!/usr/bin/env bash
# umem as a Rust program's `#[global_allocator]` against mimalloc, jemalloc and glibc
# installed the same way: the batch workload (BENCHMARKING.md workload 1) through
# `std::alloc`, one example per allocator (examples/global_{umem,mimalloc,jemalloc,system}.rs,
# identical but for the allocator), run in turn, allocators innermost, so that drifting
# load affects them alike. Each process runs every cell once; a cell's figure is the
# median over the repetitions (processes), with the spread (±half the min-max range).
#
# Usage: bench/alloc/global.sh [--reps N] [--secs F] [--threads LIST] [--sizes LIST]
#   --reps N        processes per allocator (default 5)
#   --secs F        seconds per cell (default 0.5)
#   --threads LIST  thread counts (default 1,2)
#   --sizes LIST    block sizes (default 256,4096,65536)
#
# Prints a markdown table per size (ns per loop of 100 allocations + 100 frees, per
# thread) and umem's ratio to each peer (peer's time / umem's: above 1, umem is faster).
# Measures only: nothing here fails on a timing.
set -euo pipefail
cd "$(dirname "$0")/../.."

reps=5
secs=0.5
threads=1,2
sizes=256,4096,65536
while [ $# -gt 0 ]; do
	case "$1" in
	--reps) reps="$2"; shift ;;
	--secs) secs="$2"; shift ;;
	--threads) threads="$2"; shift ;;
	--sizes) sizes="$2"; shift ;;
	-h | --help) sed -n '2,17p' "$0"; exit 0 ;;
	*) echo "global.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
	shift
done

examples=(global_umem global_mimalloc global_jemalloc global_system)
cargo build --release $(printf -- '--example %s ' "${examples[@]}")
bin=${CARGO_TARGET_DIR:-target}/release/examples
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
for rep in $(seq "$reps"); do
	for e in "${examples[@]}"; do
		echo "rep $rep/$reps: $e" >&2
		"$bin/$e" --reps 1 --secs "$secs" --threads "$threads" --sizes "$sizes" >>"$raw"
	done
done

echo "global allocators, batch workload, $reps process(es) each, ${secs} s cells ($(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git describe --always --dirty --abbrev=7 2>/dev/null || echo unknown))"
awk -F'\t' -v threads="$threads" -f bench/alloc/global_report.awk "$raw"
