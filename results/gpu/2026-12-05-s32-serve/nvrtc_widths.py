"""Compile graph_decode.cu (+ qk_norm + gemma sources) with NVRTC for sm_90 at the given NB / MV_MMA."""
import ctypes, sys, time, os
nv = ctypes.CDLL("/tmp/gpumoe/nv/nvidia/cu13/lib/libnvrtc.so.13")
src_dir = "/work/wt-gpuserve/mlx-kernels/src"
base = open(f"{src_dir}/graph_decode.cu").read()
extra = open(f"{src_dir}/graph_qk_norm.cu").read() + open(f"{src_dir}/graph_gemma.cu").read()
for arg in sys.argv[1:]:
    nb, mma = map(int, arg.split(":"))
    src = f"#define MV_ROWS 2\n#define MV_BATCH 4\n#define MV_EARLY 4\n#define NB {nb}\n#define MV_MMA {mma}\n" + base + extra
    prog = ctypes.c_void_p()
    assert nv.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"gpurt.cu", 0, None, None) == 0
    opts = [b"--gpu-architecture=sm_90", b"-std=c++17", b"--fmad=true"]
    arr = (ctypes.c_char_p * 3)(*opts)
    t = time.time()
    r = nv.nvrtcCompileProgram(prog, 3, arr)
    n = ctypes.c_size_t()
    nv.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    nv.nvrtcGetProgramLog(prog, log)
    sz = ctypes.c_size_t(); nv.nvrtcGetCUBINSize(prog, ctypes.byref(sz))
    print(f"NB={nb} MV_MMA={mma}: result {r}, {time.time()-t:.1f} s, cubin {sz.value} B", flush=True)
    if r != 0 or log.value.strip():
        print(log.value.decode()[:3000])
