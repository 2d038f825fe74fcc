#!/usr/bin/env python3
"""How far logits files (strata logits --out) are from a reference and from each other.

    logits_gap.py N_VOCAB REF.f32 LABEL=FILE.f32 [LABEL=FILE.f32 ...]

Prints, for each file against the reference and for every pair of files, the largest absolute difference over all
positions relative to the reference's largest |logit|, and at how many positions the argmax agrees. It settles whose
rounding moves the logits: a backend's whole-quantized file against the f32 file's logits, next to the other
backend's (bench/notes/fidelity.md)."""
import sys

import numpy as np


def load(path, n_vocab):
    a = np.fromfile(path, dtype="<f4")
    if a.size == 0 or a.size % n_vocab:
        sys.exit(f"logits_gap.py: {path} holds {a.size} floats, not a whole number of rows of {n_vocab}")
    return a.reshape(-1, n_vocab)


def gap(a, b, scale):
    if a.shape != b.shape:
        sys.exit(f"logits_gap.py: shapes differ: {a.shape} and {b.shape}")
    rel = float(np.abs(a - b).max()) / scale
    agree = int((a.argmax(axis=1) == b.argmax(axis=1)).sum())
    return f"{rel:.3e} of the largest logit, argmax {agree}/{a.shape[0]}"


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    n_vocab = int(sys.argv[1])
    ref = load(sys.argv[2], n_vocab)
    scale = float(np.abs(ref).max()) or 1.0
    files = []
    for arg in sys.argv[3:]:
        label, _, path = arg.partition("=")
        if not path:
            sys.exit(f"logits_gap.py: '{arg}' is not LABEL=FILE")
        files.append((label, load(path, n_vocab)))
    for label, a in files:
        print(f"{label} vs reference: {gap(a, ref, scale)}")
    for i, (la, a) in enumerate(files):
        for lb, b in files[i + 1:]:
            print(f"{la} vs {lb}: {gap(a, b, scale)}")


if __name__ == "__main__":
    main()
