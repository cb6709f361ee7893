"""Runs mlx-kernels' flash attention CUDA kernels on the CPU, here, without a GPU.

    python3 xtask/gpu/flash_emulate.py

Takes the exact kernel sources of `mlx-kernels/src/flash_cuda.rs` (HEADER, PRELUDE and the
three bodies), instantiates them for T = float, bfloat16 (a rounding struct) and _Float16 as plain C++ in which each CUDA block runs as 128
std::threads (`__syncthreads` a barrier, `__shfl_xor_sync` through a shared slot between two
barriers, `__shared__` arrays as function statics, blocks one after another), launches them
over the grid the crate uses, and compares output, dq, dk and dv with a dense attention in
double of the same (rounded) inputs (`flash_emulate_driver.cpp`: causal, sliding window, GQA,
queries after a prefix, no mask, partial tiles, head dims 16/8 to 256; the bounds of
`flash_cuda.rs`). It checks the kernels' indexing, masks, tile
ranges, barriers and lane sums and where they round before a device call is spent on them; not
the GPU's own numerics (expf's ulps, FMA contraction) nor its memory model. Needs g++ with C++20 (std::barrier).
"""
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
src = open(os.path.join(HERE, "..", "..", "mlx-kernels", "src", "flash_cuda.rs")).read()
def rs(name):
    return re.search(r'const %s: &str = r#"(.*?)"#;' % name, src, re.S).group(1)
H, P, QP = rs("HEADER"), rs("PRELUDE"), rs("QUERY_PRELUDE")
pre = r'''
#include <cmath>
#include <barrier>
#include <thread>
#include <vector>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <cstddef>
#include <algorithm>
#include <limits>
#include <array>
#include <random>
using std::min; using std::max;
namespace cuda { namespace std = ::std; }  // MLXK_INF names cuda::std::numeric_limits
#define __device__
#define __forceinline__ inline
#define __shared__ static
struct Dim { int x, y, z; };
thread_local Dim threadIdx, blockIdx;
std::barrier<>* g_bar;
inline void __syncthreads() { g_bar->arrive_and_wait(); }
float g_shfl[128];
inline float __shfl_xor_sync(unsigned, float x, int o) {
  g_shfl[threadIdx.x] = x; __syncthreads();
  float y = g_shfl[threadIdx.x ^ o]; __syncthreads(); return y; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
typedef std::array<int, 8> Shape;
// bfloat16 as MLX's CUDA back-end rounds it (to nearest even); float16 is g++'s _Float16.
struct bf16 {
  uint16_t bits;
  bf16() = default;
  bf16(float f) { uint32_t u; std::memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); bits = u >> 16; }
  operator float() const { uint32_t u = uint32_t(bits) << 16; float f; std::memcpy(&f, &u, 4); return f; }
};
'''
tpl = "template <typename T, int D, int DV, int TPR, int BK, bool CAUSAL, int WINDOW, int SCALE_HI, int SCALE_LO>\n"
bounds = "".join("constexpr double %s = %s;\n" % (n, re.search(r"pub const %s: f32 = (.*?);" % n, src).group(1))
                 for n in ("FUSED_F32_REL_BOUND", "FUSED_BF16_REL_BOUND", "FUSED_F16_REL_BOUND"))
out = pre + bounds + H + "namespace mlx::core::cu {\n"
out += tpl + "void fwd(const T* q, Shape q_shape, const T* k, Shape k_shape, const T* v, T* out, float* lse) {\n" + P + QP + rs("FWD_SOURCE") + "}\n"
out += tpl + "void dqk(const T* q, Shape q_shape, const T* k, Shape k_shape, const T* v, const T* dout, const float* lse, const float* delta, T* dqo) {\n" + P + QP + rs("DQ_SOURCE") + "}\n"
out += tpl + "void dkdv(const T* q, Shape q_shape, const T* k, Shape k_shape, const T* v, const T* dout, const float* lse, const float* delta, T* dko, T* dvo) {\n" + P + rs("DKDV_SOURCE") + "}\n"
out += "}\n"
out += open(os.path.join(HERE, "flash_emulate_driver.cpp")).read()
with tempfile.TemporaryDirectory() as tmp:
    cpp, exe = os.path.join(tmp, "emu.cpp"), os.path.join(tmp, "emu")
    open(cpp, "w").write(out)
    subprocess.run(["g++", "-std=c++20", "-O1", "-pthread", cpp, "-o", exe], check=True)
    sys.exit(subprocess.run([exe]).returncode)
