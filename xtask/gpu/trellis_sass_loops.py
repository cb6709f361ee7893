"""The product loops of every trellis kernel in a disassembly written by
`xtask/gpu/sass.py --trellis --dump FILE`: per innermost loop of 150+ instructions, its
instructions, FFMA count (weights a pass), instructions a weight, the code it decodes (IDP:
1mad computed; an IMAD by 0x88 = 128 + 2^(15 - 12) for at least half its weights: 1mad8h's
hashed table at L 12; else 1mad8's table), and the spill loads/stores (LDL/STL) inside it. Then
a summary: each kernel's range of instructions a weight by code and block.

    python3 xtask/gpu/trellis_sass_loops.py DUMP [KERNEL ...]

(s35's /work/gpug7-tmp/sass_loops.py, kept here. It names every table path "1mad8 table": the
S-box loops are those with `LDS 161` a 64 weights, the states' table's (TRELLIS_STATES) those
with a PRMT a weight.)
"""
import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sass  # noqa: E402

KERNELS = ["trellis_matvec", "trellis_matvec_in", "trellis_matvec_out", "trellis_linear",
           "trellis_qkv", "trellis_gate_up"]


def main():
    text = Path(sys.argv[1]).read_text()
    summary = {}
    for k in sys.argv[2:] or KERNELS:
        total, found = sass.loops(text, k, 150)
        lines = text.split("\n")
        start = next(i for i, l in enumerate(lines) if l.startswith(f".text.{k}:"))
        ins = []
        for line in lines[start:]:
            if line.startswith("//----"):
                break
            m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
            if m:
                ins.append(m.group(1).strip())
        spills_all = sum(1 for x in ins if re.search(r"\b(LDL|STL)\b", x))
        print(f"{k}: {total} instructions, {spills_all} LDL/STL in all")
        for s, j, mix in found:
            ffma = mix.get("FFMA", 0)
            if ffma < 32:
                continue
            n = j - s + 1
            if mix.get("IDP", 0):
                what = "1mad"
            elif sum(1 for x in ins[s:j + 1] if re.match(r"IMAD\S* R\d+, R\d+, 0x88,", x)) >= ffma // 2:
                what = "1mad8h table"
            else:
                what = "1mad8 table"
            sp = mix.get("LDL", 0) + mix.get("STL", 0)
            top = ", ".join(f"{a} {b}" for a, b in mix.most_common(9))
            print(f"  {s}-{j} ({n}) {what}, {ffma} weights, {n / ffma:.2f} a weight, "
                  f"LDL/STL {sp}: {top}")
            summary.setdefault((k, what, ffma), []).append(n / ffma)
    print("\nSummary (instructions a weight):")
    for (k, what, w), v in summary.items():
        print(f"  {k:20} {what:14} blocks of {w}: {min(v):.2f}-{max(v):.2f}")


if __name__ == "__main__":
    main()
