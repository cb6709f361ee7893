"""sm_90 SASS with each instruction's control bits decoded (stall cycles, the scoreboard it sets
on write W<n> and on read R<n>, the scoreboards it waits for: wait<ns>), for the first
tensor-core tile item of a kernel: what an item waits for.

    python3 xtask/gpu/sass_ctrl.py [--nb 16] [--kc 6144] [--min-blocks 1] [--mma-async] [--mma-banks] [--mma-pair] [--kernel matvec]
    python3 xtask/gpu/sass_ctrl.py --ffma [--nb 1] [--mv-async] [--kernel matvec,matvec_qkv]

Compiles as sass.py does (NVRTC_LIB, NVDISASM), disassembles with `nvdisasm -hex` and reads the
control bits from the upper 64-bit word of each 128-bit instruction (Volta and later: bits
41-44 stall, 45 yield, 46-48 write scoreboard, 49-51 read scoreboard, 52-57 wait mask; 7 = none).
Prints the instructions from the item's first load wait to its loads of the next item: with the
register loads (main) the scale/bias loads' PRMT waits on their own scoreboard right after
issue, and every weight load of the 8 items in flight shares one scoreboard; with the ring
(--mma-async) the item waits with DEPBAR.LE SB0, 5 (its own cp.async group) only.

--ffma: the FFMA row kernels instead (MV_MMA 0: mv_run, the one-row step at --nb 1, the verify
rows at --nb 5; rows 2, 4 items in flight, as the decoder's defaults). For each innermost loop of
1,000 or more instructions of each --kernel: its weight loads (LDG; the 2-byte ones are the
scales and biases), the PRMT that waits on a scoreboard (the pack of a scale and bias just
loaded: MV_ASYNC 0), and every instruction that waits on a scoreboard a load of the loop sets.
--mv-async builds with MV_ASYNC 1 (MLX_GRAPH_MV_ASYNC=1). (--mv-ring, the FFMA row kernels'
cp.async ring, MV_RING, was removed with the ring: measured slower on an H100,
results/gpu/2026-12-06-s37-h100 call 4.)
--loops prints the loops' instructions.
"""
import argparse
import importlib.util
import pathlib
import re
import subprocess
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("sass", HERE / "sass.py")
S = importlib.util.module_from_spec(spec)
spec.loader.exec_module(S)


def annotate(text, kernel):
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
            stall, wb, rb, wm = (hi >> 41) & 0xF, (hi >> 46) & 7, (hi >> 49) & 7, (hi >> 52) & 0x3F
            ctl = (f"S{stall:02d} " + (f"W{wb}" if wb != 7 else "  ") + " " +
                   (f"R{rb}" if rb != 7 else "  ") + " " +
                   (("wait" + "".join(str(k) for k in range(6) if wm >> k & 1)) if wm else ""))
            out.append(f"{m.group(1)} {ctl:22} {m.group(2)}")
            i += 2
            continue
        i += 1
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nb", type=int, default=16)
    ap.add_argument("--kc", type=int, default=6144)
    ap.add_argument("--min-blocks", type=int, default=1)
    ap.add_argument("--mma-async", action="store_true")
    ap.add_argument("--mma-banks", action="store_true", help="MMA_BANKS 1 (MLX_GRAPH_MMA_BANKS=1)")
    ap.add_argument("--mma-pair", action="store_true", help="MMA_PAIR 1 (MLX_GRAPH_MMA_PAIR=1)")
    ap.add_argument("--kernel", default="matvec")
    ap.add_argument("--ffma", action="store_true")
    ap.add_argument("--mv-async", action="store_true")
    ap.add_argument("--loops", action="store_true")
    a = ap.parse_args()
    root = HERE.parents[1]
    if a.ffma:
        return ffma(a, root)
    src = (f"#define MV_ROWS 2\n#define MV_BATCH 4\n#define MV_EARLY 4\n#define NB {a.nb}\n"
           f"#define MV_MMA 1\n#define MMA_KC {a.kc}\n#define MV_MIN_BLOCKS {a.min_blocks}\n"
           + ("#define MMA_ASYNC 1\n" if a.mma_async else "")
           + ("#define MMA_BANKS 1\n" if a.mma_banks else "")
           + ("#define MMA_PAIR 1\n" if a.mma_pair else "")
           + "".join((root / "mlx-kernels/src" / f).read_text()
                     for f in ("graph_decode.cu", "graph_qk_norm.cu", "graph_gemma.cu", "graph_moe.cu")))
    cubin, _ = S.compile_cubin(src)
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        text = subprocess.run([S.NVDISASM, "-hex", "-c", str(path)], check=True,
                              capture_output=True, text=True).stdout
    ins = annotate(text, a.kernel)
    first = next(i for i, l in enumerate(ins) if "HMMA" in l and l.rstrip().endswith("RZ"))
    lo = next(i for i in range(first, 0, -1) if "DEPBAR.LE" in ins[i] or "BSSY B0" in ins[i])
    hi = next(i for i in range(first, len(ins)) if "LDGDEPBAR" in ins[i] or "PRMT" in ins[i] and "wait" in ins[i])
    hi = next((i for i in range(hi + 1, len(ins)) if "PRMT" not in ins[i]), hi)
    for line in ins[lo - 2:hi + 1]:
        print(line)


