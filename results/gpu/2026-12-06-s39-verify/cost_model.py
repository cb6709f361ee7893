"""The FFMA row kernels' 4-bit loop (graph_decode.cu's mv_run, the kernel `matvec`) read from its
sm_90 machine code, and a cost model of the 8B verify step from it. No GPU needed.

    python3 results/gpu/2026-12-06-s39-verify/cost_model.py [--variants all|default] [--json FILE]

Each variant is compiled as the decoder compiles its step source (xtask/gpu/sass.py's NVRTC
options and #defines: MV_ROWS, MV_BATCH, NB, MV_MIN_BLOCKS, MV_ASYNC 1 as main's default, and
MV_NB for the switch MLX_GRAPH_MV_NB=1) and disassembled with control bits (nvdisasm -hex; the
bits as xtask/gpu/sass_ctrl.py reads them). The 4-bit loop is the innermost loop of `matvec` whose
longest block has the most FFMA (the WMAP_ONE 4-bit loop: q/k/v, o, down, the head; the SwiGLU
pair loop is the same item body). Counted, per item (one 16-byte chunk of each of MV_ROWS rows,
32 codes a row: 32 MV_ROWS weights a lane) on the loop's hot path (every block but the row
group's end: the blocks holding SHFL, MUFU, STG or CALL, run once a row group):
  instructions by kind, LDS by width, the static stall cycles (the control bits' stall counts:
  what one warp alone needs to issue them), and for each 16-byte weight load (LDG.128) the
  instructions and stall cycles between it and the first instruction waiting on its
  scoreboard (its cover).
The epilogue (the blocks run once a row group) is counted apart.

The model (per scheduler: W warps = 8 warps a block x blocks a multiprocessor / 4 schedulers):
a warp's trip (the items between two waits on a weight load) issues I instructions needing S
stall cycles alone; each weight load is waited for after `cover` instructions of the warp; a
load takes L cycles (the memory's loaded latency, fitted below). With W warps on a scheduler the
cover lasts ~W x cover issue cycles (the others issue in between), so the wait exposed a trip is
E = max(0, L - W x cover_cycles). A scheduler then finishes W trips in
max(W x I, S + E) cycles (issue-bound, or each warp's own chain + exposed latency), and a part
of the step takes trips x that / W / 528 schedulers / f. L is fitted to main's measured 5-row
GateUp (results/gpu/2026-12-06-s38-h100/call1: s37's ffma side), then checked against the
others measured (1 row, 5 rows' other parts, the ring side) and used to predict MV_NB.
"""
import argparse
import collections
import hashlib
import importlib.util
import os
import json
import pathlib
import re
import subprocess
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("sass", ROOT / "xtask/gpu/sass.py")
S = importlib.util.module_from_spec(spec)
spec.loader.exec_module(S)

CACHE = pathlib.Path(os.environ.get("S39_CACHE", "/tmp/s39_sass"))
SOURCES = ("graph_decode.cu", "graph_qk_norm.cu", "graph_gemma.cu", "graph_moe.cu")


def source(nb, rows=2, batch=None, min_blocks=None, mv_nb=False, ring=False):
    batch = batch or 8 // rows
    return (f"#define MV_ROWS {rows}\n#define MV_BATCH {batch}\n#define MV_EARLY {batch}\n"
            f"#define NB {nb}\n#define MV_MMA 0\n#define MMA_KC 0\n"
            + (f"#define MV_MIN_BLOCKS {min_blocks}\n" if min_blocks else "")
            + "#define MV_ASYNC 1\n"
            + ("#define MV_RING 1\n" if ring else "")
            + ("#define MV_NB 1\n" if mv_nb else "")
            + "".join((ROOT / "mlx-kernels/src" / f).read_text() for f in SOURCES))


