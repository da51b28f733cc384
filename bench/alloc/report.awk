# Tables for bench/alloc/run.sh: reads raw.txt (key=value lines) and prints Markdown.
# Portable awk (mawk has no asort). Variables (-v):
#   allocs   "glibc jemalloc ..."   columns, in order
#   ours     the allocator the ratio column is about ("" = no ratio column)
#   metrics  "batch:loops_per_s,faults_per_alloc;prodcons:frees_per_s;..." what to tabulate
#   order    "batch prodcons ..."   workload order
#   minpar   parallelism threshold (1.8)
#
# raw.txt lines:
#   alloc=A rep=R workload=W <config keys> <metrics>      a measurement
#   alloc=A rep=R workload=W <config keys> error=...       a failed run
#   round=W rep=R when=before|after workload=parcheck ... speedup=X

function isconfig(k) {
	return k in CONFIG
}

function fmt_num(v, metric,    a) {
	if (metric ~ /_kib$/) {
		a = v / 1024
		if (a < 0) a = -a
		if (a < 1) return sprintf("%d KiB", v)
		if (a >= 100) return sprintf("%.0f MiB", v / 1024)
		if (a >= 10) return sprintf("%.1f MiB", v / 1024)
		return sprintf("%.2f MiB", v / 1024)
	}
	if (metric ~ /_per_s/) {
		if (v >= 1e9) return sprintf("%.3g G", v / 1e9)
		if (v >= 1e6) return sprintf("%.3g M", v / 1e6)
		if (v >= 1e3) return sprintf("%.3g k", v / 1e3)
		return sprintf("%.3g", v)
	}
	if (v == int(v)) return sprintf("%d", v)
	return sprintf("%.3g", v)
}

# median and half-range of vals[key, 1..n] (sorted in place)
function stats(key, n,    i, j, t, lo, hi) {
	for (i = 2; i <= n; i++) {
		t = VALS[key, i]
		for (j = i - 1; j >= 1 && VALS[key, j] > t; j--) VALS[key, j + 1] = VALS[key, j]
		VALS[key, j + 1] = t
	}
	if (n % 2) MED = VALS[key, (n + 1) / 2]
	else MED = (VALS[key, n / 2] + VALS[key, n / 2 + 1]) / 2
	lo = VALS[key, 1]; hi = VALS[key, n]
	HALF = (hi - lo) / 2
}

function cell_text(metric, v, half, n,    s, pct) {
	s = fmt_num(v, metric)
	if (n > 1) {
		if (v != 0) {
			pct = 100 * half / (v < 0 ? -v : v)
			if (half == 0) s = s " ±0%"
			else if (pct >= 10) s = s sprintf(" ±%.0f%%", pct)
			else s = s sprintf(" ±%.2g%%", pct)
		} else if (half != 0) s = s " ±" fmt_num(half, metric)
	}
	return s
}

BEGIN {
	split("threads size live block_kib total_mib reclaim_s nthreads wave per_thread stack_kib", c, " ")
	for (i in c) CONFIG[c[i]] = 1
	na = split(allocs, AL, " ")
	nw = split(order, WO, " ")
	nm = split(metrics, ms, ";")
	for (i = 1; i <= nm; i++) {
		split(ms[i], kv, ":")
		MLIST[kv[1]] = kv[2]
	}
	if (minpar == "") minpar = 1.8
}

# The file is read twice (run.sh passes it twice): the parallelism checks first, since
# a cell's "after" check follows its measurements.
{
	delete F
	for (i = 1; i <= NF; i++) {
		p = index($i, "=")
		if (p == 0) continue
		F[substr($i, 1, p - 1)] = substr($i, p + 1)
	}
	if (F["workload"] == "parcheck") {
		if (NR != FNR) next
		k = F["round"] SUBSEP F["rep"]
		pw = F["round"]
		sub(/\.[0-9]+$/, "", pw)
		if (!(k in PCSEEN)) { PCSEEN[k] = 1; PCCELLS[pw]++ }
		if (!("speedup" in F) || F["speedup"] + 0 < minpar + 0) {
			if (!(k in PFAIL)) PCFAILED[pw]++
			PFAIL[k] = 1
		}
		if ("speedup" in F) { PCN[pw]++; VALS["pc" SUBSEP pw, PCN[pw]] = F["speedup"] + 0 }
		next
	}
	if (NR == FNR) next
	w = F["workload"]
	if (w == "" || F["alloc"] == "") next
	if ("error" in F) {
		# a failed run's configuration is taken from its cell's other runs (same round)
		NERR++
		ERR[NERR] = $0
		ERRROUND[NERR] = F["round"]
		ERRALLOC[NERR] = F["alloc"]
		next
	}
	cfg = ""
	par = 0
	for (i = 1; i <= NF; i++) {
		p = index($i, "=")
		k = substr($i, 1, p - 1)
		if (isconfig(k)) {
			cfg = cfg (cfg == "" ? "" : " ") k "=" F[k]
			if ((k == "threads" || k == "wave") && F[k] + 0 > 1) par = 1
		}
	}
	if (!((w SUBSEP cfg) in SEENCFG)) {
		SEENCFG[w, cfg] = 1
		NC[w]++
		CFG[w, NC[w]] = cfg
	}
	ROUNDCFG[F["round"]] = cfg
	nmet = split(MLIST[w], mm, ",")
	for (j = 1; j <= nmet; j++) {
		m = mm[j]
		if (!(m in F)) continue
		key = w SUBSEP cfg SUBSEP m SUBSEP F["alloc"]
		# a multi-thread rate from a round whose parallelism check failed: kept apart
		if (m ~ /_per_s/ && par && ((F["round"] SUBSEP F["rep"]) in PFAIL)) {
			NB[key]++
			VALS[key "B", NB[key]] = F[m] + 0
		} else {
			N[key]++
			VALS[key, N[key]] = F[m] + 0
		}
	}
}

