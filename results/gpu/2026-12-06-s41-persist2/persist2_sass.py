"""The persistent step's machine code, session 41's variants: NVRTC for sm_90 as the decoder
compiles the one-row step (2 rows a warp, MV_ASYNC 1, GRAPH_PERSIST 1), with each lever's
defines. For each: ptxas's registers, stack and spills of persist_step and the phase functions;
what persist_step does between two phases' calls (its loads before each CALL); in ps_matvec,
where the poll loop sits against the early weight loads (LDG.E.NA.128.CONSTANT), the fences
and L1 invalidations (MEMBAR, CCTL.IVALL) on the barrier's path, the 64-bit division call, and
the saves and restores of the ABI's callee-saved registers (STL at entry, LDL before RET); and
the innermost item loops' spills.

    NVRTC_LIB=... NVDISASM=... python3 results/gpu/2026-12-06-s41-persist2/persist2_sass.py
"""
import importlib.util
import os
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location(
    "cost_model", ROOT / "results/gpu/2026-12-06-s39-verify/cost_model.py")
C = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(C)
S = C.S

VARIANTS = [
    ("p1 (session 40: MLX_GRAPH_PERSIST=1)", "", 4),
    ("sr (=2, SPLIT)", "PS_BARRIER_RA PS_SPLIT", 4),
    ("sra (=2, SPLIT, POLL)", "PS_BARRIER_RA PS_SPLIT PS_POLL_RELAXED", 4),
    ("srs (=2, SPLIT, SMEM)", "PS_BARRIER_RA PS_SPLIT PS_SMEM_TABLE", 4),
    ("srs6 (=2, SPLIT, SMEM, CHUNKS=6)", "PS_BARRIER_RA PS_SPLIT PS_SMEM_TABLE", 6),
    ("p1, the trace compiled out (PS_TRACE 0)", "PS_TRACE=0", 4),
]
CU = (ROOT / "mlx-kernels/src/graph_decode.cu").read_text()


def source(defs, chunks):
    return (f"#define MV_ROWS 2\n#define MV_BATCH {chunks}\n#define MV_EARLY {chunks}\n#define NB 1\n"
            "#define MV_MMA 0\n#define MMA_KC 0\n#define MV_ASYNC 1\n#define GRAPH_PERSIST 1\n"
            + "".join(f"#define {d.split('=')[0]} {d.split('=')[1] if '=' in d else 1}\n"
                      for d in defs.split()) + CU)


def sections(sass):
    text = sass.split("\n")
    heads = [(i, l[:-1]) for i, l in enumerate(text) if re.match(r"^(\$persist_step\$\S+|persist_step):$", l)]
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
    m = re.match(r"_Z\d+(ps_\w+?)PK", name)
    return m.group(1) if m else name


for title, defs, chunks in VARIANTS:
    _, sass, log = C.disassemble(source(defs, chunks))
    print(f"== {title}: defines {defs or '-'}, MV_BATCH = MV_EARLY = {chunks}")
    lines = log.split("\n")
    for i, l in enumerate(lines):
        m = re.search(r"Function properties for (\S+)", l)
        if m and ("persist_step" in m.group(1) or "ps_" in m.group(1)) and "ps_none" not in m.group(1):
            props = lines[i + 1].split(".", 1)[1].strip()
            used = lines[i + 2].split(":", 1)[1].strip() if "Used" in lines[i + 2] else ""
            print(f"  {short(m.group(1))}: {props}{'; ' + used if used else ''}")
    secs = sections(sass)
    ins, _ = secs["persist_step"]
    calls = [k for k, x in enumerate(ins) if x.startswith("CALL.REL.NOINC R")]
    if len(calls) > 1:
        between = ins[calls[0] + 1:calls[1] + 1]
        loads = [x.split()[0] for x in between if re.match(r"(LDG|LDS|LDC|LD\.|ULDC)", x)]
        print(f"  persist_step between two phase calls: {len(between)} instructions, loads {loads}")
    for name, (ins, body) in secs.items():
        if "ps_matvec" not in name:
            continue
        first_early = next((k for k, x in enumerate(ins) if "LDG.E.NA.128.CONSTANT" in x), None)
        polls = [k for k, x in enumerate(ins) if re.match(r"LDG\.E\.64\.STRONG\.GPU", x)]
        atoms = [k for k, x in enumerate(ins) if x.startswith("ATOM")]
        ret = next((k for k, x in enumerate(ins) if x.startswith("RET")), len(ins))
        ldl_after_last_atom = sum(1 for x in ins[atoms[-1]:ret] if x.startswith("LDL")) if atoms else 0
        stl_entry = sum(1 for x in ins[:first_early or 0] if x.startswith("STL"))
        fence = [x.split()[0] for x in ins if x.startswith(("MEMBAR", "CCTL"))]
        div = sum(1 for x in ins if "div_u64" in x)
        print(f"  ps_matvec: {len(ins)} instructions; first early weight load at {first_early}, "
              f"first poll load at {polls[0] if polls else None} "
              f"({'after' if polls and first_early is not None and polls[0] > first_early else 'BEFORE'} it); "
              f"atomics at {atoms[:4]}{'...' if len(atoms) > 4 else ''}; RET at {ret}; "
              f"STL before the first early load {stl_entry}; LDL between the last atomic and RET "
              f"{ldl_after_last_atom}; fences/invalidations {dict((f, fence.count(f)) for f in sorted(set(fence)))}; "
              f"64-bit division calls {div}")
        total, inner = S.loops(body, "f", least=300)
        spills = [(s1 - s0 + 1, mix.get("LDL", 0), mix.get("STL", 0), mix.get("FFMA", 0))
                  for s0, s1, mix in inner if mix.get("FFMA", 0)]
        print(f"  ps_matvec item loops (length, LDL, STL, FFMA): {spills}")