def disassemble(src):
    """(nvdisasm -hex, nvdisasm, ptxas's log) of the source, kept under CACHE by its hash."""
    key = hashlib.sha256(src.encode()).hexdigest()[:16]
    d = CACHE / key
    if not (d / "log").exists():
        cubin, log = S.compile_cubin(src)
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            path = pathlib.Path(tmp) / "k.cubin"
            path.write_bytes(cubin)
            for name, args in (("hex", ["-hex"]), ("sass", [])):
                (d / name).write_text(subprocess.run([S.NVDISASM, *args, "-c", str(path)],
                                                     check=True, capture_output=True,
                                                     text=True).stdout)
        (d / "log").write_text(log)
    return (d / "hex").read_text(), (d / "sass").read_text(), (d / "log").read_text()


def annotate(text, kernel):
    """(stall, write sb, read sb, wait mask, instruction) for each instruction of `kernel`."""
    lines = text.split("\n")
    start = next(i for i, l in enumerate(lines) if l.startswith(f".text.{kernel}:"))
    out, i = [], start
    while i < len(lines):
        line = lines[i]
        if line.startswith("//----") and i > start:
            break
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?);\s+/\* (0x[0-9a-f]+) \*/", line)
        if m:
            hi = int(re.search(r"/\* (0x[0-9a-f]+) \*/", lines[i + 1]).group(1), 16)
            out.append(((hi >> 41) & 0xF, (hi >> 46) & 7, (hi >> 49) & 7, (hi >> 52) & 0x3F,
                        m.group(2).strip()))
            i += 2
            continue
        i += 1
    return out


def op(text):
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]


def blocks_of(body):
    """Basic blocks (split after branches and at BSSY/BSYNC) of the loop's instructions."""
    out, cur = [], []
    for ins in body:
        cur.append(ins)
        if re.search(r"\bBRA\b|EXIT|BSYNC|WARPSYNC|\bCALL\b", ins[4]):
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


COLD = re.compile(r"\bSHFL\b|\bMUFU\b|\bSTG\b|\bCALL\b")


def analyse(nb, rows=2, batch=None, min_blocks=None, mv_nb=False, ring=False):
    src = source(nb, rows, batch, min_blocks, mv_nb, ring)
    hx, plain, log = disassemble(src)
    res = {n: (r, st, ld) for n, r, _, st, ld in S.resources(log)}
    ins = annotate(hx, "matvec")
    total, inner = S.loops(plain, "matvec", 1000)
    best = None
    for s, j, _ in inner:
        body = ins[s:j + 1]
        bl = blocks_of(body)
        top = max(sum(op(x[4]).startswith("FFMA") for x in b) for b in bl)
        lop = max(sum(op(x[4]).startswith("LOP3") for x in b) for b in bl)
        key = (lop, top)  # the 4-bit loop: the most decoding (LOP3) in one item's block
        if best is None or key > best[0]:
            best = (key, s, j, body, bl)
    _, s, j, body, bl = best
    ffma_top = best[0][1]
    items = sum(1 for b in bl if sum(op(x[4]).startswith("FFMA") for x in b) >= ffma_top // 2
                and ffma_top > 0)
    # Ring builds sum one item a trip; a block of several items' FFMA counts as their number.
    hot = [x for b in bl if not any(COLD.search(x[4]) for x in b) for x in b]
    cold = [x for b in bl if any(COLD.search(x[4]) for x in b) for x in b]
    mix = collections.Counter(op(x[4]).split(".")[0] for x in hot)
    lds = collections.Counter(op(x[4]) for x in hot if op(x[4]).startswith("LDS"))
    stall = sum(x[0] for x in hot)
    # Each 16-byte weight load: the instructions (and stall cycles) until the first instruction
    # waiting on its scoreboard, around the loop (the loop's body repeated once).
    covers = []
    ring_body = body + body
    for i, x in enumerate(body):
        o = op(x[4])
        if (o.startswith("LDG") and ".128" in o) or o.startswith("LDGSTS"):
            sb = x[1]
            if sb == 7:
                continue
            n, cyc = 0, 0
            for y in ring_body[i + 1:]:
                if y[3] >> sb & 1:
                    break
                if COLD.search(y[4]):
                    continue
                n += 1
                cyc += y[0]
            covers.append((n, cyc))
    # The ring's waits (cp.async.wait_group): its cover is the ring's depth in items.
    depbar = [x[4] for x in body if "DEPBAR" in x[4]]
    per = 1 if items == 0 else items
    weights = 32 * rows
    out = {
        "nb": nb, "rows": rows, "batch": batch or 8 // rows, "min_blocks": min_blocks,
        "mv_nb": mv_nb, "ring": ring,
        "matvec_registers": res["matvec"][0], "matvec_spill_bytes": res["matvec"][1] + res["matvec"][2],
        "matvec_qkv_registers": res.get("matvec_qkv", (0,))[0],
        "loop_instructions": j - s + 1, "items_a_trip": items,
        "hot_instructions_an_item": len(hot) / per,
        "hot_stall_cycles_an_item": stall / per,
        "epilogue_instructions_a_group": len(cold),
        "mix_an_item": {k: round(v / per, 1) for k, v in mix.most_common()},
        "lds_an_item": {k: round(v / per, 1) for k, v in lds.items()},
        "instructions_a_weight": len(hot) / per / weights,
        "instructions_a_weight_and_sequence": len(hot) / per / weights / nb,
        "load_cover_instructions_min": min((c[0] for c in covers), default=None),
        "load_cover_cycles_min": min((c[1] for c in covers), default=None),
        "load_covers": covers,
        "depbar": depbar,
        "weights_an_item": weights,
    }
    return out


