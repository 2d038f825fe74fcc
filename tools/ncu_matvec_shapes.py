#!/usr/bin/env python3
"""Splits the matrix-vector launches of an `ncu --csv --print-units base` report (scripts/gpu_ncu.sh) by launch shape:
the grid and the bytes read tell the products apart (a gathered expert launch has a grid.y of pairs). Prints launches,
GPU time, DRAM bytes and bandwidth per shape, slowest first. Reads the CSV on stdin or from a file."""
import collections
import csv
import sys


def main():
    src = open(sys.argv[1], newline="") if len(sys.argv) > 1 else sys.stdin
    lines = [line for line in src if line.startswith('"')]  # ncu's own messages are not CSV rows
    metrics = collections.defaultdict(dict)
    shape = {}
    for r in csv.DictReader(lines):
        if "matvec_kernel" not in r["Kernel Name"]:
            continue
        try:
            metrics[r["ID"]][r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
        except ValueError:
            pass
        shape[r["ID"]] = r["Grid Size"]
    groups = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for launch, m in metrics.items():
        mb = round(m.get("dram__bytes_read.sum", 0.0) / 1e6, 1)
        g = groups[(shape[launch], mb)]
        g[0] += 1
        g[1] += m.get("gpu__time_duration.sum", 0.0)
        g[2] += m.get("dram__bytes_read.sum", 0.0)
    print("| matvec grid | MB a launch | launches | us | us a launch | GB/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for (grid, mb), (n, ns, b) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        print(f"| {grid} | {mb} | {n} | {ns / 1e3:.1f} | {ns / n / 1e3:.2f} | {b / ns if ns else 0:.0f} |")


if __name__ == "__main__":
    main()
