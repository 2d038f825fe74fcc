#!/usr/bin/env python3
"""Compares `strata perplexity --jsonl` runs of the same files: one baseline and one or more arms.

For each arm: the mean NLL per token (all files' tokens together), how often its top-1 token equals the baseline's,
and the change of the mean NLL against the baseline with a 95% bootstrap interval over the files (files resampled with
replacement, the token-weighted mean recomputed; a change whose interval holds 0 is not resolved by these files).
Usage: tools/nll_compare.py BASELINE.jsonl NAME=ARM.jsonl [NAME=ARM.jsonl ...] [--resamples N] [--seed S]
Standard library only (the GPU machine has no package registry).
"""
import argparse
import json
import random
import sys


def load(path):
    rows = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                rows[row["file"]] = (int(row["tokens"]), float(row["nll_sum"]), row["argmax"])
            except (ValueError, KeyError, TypeError) as e:
                sys.exit(f"nll_compare: {path}:{number}: not a strata perplexity line ({e})")
    if not rows:
        sys.exit(f"nll_compare: {path} holds no files")
    return rows


def weighted_mean(files, table):
    return sum(table[f][1] for f in files) / sum(table[f][0] for f in files)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("baseline")
    ap.add_argument("arms", nargs="+", help="NAME=FILE.jsonl")
    ap.add_argument("--resamples", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    base = load(args.baseline)
    files = sorted(base)
    print(f"baseline {args.baseline}: {len(files)} files, {sum(base[f][0] for f in files)} tokens, "
          f"mean NLL {weighted_mean(files, base):.4f}")
    print("| arm | mean NLL | change | 95% bootstrap interval over files | top-1 same as baseline |")
    print("| --- | ---: | ---: | --- | ---: |")
    for spec in args.arms:
        name, sep, path = spec.partition("=")
        if not sep:
            sys.exit(f"nll_compare: arm '{spec}' is not NAME=FILE.jsonl")
        arm = load(path)
        if sorted(arm) != files:
            sys.exit(f"nll_compare: {path} scores other files than the baseline")
        same = total = 0
        for f in files:
            if arm[f][0] != base[f][0]:
                sys.exit(f"nll_compare: {path} scores {arm[f][0]} tokens of {f}, the baseline {base[f][0]}")
            same += sum(a == b for a, b in zip(arm[f][2], base[f][2]))
            total += arm[f][0]
        change = weighted_mean(files, arm) - weighted_mean(files, base)
        rng = random.Random(args.seed)
        changes = []
        for _ in range(args.resamples):
            pick = [rng.choice(files) for _ in files]
            changes.append(weighted_mean(pick, arm) - weighted_mean(pick, base))
        changes.sort()
        low = changes[int(0.025 * len(changes))]
        high = changes[min(len(changes) - 1, int(0.975 * len(changes)))]
        print(f"| {name} | {weighted_mean(files, arm):.4f} | {change:+.5f} | {low:+.5f} to {high:+.5f} | "
              f"{100.0 * same / total:.1f}% |")


if __name__ == "__main__":
    main()
