"""The default's machine code (MLX_GRAPH_MMA_PAIR unset: no MMA_PAIR define) against main's, for
every kernel of the step source, in the builds the decoder makes of the wide tensor-core tiles
and the FFMA row kernels: sm_90 SASS from NVRTC (xtask/gpu/sass.py's compiler and nvdisasm).

    python3 results/gpu/2026-12-07-s43-mmapair/sass_identity_mma.py [REF_COMMIT (default eb48784b, main)]

Prints, for each build, whether the whole disassembly (every kernel, the `.text` sections and the
instructions) is byte-identical; exits 1 unless all are.
"""
import importlib.util
import pathlib
import re
import subprocess
import sys

_spec = importlib.util.spec_from_file_location(
    "cost_model", pathlib.Path(__file__).resolve().parent.parent / "2026-12-06-s39-verify" / "cost_model.py")
C = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(C)

REF = sys.argv[1] if len(sys.argv) > 1 else "eb48784b"

# (name, defines): the 8B's wide tiles as step_source writes them (16 rows: one block, the ring's
# chunks of 5,120; 8 rows: two blocks, chunks of 4,096; the ring on by default, banks off), the
# ring off and banks on for A/B, and the FFMA row kernels (one row, a 5-row verify tile).
BUILDS = [
    ("NB 16, ring (default)", "#define NB 16\n#define MV_MMA 1\n#define MMA_KC 5120\n#define MV_MIN_BLOCKS 1\n#define MMA_ASYNC 1\n#define MV_ASYNC 1\n"),
    ("NB 16, ring, banks", "#define NB 16\n#define MV_MMA 1\n#define MMA_KC 5120\n#define MV_MIN_BLOCKS 1\n#define MMA_ASYNC 1\n#define MV_ASYNC 1\n#define MMA_BANKS 1\n"),
    ("NB 16, no ring", "#define NB 16\n#define MV_MMA 1\n#define MMA_KC 6144\n#define MV_MIN_BLOCKS 1\n#define MV_ASYNC 1\n"),
    ("NB 8, ring (default)", "#define NB 8\n#define MV_MMA 1\n#define MMA_KC 4096\n#define MV_MIN_BLOCKS 2\n#define MMA_ASYNC 1\n#define MV_ASYNC 1\n"),
    ("NB 1, FFMA (default)", "#define NB 1\n#define MV_MMA 0\n#define MMA_KC 0\n#define MV_ASYNC 1\n"),
]


def strip(sass):
    return "\n".join(l for l in sass.split("\n") if not l.startswith("\t.headerflags")
                     and "gpurt.cu" not in l)


ref = "".join(subprocess.run(["git", "-C", str(C.ROOT), "show", f"{REF}:mlx-kernels/src/{f}"],
                             check=True, capture_output=True, text=True).stdout for f in C.SOURCES)
new = "".join((C.ROOT / "mlx-kernels/src" / f).read_text() for f in C.SOURCES)
assert ref != new, "the reference is this tree"
head = "#define MV_ROWS 2\n#define MV_BATCH 4\n#define MV_EARLY 4\n"
ok = True
for name, defs in BUILDS:
    a = strip(C.disassemble(head + defs + ref)[1])
    b = strip(C.disassemble(head + defs + new)[1])
    same = a == b
    ok &= same
    n = len(re.findall(r"/\*[0-9a-f]{4,}\*/", b))
    print(f"{name}: this tree without MMA_PAIR against {REF}: {n} instructions, "
          f"{'byte-identical' if same else 'DIFFERENT'}", flush=True)
sys.exit(0 if ok else 1)
