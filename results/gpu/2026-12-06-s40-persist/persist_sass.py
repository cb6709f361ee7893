"""The persistent step's machine code (GRAPH_PERSIST 1, the one-row step's defines: 2 rows a
warp, 4 chunks in flight, MV_ASYNC 1): ptxas's registers, stack and spills for persist_step and
each phase's function, from NVRTC for sm_90 as the decoder compiles it, and where the spills
sit (inside backward-branch loops or not), per phase function.

    NVRTC_LIB=... NVDISASM=... python3 results/gpu/2026-12-06-s40-persist/persist_sass.py
"""
import importlib.util
import pathlib
import re
import subprocess
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("sass", ROOT / "xtask/gpu/sass.py")
S = importlib.util.module_from_spec(spec)
spec.loader.exec_module(S)

SRC = ("#define MV_ROWS 2\n#define MV_BATCH 4\n#define MV_EARLY 4\n#define NB 1\n#define MV_MMA 0\n"
       "#define MMA_KC 0\n#define MV_ASYNC 1\n#define GRAPH_PERSIST 1\n"
       + (ROOT / "mlx-kernels/src/graph_decode.cu").read_text())
cubin, log = S.compile_cubin(SRC)
lines = log.split("\n")
for i, l in enumerate(lines):
    m = re.search(r"Function properties for (\S+)", l)
    if m and ("persist" in m.group(1) or "ps_" in m.group(1)):
        props = lines[i + 1].strip(" .")
        used = lines[i + 2] if "Used" in lines[i + 2] else ""
        print(f"{m.group(1)}: {props}{'; ' + used.split(':', 1)[1].strip() if used else ''}")
with tempfile.TemporaryDirectory() as tmp:
    path = pathlib.Path(tmp) / "k.cubin"
    path.write_bytes(cubin)
    sass = subprocess.run([S.NVDISASM, "-c", str(path)], check=True, capture_output=True,
                          text=True).stdout
text = sass.split("\n")
# The phase functions' sections ($persist_step$<mangled>:), instructions and spill traffic.
starts = [(i, l[:-1]) for i, l in enumerate(text) if re.match(r"^\$persist_step\$\S+:$", l)]
ends = [i for i, l in enumerate(text) if re.match(r"^\S+:$", l) and not l.startswith(".")]
for n, (i, name) in enumerate(starts):
    j = min([e for e in ends if e > i] + [len(text)])
    ins = [re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", l) for l in text[i:j]]
    ins = [m.group(1) for m in ins if m]
    ldl = sum("LDL" in x for x in ins)
    stl = sum("STL" in x for x in ins)
    print(f"{name}: {len(ins)} instructions, {ldl} LDL, {stl} STL")
# The phase functions' innermost loops of 300 or more instructions (the products' item loops;
# sass.py's `loops`), with their spill traffic, and the same for the kernels themselves.
for n, (i, name) in enumerate(starts):
    j = min([e for e in ends if e > i] + [len(text)])
    body = "\n".join([".text.f:"] + text[i + 1:j] + ["//----"])
    total, inner = S.loops(body, "f", least=300)
    for s0, s1, mix in inner:
        print(f"  {name.split('$')[-1]} loop {s0}-{s1} ({s1 - s0 + 1}): LDL {mix.get('LDL', 0)}, "
              f"STL {mix.get('STL', 0)}, FFMA {mix.get('FFMA', 0)}")
for k in ("matvec", "matvec_qkv", "matvec_attn_out", "attention"):
    total, inner = S.loops(sass, k, least=300)
    for s0, s1, mix in inner:
        print(f"  kernel {k} loop {s0}-{s1} ({s1 - s0 + 1}): LDL {mix.get('LDL', 0)}, "
              f"STL {mix.get('STL', 0)}, FFMA {mix.get('FFMA', 0)}")
