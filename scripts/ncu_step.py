#!/usr/bin/env python3
"""Per-kernel device time of one decode step, from an Nsight Compute CSV.

On the GPU machine (Firecracker runtime: ncu reads the counters):
    ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file step.csv \\
        .dev/porter/porter bench ... --enforce-eager --batch 1 --steps 2
    python3 scripts/ncu_step.py step.csv [--layers N]

Each forward starts with the embedding kernel, so the kernels after the last `embedding_*`
launch are the last decode step's. ncu serialises the kernels, so the sum is the step's
device time without launch gaps; the gap share is the graphed step time minus this sum.
Prints the kernels grouped by name (the NVRTC name, template suffixes kept), with calls,
total µs, µs per call and share of the step.
"""
import argparse
import csv
import collections


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--layers", type=int, default=0, help="print µs per layer with this many layers too")
    a = ap.parse_args()
    rows = []
    with open(a.csv, newline="") as f:
        # ncu's log file may start with its own "==PROF==" lines before the CSV header.
        lines = [ln for ln in f if ln.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "nsecond")
        v = float(r["Metric Value"].replace(",", ""))
        scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}.get(unit, 1e-3)
        rows.append((r["Kernel Name"], v * scale))
    starts = [i for i, (n, _) in enumerate(rows) if n.startswith("embedding_")]
    if not starts:
        raise SystemExit("no embedding kernel found: not a porter forward?")
    step = rows[starts[-1]:]
    total = sum(us for _, us in step)
    agg = collections.OrderedDict()
    for n, us in step:
        c, s = agg.get(n, (0, 0.0))
        agg[n] = (c + 1, s + us)
    print(f"kernels in the last step: {len(step)}, device time {total:.1f} µs (kernels serialised, no gaps)")
    print(f"{'kernel':<60} {'calls':>5} {'µs':>9} {'µs/call':>8} {'share':>6}")
    for n, (c, s) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"{n[:60]:<60} {c:>5} {s:>9.1f} {s / c:>8.2f} {100 * s / total:>5.1f}%")


if __name__ == "__main__":
    main()