END {
	for (i = 1; i <= NERR; i++) {
		w = ERRROUND[i]
		sub(/\.[0-9]+$/, "", w)
		if (ERRROUND[i] in ROUNDCFG) FAILED[w, ROUNDCFG[ERRROUND[i]], ERRALLOC[i]]++
	}
	npc = 0
	for (wi = 1; wi <= nw; wi++) if (PCCELLS[WO[wi]] > 0) npc++
	if (npc > 0) {
		print "### Parallelism check"
		print ""
		print "Two spin loops against one (`workloads parcheck`, no LD_PRELOAD), before and after"
		print "every multi-thread cell of every repetition. A cell-repetition where either check"
		print "read below " minpar "x is unchecked: its multi-thread rates are left out of the"
		print "medians below, and a cell with no checked repetition shows the median of the"
		print "unchecked ones marked `(u)`. Every reading is in raw.txt."
		print ""
		print "| workload | checked / multi-thread cell-repetitions | speedup min | median | max |"
		print "|---|---|---|---|---|"
		for (wi = 1; wi <= nw; wi++) {
			pw = WO[wi]
			if (PCCELLS[pw] == 0) continue
			key = "pc" SUBSEP pw
			stats(key, PCN[pw])
			printf "| %s | %d / %d | %.2f | %.2f | %.2f |\n", pw, PCCELLS[pw] - PCFAILED[pw], PCCELLS[pw], VALS[key, 1], MED, VALS[key, PCN[pw]]
		}
		print ""
	}
	for (wi = 1; wi <= nw; wi++) {
		w = WO[wi]
		if (NC[w] == 0) continue
		nmet = split(MLIST[w], mm, ",")
		single = (NC[w] == 1)
		print "### " w
		print ""
		if (single && CFG[w, 1] != "") { print "Configuration: `" CFG[w, 1] "`."; print "" }
		for (j = 1; j <= nmet; j++) {
			m = mm[j]
			if (!single || j == 1) {
				hdr = single ? "| measurement |" : "| " m " |"
				sep = "|---|"
				for (a = 1; a <= na; a++) { hdr = hdr " " AL[a] " |"; sep = sep "---|" }
				if (ours != "") { hdr = hdr " " ours " / best peer |"; sep = sep "---|" }
				if (!single) { print "`" m "` (" (m ~ /_per_s/ ? "higher is better" : "lower is better") "):"; print "" }
				print hdr
				print sep
			}
			for (ci = 1; ci <= NC[w]; ci++) {
				cfg = CFG[w, ci]
				row = single ? "| " m " |" : "| " cfg " |"
				best = ""; ov = ""
				for (a = 1; a <= na; a++) {
					key = w SUBSEP cfg SUBSEP m SUBSEP AL[a]
					nf = FAILED[w, cfg, AL[a]]
					if (N[key] + NB[key] == 0 && nf > 0) {
						row = row " failed |"
						continue
					}
					if (N[key] > 0) {
						stats(key, N[key])
						txt = cell_text(m, MED, HALF, N[key])
						if (N[key] == 1 && NB[key] > 0) txt = txt " (1 checked rep)"
					} else if (NB[key] > 0) {
						stats(key "B", NB[key])
						txt = cell_text(m, MED, HALF, NB[key]) " (u)"
					} else {
						row = row " - |"
						continue
					}
					if (nf > 0) txt = txt " (" nf " failed)"
					row = row " " txt " |"
					if (AL[a] == ours) ov = MED
					else if (best == "" || (m ~ /_per_s/ ? MED > best : MED < best)) best = MED
				}
				if (ours != "") {
					if (ov != "" && best != "" && best != 0) row = row sprintf(" %.2f |", ov / best)
					else row = row " - |"
				}
				print row
			}
			if (!single) print ""
		}
		if (single) print ""
	}
	if (NERR > 0) {
		print "### Failed runs"
		print ""
		print "Runs that exited non-zero (124: killed by the 300 s timeout), as raw.txt has them:"
		print ""
		for (i = 1; i <= NERR; i++) print "- `" ERR[i] "`"
		print ""
	}
}