def ffma(a, root):
    """The FFMA row kernels' loops: their loads and what waits on them (--ffma)."""
    src = (f"#define MV_ROWS 2\n#define MV_BATCH 4\n#define MV_EARLY 4\n#define NB {a.nb}\n"
           "#define MV_MMA 0\n#define MMA_KC 0\n" + ("#define MV_ASYNC 1\n" if a.mv_async else "")
           + "".join((root / "mlx-kernels/src" / f).read_text()
                     for f in ("graph_decode.cu", "graph_qk_norm.cu", "graph_gemma.cu", "graph_moe.cu")))
    cubin, log = S.compile_cubin(src)
    for name, regs, stack, st, ld in S.resources(log):
        if name.startswith("matvec"):
            print(f"{name:16} {regs:4} registers, {stack} bytes stack, spills {st} stored / {ld} loaded")
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        hx = subprocess.run([S.NVDISASM, "-hex", "-c", str(path)], check=True,
                            capture_output=True, text=True).stdout
        plain = subprocess.run([S.NVDISASM, "-c", str(path)], check=True, capture_output=True,
                               text=True).stdout
    for k in a.kernel.split(","):
        ins = annotate(hx, k)
        total, inner = S.loops(plain, k, 1000)
        print(f"{k}: {total} instructions")
        for s, j, _ in inner:
            body = ins[s:j + 1]
            ldg = [l for l in body if "LDG" in l and "LDGDEPBAR" not in l]
            packs = [l for l in body if "PRMT" in l and "wait" in l]
            print(f"  loop {s}-{j} ({j - s + 1}): {len(ldg)} LDG ({sum('U16' in l for l in ldg)} "
                  f"2-byte, {sum('LDGSTS' in l for l in ldg)} LDGSTS), {len(packs)} PRMT waiting "
                  "on a scoreboard")
            for l in packs:
                print(f"      {l}")
            # The ring's waits (cp.async.wait_group) and the commits.
            for l in body:
                if "DEPBAR" in l:
                    print(f"      {l}")
            sbs = sorted({m.group(1) for l in ldg for m in [re.search(r" W(\d) ", l)] if m})
            for sb in sbs:
                waits = [l for l in body if re.search(r"wait\d*" + sb, l)]
                print(f"    loads on SB{sb}: {sum(f' W{sb} ' in l for l in ldg)}; "
                      f"instructions waiting on SB{sb}: {len(waits)}")
                for l in waits:
                    print(f"      {l}")
            if a.loops:
                for l in body:
                    print(f"    {l}")


if __name__ == "__main__":
    main()