# The 8B (Llama-3.1-8B-shaped, 4-bit g64) parts: (name, layers, N rows, K) of each mat-vec.
PARTS = [("Qkv", 32, 6144, 4096), ("Output", 32, 4096, 4096), ("GateUp", 32, 28672, 4096),
         ("Down", 32, 4096, 14336), ("Head", 1, 128256, 4096)]
SCHEDULERS = 132 * 4
F = 1.755e9  # the H100 SXM's clock under this load (as s31-s37's models)


def part_time(a, name, layers, n, k, L, warps_per_sched):
    rows = a["rows"]
    groups = layers * n / rows
    per_lane = k / 32 / 32  # chunks of 32 codes a lane a row (K / 32 chunks over 32 lanes)
    items = groups * per_lane  # warp-items
    per = max(a["items_a_trip"], 1)
    trips = items / per
    I = a["hot_instructions_an_item"] * per
    Sx = a["hot_stall_cycles_an_item"] * per
    W = warps_per_sched
    cover = (a["load_cover_cycles_min"] or 0)
    if a["ring"]:
        cover = a["hot_stall_cycles_an_item"] * 2  # the ring waits for the item 2 back (depth 3)
    E = max(0.0, L - W * cover)
    per_trips = max(W * I, Sx + E)  # cycles a scheduler needs for W trips
    epi = groups * a["epilogue_instructions_a_group"] * 0.5  # about half the cold path runs
    cycles = trips * per_trips / W / SCHEDULERS + epi / SCHEDULERS
    return cycles / F * 1e6


