"""Goldens for GGUF loading: a small hand-written GGUF file and what mlx loads from it.

Writes mlx-core/tests/goldens/small.gguf (the input: F32, F16, Q4_0, Q4_1 and Q8_0 tensors and
metadata of every scalar type, number arrays and string arrays) and
mlx-core/tests/goldens/gguf.safetensors (what `mx.load(path, return_metadata=True)` returns).
Run with `cargo xtask goldens gguf`.

Layout of gguf.safetensors (read by mlx-core/tests/gguf.rs):
- metadata `gguf.tensor_names`: the loaded tensor names, sorted, joined with ",";
  case `tensors`: the loaded tensors in that order.
- metadata `gguf.quantized`: "<prefix>:<bits>" for each quantized triple, joined with ",";
  case `dequantized`: mx.dequantize(weight, scales, biases, group_size=32, bits) for each.
- metadata `gguf.meta.<key>` = "array" | "string:<value>" | "strings:<values joined by \\x1f>"
  | "none"; case `meta_arrays`: the array values, in sorted key order.
"""

import os
import struct

import numpy as np

import mlx.core as mx

from golden import Golden

OUT = "mlx-core/tests/goldens/small.gguf"
rng = np.random.default_rng(11)

# ---- a minimal GGUF v3 writer ----
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
       U64: "<Q", I64: "<q", F64: "<d"}
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0 = 0, 1, 2, 3, 8
ALIGN = 32


def gstr(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def gval(t, v):
    if t == STR:
        return gstr(v)
    if t == ARR:
        et, items = v
        body = b"".join(gval(et, x) for x in items)
        return struct.pack("<IQ", et, len(items)) + body
    return struct.pack(FMT[t], v)


def f16(x):
    return np.float16(x).tobytes()


def q4_0(rows, cols):
    blocks = []
    for _ in range(rows * cols // 32):
        d = rng.uniform(0.01, 0.2)
        blocks.append(f16(d) + rng.integers(0, 256, 16, dtype=np.uint8).tobytes())
    return b"".join(blocks)


def q4_1(rows, cols):
    blocks = []
    for _ in range(rows * cols // 32):
        d, m = rng.uniform(0.01, 0.2), rng.uniform(-1, 1)
        blocks.append(f16(d) + f16(m) + rng.integers(0, 256, 16, dtype=np.uint8).tobytes())
    return b"".join(blocks)


def q8_0(rows, cols):
    blocks = []
    for _ in range(rows * cols // 32):
        d = rng.uniform(0.001, 0.05)
        blocks.append(f16(d) + rng.integers(-128, 128, 32, dtype=np.int8).tobytes())
    return b"".join(blocks)


# (name, shape as numpy row-major, ggml type, data)
tensors = [
    ("norm.weight", (16,), GGML_F32, rng.standard_normal(16).astype(np.float32).tobytes()),
    ("emb.weight", (4, 32), GGML_F16, rng.standard_normal((4, 32)).astype(np.float16).tobytes()),
    ("blk.0.q4_0.weight", (3, 64), GGML_Q4_0, q4_0(3, 64)),
    ("blk.0.q4_1.weight", (2, 96), GGML_Q4_1, q4_1(2, 96)),
    ("blk.0.q8_0.weight", (4, 32), GGML_Q8_0, q8_0(4, 32)),
    ("cube", (2, 3, 4), GGML_F32, rng.standard_normal((2, 3, 4)).astype(np.float32).tobytes()),
]

kvs = [
    ("general.architecture", STR, "llama"),
    ("general.alignment", U32, ALIGN),
    ("t.u8", U8, 200),
    ("t.i8", I8, -100),
    ("t.u16", U16, 60000),
    ("t.i16", I16, -30000),
    ("t.u32", U32, 4000000000),
    ("t.i32", I32, -2000000000),
    ("t.f32", F32, 0.1),
    ("t.bool", BOOL, True),
    ("t.u64", U64, 2**40 + 3),
    ("t.i64", I64, -(2**40) - 3),
    # No FLOAT64 value: with tensors present, MLX 0.32.4's GGUF reader crashes on one
    # (mlx_core::io::load_gguf refuses such files; tested in mlx-core/tests/gguf.rs).
    ("t.str", STR, "héllo wörld"),
    ("t.empty_str", STR, ""),
    ("t.u32s", ARR, (U32, [1, 2, 3, 4])),
    ("t.f32s", ARR, (F32, [0.5, -1.25])),
    ("t.i32s", ARR, (I32, [-7, 0, 7])),
    ("t.strs", ARR, (STR, ["a", "Ġb c", "<|im_end|>", ""])),
]

out = bytearray(b"GGUF")
out += struct.pack("<IQQ", 3, len(tensors), len(kvs))
for k, t, v in kvs:
    out += gstr(k) + struct.pack("<I", t) + gval(t, v)
offset = 0
datas = []
for name, shape, t, data in tensors:
    out += gstr(name) + struct.pack("<I", len(shape))
    for d in reversed(shape):  # ggml lists the innermost dimension first
        out += struct.pack("<Q", d)
    out += struct.pack("<IQ", t, offset)
    datas.append(data + b"\0" * ((-len(data)) % ALIGN))
    offset += len(datas[-1])
out += b"\0" * ((-len(out)) % ALIGN)
out += b"".join(datas)
os.makedirs(os.path.dirname(OUT), exist_ok=True)
with open(OUT, "wb") as f:
    f.write(out)

# ---- what mlx makes of it ----
arrays, meta = mx.load(OUT, return_metadata=True)
g = Golden("mlx-core/tests/goldens/gguf.safetensors", __file__)
names = sorted(arrays)
g.meta["gguf.tensor_names"] = ",".join(names)
g.case("tensors", "tensors", [], [arrays[n] for n in names])
quant = [(n[: -len(".weight")], 8 if "q8" in n else 4) for n in names
         if n.endswith(".weight") and n[: -len(".weight")] + ".scales" in arrays]
g.meta["gguf.quantized"] = ",".join(f"{p}:{b}" for p, b in quant)
g.case("dequantized", "dequantize", [], [
    mx.dequantize(arrays[p + ".weight"], arrays[p + ".scales"], arrays[p + ".biases"], group_size=32, bits=b)
    for p, b in quant])
meta_arrays = []
for k in sorted(meta):
    v = meta[k]
    if isinstance(v, mx.array):
        g.meta[f"gguf.meta.{k}"] = "array"
        meta_arrays.append(v)
    elif isinstance(v, str):
        g.meta[f"gguf.meta.{k}"] = "string:" + v
    elif isinstance(v, list):
        g.meta[f"gguf.meta.{k}"] = "strings:" + "\x1f".join(v)
    else:
        assert v is None, (k, v)
        g.meta[f"gguf.meta.{k}"] = "none"
g.case("meta_arrays", "meta_arrays", [], meta_arrays)
g.save()
