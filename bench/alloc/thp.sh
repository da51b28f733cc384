#!/bin/bash
# Memory given back under transparent huge pages in `always` mode (needs root: it
# switches /sys/kernel/mm/transparent_hugepage/enabled to `always` and khugepaged's scan
# interval to 1 s for the run, and puts both back on exit).
#
#   bench/alloc/thp.sh [NAME=LIB.so ...]
#
# Runs, for glibc and each NAME=LIB.so given (default: this checkout's libscalemem.so,
# jemalloc, mimalloc from Debian), all at once (memory figures, not timings):
#   - `large_thp 60`: 48 live 64 KiB blocks, 48 freed 1.5 MiB blocks, RSS every 15 s;
#   - `workloads footprint --threads 32 --total-mib 256 --reclaim-secs 60`.
# Output: one file per allocator and workload under bench/alloc/results/thp-<date>/.
set -euo pipefail
cd "$(dirname "$0")/../.."
T=/sys/kernel/mm/transparent_hugepage
[ -w "$T/enabled" ] || { echo "thp.sh: $T/enabled is not writable (run as root)" >&2; exit 1; }
was_enabled=$(sed -n 's/.*\[\(.*\)\].*/\1/p' "$T/enabled")
was_sleep=$(cat "$T/khugepaged/scan_sleep_millisecs")
restore() { echo "$was_enabled" > "$T/enabled"; echo "$was_sleep" > "$T/khugepaged/scan_sleep_millisecs"; }
trap restore EXIT
out=bench/alloc/results/$(date -u +%F)-thp
mkdir -p "$out"
cc -std=c11 -O2 -pthread -Wall -Wextra -o "$out/workloads" bench/alloc/workloads.c
cc -std=c11 -O2 -Wall -Wextra -o "$out/large_thp" bench/alloc/large_thp.c
libs=("$@")
if [ ${#libs[@]} -eq 0 ]; then
	cargo build --release -p scalemem-preload >&2
	dir=/usr/lib/$(cc -print-multiarch)
	libs=("scalemem=$PWD/target/release/libscalemem.so" "jemalloc=$dir/libjemalloc.so.2" "mimalloc=$dir/libmimalloc.so.2")
fi
echo always > "$T/enabled"
echo 1000 > "$T/khugepaged/scan_sleep_millisecs"
for entry in glibc= "${libs[@]}"; do
	name=${entry%%=*} so=${entry#*=}
	LD_PRELOAD=$so "$out/large_thp" 60 > "$out/large-$name.txt" 2>&1 &
	LD_PRELOAD=$so "$out/workloads" footprint --threads 32 --total-mib 256 --reclaim-secs 60 --stack-kib 64 \
		> "$out/footprint-$name.txt" 2>&1 &
done
wait
rm -f "$out/workloads" "$out/large_thp"
for f in "$out"/*.txt; do echo "== $f"; cat "$f"; done
