"""Goldens for mlx_models::gguf_dequant: gguf-py's `gguf.quants.dequantize` (numpy, float32) on
small seeded blocks of every GGML type the Rust dequantizer reads.

Per type two cases: `<type>_finite` (random quants, the block's f16 scales and mins replaced by
seeded finite values) and `<type>_raw` (every byte random: infinities, NaNs with payloads,
subnormal scales). Inputs are the raw bytes, outputs gguf-py's float32 values.

Also writes mlx-models/tests/models/gguf/quants.gguf: one tensor per type (3 rows, written
with gguf-py's GGUFWriter as raw quantized bytes) plus metadata of each value type, so the Rust
test reads the file's header, offsets and shapes, not only the block arithmetic; its expected
values are the cases `file_<tensor>`.

Writes mlx-models/tests/goldens/gguf_dequant.safetensors. Run with
`cargo xtask goldens gguf_dequant`.
"""

import os

import gguf
import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

from golden import Golden

# type -> byte offsets of its f16 scale / min fields within one block
SCALES = {
    T.F32: [],
    T.F16: [],
    T.BF16: [],
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}
# Types added later, drawn from their own generator so that the cases above keep their bytes.
LATER = {
    T.MXFP4: [],
}
BLOCKS = 4


def blocks(rng, qtype, n_blocks, finite):
    block, size = GGML_QUANT_SIZES[qtype]
    if finite and qtype == T.F32:
        return rng.standard_normal(n_blocks * block).astype(np.float32).view(np.uint8), n_blocks * block
    if finite and qtype == T.F16:
        return rng.standard_normal(n_blocks * block).astype(np.float16).view(np.uint8), n_blocks * block
    data = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    if finite:
        for off in {**SCALES, **LATER}[qtype]:
            v = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
            data[:, off:off + 2] = v.view(np.uint8).reshape(n_blocks, 2)
    return data.reshape(-1), n_blocks * block


def main():
    rng = np.random.default_rng(20261201)
    g = Golden("mlx-models/tests/goldens/gguf_dequant.safetensors", __file__)
    for qtype in SCALES:
        for finite in (True, False):
            nb = BLOCKS if GGML_QUANT_SIZES[qtype][0] > 1 else 256
            data, n = blocks(rng, qtype, nb, finite)
            out = gguf.quants.dequantize(data.reshape(1, -1), qtype).reshape(-1)
            assert out.dtype == np.float32 and out.size == n
            name = f"{qtype.name}_{'finite' if finite else 'raw'}"
            g.case(name, "dequantize", [mx.array(data)], [mx.array(out)], ggml_type=int(qtype), elements=n)
    later = np.random.default_rng(20261204)
    for qtype in LATER:
        for finite in (True, False):
            data, n = blocks(later, qtype, BLOCKS, finite)
            out = gguf.quants.dequantize(data.reshape(1, -1), qtype).reshape(-1)
            assert out.dtype == np.float32 and out.size == n
            name = f"{qtype.name}_{'finite' if finite else 'raw'}"
            g.case(name, "dequantize", [mx.array(data)], [mx.array(out)], ggml_type=int(qtype), elements=n)

    # A file: 3 rows per tensor, each row one or two blocks wide.
    path = "mlx-models/tests/models/gguf/quants.gguf"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    w = gguf.GGUFWriter(path, "quants")
    w.add_uint32("test.u32", 7)
    w.add_int8("test.i8", -3)
    w.add_float32("test.f32", 0.5)
    w.add_bool("test.bool", True)
    w.add_string("test.str", "héllo")
    w.add_array("test.ints", [1, 2, 3])
    w.add_array("test.strs", ["a", "bc"])
    for qtype in [*SCALES, *LATER]:
        block, size = GGML_QUANT_SIZES[qtype]
        cols = block * (2 if block == 32 else 1) if block > 1 else 8
        data, n = blocks(rng if qtype in SCALES else later, qtype, 3 * cols // block, True)
        raw = data.reshape(3, -1)
        w.add_tensor(f"t_{qtype.name.lower()}", raw, raw_shape=raw.shape, raw_dtype=qtype)
        out = gguf.quants.dequantize(raw, qtype)
        assert out.shape == (3, cols), (qtype, out.shape)
        g.case(f"file_t_{qtype.name.lower()}", "file", [], [mx.array(out)])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    g.save()


if __name__ == "__main__":
    main()
