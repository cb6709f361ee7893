"""Session 41's persistent step (srs: =2, SPLIT, SMEM; and p1: =1) of this tree against a
reference commit's: sm_90 SASS from NVRTC, the whole disassembly byte-compared (the layer loop,
PS_LOOP, is off in both: its edits must not change the step it sits beside).

    NVRTC_LIB=... NVDISASM=... python3 results/gpu/2026-12-06-s42-persist3/srs_identity.py REF
"""
import pathlib
import re
import subprocess
import sys
import importlib.util

ROOT = pathlib.Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location(
    "p3", ROOT / "results/gpu/2026-12-06-s42-persist3/persist3_sass.py")
src = (ROOT / "results/gpu/2026-12-06-s42-persist3/persist3_sass.py").read_text()
g = {"__file__": str(ROOT / "results/gpu/2026-12-06-s42-persist3/persist3_sass.py")}
exec(compile(src.split("\nfor key in sys.argv")[0], "persist3_sass", "exec"), g)
C = g["C"]
REF = sys.argv[1]
ref_cu = subprocess.run(["git", "-C", str(ROOT), "show", f"{REF}:mlx-kernels/src/graph_decode.cu"],
                        check=True, capture_output=True, text=True).stdout
for name, defs in (("srs", "PS_BARRIER_RA PS_SPLIT PS_SMEM_TABLE"), ("p1", "")):
    mine = g["source"](defs)
    theirs = mine.replace(g["CU"], ref_cu)
    _, a, _ = C.disassemble(mine)
    _, b, _ = C.disassemble(theirs)
    n = len(re.findall(r"/\*[0-9a-f]{4,}\*/", a))
    print(f"{name} ({defs or 'MLX_GRAPH_PERSIST=1'}): this tree against {REF}: "
          f"{'byte-identical' if a == b else 'DIFFERENT'} ({n} instruction lines)")
