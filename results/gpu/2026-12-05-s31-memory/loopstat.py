"""The innermost loops of each kernel named in a `sass.py --dump FILE` disassembly, with their
instructions a FFMA (the hot mat-vec loops: fewer is cheaper for the same work).
    python3 loopstat.py FILE KERNEL..."""
import importlib.util
import pathlib
import sys

SASS = pathlib.Path(__file__).resolve().parents[3] / "xtask" / "gpu" / "sass.py"
spec = importlib.util.spec_from_file_location("sass", SASS)
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
sass = open(sys.argv[1]).read()
for kernel in sys.argv[2:]:
    n, inner = m.loops(sass, kernel, 300)
    print(f"{kernel}: {n} instructions")
    for s, j, c in inner:
        ldg = sum(v for k, v in c.items() if k == "LDG")
        tot = j - s + 1
        print(f"  loop {s}-{j}: {tot} instr, LDG {ldg}, FFMA {c['FFMA']}, LOP3 {c['LOP3']}, IMAD {c['IMAD']}, instr/FFMA {tot / max(c['FFMA'],1):.2f}")
