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
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1] + "/libnvrtc.so.13")
arch = sys.argv[2]
bad = 0
for f in sys.argv[3:]:
    src = open(f, "rb").read()
    prog = ctypes.c_void_p()
    r = lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"gpurt.cu", 0, None, None)
    assert r == 0, r
    opts = [b"--gpu-architecture=" + arch.encode(), b"-std=c++17", b"--fmad=true"]
    arr = (ctypes.c_char_p * 3)(*opts)
    r = lib.nvrtcCompileProgram(prog, 3, arr)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    print(f"{f}: {'ok' if r == 0 else 'FAILED (%d)' % r}")
    if log.value.strip():
        print(log.value.decode()[:3000])
    bad += r != 0
sys.exit(1 if bad else 0)
