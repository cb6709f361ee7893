"""Compares two GRAPH_EMU_DUMP folders bit for bit: every step's logits of every fixture."""
import sys
from pathlib import Path
import numpy as np
a, b = Path(sys.argv[1]), Path(sys.argv[2])
fa, fb = sorted(p.name for p in a.glob("*.npy")), sorted(p.name for p in b.glob("*.npy"))
assert fa == fb, (set(fa) ^ set(fb))
same = 0
for n in fa:
    x, y = np.load(a / n), np.load(b / n)
    eq = x.shape == y.shape and np.array_equal(x.view(np.uint32), y.view(np.uint32))
    same += eq
    if not eq:
        print("DIFFER", n, int(np.sum(x.view(np.uint32) != y.view(np.uint32))), "of", x.size)
fx = sorted({n.rsplit("-row", 1)[0] for n in fa})
print(f"{a.name} vs {b.name}: {same}/{len(fa)} step logits bit-equal ({len(fx)} fixtures: {', '.join(fx)})")
