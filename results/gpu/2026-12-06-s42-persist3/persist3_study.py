"""Where the layer loop's spills come from (session 42): ptxas's figures for persist_step
(PS_LOOP) with its body cut down to one phase kind, in a loop or not. Compile-only (the cut
kernels are not run). Bodies:
  mv1         one matvec phase, no loop
  mv2         two matvec phases one after the other, no loop
  mvloop      one matvec phase in a `while` over the loop state in shared memory (as srsl's)
  mvfor       one matvec phase in `for (r < 3)` with `#pragma unroll 1`
  mvnopragma  mvloop without `#pragma unroll 1`
  full        the whole step as it is (=2, SPLIT, SMEM, LOOP with the trace unless DEFINES)
Environment: CH=N chunks (MV_BATCH = MV_EARLY, default 4), NOASYNC=1 (MV_ASYNC 0), NOZERO=1
(the tree before PS_ZERO: the registers loaded on some paths left unset in the layer loop),
NOSREG=1 (the built-in indices read as ever, not through the opaque asm), NOOPAQUE=1
(ps_opaque a plain copy).

    NVRTC_LIB=... NVDISASM=... python3 persist3_study.py BODY ["DEFINES"]
"""
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
HERE = ROOT / "results/gpu/2026-12-06-s42-persist3/persist3_sass.py"
g = {"__file__": str(HERE)}
exec(compile(HERE.read_text().split("\nfor key in sys.argv")[0], "persist3_sass", "exec"), g)
C = g["C"]
defs = sys.argv[2] if len(sys.argv) > 2 else "PS_BARRIER_RA PS_SPLIT PS_SMEM_TABLE PS_LOOP"
s = g["source"](defs, int(os.environ.get("CH", "4")))
a = s.index("  PS_RUN(ps_embed, 0, 1)\n")
b = s.index("  ps_mark(PS_SLOT(n), 0);\n#undef PS_RUN")
body = {
    "full": s[a:b],
    "mv1": "  PS_RUN(ps_matvec, 1, 0)\n",
    "mv2": "  PS_RUN(ps_matvec, 1, 0)\n  PS_RUN(ps_matvec, 2, 0)\n",
    "mvfor": "#pragma unroll 1\n  for (int r = 0; r < 3; ++r) {\n    PS_RUN(ps_matvec, 1 + r, 0)\n  }\n",
    "mvnopragma": "  while (st.r > 0) {\n    PS_RUN(ps_matvec, st.i, 0)\n    if (threadIdx.x == 0) { st.i = st.i + 1; st.r = st.r - 1; }\n    ps_block_sync();\n  }\n",
    "mvloop": "#pragma unroll 1\n  while (st.r > 0) {\n    PS_RUN(ps_matvec, st.i, 0)\n    if (threadIdx.x == 0) { st.i = st.i + 1; st.r = st.r - 1; }\n    ps_block_sync();\n  }\n",
}[sys.argv[1]]
s = s[:a] + body + s[b:]
if os.environ.get("NOZERO"):
    assert s.count("#if defined(PS_LOOP) && PS_LOOP\n") == 2 and "#define PS_ZERO = {}\n" in s
    s = s.replace("#if defined(PS_LOOP) && PS_LOOP\n", "#if 0\n")
    s = s.replace("#define PS_ZERO = {}\n", "#define PS_ZERO\n")
if os.environ.get("NOSREG"):
    for m in ("threadIdx ps_tid()", "blockIdx ps_ctaid()", "blockDim ps_ntid()",
              "gridDim ps_nctaid()"):
        assert f"#define {m}\n" in s
        s = s.replace(f"#define {m}\n", "")
if os.environ.get("NOOPAQUE"):
    assert '  asm volatile("" : "+l"(v));\n' in s
    s = s.replace('  asm volatile("" : "+l"(v));\n', "")
if os.environ.get("NOASYNC"):
    s = s.replace("#define MV_ASYNC 1\n", "#define MV_ASYNC 0\n")
_, sass, log = C.disassemble(s)
lines = log.split("\n")
for i, l in enumerate(lines):
    if "Function properties for persist_step" in l:
        print(sys.argv[1:], f"CH={os.environ.get('CH', '4')}",
              "NOASYNC" if os.environ.get("NOASYNC") else "",
              "NOZERO" if os.environ.get("NOZERO") else "",
              "NOSREG" if os.environ.get("NOSREG") else "",
              "NOOPAQUE" if os.environ.get("NOOPAQUE") else "", lines[i + 1].split(".", 1)[1].strip(),
              lines[i + 2].split(":", 1)[1].strip())
