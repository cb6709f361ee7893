"""Static shared memory (ptxas -v) of matvec, matvec_qkv and matvec_experts at NB 16, the ring, KC 5,120,
without and with MMA_PAIR: the host sizes both with MMA_RING_SHARED + MV_STATIC_SHARED.

    python3 results/gpu/2026-12-07-s43-mmapair/static_smem.py
"""
import importlib.util, pathlib, re, sys
ROOT = pathlib.Path(__file__).resolve().parents[3]
_s = importlib.util.spec_from_file_location("sass", ROOT / "xtask/gpu/sass.py")
S = importlib.util.module_from_spec(_s); _s.loader.exec_module(S)
for pair in (0, 1):
    for banks in (0,):
        src = ("#define MV_ROWS 2\n#define MV_BATCH 4\n#define MV_EARLY 4\n#define NB 16\n#define MV_MMA 1\n#define MMA_KC 5120\n#define MV_MIN_BLOCKS 1\n#define MV_ASYNC 1\n#define MMA_ASYNC 1\n"
               + ("#define MMA_BANKS 1\n" if banks else "") + ("#define MMA_PAIR 1\n" if pair else "")
               + "".join((ROOT / "mlx-kernels/src" / f).read_text() for f in ("graph_decode.cu", "graph_qk_norm.cu", "graph_gemma.cu", "graph_moe.cu")))
        _, log = S.compile_cubin(src)
        lines = log.split("\n")
        cur = None
        for l in lines:
            m = re.search(r"(?:entry function|Function properties for) '?(\w+)", l)
            if m:
                cur = m.group(1)
            if "smem" in l and cur and "matvec" in cur:
                print(f"pair {pair} banks {banks}: {cur[:40]}: {l.strip()}", flush=True)
