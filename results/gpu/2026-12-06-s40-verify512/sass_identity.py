"""The default's machine code (MLX_GRAPH_MV_WIDE unset: no MV_WIDE define) against main's, for
every kernel of the step source (sm_90 SASS from NVRTC as the decoder compiles it, through
session 39's cost_model.py), and MV_WIDE 1 where the host never adds it (one row: MV_WIDE_ON
needs NB > 1) against main.

    NVRTC_LIB=... NVDISASM=... python3 results/gpu/2026-12-06-s40-verify512/sass_identity.py [REF (default 015deb8b, main before the switch)]

Prints, for each build, whether the whole disassembly (every kernel, the `.text` sections and
the instructions) is byte-identical.
"""
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
os.environ.setdefault("S39_CACHE", "/tmp/s40_sass")
spec = importlib.util.spec_from_file_location("cost_model",
                                              HERE.parent / "2026-12-06-s39-verify/cost_model.py")
C = importlib.util.module_from_spec(spec)
spec.loader.exec_module(C)

REF = sys.argv[1] if len(sys.argv) > 1 else "015deb8b"


def tree_source(files_text, nb, mv_async=True, mv_nb=False, wide=False, batch=4, rows=2):
    return (f"#define MV_ROWS {rows}\n#define MV_BATCH {batch}\n#define MV_EARLY {batch}\n#define NB {nb}\n"
            "#define MV_MMA 0\n#define MMA_KC 0\n"
            + ("#define MV_ASYNC 1\n" if mv_async else "")
            + ("#define MV_NB 1\n" if mv_nb else "")
            + ("#define MV_WIDE 1\n" if wide else "") + files_text)


def strip(sass):
    # Only the instructions and section labels (no headers naming the input).
    return "\n".join(l for l in sass.split("\n") if not l.startswith("\t.headerflags")
                     and "gpurt.cu" not in l)


ref = "".join(subprocess.run(["git", "-C", str(C.ROOT), "show", f"{REF}:mlx-kernels/src/{f}"],
                             check=True, capture_output=True, text=True).stdout for f in C.SOURCES)
new = "".join((C.ROOT / "mlx-kernels/src" / f).read_text() for f in C.SOURCES)
assert ref != new, "the reference is this tree"
ok = True
# (NB, MV_ASYNC, MV_NB, this tree's MV_WIDE, rows a warp, chunks in flight)
for nb, mv_async, mv_nb, wide, rows, batch in (
        (1, True, False, False, 2, 4), (5, True, False, False, 2, 4), (8, True, False, False, 2, 4),
        (5, False, False, False, 2, 4), (5, True, True, False, 2, 4), (1, True, False, True, 2, 4),
        (5, True, False, False, 4, 2)):
    a = strip(C.disassemble(tree_source(ref, nb, mv_async, mv_nb, batch=batch, rows=rows))[1])
    b = strip(C.disassemble(tree_source(new, nb, mv_async, mv_nb, wide, batch, rows))[1])
    same = a == b
    ok &= same
    n = len(re.findall(r"/\*[0-9a-f]{4,}\*/", b))
    print(f"NB {nb}, {rows} rows a warp, MV_ASYNC {int(mv_async)}, MV_NB {int(mv_nb)}, this tree "
          f"{'with' if wide else 'without'} MV_WIDE 1 against {REF}: {n} instructions, "
          f"{'byte-identical' if same else 'DIFFERENT'}", flush=True)
print(f"rc {0 if ok else 1}")
sys.exit(0 if ok else 1)
