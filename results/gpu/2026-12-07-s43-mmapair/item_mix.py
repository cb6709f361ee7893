"""One tensor-core tile item's machine code, paired (MMA_PAIR) and not: its instruction mix, the
stall cycles the compiler set, the shared-memory instructions, and the issue bound, as session 37
read them (results/gpu/2026-12-06-s37-mmagap, section 1 term 3). No GPU needed.

    python3 results/gpu/2026-12-07-s43-mmapair/item_mix.py [--nb 16] [--kc 5120] [--min-blocks 1] [--no-ring] [--banks] [--dump DIR]

The item is what xtask/gpu/sass_ctrl.py prints: from the ring's wait (DEPBAR.LE) before the
item's first mma.sync to the next item's commit (LDGDEPBAR), the loop's straight path (the
epilogue is not in it). Without the ring (--no-ring): from the item's first instruction
after the branch past empty items to the next item's last scale/bias pack. Per build: registers and
spills of matvec and matvec_qkv (ptxas), then per item: instructions, HMMA, LDS (and their
widths), LDGSTS, the ALU and FMA pipes' instructions (s37's grouping), the sum of the stall
fields; then per rows block item (a pair item counts two): instructions and stalls.
"""
import argparse
import collections
import importlib.util
import pathlib
import re
import subprocess
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[3]
_s = importlib.util.spec_from_file_location("sass", ROOT / "xtask/gpu/sass.py")
S = importlib.util.module_from_spec(_s)
_s.loader.exec_module(S)
_c = importlib.util.spec_from_file_location("sass_ctrl", ROOT / "xtask/gpu/sass_ctrl.py")
SC = importlib.util.module_from_spec(_c)
_c.loader.exec_module(SC)

ALU = ("LOP3", "SHF", "ISETP", "LEA", "SEL", "IADD3", "VIADD", "PRMT", "MOV", "SHL", "UMOV",
       "ULOP3", "UIADD3", "PLOP3", "CS2R")
FMA = ("IMAD", "HFMA2", "FADD", "FMUL", "FFMA")


def build(nb, kc, mb, ring, banks, pair):
    src = (f"#define MV_ROWS 2\n#define MV_BATCH 4\n#define MV_EARLY 4\n#define NB {nb}\n"
           f"#define MV_MMA 1\n#define MMA_KC {kc}\n#define MV_MIN_BLOCKS {mb}\n#define MV_ASYNC 1\n"
           + ("#define MMA_ASYNC 1\n" if ring else "")
           + ("#define MMA_BANKS 1\n" if banks else "")
           + ("#define MMA_PAIR 1\n" if pair else "")
           + "".join((ROOT / "mlx-kernels/src" / f).read_text()
                     for f in ("graph_decode.cu", "graph_qk_norm.cu", "graph_gemma.cu", "graph_moe.cu")))
    cubin, log = S.compile_cubin(src)
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        text = subprocess.run([S.NVDISASM, "-hex", "-c", str(path)], check=True,
                              capture_output=True, text=True).stdout
    return text, log


def item(ins, ring):
    first = next(i for i, l in enumerate(ins) if "HMMA" in l and l.rstrip().endswith("RZ"))
    if ring:
        lo = next(i for i in range(first, 0, -1) if "DEPBAR.LE" in ins[i])
        hi = next(i for i in range(first, len(ins)) if "LDGDEPBAR" in ins[i])
    else:
        lo = next(i for i in range(first, 0, -1) if "BSSY B0" in ins[i] or "BRA" in ins[i])
        hi = next(i for i in range(first, len(ins)) if "PRMT" in ins[i] and "wait" in ins[i])
        hi = next((i for i in range(hi + 1, len(ins)) if "PRMT" not in ins[i]), hi)
    return ins[lo:hi + 1]


def mix(body):
    ops = collections.Counter()
    stall = 0
    lds = collections.Counter()
    for l in body:
        m = re.match(r"\S+ S(\d\d) .{16}\s*(@!?U?P\w+ )?([A-Z0-9_]+)(\.\S+)?", l)
        if not m:
            continue
        stall += int(m.group(1))
        op = m.group(3)
        ops[op] += 1
        if op == "LDS":
            lds[(m.group(4) or ".32").lstrip(".").split(".")[0]] += 1
    return ops, stall, lds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nb", type=int, default=16)
    ap.add_argument("--kc", type=int, default=5120)
    ap.add_argument("--min-blocks", type=int, default=1)
    ap.add_argument("--no-ring", action="store_true")
    ap.add_argument("--banks", action="store_true")
    ap.add_argument("--dump", help="a folder: each build's item as sass_ctrl prints it")
    a = ap.parse_args()
    ring = not a.no_ring
    rows = {}
    for pair in (False, True):
        text, log = build(a.nb, a.kc, a.min_blocks, ring, a.banks, pair)
        name = f"NB {a.nb}, KC {a.kc}, {a.min_blocks} block(s), ring {int(ring)}, banks {int(a.banks)}, pair {int(pair)}"
        print(f"== {name}")
        for k, regs, stack, st, ld in S.resources(log):
            if k in ("matvec", "matvec_qkv"):
                print(f"   {k:11} {regs:4} registers, {stack} bytes stack, spills {st} stored / {ld} loaded")
        ins = SC.annotate(text, "matvec")
        body = item(ins, ring)
        if a.dump:
            d = pathlib.Path(a.dump)
            d.mkdir(parents=True, exist_ok=True)
            (d / f"sass_ctrl_nb{a.nb}{'_ring' if ring else ''}{'_banks' if a.banks else ''}"
                 f"{'_pair' if pair else ''}.txt").write_text("\n".join(body) + "\n")
        ops, stall, lds = mix(body)
        n = sum(ops.values())
        alu = sum(v for k, v in ops.items() if k in ALU)
        fma = sum(v for k, v in ops.items() if k in FMA)
        local = ops["LDL"] + ops["STL"]
        per = 2 if pair else 1
        print(f"   an item ({per} rows block{'s' if pair else ''}): {n} instructions, HMMA {ops['HMMA']}, "
              f"LDS {ops['LDS']} ({', '.join(f'{w} {c}' for w, c in sorted(lds.items()))}), "
              f"LDGSTS {ops['LDGSTS']}, LDL/STL {local}, ALU {alu}, FMA pipe {fma}, stalls {stall} cycles")
        print(f"   top: {', '.join(f'{k} {v}' for k, v in ops.most_common(12))}")
        print(f"   a rows block's item: {n / per:.1f} instructions, {stall / per:.1f} stall cycles, "
              f"LDS {ops['LDS'] / per:.1f}; issue bound at 2 warps a scheduler: {2 * n / per:.0f} cycles")
        rows[pair] = (n / per, stall / per, ops["LDS"] / per)
    (n1, s1, l1), (n2, s2, l2) = rows[False], rows[True]
    print(f"== a rows block's item, pair against one: instructions {n2 / n1:.3f}x, stalls "
          f"{s2 / s1:.3f}x, LDS {l2 / l1:.3f}x")


if __name__ == "__main__":
    main()
