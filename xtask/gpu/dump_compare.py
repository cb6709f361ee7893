"""Compares two folders of graph_emulate.py's per-step logits (GRAPH_EMU_DUMP), bit for bit.

    python3 xtask/gpu/dump_compare.py REF_DIR NEW_DIR

Prints, per fixture, the steps found in both and how many are bit-equal (the .npy files'
arrays compared as raw bytes), and the files only one side has; exits 1 unless every common
step is equal and the sides hold the same files.
"""
import collections
import sys
from pathlib import Path

import numpy as np


def main():
    ref, new = Path(sys.argv[1]), Path(sys.argv[2])
    a = {p.name for p in ref.glob("*.npy")}
    b = {p.name for p in new.glob("*.npy")}
    per = collections.defaultdict(lambda: [0, 0])
    for name in sorted(a & b):
        x, y = np.load(ref / name), np.load(new / name)
        fixture = name.split("-row")[0]
        per[fixture][0] += 1
        per[fixture][1] += int(x.dtype == y.dtype and x.shape == y.shape
                               and x.tobytes() == y.tobytes())
    ok = a == b
    for fixture, (n, eq) in per.items():
        ok &= n == eq
        print(f"{fixture}: {eq} of {n} steps' logits bit-equal")
    for name in sorted(a ^ b):
        print(f"only in {'the reference' if name in a else 'the new side'}: {name}")
    print(f"total: {sum(e for _, e in per.values())} of {sum(n for n, _ in per.values())} "
          f"bit-equal {'ok' if ok else 'FAILED'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
