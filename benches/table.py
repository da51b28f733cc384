#!/usr/bin/env python3
"""Prints criterion's medians (and their 95% confidence intervals) for every benchmark
under target/criterion whose id starts with one of the given prefixes.

    python3 benches/table.py epoch/ rmlock/ refcount/
"""
import json
import pathlib
import sys

root = pathlib.Path(__file__).resolve().parent.parent / "target" / "criterion"
prefixes = sys.argv[1:] or [""]


def fmt(ns):
    return f"{ns / 1000:.2f} us" if ns >= 10_000 else f"{ns:.2f} ns"


rows = []
for est in root.glob("**/new/estimates.json"):
    bench = json.loads((est.parent / "benchmark.json").read_text())
    name = bench["full_id"]
    if not any(name.startswith(p) for p in prefixes):
        continue
    median = json.loads(est.read_text())["median"]
    ci = median["confidence_interval"]
    throughput = bench.get("throughput") or {}
    elements = throughput.get("Elements")
    rate = f"{elements / median['point_estimate'] * 1e3:.1f} Mops/s" if elements else ""
    rows.append((name, fmt(median["point_estimate"]), f"({fmt(ci['lower_bound'])} - {fmt(ci['upper_bound'])})", rate))

for row in sorted(rows):
    print(" | ".join(row))
