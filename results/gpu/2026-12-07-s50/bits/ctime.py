import ctypes, sys, time
L = "/work/gpu-tmp/nvrtc/nvidia/cu13/lib"
lib = ctypes.CDLL(L + "/libnvrtc.so.13")
opts = [b"--gpu-architecture=sm_90", b"-std=c++17", b"--fmad=true"]
def compile_cubin(src):
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"gpurt.cu", 0, None, None) == 0
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t(); lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc, n.value
for name in sys.argv[1:]:
    for side in ("dumpA", "dumpB"):
        src = open(f"/tmp/{side}/{name}.cu", "rb").read()
        t = time.time(); rc, n = compile_cubin(src); dt = time.time() - t
        print(f"{name} {side}: rc {rc}, cubin {n} B, {dt:.1f} s, load {open('/proc/loadavg').read().split()[0]}", flush=True)
