"""Compares two disassemblies (sass.py --dump) kernel by kernel, branch labels and addresses
normalised: which trellis kernels are the same instructions.

    python3 sass_compare.py A.sass B.sass
"""
import re
import sys

KERNELS = ["trellis_decode", "trellis_input", "trellis_matvec", "trellis_output", "trellis_matvec_in",
           "trellis_matvec_out", "trellis_linear", "trellis_rope_qkv", "trellis_qkv", "trellis_gate_up"]


def section(text, k):
    lines = text.split("\n")
    s = next(i for i, l in enumerate(lines) if l.startswith(f".text.{k}:"))
    e = next((i for i in range(s + 1, len(lines)) if lines[i].startswith("//----")), len(lines))
    return [re.sub(r"L_x_\d+", "L", re.sub(r"/\*[0-9a-f]+\*/", "", x)).strip() for x in lines[s:e]]


a, b = (open(f).read() for f in sys.argv[1:3])
for k in KERNELS:
    x, y = section(a, k), section(b, k)
    print(f"{k:20} {len(x):6} / {len(y):6} lines: {'the same' if x == y else 'differ'}")
