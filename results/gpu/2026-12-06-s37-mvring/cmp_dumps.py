"""Compares two GRAPH_EMU_DUMP folders step logit for step logit, bit for bit:
    $MLX_ORACLE_VENV/bin/python cmp_dumps.py MAIN_DIR RING_DIR"""
import numpy as np, pathlib, sys
a, b = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])  # main's dumps, MV_RING's
fa, fb = sorted(p.name for p in a.glob("*.npy")), sorted(p.name for p in b.glob("*.npy"))
print(f"main dumps {len(fa)}, MV_RING dumps {len(fb)}, same names: {fa == fb}")
diff, fixtures = [], set()
for n in fa:
    x, y = np.load(a / n), np.load(b / n)
    fixtures.add(n.split("-row")[0])
    if x.shape != y.shape or x.tobytes() != y.tobytes():
        diff.append(n)
print(f"{len(fixtures)} fixtures, {len(fa)} step logits: {len(fa) - len(diff)} bit-equal, {len(diff)} differ")
for n in diff: print("  differs:", n)
sys.exit(1 if diff or fa != fb else 0)
