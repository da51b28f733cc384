#!/usr/bin/env bash
# The field-workload allocator benchmark: glibc, jemalloc, mimalloc, tcmalloc and ours
# (libscalemem.so) side by side under LD_PRELOAD, in one run, allocators interleaved per
# cell. Workloads: bench/alloc/workloads.c; rules: shared/BENCHMARKING.md.
#
# Usage: bench/alloc/run.sh [--quick] [--only WORKLOAD] [--reps N] [--allocators a,b,...]
#   --quick        tiny parameters, 1 repetition (CI smoke: well under a minute)
#   --only W       one workload: batch, prodcons, footprint, vsize, large, largemix, churn, startup
#   --reps N       repetitions per cell (default 3; quick 1)
#   --allocators   comma list from glibc,jemalloc,mimalloc,tcmalloc,scalemem (default all)
#   --reclaim-secs footprint's wait before the reclaim reading (default 15; quick 1)
#
# Writes target/alloc-bench/report.md (tables: median of the repetitions and the spread,
# ±half the min-max range) and target/alloc-bench/raw.txt (every line the runs printed).
# Measures only: nothing here fails on a timing. Exits 1 (after writing the report) if a
# run exited non-zero or a preloaded library did not take over malloc.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

quick=0
reps=""
only=""
alloc_list="glibc,jemalloc,mimalloc,tcmalloc,scalemem"
reclaim=""
cmdline="bench/alloc/run.sh${*:+ $*}"
while [ $# -gt 0 ]; do
	case "$1" in
	--quick) quick=1 ;;
	--only) only="$2"; shift ;;
	--reps) reps="$2"; shift ;;
	--allocators) alloc_list="$2"; shift ;;
	--reclaim-secs) reclaim="$2"; shift ;;
	-h | --help) sed -n '2,16p' "$0"; exit 0 ;;
	*) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
	shift
done

