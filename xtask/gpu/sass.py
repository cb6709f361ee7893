"""Compiles the graph decoder's kernels here, as the decoder does on the GPU, and reads their
machine code: no GPU needed.

    python3 xtask/gpu/sass.py [--rows 2] [--batch N] [--early N] [--nb N] [--mma 1] [--kc N] [--mma-async] [--mma-banks] [--mma-pair] [--mv-async] [--mv-nb] [--early-norm] [--gptoss] [--kernel matvec] [--dump FILE] [--blocks]
        [--trellis [--trellis-v-l N] [--trellis-define TRELLIS_ALIAS ...] [--trellis-define TRELLIS_FUSED_THREADS=1024]]
    python3 xtask/gpu/sass.py --source FILE [--kernel trellis_qkv] [--dump FILE]

--source compiles FILE as it is instead: a step source the host wrote (graph_decode.rs's
`step_sources_dump` test, `MLX_SOURCE_DUMP=DIR`: the decoder's own defines and switches).

Prints, for each kernel, ptxas's registers, stack and spills, and for --kernel (default
matvec) its innermost loops of 1,000 or more instructions with the instruction mix: one a
width of codes, the 4-bit one with the most LOP3, FADD and FFMA (two rows, four chunks in
flight: 256 codes a row each of four unrolled items, and the epilogue four times). The loops are
found from backward branches, as nvdisasm prints them. --dump FILE writes the whole
disassembly.

The compiler is NVRTC, with the options `mlx-sys/shim/gpurt.cpp` passes (sm_90, C++17,
--fmad=true) and the #defines `GraphDecoder::load_with` prepends. Its library and nvdisasm
come from PyPI's CUDA 13 wheels:

    python3 -m pip download --no-deps nvidia-cuda-nvrtc nvidia-cuda-nvdisasm -d /tmp/nv
    (cd /tmp/nv && for w in *.whl; do unzip -oq "$w"; done)

then NVRTC_LIB=/tmp/nv/nvidia/cu13/lib/libnvrtc.so.13 NVDISASM=/tmp/nv/nvidia/cu13/bin/nvdisasm
(the defaults). PyPI's NVRTC may be newer than the one MLX's wheel loads on the GPU: the
code can differ a little.
"""
import argparse
import collections
import ctypes
import os
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
NVRTC_LIB = os.environ.get("NVRTC_LIB", "/tmp/nv/nvidia/cu13/lib/libnvrtc.so.13")
NVDISASM = os.environ.get("NVDISASM", "/tmp/nv/nvidia/cu13/bin/nvdisasm")


def compile_cubin(src):
    lib = ctypes.CDLL(NVRTC_LIB)
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"gpurt.cu", 0, None, None):
        sys.exit("nvrtcCreateProgram failed")
    opts = [b"--gpu-architecture=sm_90", b"-std=c++17", b"--fmad=true", b"-Xptxas=-v"]
    r = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    log = log.value.decode()
    if r:
        sys.exit(f"nvrtcCompileProgram: {r}\n{log}")
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    cubin = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetCUBIN(prog, cubin)
    return cubin.raw, log


def resources(log):
    """(kernel, registers, stack bytes, spill stores, spill loads) from ptxas's -v log."""
    out, name = [], None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name, stack, spills = m.group(1), 0, (0, 0)
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      line)
        if m:
            stack, spills = int(m.group(1)), (int(m.group(2)), int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            out.append((name, int(m.group(1)), stack, *spills))
    return out


def loops(sass, kernel, least=1000):
    """The loops of `kernel` with at least `least` instructions: (first, last, mix)."""
    lines = sass.split("\n")
    start = next(i for i, l in enumerate(lines) if l.startswith(f".text.{kernel}:"))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("//----")),
               len(lines))
    ins, labels = [], {}
    for line in lines[start:end]:
        m = re.match(r"\.(L_x_\d+):", line.strip())
        if m:
            labels[m.group(1)] = len(ins)
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if m:
            ins.append(m.group(1).strip())
    found = []
    for j, text in enumerate(ins):
        m = re.search(r"BRA\s+`?\(?\.?(L_x_\d+)", text)
        if m and m.group(1) in labels and labels[m.group(1)] < j:
            s = labels[m.group(1)]
            if j - s + 1 >= least:
                ops = (re.sub(r"^@!?U?P\w+\s+", "", x).split()[0].split(".")[0]
                       for x in ins[s:j + 1])
                found.append((s, j, collections.Counter(ops)))
    # Innermost only, and not the branches back from the warp-divergence fallbacks (`BRA.DIV`
    # to code with WARPSYNC at the end of the function), which span whole regions.
    found = [f for f in found if "WARPSYNC" not in f[2]]
    inner = [f for f in found
             if not any(g is not f and f[0] <= g[0] and g[1] <= f[1] for g in found)]
    return len(ins), inner


