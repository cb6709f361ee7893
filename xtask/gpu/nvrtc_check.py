"""Compile-checks mlx-kernels' CUDA sources with NVRTC, here, without a GPU.

    python nvrtc_check.py NVIDIA_ROOT MLX_SRC

NVIDIA_ROOT holds the unpacked `nvidia-cuda-nvrtc`, `nvidia-cuda-runtime` and
`nvidia-cuda-cccl` 13.0 wheels (`nvidia/cu13/{lib,include}`); MLX_SRC a checkout of MLX's
`mlx/backend/cuda/device` headers (MLX's JIT bundles them). Each kernel's source is wrapped as
MLX's `cuda_kernel` wraps it (mlx/backend/cuda/custom_kernel.cpp `build_kernel`) for every
dtype and template instance the crate launches, and compiled for compute_90a with MLX's
options. It catches compile errors before a device call is spent on them.
"""

import ctypes
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CRATE = os.path.join(HERE, "..", "..", "mlx-kernels", "src")

DEFAULT_HEADER = """
#include "mlx/backend/cuda/device/utils.cuh"

#include <cooperative_groups.h>

"""
CUDA_TYPE = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}


def rust_str(path, name):
    text = open(os.path.join(CRATE, path)).read()
    return re.search(r"const %s: &str = r#\"(.*?)\"#;" % name, text, re.S).group(1)


def build(name, header, source, inputs, outputs, templates):
    s = DEFAULT_HEADER + header + "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
    s += f"__global__ void {name}(\n"
    for n, t, ndim in inputs:
        s += f"    const {CUDA_TYPE[t]}* {n},\n"
        if ndim > 0:
            for suffix, ty in (("_shape", "Shape"), ("_strides", "Strides"), ("_ndim", "int")):
                if n + suffix in source:
                    s += f"    const __grid_constant__ {ty} {n}{suffix},\n"
    s += ",\n".join(f"    {CUDA_TYPE[t]}* {n}" for n, t in outputs) + ") {\n"
    for k, v in templates:
        if isinstance(v, bool):
            s += f"  constexpr bool {k} = {'true' if v else 'false'};\n"
        elif isinstance(v, int):
            s += f"  constexpr int {k} = {v};\n"
        else:
            s += f"  using {k} = {CUDA_TYPE[v]};\n"
    s += "\n" + source + "\n}\n\n} // namespace mlx::core::cu\n"
    return s


def nvrtc_compile(lib, src, name, opts):
    """Compiles `src` (bytes) as program `name` (bytes) with NVRTC's `opts` (bytes each) through
    the loaded `libnvrtc` `lib`: (NVRTC's result code, its log as text)."""
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, name, 0, None, None) == 0
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    return rc, log.value.decode(errors="replace").strip()


def compile_one(label, src):
    opts = [b"--device-as-default-execution-space", b"--gpu-architecture=compute_90a",
            f"--include-path={MLX_SRC}".encode(), f"--include-path={CU}/include/cccl".encode(),
            f"--include-path={CU}/include".encode()]
    rc, text = nvrtc_compile(nvrtc, src.encode(), b"k.cu", opts)
    print(f"{'ok  ' if rc == 0 else 'FAIL'} {label}" + (f"\n{text}" if text else ""), flush=True)
    return rc == 0


def main():
    ok = True
    rms_h, rms_s = rust_str("rms_norm.rs", "HEADER"), rust_str("rms_norm.rs", "SOURCE")
    swi_h, swi_s = rust_str("swiglu.rs", "HEADER"), rust_str("swiglu.rs", "SOURCE")
    for dt, nr in (("float32", 4), ("float16", 8), ("bfloat16", 8)):
        for dims, block, chunks, small in ((576, 128, 1, True), (4096, 128, 4, True), (10000, 1024, 1, False)):
            src = build("mlxk_add_rms_norm", rms_h, rms_s,
                        [("x", dt, 3), ("residual", dt, 3), ("weight", dt, 1)],
                        [("h", dt), ("out", dt)],
                        [("T", dt), ("D", dims), ("NR", nr), ("BLOCK", block), ("CHUNKS", chunks), ("SMALL", small),
                         ("EPS_BITS", 0x3727C5AC)])
            ok &= compile_one(f"add_rms_norm {dt} D={dims} BLOCK={block} CHUNKS={chunks} SMALL={small}", src)
        src = build("mlxk_swiglu", swi_h, swi_s, [("gate", dt, 3), ("up", dt, 3)], [("out", dt)],
                    [("T", dt), ("NR", nr)])
        ok &= compile_one(f"swiglu {dt}", src)
    ok &= check_flash()
    sys.exit(0 if ok else 1)


def check_flash():
    """The three flash attention kernels (flash_cuda.rs: HEADER + PRELUDE [+ QUERY_PRELUDE] + body) for every
    dtype, the head dims the tests use, and each mask kind."""
    ok = True
    header, prelude = rust_str("flash_cuda.rs", "HEADER"), rust_str("flash_cuda.rs", "PRELUDE")
    qp = rust_str("flash_cuda.rs", "QUERY_PRELUDE")
    kernels = [("mlxk_flash_fwd", qp, "FWD_SOURCE", ["q", "k", "v"], ["out", "lse"]),
               ("mlxk_flash_dq", qp, "DQ_SOURCE", ["q", "k", "v", "dout", "lse", "delta"], ["dqo"]),
               ("mlxk_flash_dkdv", "", "DKDV_SOURCE", ["q", "k", "v", "dout", "lse", "delta"], ["dko", "dvo"])]
    f32 = ("lse", "delta")
    for dt in ("float32", "float16", "bfloat16"):
        for d, dv, causal, window in ((64, 64, True, 0), (128, 128, True, 100), (128, 128, False, 0),
                                      (16, 8, True, 9), (256, 256, True, 0)):
            tpr = 4 if max(d, dv) <= 64 else 8
            bk = 64
            while bk > 1 and bk * (d + dv) * 4 > 32 * 1024:
                bk //= 2
            for name, start, body, ins, outs in kernels:
                src = build(name, header, prelude + start + rust_str("flash_cuda.rs", body),
                            [(n, "float32" if n in f32 else dt, 4 if n not in f32 else 3) for n in ins],
                            [(n, "float32" if n == "lse" else dt) for n in outs],
                            [("T", dt), ("D", d), ("DV", dv), ("TPR", tpr), ("BK", bk), ("CAUSAL", causal),
                             ("WINDOW", window), ("SCALE_HI", 0x3e00), ("SCALE_LO", 0)])
                ok &= compile_one(f"{name} {dt} D={d} DV={dv} causal={causal} window={window}", src)
    return ok


if __name__ == "__main__":
    ROOT, MLX_SRC = sys.argv[1], sys.argv[2]
    CU = os.path.join(ROOT, "nvidia", "cu13")
    nvrtc = ctypes.CDLL(os.path.join(CU, "lib", "libnvrtc.so.13"))
    main()
