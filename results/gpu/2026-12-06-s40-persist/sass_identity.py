"""The default's machine code (MLX_GRAPH_PERSIST unset: no GRAPH_PERSIST define; the row and
attention kernels now thin wrappers over their bodies) against main's, for every kernel of the
step source: sm_90 SASS from NVRTC as the decoder compiles it.

    python3 results/gpu/2026-12-06-s40-persist/sass_identity.py [REF_COMMIT (default 015deb8b, main before the bodies)]

Prints, for each build, whether the whole disassembly (every kernel, the `.text` sections
and the instructions) is byte-identical.
"""
import re
import subprocess
import sys

import importlib.util
import pathlib

# Session 39's SASS helpers (NVRTC, nvdisasm, the cache), from its folder.
_spec = importlib.util.spec_from_file_location(
    "cost_model", pathlib.Path(__file__).resolve().parent.parent / "2026-12-06-s39-verify" / "cost_model.py")
C = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(C)

REF = sys.argv[1] if len(sys.argv) > 1 else "015deb8b"


def tree_source(files_text, nb, mv_nb=False, mv_async=True):
    return (f"#define MV_ROWS 2\n#define MV_BATCH 4\n#define MV_EARLY 4\n#define NB {nb}\n"
            "#define MV_MMA 0\n#define MMA_KC 0\n"
            + ("#define MV_ASYNC 1\n" if mv_async else "")
            + ("#define MV_NB 1\n" if mv_nb else "") + files_text)


def strip(sass):
    # Only the instructions and section labels (no headers naming the input).
    return "\n".join(l for l in sass.split("\n") if not l.startswith("\t.headerflags")
                     and "gpurt.cu" not in l)


ref = "".join(subprocess.run(["git", "-C", str(C.ROOT), "show", f"{REF}:mlx-kernels/src/{f}"],
                             check=True, capture_output=True, text=True).stdout for f in C.SOURCES)
new = "".join((C.ROOT / "mlx-kernels/src" / f).read_text() for f in C.SOURCES)
assert ref != new, "the reference is this tree"
ok = True
for nb, mv_async, on in ((1, True, False), (5, True, False), (1, False, False)):
    a = strip(C.disassemble(tree_source(ref, nb, False, mv_async))[1])
    b = strip(C.disassemble(tree_source(new, nb, on, mv_async))[1])
    same = a == b
    ok &= same
    n = len(re.findall(r"/\*[0-9a-f]{4,}\*/", b))
    print(f"NB {nb}, MV_ASYNC {int(mv_async)}: this tree without GRAPH_PERSIST against {REF}: "
          f"{n} instructions, {'byte-identical' if same else 'DIFFERENT'}")
sys.exit(0 if ok else 1)