def blocks(sass, kernel, first, last, least=40):
    """The basic blocks of `kernel`'s instructions first..last (split at labels and after
    branches) of at least `least` instructions: (start, size, mix). A loop's blocks tell what
    one item costs (the long block of products) from what runs once a row group (the
    epilogue's, mostly skipped)."""
    lines = sass.split("\n")
    start = next(i for i, l in enumerate(lines) if l.startswith(f".text.{kernel}:"))
    ins, labels = [], set()
    for line in lines[start:]:
        if line.startswith("//----"):
            break
        if re.match(r"\.(L_x_\d+):", line.strip()):
            labels.add(len(ins))
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if m:
            ins.append(m.group(1).strip())
    out, cur, cs = [], [], first
    for j in range(first, last + 1):
        if j in labels and cur:
            out.append((cs, cur))
            cur, cs = [], j
        cur.append(ins[j])
        if re.search(r"\bBRA\b|EXIT|BSYNC|WARPSYNC", ins[j]):
            out.append((cs, cur))
            cur, cs = [], j + 1
    if cur:
        out.append((cs, cur))
    return [(s, len(b), collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", x).split()[0].split(".")[0]
                                            for x in b))
            for s, b in out if len(b) >= least]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--early", type=int)
    ap.add_argument("--nb", type=int, default=1, help="sequences a step (GraphOptions::sequences)")
    ap.add_argument("--mma", type=int, default=0, help="tensor-core tiles (MV_MMA)")
    ap.add_argument("--min-blocks", type=int,
                    help="MV_MIN_BLOCKS (GraphOptions::min_blocks_per_sm; default: the source's)")
    ap.add_argument("--kc", type=int, default=0,
                    help="MMA_KC: inputs a tensor-core tile stages at once (0: all of K)")
    ap.add_argument("--mma-async", action="store_true",
                    help="MMA_ASYNC 1: the wide tiles' cp.async ring (MLX_GRAPH_MMA_ASYNC=1)")
    ap.add_argument("--mma-banks", action="store_true",
                    help="MMA_BANKS 1: the wide tiles' bank-conflict-free placement (MLX_GRAPH_MMA_BANKS=1)")
    ap.add_argument("--mma-pair", action="store_true",
                    help="MMA_PAIR 1: the wide tiles' items of two rows blocks (MLX_GRAPH_MMA_PAIR=1)")
    ap.add_argument("--mv-async", action="store_true",
                    help="MV_ASYNC 1: the FFMA row kernels' deferred scale/bias reads (MLX_GRAPH_MV_ASYNC=1)")
    ap.add_argument("--mv-nb", action="store_true",
                    help="MV_NB 1: the FFMA tiles of several sequences stream MV_BATCH items a trip "
                         "from constant slots (MLX_GRAPH_MV_NB=1)")
    ap.add_argument("--early-norm", action="store_true",
                    help="MV_EARLY_NORM 1 and EMBED_BATCH 16: the norm weights before the wait, embed's "
                         "loads at once (MLX_GRAPH_EARLY_PROLOGUE=1)")
    ap.add_argument("--kernel", default="matvec")
    ap.add_argument("--trellis", action="store_true",
                    help="append graph_trellis.cu (the trellis kernels; --kernel trellis_matvec)")
    ap.add_argument("--trellis-v-l", type=int,
                    help="with --trellis: TRELLIS_V_L (the value projections' l_arg, e.g. 12 for 1mad "
                         "L 12), as TrellisSwitches::source defines it for a model whose v_proj take their own code")
    ap.add_argument("--trellis-define", action="append", default=[], metavar="NAME",
                    help="with --trellis: #define NAME 1 (NAME=VALUE: NAME VALUE) first, as TrellisSwitches::source "
                         "does for a switch (TRELLIS_ALIAS, TRELLIS_PIPE, TRELLIS_ROWS2, "
                         "TRELLIS_FUSED_THREADS=1024; repeatable)")
    ap.add_argument("--gptoss", action="store_true",
                    help="gpt_oss's step source: ATTN_SINKS, MOE_OAI, MV_OUT_BIAS and MV_FP4 "
                         "(--kernel matvec_experts: the mxfp4 loop)")
    ap.add_argument("--dump")
    ap.add_argument("--source", help="compile this step source as it is (the other options but "
                    "--kernel, --dump and --blocks are ignored)")
    ap.add_argument("--blocks", action="store_true",
                    help="also each innermost loop's basic blocks of 40 or more instructions")
    a = ap.parse_args()
    batch = a.batch or 8 // a.rows
    early = a.early or batch
    src = (("#define ATTN_SINKS 1\n#define MOE_OAI 1\n#define MV_OUT_BIAS 1\n#define MV_FP4 1\n"
            if a.gptoss else "") +
           f"#define MV_ROWS {a.rows}\n#define MV_BATCH {batch}\n#define MV_EARLY {early}\n"
           f"#define NB {a.nb}\n#define MV_MMA {a.mma}\n#define MMA_KC {a.kc}\n"
           + (f"#define MV_MIN_BLOCKS {a.min_blocks}\n" if a.min_blocks else "")
           + ("#define MMA_ASYNC 1\n" if a.mma_async else "")
           + ("#define MMA_BANKS 1\n" if a.mma_banks else "")
           + ("#define MMA_PAIR 1\n" if a.mma_pair else "")
           + ("#define MV_ASYNC 1\n" if a.mv_async else "")
           + ("#define MV_NB 1\n" if a.mv_nb else "")
           + ("#define MV_EARLY_NORM 1\n#define EMBED_BATCH 16\n" if a.early_norm else "")
           + "".join((ROOT / "mlx-kernels/src" / f).read_text()
                     for f in ("graph_decode.cu", "graph_qk_norm.cu", "graph_gemma.cu", "graph_moe.cu"))
           + (f"#define TRELLIS_V_L {a.trellis_v_l}\n" if a.trellis and a.trellis_v_l is not None else "")
           + "".join(f"#define {d.partition('=')[0]} {d.partition('=')[2] or 1}\n"
                     for d in (a.trellis_define if a.trellis else []))
           + ((ROOT / "mlx-kernels/src/graph_trellis.cu").read_text() if a.trellis else ""))
    if a.source:
        src = pathlib.Path(a.source).read_text()
    cubin, log = compile_cubin(src)
    if not os.path.exists(NVDISASM):
        for name, regs, stack, st, ld in resources(log):
            print(f"{name:14} {regs:4} registers, {stack} bytes stack, spills {st} stored / {ld} loaded")
        return
    for name, regs, stack, st, ld in resources(log):
        print(f"{name:12} {regs:4} registers, {stack} bytes stack, spills {st} stored / {ld} loaded")
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        sass = subprocess.run([NVDISASM, "-c", str(path)], check=True, capture_output=True,
                              text=True).stdout
    if a.dump:
        pathlib.Path(a.dump).write_text(sass)
    least = 200 if a.kernel.startswith("trellis") else 1000
    total, found = loops(sass, a.kernel, least)
    print(f"{a.kernel}: {total} instructions; innermost loops of {least:,} or more:")
    for s, j, mix in found:
        top = ", ".join(f"{k} {v}" for k, v in mix.most_common(8))
        print(f"  {s}-{j} ({j - s + 1}): {top}")
        if a.blocks:
            for b, n, bmix in blocks(sass, a.kernel, s, j):
                top = ", ".join(f"{k} {v}" for k, v in bmix.most_common(8))
                print(f"    block {b} ({n}): {top}")


if __name__ == "__main__":
    main()
