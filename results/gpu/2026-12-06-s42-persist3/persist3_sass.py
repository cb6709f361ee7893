"""The persistent step's machine code, session 42: the layer loop (PS_LOOP,
MLX_GRAPH_PERSIST_LOOP=1) against session 41's loop over the table of functions. NVRTC for
sm_90 as the decoder compiles the one-row step (2 rows a warp, MV_ASYNC 1, GRAPH_PERSIST 1),
each variant's defines. For each: ptxas's registers, stack and spills of every function; the
CALL instructions in persist_step (the layer loop must have none); LDL/STL in persist_step and
in its item loops (innermost loops of >= 300 instructions with FFMA); and, for each grid
barrier's arrival (ATOMG) on the layout, the instructions to the next early weight load
(LDG.E.NA.128.CONSTANT) and from the polls (LDG.E.64.STRONG.GPU) to the next phase's first
FFMA.

    NVRTC_LIB=/work/gpug7-tmp/nvidia/cu13/lib/libnvrtc.so.13 \
    NVDISASM=/work/gpug7-tmp/nvidia/cu13/bin/nvdisasm \
    python3 results/gpu/2026-12-06-s42-persist3/persist3_sass.py [VARIANT ...]
"""
import importlib.util
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location(
    "cost_model", ROOT / "results/gpu/2026-12-06-s39-verify/cost_model.py")
C = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(C)
S = C.S

VARIANTS = {
    "srs": ("session 41's srs (=2, SPLIT, SMEM): calls through ps_phases",
            "PS_BARRIER_RA PS_SPLIT PS_SMEM_TABLE"),
    "srsl": ("srs + LOOP (=2, SPLIT, SMEM, LOOP): the layer loop",
             "PS_BARRIER_RA PS_SPLIT PS_SMEM_TABLE PS_LOOP"),
    "srl": ("=2, SPLIT, LOOP (the table in global memory)", "PS_BARRIER_RA PS_SPLIT PS_LOOP"),
    "p1l": ("=1, LOOP (no split)", "PS_LOOP"),
    "srsl_c6": ("srsl with 6 chunks in flight and before the wait (MLX_GRAPH_PERSIST_CHUNKS=6)",
                "PS_BARRIER_RA PS_SPLIT PS_SMEM_TABLE PS_LOOP CHUNKS=6"),
    "srsl_c2": ("srsl with 2 chunks in flight and before the wait (MLX_GRAPH_PERSIST_CHUNKS=2)",
                "PS_BARRIER_RA PS_SPLIT PS_SMEM_TABLE PS_LOOP CHUNKS=2"),
    "srsl_c1": ("srsl with 1 chunk in flight and before the wait (MLX_GRAPH_PERSIST_CHUNKS=1)",
                "PS_BARRIER_RA PS_SPLIT PS_SMEM_TABLE PS_LOOP CHUNKS=1"),
    "srsl_t0": ("srsl, the trace compiled out (PS_TRACE 0)",
                "PS_BARRIER_RA PS_SPLIT PS_SMEM_TABLE PS_LOOP PS_TRACE=0"),
}
CU = (ROOT / "mlx-kernels/src/graph_decode.cu").read_text()


def source(defs, chunks=4):
    """The step source with `defs` (CHUNKS=N: MV_BATCH = MV_EARLY = N, as
    MLX_GRAPH_PERSIST_CHUNKS)."""
    for d in defs.split():
        if d.startswith("CHUNKS="):
            chunks = int(d.split("=")[1])
    defs = " ".join(d for d in defs.split() if not d.startswith("CHUNKS="))
    return (f"#define MV_ROWS 2\n#define MV_BATCH {chunks}\n#define MV_EARLY {chunks}\n#define NB 1\n"
            "#define MV_MMA 0\n#define MMA_KC 0\n#define MV_ASYNC 1\n#define GRAPH_PERSIST 1\n"
            + "".join(f"#define {d.split('=')[0]} {d.split('=')[1] if '=' in d else 1}\n"
                      for d in defs.split()) + CU)


