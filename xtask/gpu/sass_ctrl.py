"""sm_90 SASS with each instruction's control bits decoded (stall cycles, the scoreboard it sets
on write W<n> and on read R<n>, the scoreboards it waits for: wait<ns>), for the first
tensor-core tile item of a kernel: what an item waits for.

    python3 xtask/gpu/sass_ctrl.py [--nb 16] [--kc 6144] [--min-blocks 1] [--mma-async] [--kernel matvec]

Compiles as sass.py does (NVRTC_LIB, NVDISASM), disassembles with `nvdisasm -hex` and reads the
control bits from the upper 64-bit word of each 128-bit instruction (Volta and later: bits
41-44 stall, 45 yield, 46-48 write scoreboard, 49-51 read scoreboard, 52-57 wait mask; 7 = none).
Prints the instructions from the item's first load wait to its loads of the next item: with the
register loads (main) the scale/bias loads' PRMT waits on their own scoreboard right after
issue, and every weight load of the 8 items in flight shares one scoreboard; with the ring
(--mma-async) the item waits with DEPBAR.LE SB0, 5 (its own cp.async group) only.
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
    ap.add_argument("--kernel", default="matvec")
    a = ap.parse_args()
    root = HERE.parents[1]
    src = (f"#define MV_ROWS 2\n#define MV_BATCH 4\n#define MV_EARLY 4\n#define NB {a.nb}\n"
           f"#define MV_MMA 1\n#define MMA_KC {a.kc}\n#define MV_MIN_BLOCKS {a.min_blocks}\n"
           + ("#define MMA_ASYNC 1\n" if a.mma_async else "")
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


if __name__ == "__main__":
    main()
