"""Compares two GRAPH_EMU_DUMP folders of xtask/gpu/graph_emulate.py (each step's logits, one
.npy a row and position) bit for bit: python cmp.py BASE NEW."""
import numpy as np, os, sys
base, new = sys.argv[1], sys.argv[2]
n = eq = 0
for f in sorted(os.listdir(new)):
    if not os.path.exists(os.path.join(base, f)):
        print(f, "no base"); continue
    a = np.load(os.path.join(base, f)); b = np.load(os.path.join(new, f))
    n += 1; same = a.tobytes() == b.tobytes(); eq += same
    if not same: print(f, "DIFFER", float(np.max(np.abs(a - b))))
print(f"{eq}/{n} step logits bit-equal")