target_dir=${CARGO_TARGET_DIR:-target}
case "$target_dir" in /*) ;; *) target_dir="$root/$target_dir" ;; esac
out="$target_dir/alloc-bench"
mkdir -p "$out"
raw="$out/raw.txt"
report="$out/report.md"
log="$out/run.log"
: >"$raw"
: >"$log"
say() { echo "$*" | tee -a "$log" >&2; }

# ---------------------------------------------------------------- parameters
if [ "$quick" = 1 ]; then
	reps=${reps:-1}
	secs=0.05
	par_secs=0.05
	batch_sizes="256 4096 65536"
	batch_threads="1 2"
	pc_threads="2 4"
	fp_total=16
	reclaim=${reclaim:-1}
	churn_n=64
else
	reps=${reps:-3}
	secs=1
	par_secs=0.2
	batch_sizes="256 1024 4096 16384 65536"
	batch_threads="1 2 4 8 16"
	pc_threads="2 4 8 16"
	fp_total=256
	reclaim=${reclaim:-15}
	churn_n=2000
fi
case "$reps" in '' | *[!0-9]* | 0) echo "run.sh: --reps needs a positive integer" >&2; exit 2 ;; esac
workloads="batch prodcons footprint vsize large largemix churn startup"
if [ -n "$only" ]; then
	case " $workloads " in *" $only "*) workloads=$only ;; *) echo "run.sh: no workload '$only'" >&2; exit 2 ;; esac
fi

# The cells of a workload, one argument string per line.
cells() {
	local s t
	case "$1" in
	batch) for s in $batch_sizes; do for t in $batch_threads; do echo "--size $s --threads $t --secs $secs"; done; done ;;
	prodcons) for t in $pc_threads; do echo "--threads $t --secs $secs"; done ;;
	footprint) echo "--threads 32 --total-mib $fp_total --reclaim-secs $reclaim --stack-kib 64" ;;
	vsize) echo "--threads 64 --stack-kib 64" ;;
	large)
		echo "--block-kib 2048 --live 1 --secs $secs"
		echo "--block-kib 2048 --live 4 --secs $secs"
		echo "--block-kib 65536 --live 1 --secs $secs"
		echo "--block-kib 65536 --live 4 --secs $secs"
		;;
	largemix)
		echo "--live 4 --block-kib 4096"
		echo "--live 16 --block-kib 4096"
		;;
	churn) echo "--nthreads $churn_n --threads 16 --per-thread 300 --stack-kib 64" ;;
	startup) echo "--secs $secs" ;;
	esac
}

# What the report tabulates (raw.txt has every field).
metrics="batch:loops_per_s,loops_per_s_per_thread,faults_per_alloc"
metrics+=";prodcons:frees_per_s,faults_per_alloc"
metrics+=";footprint:peak_rss_kib,rss_all_live_kib,rss_after_free_kib,rss_after_reclaim_wait_kib,rss_after_exit_kib,rss_start_kib"
metrics+=";vsize:vmsize_per_thread_minus_stack_kib,vmsize_per_thread_kib,rss_per_thread_kib"
metrics+=";large:requests_per_s,faults_per_request"
metrics+=";largemix:peak_rss_kib,faults_per_request,requests_per_s"
metrics+=";churn:rss_start_kib,rss_after_first_wave_kib,rss_end_kib,rss_growth_after_first_wave_kib,vmsize_growth_after_first_wave_kib,threads_per_s"
metrics+=";startup:processes_per_s,child_max_rss_kib"

# ---------------------------------------------------------------- allocators
multiarch=$(cc -print-multiarch 2>/dev/null || true)
libdir=/usr/lib/${multiarch:-x86_64-linux-gnu}
lib_of() {
	case "$1" in
	glibc) echo "" ;;
	jemalloc) echo "$libdir/libjemalloc.so.2" ;;
	mimalloc) echo "$libdir/libmimalloc.so.2" ;;
	tcmalloc) echo "$libdir/libtcmalloc_minimal.so.4" ;;
	scalemem) echo "$target_dir/release/libscalemem.so" ;;
	*) return 1 ;;
	esac
}
pkg_of() {
	case "$1" in
	jemalloc) echo libjemalloc2 ;;
	mimalloc) echo libmimalloc2.0 ;;
	tcmalloc) echo libtcmalloc-minimal4 ;;
	esac
}
# the file that must provide malloc under each allocator (workloads whoami)
expect_of() {
	case "$1" in
	glibc) echo "/libc.so" ;;
	jemalloc) echo "/libjemalloc.so" ;;
	mimalloc) echo "/libmimalloc.so" ;;
	tcmalloc) echo "/libtcmalloc_minimal.so" ;;
	scalemem) echo "/libscalemem.so" ;;
	esac
}

IFS=, read -r -a wanted <<<"$alloc_list"
for a in "${wanted[@]}"; do
	lib_of "$a" >/dev/null || { echo "run.sh: unknown allocator '$a'" >&2; exit 2; }
done

notes=()
failures=0
missing_pkgs=()
for a in "${wanted[@]}"; do
	case "$a" in glibc | scalemem) continue ;; esac
	[ -e "$(lib_of "$a")" ] || missing_pkgs+=("$(pkg_of "$a")")
done
if [ ${#missing_pkgs[@]} -gt 0 ]; then
	sudo=()
	[ "$(id -u)" = 0 ] || sudo=(sudo)
	say "installing ${missing_pkgs[*]}"
	if ! "${sudo[@]}" apt-get install -y --no-install-recommends "${missing_pkgs[@]}" >>"$log" 2>&1; then
		say "warning: apt-get install ${missing_pkgs[*]} failed (see $log)"
	fi
fi

say "building workloads"
cc -std=c11 -O2 -pthread -Wall -Wextra -o "$out/workloads" bench/alloc/workloads.c
wl="$out/workloads"

have_ours=0
for a in "${wanted[@]}"; do [ "$a" = scalemem ] && have_ours=1; done
if [ "$have_ours" = 1 ]; then
	if [ -d preload ]; then
		say "building ours: cargo build --release -p scalemem-preload"
		cargo build --release -p scalemem-preload 2>&1 | tee -a "$log" >&2
	else
		msg="scalemem: no preload/ directory on this checkout, so libscalemem.so cannot be built; its column is skipped"
		say "$msg"
		notes+=("$msg.")
	fi
fi

allocs=()
for a in "${wanted[@]}"; do
	lib=$(lib_of "$a")
	if [ -n "$lib" ] && [ ! -e "$lib" ]; then
		[ "$a" = scalemem ] && [ ! -d preload ] && continue
		msg="$a: $lib not found; skipped"
		say "$msg"
		notes+=("$msg.")
		continue
	fi
	who=$(LD_PRELOAD="$lib" "$wl" whoami 2>&1 || true)
	case "$who" in
	*"$(expect_of "$a")"*) allocs+=("$a"); say "$a: $who" ;;
	*)
		msg="$a: malloc is not the expected one under LD_PRELOAD=$lib ($who); skipped"
		failures=$((failures + 1))
		say "$msg"
		notes+=("$msg.")
		;;
	esac
done
[ ${#allocs[@]} -gt 0 ] || { echo "run.sh: no allocator left to run" >&2; exit 1; }
ours=""
for a in "${allocs[@]}"; do [ "$a" = scalemem ] && ours=scalemem; done

versions() {
	local a p v
	for a in "${allocs[@]}"; do
		case "$a" in
		glibc) p=libc6 ;;
		scalemem) echo "scalemem $(git -C "$root" rev-parse --short HEAD)"; continue ;;
		*) p=$(pkg_of "$a") ;;
		esac
		v=$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null || echo "?")
		echo "$a ($p $v)"
	done
}

# ---------------------------------------------------------------- the run
parcheck() { # round rep when
	local line
	line=$("$wl" parcheck --secs "$par_secs" </dev/null) || line="workload=parcheck error=$?"
	echo "round=$1 rep=$2 when=$3 $line" >>"$raw"
	say "  parcheck $1 rep $2 $3: ${line##*speedup=}"
}

start=$(date +%s)
start_utc=$(date -u '+%Y-%m-%d %H:%M UTC')
say "$start_utc; nproc $(nproc); $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'); $(uname -sr); $(ldd --version 2>&1 | head -n1)"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
n=${#allocs[@]}
say "allocators: ${allocs[*]}; reps $reps; workloads: $workloads"
for rep in $(seq 1 "$reps"); do
	for w in $workloads; do
		say "rep $rep/$reps: $w"
		ci=0
		while IFS= read -r args; do
			ci=$((ci + 1))
			round="$w.$ci"
			# a multi-thread cell is bracketed by parallelism checks
			# (footprint and vsize measure memory only)
			multi=0
			case "$w $args " in footprint* | vsize* | *" --threads 1 "*) ;; *" --threads "*) multi=1 ;; esac
			[ "$multi" = 1 ] && parcheck "$round" "$rep" before
			# rotate the allocator order per cell and repetition, so that drift and
			# ordering effects spread over all of them
			for k in $(seq 0 $((n - 1))); do
				a=${allocs[$(((k + ci + rep) % n))]}
				lib=$(lib_of "$a")
				# shellcheck disable=SC2086 # args is a word list by design
				if line=$(LD_PRELOAD="$lib" timeout 300 "$wl" "$w" $args </dev/null 2>>"$log"); then
					echo "alloc=$a rep=$rep round=$round $line" >>"$raw"
				else
					rc=$?
					echo "alloc=$a rep=$rep round=$round workload=$w ${args// /_} error=exit_$rc" >>"$raw"
					failures=$((failures + 1))
					say "  FAILED: $a $w $args (exit $rc)"
				fi
			done
			[ "$multi" = 1 ] && parcheck "$round" "$rep" after
		done < <(cells "$w")
	done
done
elapsed=$(($(date +%s) - start))
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------- the report
{
	echo "# Allocator workloads (C malloc via LD_PRELOAD)"
	echo ""
	echo "| | |"
	echo "|---|---|"
	echo "| date | $start_utc, $elapsed s in all |"
	echo "| command | \`$cmdline\` |"
	echo "| machine | nproc $(nproc), $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) |"
	echo "| kernel | $(uname -sr) |"
	echo "| glibc | $(ldd --version 2>&1 | head -n1) |"
	echo "| compiler | $(cc --version | head -n1), \`-std=c11 -O2 -pthread\` |"
	echo "| allocators | $(versions | paste -sd ';' - | sed 's/;/; /g') |"
	echo "| commit | $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- bench/alloc || echo ' (bench/alloc modified)') |"
	echo "| load average | $load_before before, $load_after after |"
	echo "| repetitions | $reps per cell, allocators interleaved per cell (order rotated per cell and repetition) |"
	echo ""
	for note in "${notes[@]+"${notes[@]}"}"; do echo "- $note"; done
	[ ${#notes[@]} -gt 0 ] && echo ""
	echo "Cells: median of the repetitions, ± half the min-max range as a share of the median."
	echo "Memory in MiB (from /proc/self/status, whole process). Rates are per second."
	if [ -n "$ours" ]; then
		echo "Ratio: $ours / the best peer in the row (for rates below 1 means slower; for"
		echo "faults and memory above 1 means more)."
	fi
	echo "Footprint: the reclaim reading is taken after sleeping the interval and then one"
	echo "malloc(16)/free from the main thread (so an allocator that reclaims on its next call"
	echo "can act); the 32 threads are still alive then, and exit before the last reading."
	echo ""
	awk -v allocs="${allocs[*]}" -v ours="$ours" -v metrics="$metrics" \
		-v order="$workloads" -v minpar=1.8 -f bench/alloc/report.awk "$raw" "$raw"
} >"$report"

say "done in $elapsed s: $report (raw lines: $raw)"
cat "$report"
if [ "$failures" -gt 0 ]; then
	say "run.sh: $failures failure(s): runs that exited non-zero or a library that did not take over malloc"
	exit 1
fi