def warps(a):
    if a["nb"] == 1:
        return 4  # two blocks of 8 warps an SM (MV_MIN_BLOCKS 2)
    return 2 * (a["min_blocks"] or 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    a_ = ap.parse_args()
    variants = [
        dict(nb=1), dict(nb=5), dict(nb=5, ring=True), dict(nb=5, mv_nb=True),
        dict(nb=5, rows=4), dict(nb=5, rows=4, mv_nb=True),
        dict(nb=5, min_blocks=2, batch=2), dict(nb=5, min_blocks=2, batch=2, mv_nb=True),
        dict(nb=2), dict(nb=2, mv_nb=True), dict(nb=8), dict(nb=8, mv_nb=True),
    ]
    res = []
    for v in variants:
        r = analyse(**v)
        res.append(r)
        name = " ".join(f"{k}={val}" for k, val in v.items())
        print(f"== {name}: matvec {r['matvec_registers']} registers ({r['matvec_spill_bytes']} B "
              f"spilled), matvec_qkv {r['matvec_qkv_registers']}; 4-bit loop "
              f"{r['loop_instructions']} instructions, {r['items_a_trip']} items a trip")
        print(f"   an item ({r['weights_an_item']} weights a lane): {r['hot_instructions_an_item']:.0f} "
              f"instructions, {r['hot_stall_cycles_an_item']:.0f} stall cycles alone; "
              f"{r['instructions_a_weight']:.2f} a weight, {r['instructions_a_weight_and_sequence']:.2f} "
              f"a weight and sequence; epilogue {r['epilogue_instructions_a_group']} a row group")
        print(f"   mix an item: {r['mix_an_item']}")
        print(f"   LDS an item: {r['lds_an_item']}; weight loads' cover (instructions, stall cycles): "
              f"{r['load_covers']} {r['depbar'][:2]}")
    by = {(r["nb"], r["rows"], r["min_blocks"], r["mv_nb"], r["ring"]): r for r in res}
    # Fit L to main's 5-row GateUp (s38-h100 call1's ffma side: 3,039.4 us).
    base5 = by[(5, 2, None, False, False)]
    measured = {1: {"Qkv": 380.2, "Output": 226.3, "GateUp": 994.3, "Down": 513.9, "Head": 117.6},
                5: {"Qkv": 1114.8, "Output": 614.5, "GateUp": 3039.4, "Down": 1630.9, "Head": 377.3}}
    ring5 = {"Qkv": 1039.5, "Output": 592.5, "GateUp": 3086.5, "Down": 1583.0, "Head": 325.4}
    lo, hi = 0.0, 40000.0
    for _ in range(60):
        mid = (lo + hi) / 2
        t = part_time(base5, "GateUp", 32, 28672, 4096, mid, warps(base5))
        lo, hi = (mid, hi) if t < 3039.4 else (lo, mid)
    L = lo
    print(f"\nL fitted to main's 5-row GateUp (3,039.4 us): {L:.0f} cycles ({L / F * 1e6:.2f} us)")
    rowsets = [("1 row, main (MV_MIN_BLOCKS 2)", by[(1, 2, None, False, False)], measured[1]),
               ("5 rows, main", base5, measured[5]),
               ("5 rows, MV_RING", by[(5, 2, None, False, True)], ring5),
               ("5 rows, MV_NB", by[(5, 2, None, True, False)], None),
               ("5 rows, 4 rows a warp", by[(5, 4, None, False, False)], None),
               ("5 rows, 4 rows a warp, MV_NB", by[(5, 4, None, True, False)], None),
               ("5 rows, MV_MIN_BLOCKS 2, 2 chunks", by[(5, 2, 2, False, False)], None),
               ("5 rows, MV_MIN_BLOCKS 2, 2 chunks, MV_NB", by[(5, 2, 2, True, False)], None)]
    print("| build | W | " + " | ".join(p[0] for p in PARTS) + " | mat-vecs |")
    print("|---|---|" + "---|" * (len(PARTS) + 1))
    table = []
    for label, a, meas in rowsets:
        cells, tot, mtot = [], 0.0, 0.0
        for name, layers, n, k in PARTS:
            w = warps(a)
            if a["min_blocks"] == 2 and k > 4096:
                w = 2  # down's 5 inputs (152 KB) leave room for one block
            t = part_time(a, name, layers, n, k, L, w)
            tot += t
            if meas:
                mtot += meas[name]
                cells.append(f"{t:,.0f} ({meas[name]:,.0f})")
            else:
                cells.append(f"{t:,.0f}")
        m = f"{tot:,.0f}" + (f" ({mtot:,.0f})" if meas else "")
        print(f"| {label} | {warps(a)} | " + " | ".join(cells) + f" | {m} |")
        table.append({"build": label, "predicted_us": tot, "measured_us": mtot or None})
    if a_.json:
        pathlib.Path(a_.json).write_text(json.dumps({"L_cycles": L, "variants": res,
                                                     "table": table}, indent=1))


if __name__ == "__main__":
    main()
