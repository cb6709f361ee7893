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


def kind(text):
    """What an instruction of the loop does (its opcode and operands)."""
    o = op(text)
    if o.startswith(("FFMA", "FMUL")):
        return "product (FFMA/FMUL)"
    if o.startswith("FADD"):
        return "decode (FADD -2^23)" if "-8388608" in text else "sum (FADD)"
    if o.startswith("LOP3"):
        if ", 0xea," in text:
            return "decode (LOP3)"
        if "0xffff0000" in text:
            return "bf16->f32 (LOP3 hi)"
        return "integer"
    if o.startswith("IMAD.U32") and "0x10000" in text:
        return "bf16->f32 (IMAD lo)"
    if o.startswith(("IMAD.MOV", "MOV")):
        return "move"
    if o.startswith("LDS"):
        return o
    if o.startswith("LDG"):
        return "LDG"
    if o.startswith(("LDL", "STL")):
        return "spill (" + o.split(".")[0] + ")"
    if o.startswith("SHFL"):
        return "SHFL"
    if o.startswith(("BRA", "BSSY", "BSYNC")):
        return "branch"
    return "integer"


def blocks_an_sm(regs, threads=256):
    """Blocks of `threads` a multiprocessor by registers (allocated 8 a thread at a time)."""
    per = -(-regs // 8) * 8 * threads
    return 65536 // per


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
    total, inner = S.loops(plain, "matvec", 300)
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
    kinds = collections.Counter(kind(x[4]) for x in hot)
    out = {
        "kinds_an_item": {k: round(v / per, 1) for k, v in kinds.most_common()},
        "blocks_an_sm": blocks_an_sm(res["matvec"][0]),
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
        "_hot": hot,
        "_cold": cold,
    }
    return out


def pipe_of(o):
    """The pipe an instruction takes and for how many cycles of one scheduler: the integer
    ALU, the FMA pipes (FFMA/FADD/FMUL on either of heavy and lite, IMAD on heavy: 16 lanes
    each, 2 cycles a warp), MIO (LDS.128: 512 bytes at the SM's 128 a cycle, 4 cycles, a
    scheduler's share of 16 when all four load alike; 4-byte LDS 4; LDG.128 16, LDG.U16 4)."""
    if o.startswith(("FFMA", "FADD", "FMUL")):
        return "fma", 2
    if o.startswith("IMAD"):
        return "heavy", 2
    if o.startswith("LDS.128") or o.startswith("LDG.E.NA.128") or o.startswith("LDG.E.128"):
        return "mio", 16
    if o.startswith(("LDS", "LDG", "LDGSTS", "LDL", "STL", "SHFL")):
        return "mio", 4
    if o.startswith(("BRA", "BSSY", "BSYNC", "DEPBAR", "CS2R", "UMOV", "S2R", "NOP")):
        return None, 0
    return "alu", 2


def latency(o, L):
    if o.startswith("LDG") or o.startswith("LDGSTS"):
        return L
    if o.startswith("LDL"):
        return 35  # a spill's reload: from L1
    if o.startswith("LDS"):
        return 30
    return 20  # SHFL, MUFU, S2R and the other variable-latency ones


def simulate(trace, W, L, units=6):
    """Cycles for each of W warps on one scheduler to run `trace` `units` times: one
    instruction a cycle from a ready warp (loose round robin), each warp held for its
    instruction's stall count, waits on scoreboards until every load setting them has landed
    (LDS 30 cycles, LDG L), and the pipes' occupancy (pipe_of). Returns the cycles."""
    n = len(trace)
    dec = [(x[0], x[1], x[3], op(x[4])) for x in trace]
    pc = [0] * W
    done = [0] * W
    ready = [0] * W
    sb = [[0] * 6 for _ in range(W)]  # the latest landing of each scoreboard's loads
    free = {"alu": 0, "heavy": 0, "lite": 0, "mio": 0}
    cycle, last = 0, W - 1
    while min(done) < units:
        for k in range(W):
            w = (last + 1 + k) % W
            if done[w] >= units or ready[w] > cycle:
                continue
            stall, wsb, wmask, o = dec[pc[w]]
            if wmask and any(wmask >> b & 1 and sb[w][b] > cycle for b in range(6)):
                continue
            pipe, occ = pipe_of(o)
            if pipe == "fma":
                pipe = "heavy" if free["heavy"] <= cycle else "lite"
            if pipe and free[pipe] > cycle:
                continue
            if pipe:
                free[pipe] = cycle + occ
            ready[w] = cycle + max(1, stall)
            if wsb != 7:
                sb[w][wsb] = max(sb[w][wsb], cycle + latency(o, L))
            pc[w] += 1
            if pc[w] == n:
                pc[w] = 0
                done[w] += 1
            last = w
            break
        cycle += 1
    return cycle


def group_trace(a, per_lane):
    """One simulation unit's trace: lcm(per_lane, items a trip) items of the hot path, with the
    row group's end (one copy of the cold blocks: the unrolled loop has one a slot) once a
    row group."""
    import math
    per = max(a["items_a_trip"], 1)
    unit = per_lane * per // math.gcd(per_lane, per)
    cold = a["_cold"][: len(a["_cold"]) // per]
    return a["_hot"] * (unit // per) + cold * (unit // per_lane), unit


# The 8B (Llama-3.1-8B-shaped, 4-bit g64) parts: (name, layers, N rows, K) of each mat-vec.
PARTS = [("Qkv", 32, 6144, 4096), ("Output", 32, 4096, 4096), ("GateUp", 32, 28672, 4096),
         ("Down", 32, 4096, 14336), ("Head", 1, 128256, 4096)]
SCHEDULERS = 132 * 4
F = 1.755e9  # the H100 SXM's clock under this load (as s31-s37's models)
# H100, main, results/gpu/2026-12-06-s38-h100/call1 (1 row: the `on` side) and s37-h100 call 4
# (5 rows: the `ffma` side, MLX_GRAPH_BATCH_MMA=99; `ring`: MLX_GRAPH_MV_RING=1): us a step.
MEASURED = {
    "1 row": {"Qkv": 380.2, "Output": 226.3, "GateUp": 994.3, "Down": 513.9, "Head": 117.6},
    "5 rows": {"Qkv": 1114.8, "Output": 614.5, "GateUp": 3039.4, "Down": 1630.9, "Head": 377.3},
    "5 rows ring": {"Qkv": 1039.5, "Output": 592.5, "GateUp": 3086.5, "Down": 1583.0,
                    "Head": 325.4},
}
# The rest of the 5-row step (embed, attention, argmax; s37-h100 call 4) and the step's gap
# over its parts (the step 7,599 us at 131.6 steps/s against the parts' 7,023).
REST5 = 10.4 + 225.3 + 10.7
GAP5 = 1e6 / 131.6 - 7023.3


def warps_a_scheduler(a, k):
    """Warps a scheduler: 8 a block, the blocks a multiprocessor its registers allow (and, at
    5 rows, the inputs: K 14,336 x 5 sequences fill the shared memory for one block)."""
    blocks = a["blocks_an_sm"]
    if a["nb"] > 1 and k > 4096:
        blocks = 1
    if a["min_blocks"] is None and a["nb"] == 1:
        blocks = min(blocks, 2)
    return 2 * blocks


def items_a_scheduler(a, n, layers, k):
    per_lane = k // 1024  # chunks of 32 codes a lane a row
    return layers * n / a["rows"] * per_lane / SCHEDULERS, per_lane


def cycles_an_item(a, per_lane, W, L, cache={}):
    key = (a["nb"], a["rows"], a["batch"], a["min_blocks"], a["mv_nb"], a["ring"], per_lane, W, L)
    if key not in cache:
        tr, unit = group_trace(a, per_lane)
        cache[key] = simulate(tr, W, L, units=4) / (unit * 4 * W)
    return cache[key]


def part_us(a, part, L):
    name, layers, n, k = part
    items, per_lane = items_a_scheduler(a, n, layers, k)
    W = warps_a_scheduler(a, k)
    return items * cycles_an_item(a, per_lane, W, L) / F * 1e6


VARIANTS = [
    ("1 row (main)", dict(nb=1)),
    ("5 rows (main)", dict(nb=5)),
    ("5 rows, MV_RING", dict(nb=5, ring=True)),
    ("5 rows, MV_NB", dict(nb=5, mv_nb=True)),
    ("5 rows, 4 rows a warp", dict(nb=5, rows=4)),
    ("5 rows, 4 rows a warp, MV_NB", dict(nb=5, rows=4, mv_nb=True)),
    ("5 rows, MV_MIN_BLOCKS 2, 2 chunks", dict(nb=5, min_blocks=2, batch=2)),
    ("5 rows, MV_MIN_BLOCKS 2, 2 chunks, MV_NB", dict(nb=5, min_blocks=2, batch=2, mv_nb=True)),
    ("2 rows (main)", dict(nb=2)), ("2 rows, MV_NB", dict(nb=2, mv_nb=True)),
    ("8 rows (main)", dict(nb=8)), ("8 rows, MV_NB", dict(nb=8, mv_nb=True)),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    got = {}
    for label, v in VARIANTS:
        r = analyse(**v)
        got[label] = r
        print(f"== {label}: matvec {r['matvec_registers']} registers ({r['matvec_spill_bytes']} B "
              f"spilled; {r['blocks_an_sm']} blocks of 256 an SM by registers), matvec_qkv "
              f"{r['matvec_qkv_registers']}; the 4-bit loop {r['loop_instructions']} instructions, "
              f"{r['items_a_trip']} item(s) a trip")
        print(f"   an item ({r['weights_an_item']} weights a lane): {r['hot_instructions_an_item']:.0f} "
              f"instructions ({r['instructions_a_weight']:.2f} a weight, "
              f"{r['instructions_a_weight_and_sequence']:.2f} a weight and sequence), "
              f"{r['hot_stall_cycles_an_item']:.0f} stall cycles alone; row group's end "
              f"{r['epilogue_instructions_a_group'] // max(r['items_a_trip'], 1)} instructions")
        print(f"   by kind: {r['kinds_an_item']}")
        print(f"   LDS: {r['lds_an_item']}; each weight load waited for after (instructions, "
              f"stall cycles): {sorted(set(map(tuple, r['load_covers'])))} {r['depbar'][:1]}")
    # L: the latency of a weight load, fitted to main's 5-row GateUp (its items alone).
    base = got["5 rows (main)"]
    gate = PARTS[2]
    lo, hi = 0.0, 6000.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if part_us(base, gate, mid) < MEASURED["5 rows"]["GateUp"] else (lo, mid)
    L = round(lo)
    print(f"\nL fitted to main's 5-row GateUp ({MEASURED['5 rows']['GateUp']:,} us): {L} cycles "
          f"({L / F * 1e6:.2f} us at {F / 1e9} GHz)")
    print("\nThe model's items alone, us a step (measured in brackets), and each build's 5-row "
          "step predicted as main's measured parts plus the difference of the model's items:")
    print("| build | warps a scheduler (K 4,096 / 14,336) | " + " | ".join(p[0] for p in PARTS)
          + " | mat-vecs | 5-row step predicted |")
    print("|---|---|" + "---|" * (len(PARTS) + 2))
    table = []
    for label, _ in VARIANTS:
        a = got[label]
        meas = (MEASURED["1 row"] if label.startswith("1 row") else MEASURED["5 rows"]
                if label == "5 rows (main)" else MEASURED["5 rows ring"]
                if label == "5 rows, MV_RING" else None)
        cells, tot, step = [], 0.0, None
        for part in PARTS:
            t = part_us(a, part, L)
            tot += t
            cells.append(f"{t:,.0f}" + (f" ({meas[part[0]]:,.0f})" if meas else ""))
        if label.startswith("5 rows"):
            step = sum(MEASURED["5 rows"][p[0]] + part_us(a, p, L) - part_us(base, p, L)
                       for p in PARTS) + REST5 + GAP5
        w = f"{warps_a_scheduler(a, 4096)} / {warps_a_scheduler(a, 14336)}"
        print(f"| {label} | {w} | " + " | ".join(cells) + f" | {tot:,.0f} | "
              + (f"{step:,.0f}" if step else "") + " |")
        table.append({"build": label, "model_us": tot, "step_5rows_predicted_us": step})
    print(f"\n5-row step measured (main, H100): {1e6 / 131.6:,.0f} us; one-row step "
          f"{1e6 / 338.5:,.0f} us; #33's target for the verify: <= ~3,900 us")
    if args.json:
        clean = [{k: v for k, v in got[lbl].items() if not k.startswith("_")} for lbl, _ in VARIANTS]
        pathlib.Path(args.json).write_text(json.dumps({"L_cycles": L, "variants": clean,
                                                       "table": table}, indent=1))


if __name__ == "__main__":
    main()
