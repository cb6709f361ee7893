#!/usr/bin/env python3
"""Compiles the graph decoder's step sources with NVRTC, here, without a GPU, with the options
gpurt's `load_module` passes (mlx-sys/shim/gpurt.cpp):

    LD_LIBRARY_PATH=LIBDIR python3 nvrtc_step_check.py LIBDIR ARCH FILE.cu ...

LIBDIR holds `libnvrtc.so.13` and `libnvrtc-builtins.so.13.0` (the unpacked
`nvidia-cuda-nvrtc` 13.0 wheel's `nvidia/cu13/lib`), ARCH is `sm_90`; the files come from
mlx-kernels' `step_sources_dump` test (`MLX_SOURCE_DUMP=DIR cargo test -p mlx-kernels --lib
step_sources_dump`, with the `MLX_GRAPH_*` switches under test set: the dump takes what they make
of the sources). Prints each file's result and NVRTC's log; exits 1 if any fails. The CPU
emulator (graph_emulate.py) compiles the same source as plain C++, which accepts what NVRTC
refuses (session 45: a generic lambda in device code), so both run before a device call.
"""
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nvrtc_check import nvrtc_compile  # noqa: E402

lib = ctypes.CDLL(os.path.join(sys.argv[1], "libnvrtc.so.13"))
# gpurt's `load_module` options.
opts = [b"--gpu-architecture=" + sys.argv[2].encode(), b"-std=c++17", b"--fmad=true"]
bad = 0
for f in sys.argv[3:]:
    rc, log = nvrtc_compile(lib, open(f, "rb").read(), b"gpurt.cu", opts)
    print(f"{f}: {'ok' if rc == 0 else 'FAILED (%d)' % rc}")
    if log:
        print(log[:3000])
    bad += rc != 0
sys.exit(1 if bad else 0)
