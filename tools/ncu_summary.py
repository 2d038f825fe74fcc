#!/usr/bin/env python3
"""Sums an `ncu --csv --print-units base` report of one decode window by kernel: launches, GPU time, DRAM bytes and
the bandwidth each kernel reached; then splits the matrix-vector launches by shape (grid and bytes read: a gathered
expert launch has a grid.y of pairs). Written for scripts/gpu_ncu.sh; reads the CSV on stdin or from a file."""
import collections
import csv
import re
import sys


def short_name(name):
    name = re.sub(r"\(.*$", "", name)            # parameters
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"strata::cuda::(kernels::)?", "", name)
    name = re.sub(r"\(anonymous namespace\)::", "", name)
    return name[:90]


def main():
    src = open(sys.argv[1], newline="") if len(sys.argv) > 1 else sys.stdin
    lines = [line for line in src if line.startswith('"')]  # ncu's own messages are not CSV rows
    rows = csv.DictReader(lines)
    per_launch = collections.defaultdict(dict)
    grid = {}
    for r in rows:
        key = (r["ID"], r["Kernel Name"])
        grid[key] = r["Grid Size"]
        try:
            per_launch[key][r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
        except ValueError:
            pass
    by_kernel = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for (_, name), m in per_launch.items():
        k = by_kernel[short_name(name)]
        k[0] += 1
        k[1] += m.get("gpu__time_duration.sum", 0.0)
        k[2] += m.get("dram__bytes_read.sum", 0.0) + m.get("dram__bytes_write.sum", 0.0)
    total_ns = sum(v[1] for v in by_kernel.values()) or 1.0
    total_bytes = sum(v[2] for v in by_kernel.values())
    print(f"{len(per_launch)} launches, {total_ns / 1e3:.1f} us of kernel time, {total_bytes / 1e6:.1f} MB of DRAM "
          f"traffic ({total_bytes / total_ns:.0f} GB/s over the kernel time)")
    print("| kernel | launches | us | share | us a launch | MB | GB/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, (n, ns, b) in sorted(by_kernel.items(), key=lambda kv: -kv[1][1]):
        print(f"| {name} | {n} | {ns / 1e3:.1f} | {100 * ns / total_ns:.1f}% | {ns / n / 1e3:.2f} | {b / 1e6:.1f} | "
              f"{b / ns if ns else 0:.0f} |")

    shapes = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for key, m in per_launch.items():
        if short_name(key[1]) != "matvec_kernel":
            continue
        read = m.get("dram__bytes_read.sum", 0.0)
        v = shapes[(grid[key], round(read / 1e6, 1))]
        v[0] += 1
        v[1] += m.get("gpu__time_duration.sum", 0.0)
        v[2] += read
    if shapes:
        print()
        print("| matvec grid | MB a launch | launches | us | us a launch | GB/s |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for (g, mb), (n, ns, b) in sorted(shapes.items(), key=lambda kv: -kv[1][1]):
            print(f"| {g} | {mb} | {n} | {ns / 1e3:.1f} | {ns / n / 1e3:.2f} | {b / ns if ns else 0:.0f} |")


if __name__ == "__main__":
    main()