def functions(sass):
    """{name: (instructions, body as `loops` reads it)} for persist_step and the ps_ functions."""
    text = sass.split("\n")
    heads = [(i, l[:-1]) for i, l in enumerate(text)
             if re.match(r"^(\$persist_step\$\S+|persist_step):$", l)]
    ends = [i for i, l in enumerate(text) if re.match(r"^\S+:$", l) and not l.startswith(".")]
    out = {}
    for i, name in heads:
        j = min([e for e in ends if e > i] + [len(text)])
        ins = []
        for l in text[i:j]:
            m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", l)
            if m:
                ins.append(m.group(2).strip())
        out[name.split("$")[-1]] = (ins, "\n".join([".text.f:"] + text[i + 1:j] + ["//----"]))
    return out


def short(name):
    m = re.match(r"_Z\d+(ps_\w+?)PV?K", name)
    return m.group(1) if m else name


def op(x):
    return re.sub(r"^@!?U?P\w+\s+", "", x).split()[0]


def report(key):
    title, defs = VARIANTS[key]
    _, sass, log = C.disassemble(source(defs))
    print(f"== {key}: {title}; defines {defs}")
    lines = log.split("\n")
    for i, l in enumerate(lines):
        m = re.search(r"Function properties for (\S+)", l)
        if m and ("persist_step" in m.group(1) or "ps_" in m.group(1)) and "ps_none" not in m.group(1):
            props = lines[i + 1].split(".", 1)[1].strip()
            used = lines[i + 2].split(":", 1)[1].strip() if "Used" in lines[i + 2] else ""
            print(f"  {short(m.group(1))}: {props}{'; ' + used if used else ''}")
    for name, (ins, body) in functions(sass).items():
        ops = [op(x) for x in ins]
        calls = sum(1 for x in ins if op(x).startswith("CALL") and "__cuda_sm" not in x)
        ldl = sum(1 for o in ops if o.startswith("LDL"))
        stl = sum(1 for o in ops if o.startswith("STL"))
        print(f"  {short(name)}: {len(ins)} instructions, CALL (not the arithmetic helpers) {calls}, LDL {ldl}, STL {stl}")
        if not any(k in name for k in ("persist_step", "ps_matvec", "ps_qkv")):
            continue
        _, inner = S.loops(body, "f", least=300)
        items = [(s1 - s0 + 1, mix.get("LDL", 0), mix.get("STL", 0), mix.get("FFMA", 0))
                 for s0, s1, mix in inner if mix.get("FFMA", 0)]
        print(f"    item loops (length, LDL, STL, FFMA), {len(items)}: {items}")
        atoms = [k for k, x in enumerate(ins) if op(x).startswith("ATOMG")]
        early = [k for k, x in enumerate(ins) if "LDG.E.NA.128.CONSTANT" in x]
        # A poll: the counter's strong load and the L1 invalidation after it.
        polls = [k for k, x in enumerate(ins) if op(x).startswith("LDG.E.64.STRONG.GPU")
                 and k + 1 < len(ins) and ins[k + 1].startswith("CCTL.IVALL")]
        ffma = [k for k, x in enumerate(ins) if op(x) == "FFMA"]
        to_early = [next((e - a for e in early if e > a), None) for a in atoms]
        to_ffma = [next((f - p for f in ffma if f > p), None) for p in polls]
        print(f"    arrivals (ATOMG) {len(atoms)}: instructions to the next early weight load "
              f"{to_early}")
        print(f"    polls {len(polls)}: instructions from the poll to the next FFMA {to_ffma}")
        stack = [k for k, x in enumerate(ins) if op(x).startswith(("LDL", "STL"))]
        if stack:
            print(f"    LDL/STL at {stack[:40]}{' ...' if len(stack) > 40 else ''}")


for key in sys.argv[1:] or list(VARIANTS):
    report(key)
