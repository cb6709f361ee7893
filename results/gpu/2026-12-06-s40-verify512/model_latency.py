"""The switch's cycles an item against a weight load's latency L in the recalibrated simulator
(model.py: stall counts x 2.0; L fitted 0 on the W = 2 builds, whose 2-4 items in flight a lane
hide it; the switch keeps 1 in flight, its load issued after the item before is summed, so its
wait is the other 3 warps' work). Uses model.py's (cached) builds.

    NVRTC_LIB=... NVDISASM=... python3 results/gpu/2026-12-06-s40-verify512/model_latency.py
"""
import importlib.util
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("model", HERE / "model.py")
M = importlib.util.module_from_spec(spec)
spec.loader.exec_module(M)
C = M.C
K = 2.0
F = C.F
meas = {2: (3059.9 + 3049.1) / 2 * 1e-6 * F / M.ITEMS["GateUp"],
        4: 2420.2 * 1e-6 * F / (M.ITEMS["GateUp"] / 2)}


def cyc(b, W, L):
    a = dict(b["_a"])
    a["_hot"] = [(max(0, round(x[0] * K)),) + tuple(x[1:]) for x in a["_hot"]]
    a["_cold"] = [(max(0, round(x[0] * K)),) + tuple(x[1:]) for x in a["_cold"]]
    tr, unit = C.group_trace(a, 4)
    return C.simulate(tr, W, L, units=3) / (unit * 3 * W)


print("| build | warps a scheduler | L = 0 | 600 | 1,206 | 1,800 cycles | default measured |")
print("|---|---|---|---|---|---|---|")
for rows in (2, 4):
    d = M.analyse(5, rows=rows)
    w = M.analyse(5, batch=1, wide=True, rows=rows)
    for name, b, W in ((f"default, {rows} rows a warp", d, 2), (f"MV_WIDE, {rows} rows a warp", w, 4)):
        cells = [cyc(b, W, L) for L in (0, 600, 1206, 1800)]
        print(f"| {name} | {W} | " + " | ".join(f"{c:,.0f} ({c / meas[rows]:.2f})" for c in cells)
              + f" | {meas[rows]:,.0f} |")

# The step: the base's measured step with each mat-vec part's item time (session 39's item model
# of the base) scaled by the switch's GateUp ratio (model / base measured), fixed costs kept.
print("\n| 5 rows, 8B, H100 | L | GateUp ratio | step us predicted | against the base measured |")
print("|---|---|---|---|---|")
for rows, base_key, items in ((2, "5 rows (main)", M.S39_ITEMS_5),
                              (4, "5 rows, 4 rows a warp (s40)", M.S39_ITEMS_5_R4)):
    w = M.analyse(5, batch=1, wide=True, rows=rows)
    base = M.MEAS[base_key]["step"]
    for L in (0, 600, 1206):
        r = cyc(w, 4, L) / meas[rows]
        step = base + sum(items.values()) * (r - 1)
        print(f"| MV_WIDE, {rows} rows a warp, against {base_key} ({base:,.0f} us) | {L} | "
              f"{r:.3f} | {step:,.0f} | {step / base - 1:+.1%} |")
