# The table of bench/alloc/global.sh from its examples' `cell` lines (see
# examples/global_alloc/cells.rs); -v threads=LIST gives the column order.
$1 == "cell" {
	key = $2 SUBSEP $3 SUBSEP $4
	n[key]++; v[key, n[key]] = $5
	if (!($2 in seen)) { seen[$2] = 1; order[++nalloc] = $2 }
	if (!($3 in sseen)) { sseen[$3] = 1; sizes[++nsize] = $3 }
}
function median(key,    i, j, k, t, a) {
	k = n[key]
	for (i = 1; i <= k; i++) a[i] = v[key, i]
	for (i = 2; i <= k; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
	lo = a[1]; hi = a[k]
	return (k % 2) ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
}
END {
	nt = split(threads, ts, ",")
	for (s = 1; s <= nsize; s++) {
		size = sizes[s]
		printf "\nbatch %s B: ns per loop per thread (median ± half the range)\n\n| allocator |", size
		for (t = 1; t <= nt; t++) printf " %s thread%s |", ts[t], ts[t] == 1 ? "" : "s"
		printf "\n|---|"; for (t = 1; t <= nt; t++) printf "---:|"; printf "\n"
		for (a = 1; a <= nalloc; a++) {
			printf "| %s |", order[a]
			for (t = 1; t <= nt; t++) {
				key = order[a] SUBSEP size SUBSEP ts[t]
				if (!(key in n)) { printf " |"; continue }
				m = median(key); med[key] = m
				printf " %.0f ±%.0f%% |", m, (m > 0 ? 50 * (hi - lo) / m : 0)
			}
			printf "\n"
		}
		printf "\n%s / peer (peer time / umem time):", order[1]
		for (a = 2; a <= nalloc; a++) {
			printf " %s", order[a]
			for (t = 1; t <= nt; t++) {
				k1 = order[1] SUBSEP size SUBSEP ts[t]; k2 = order[a] SUBSEP size SUBSEP ts[t]
				if ((k1 in med) && (k2 in med) && med[k1] > 0) printf " T=%s %.2fx%s", ts[t], med[k2] / med[k1], t < nt ? "," : ""
			}
			printf "%s", a < nalloc ? ";" : "\n"
		}
	}
}
