"""Runs the graph decoder's CUDA kernels on the CPU, here, without a GPU, against mlx-lm.

    [GRAPH_EMU_FP4=1] [GRAPH_EMU_ROWS=2|4] [GRAPH_EMU_BATCH=N] [GRAPH_EMU_NB=N] [GRAPH_EMU_MMA=1] [GRAPH_EMU_MMA_KC=N] [GRAPH_EMU_MMA_ASYNC=1] [GRAPH_EMU_MMA_BANKS=1] [GRAPH_EMU_MMA_PAIR=1 [GRAPH_EMU_MMA_PAIR_MUTATE=swap|scale]] [GRAPH_EMU_MV_ASYNC=1] [GRAPH_EMU_MV_NB=1] [GRAPH_EMU_MV_WIDE=1] [GRAPH_EMU_EARLY_NORM=1] [GRAPH_EMU_PERSIST=1 [GRAPH_EMU_PERSIST_GRID=N] [GRAPH_EMU_PERSIST_LOOP=1] [GRAPH_EMU_PERSIST_MUTATE=skip|barrier|loop_order|loop_target]] [GRAPH_EMU_RESIDENT=N] [GRAPH_EMU_DUMP=DIR] [GRAPH_EMU_SKIP_SAMPLER=1] [GRAPH_EMU_NB_CHECK_ONLY=1] $MLX_ORACLE_VENV/bin/python xtask/gpu/graph_emulate.py [FIXTURE ...]

Takes the exact source of `mlx-kernels/src/graph_decode.cu` as plain C++: each CUDA block
runs as its threads (std::thread); `__syncthreads` is a block barrier, and `__shfl_xor_sync`
goes through a per-warp slot between two warp barriers; `__shared__` arrays become function
statics (blocks run one after another). It is built as a shared library, and the kernels
are launched from here in the order `graph_decode.rs` records one step (`record_step`), over
device buffers laid out as `GraphDecoder::load` lays them out (each weight as the model holds
it: q, k and v, gate and up, scales and biases apart; the kernels pair q/k rows for RoPE and
interleave gate/up rows by index).

Mixture-of-experts rows (`make_qwen3_moe`, `make_qwen3_moe_k3`, `make_mixtral`, also quantized
with `q4:`, and `q4r8:` with the routers in 8 bits as mlx-lm's convert writes qwen3_moe): the
router, `moe_route`, the chosen experts' `matvec_experts` and `moe_combine` (graph_moe.cu), in
the order `record_experts` launches them; `route_check` runs `moe_route` alone against
mlx-lm's routers on the same bfloat16 logits. gpt_oss (`make_gpt_oss`, and `fp4e:make_gpt_oss`
with its experts in MLX's mxfp4, the rest bfloat16, as its checkpoint loads): the step source
gpt_oss's spec compiles (sinks, matvec's biased o projection and router, the experts' biases
and clamped SwiGLU, mxfp4 experts), sliding and full layers; fp4e's reference takes its mxfp4
products over the dequantized weights in float32 (`gather_qmm_fp4_f32`; GRAPH_EMU_FP4_MLX=1
keeps MLX's CPU product), and GRAPH_EMU_FP4=1 adds `fp4_check` (the mxfp4 product alone).

The CUDA test's own gpt_oss rows (`rs:gpt_oss`, `rs:gpt_oss_mxfp4`: graph_models.rs's weights
bit for bit, their fingerprint printed as the test's MLX_GRAPH_FOLLOW_CPU=1 prints it) run as
`graph_decoder_follows_the_mlx_forward` runs them: a 40-token prompt, 24 teacher-forced steps,
a cache of 128, the reference over mlx-lm's make_cache (RotatingKVCache(48) on the sliding
layers). Each step prints its difference, the float32 reference's (the same weights in float32
on the CPU) against ours and against mlx-lm's, and per layer the routers' top-k margins (mlx-lm's,
ours, how far the two sides' router logits are apart); then the test's near-tie rule
(ROUTER_NEAR_TIE in graph_decode.rs). GRAPH_EMU_FOLLOW=f32 teacher-forces on the float32
reference's picks (as the test does with MLX_GRAPH_FOLLOW_CPU=1), GRAPH_EMU_FOLLOW=ours on ours;
GRAPH_EMU_PROMPT and GRAPH_EMU_STEPS override the prompt's length and the steps.

First the greedy sampler's two kernels alone (`sampler_check`: vocabularies of one to 25
blocks, ties and near ties) against mlx-lm's pick. Then, for each llama fixture (default: the
three `GraphDecoder` accepts, `dense_bf16_mha` with traditional RoPE and MHA,
`dense_bf16_untied`, `q8_g32_bf16` with 8-bit weights, and `q4:dense_bf16_untied`, that one
quantized here to 4 bits in groups of 64), mlx-lm 0.32.2's own model (`mlx_lm.utils.load_model`, CPU) prefills a prompt. Its KV cache is
copied in, and then, teacher-forced for 8 steps, the emulated step's logits are compared with
mlx-lm's. The bounds are `TEACHER_FORCED_BOUNDS` in graph_decode.rs. A quantized fixture
outside them passes only if its layer-0 down projection is closer to a float64 product over
the dequantized weights than MLX's CPU `quantized_matmul` is, and greedy agreement is at
least 75%: MLX's CPU quantized products are themselves that far off (on the GPU, where
MLX's are not, the decoder is within the bounds: `results/gpu/README.md`).

What this checks:
- the kernels' indexing, layouts, rounding points, barriers and lane sums;
- the combine by the last block, and the argmax;
- the step state;
- where they round.

It does not check the GPU's own numerics or its memory model, and not programmatic dependent
launch: the `griddepcontrol` and `prefetch` instructions compile only for the device.

With GRAPH_EMU_MMA=1 (the tensor-core tiles) and GRAPH_EMU_NB=N > 1, `mma_bit_check` runs the
N-sequence tile against main's 5-sequence tile (c6af23fc's source, from git) 5 sequences at a
time, every output bit for bit; GRAPH_EMU_MMA_KC=512 stages every product of K > 512 in chunks
(`mma_chunk` in graph_decode.rs). Widths past 8 are tensor-core tiles only (GRAPH_EMU_MMA=1).
GRAPH_EMU_MMA_ASYNC=1 builds this tree's tiles with the cp.async weight ring (MMA_ASYNC,
MLX_GRAPH_MMA_ASYNC=1 on the device; the emulator copies at once, so the check is of the ring's
slots, halves and order, not of the device's memory ordering).
GRAPH_EMU_MMA_BANKS=1 builds this tree's tiles with their staged inputs, chunk sums and partial
sums placed in distinct banks (MMA_BANKS, MLX_GRAPH_MMA_BANKS=1 on the device): only addresses
move, so mma_bit_check must find every output bit-equal to main's tile.
GRAPH_EMU_MMA_PAIR=1 builds this tree's tiles with items of two rows blocks (MMA_PAIR,
MLX_GRAPH_MMA_PAIR=1 on the device): each rows block's sums in their own order, so mma_bit_check
must find every output bit-equal to main's tile, and every step's logits (GRAPH_EMU_DUMP) must be
a run without it's. GRAPH_EMU_MMA_PAIR_MUTATE=swap writes the pair's two rows blocks with each
other's sums, =scale scales the second rows block's sums by the first's scales and biases: both
must fail.
GRAPH_EMU_MV_ASYNC=1 builds this tree's FFMA row kernels (mv_run) with their scales and biases
kept as loaded and read where summed (MV_ASYNC, MLX_GRAPH_MV_ASYNC=1 on the device), and
`nb_bit_check` then runs at any NB (1 included) against the one-sequence kernel of main's source
(MV_ASYNC_REF, a commit, from git): every output bit for bit.
GRAPH_EMU_MV_NB=1 builds this tree's FFMA tiles of several sequences with MV_NB (MLX_GRAPH_MV_NB=1
on the device: MV_BATCH items a trip from constant register slots), and `nb_bit_check` then
compares every sequence's output both with the one-sequence kernel (this tree's, no switch) and
with the NB-sequence kernel built without the switch: every output bit for bit.
GRAPH_EMU_PERSIST=1 builds the persistent step (GRAPH_PERSIST, MLX_GRAPH_PERSIST=1 on the device)
and runs each one-row llama step's row and attention kernels as one `persist_step` grid, its
blocks at once (PERSIST below); compare the steps' logits with a run without it.

Needs g++ with C++20 (std::barrier).
"""
import ctypes
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
# graph_decode.cu, graph_qk_norm.cu, graph_gemma.cu and graph_moe.cu (which the decoder appends
# only for a model with q/k norms, with sandwich norms, with experts; always here).
CU = "".join((ROOT / "mlx-kernels" / "src" / f).read_text()
             for f in ("graph_decode.cu", "graph_qk_norm.cu", "graph_gemma.cu", "graph_moe.cu"))
RS = (ROOT / "mlx-kernels" / "src" / "graph_decode.rs").read_text()
NEAR_TIE = float(re.search(r"pub const ROUTER_NEAR_TIE: f32 = (.*?);", RS).group(1))
NEAR_TIES = int(re.search(r"pub const ROUTER_NEAR_TIES: usize = (.*?);", RS).group(1))
BOUND_REL, BOUND_AGREE = (
    float(x) for x in re.search(r"TEACHER_FORCED_BOUNDS: \(f32, f32\) = \((.*?), (.*?)\);", RS).groups()
)

# Logits a block of the greedy sampler's kernels (ARGMAX_THREADS * ARGMAX_PER in the source).
ARGMAX_SLICE = 1
for _name in ("ARGMAX_THREADS", "ARGMAX_PER"):
    ARGMAX_SLICE *= int(re.search(rf"#define {_name} (\d+)", CU).group(1))

PRE = r"""
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#define __global__
#define __device__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct Dim { unsigned x, y, z; };
thread_local Dim threadIdx, blockIdx;
Dim blockDim, gridDim;
std::barrier<>* g_bar;
std::barrier<>* g_wbar[32];
float g_fs[32][32];
int g_is[32][32];
unsigned g_us[32][32];
// The persistent step's blocks run at once (run_grid_coop), each with its own barriers, warp
// exchange slots and shared memory (t_bar set: these; else the globals above, blocks running one
// after another); EMU_BLOCKS at most.
#define EMU_BLOCKS 16
thread_local std::barrier<>* t_bar = nullptr;
thread_local std::barrier<>* t_wbar[32];
thread_local std::barrier<>* t_hbar[2];
thread_local float (*t_fs)[32] = g_fs;
thread_local int (*t_is)[32] = g_is;
thread_local unsigned (*t_us)[32] = g_us;
float g_fs_blk[EMU_BLOCKS][32][32];
int g_is_blk[EMU_BLOCKS][32][32];
unsigned g_us_blk[EMU_BLOCKS][32][32];
alignas(16) unsigned char g_smem_store[EMU_BLOCKS][256 * 1024];
thread_local unsigned char* g_smem = g_smem_store[0];
inline std::barrier<>* warp_bar(int w) { return t_bar ? t_wbar[w] : g_wbar[w]; }
inline void __syncthreads() { (t_bar ? t_bar : g_bar)->arrive_and_wait(); }
// The persistent step's half-block barrier (bar.sync 1 + half, 128) and its spin's pause.
inline void emu_half_sync(int half) { t_hbar[half]->arrive_and_wait(); }
inline void emu_yield() { std::this_thread::yield(); }
inline void __trap() { fprintf(stderr, "__trap\n"); abort(); }
inline double __longlong_as_double(long long v) { double d; std::memcpy(&d, &v, 8); return d; }
inline void __syncwarp() { warp_bar(threadIdx.x >> 5)->arrive_and_wait(); }
inline void __threadfence() {}
template <class T> inline T shfl(T (*slot)[32], T v, int o) {
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  slot[w][l] = v;
  warp_bar(w)->arrive_and_wait();
  T r = slot[w][l ^ o];
  warp_bar(w)->arrive_and_wait();
  return r;
}
inline unsigned __ballot_sync(unsigned, int p) {
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  t_is[w][l] = p != 0;
  warp_bar(w)->arrive_and_wait();
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= (unsigned)t_is[w][i] << i;
  warp_bar(w)->arrive_and_wait();
  return r;
}
inline float __shfl_xor_sync(unsigned, float v, int o) { return shfl(t_fs, v, o); }
inline int __shfl_xor_sync(unsigned, int v, int o) { return shfl(t_is, v, o); }
inline unsigned __shfl_sync(unsigned, unsigned v, int src) {
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  t_us[w][l] = v;
  warp_bar(w)->arrive_and_wait();
  unsigned r = t_us[w][src];
  warp_bar(w)->arrive_and_wait();
  return r;
}
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned sel) {
  const unsigned long long v = x | ((unsigned long long)y << 32);
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return r;
}
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline float __ldcg(const float* p) { return *p; }
inline float __fmul_rn(float a, float b) { return a * b; }
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
inline float4 __ldcg(const float4* p) { return *p; }
inline float2 __ldcg(const float2* p) { return *p; }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline int atomicExch(int* p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
inline int atomicMax(int* p, int v) {
  int o = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (o < v && !__atomic_compare_exchange_n(p, &o, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
  return o;
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
// mma.sync.m16n8k16 (bfloat16 A and B, float32 C and D) over the warp's fragments, as the PTX
// ISA lays them out: each lane posts its A and B registers, then computes its four elements
// of D from all lanes' (the products exact, summed in double, added to C, rounded once; the
// tensor cores' own order and rounding are not known here).
unsigned g_ma[32][32][4], g_mb[32][32][2];
inline float bf_half(unsigned p, int hi) { unsigned u = hi ? (p & 0xffff0000u) : (p << 16); float f; std::memcpy(&f, &u, 4); return f; }
inline void mma_emulate(float* d, const unsigned* a, const unsigned* b) {
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  for (int i = 0; i < 4; ++i) g_ma[w][l][i] = a[i];
  g_mb[w][l][0] = b[0];
  g_mb[w][l][1] = b[1];
  g_wbar[w]->arrive_and_wait();
  const int g = l >> 2, t = l & 3;
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int m = g + 8 * (e >> 1), n = 2 * t + (e & 1);
    double s = 0;
    for (int k = 0; k < 16; ++k) {
      const int al = 4 * (m & 7) + ((k & 7) >> 1), ar = (m >> 3) + 2 * (k >> 3);
      const int bl = 4 * n + ((k & 7) >> 1), br = k >> 3;
      s += (double)bf_half(g_ma[w][al][ar], k & 1) * (double)bf_half(g_mb[w][bl][br], k & 1);
    }
    out[e] = (float)((double)d[e] + s);
  }
  g_wbar[w]->arrive_and_wait();
  for (int e = 0; e < 4; ++e) d[e] = out[e];
}
"""

LAUNCH = r"""
template <class F> void run_grid(unsigned gx, unsigned gy, unsigned bx, F f) {
  gridDim = {gx, gy, 1};
  blockDim = {bx, 1, 1};
  for (unsigned y = 0; y < gy; ++y)
    for (unsigned x = 0; x < gx; ++x) {
      std::barrier<> bar(bx);
      g_bar = &bar;
      std::vector<std::barrier<>*> wb;
      for (unsigned w = 0; w < (bx + 31) / 32; ++w) { wb.push_back(new std::barrier<>(32)); g_wbar[w] = wb.back(); }
      std::vector<std::thread> ts;
      for (unsigned t = 0; t < bx; ++t)
        ts.emplace_back([=] { threadIdx = {t, 0, 0}; blockIdx = {x, y, 0}; f(); });
      for (auto& t : ts) t.join();
      for (auto* b : wb) delete b;
    }
}
// The persistent step's grid (GRAPH_PERSIST): every block at once, each thread its own
// (blocks of 256: halves of 128 with their own barriers), so that the grid barrier can work.
template <class F> void run_grid_coop(unsigned gx, unsigned bx, F f) {
  gridDim = {gx, 1, 1};
  blockDim = {bx, 1, 1};
  if (gx > EMU_BLOCKS || bx != 256) { fprintf(stderr, "run_grid_coop: %u blocks of %u\n", gx, bx); abort(); }
  std::vector<std::barrier<>*> bars;
  for (unsigned i = 0; i < gx * 11; ++i) bars.push_back(new std::barrier<>(i % 11 == 0 ? 256 : i % 11 < 3 ? 128 : 32));
  std::vector<std::thread> ts;
  for (unsigned x = 0; x < gx; ++x)
    for (unsigned t = 0; t < bx; ++t)
      ts.emplace_back([=] {
        threadIdx = {t, 0, 0}; blockIdx = {x, 0, 0}; g_smem = g_smem_store[x];
        t_fs = g_fs_blk[x]; t_is = g_is_blk[x]; t_us = g_us_blk[x];
        t_bar = bars[11 * x]; t_hbar[0] = bars[11 * x + 1]; t_hbar[1] = bars[11 * x + 2];
        for (unsigned w = 0; w < 8; ++w) t_wbar[w] = bars[11 * x + 3 + w];
        f();
      });
  for (auto& t : ts) t.join();
  for (auto* b : bars) delete b;
}
typedef unsigned long long u64;
#define A(i) (a[i])
#define P(T, i) ((T)(uintptr_t)a[i])
#define L(i) ((long long)a[i])
inline double D_(u64 v) { double d; std::memcpy(&d, &v, 8); return d; }
extern "C" void emu(int k, unsigned gx, unsigned gy, unsigned bx, const u64* a) {
  switch (k) {
    case 0: run_grid(gx, gy, bx, [=] { embed(P(const void*, 0), P(const bf16_t*, 1), P(const bf16_t*, 2), P(const int*, 3), P(bf16_t*, 4), L(5), L(6), L(7), P(float*, 8), L(9), L(10), P(const float*, 11), D_(a[12]), D_(a[13]), D_(a[14]), L(15), P(const float*, 16), D_(a[17]), D_(a[18])); }); break;
    case 1: run_grid(gx, gy, bx, [=] { matvec(P(const void*, 0), P(const void*, 1), P(const bf16_t*, 2), P(const bf16_t*, 3), P(const bf16_t*, 4), P(const bf16_t*, 5), P(const bf16_t*, 6), P(const bf16_t*, 7), P(const bf16_t*, 8), P(void*, 9), L(10), L(11), L(12), L(13), L(14), D_(a[15]), P(u64*, 16), D_(a[17])); }); break;
#if MMA_LATE_NORM >= 2
    case 14: run_grid(gx, gy, bx, [=] { matvec_norm(P(const void*, 0), P(const void*, 1), P(const bf16_t*, 2), P(const bf16_t*, 3), P(const bf16_t*, 4), P(const bf16_t*, 5), P(const bf16_t*, 6), P(const bf16_t*, 7), P(const bf16_t*, 8), P(void*, 9), L(10), L(11), L(12), L(13), L(14), D_(a[15]), P(u64*, 16), D_(a[17])); }); break;
#endif
    case 2: run_grid(gx, gy, bx, [=] { matvec_qkv(P(const void*, 0), P(const void*, 1), P(const void*, 2), P(const bf16_t*, 3), P(const bf16_t*, 4), P(const bf16_t*, 5), P(const bf16_t*, 6), P(const bf16_t*, 7), P(const bf16_t*, 8), P(const bf16_t*, 9), P(const bf16_t*, 10), P(bf16_t*, 11), P(bf16_t*, 12), P(bf16_t*, 13), P(const int*, 14), L(15), L(16), L(17), L(18), L(19), L(20), L(21), L(22), D_(a[23]), P(const float*, 24), P(u64*, 25), L(26), P(const bf16_t*, 27), L(28)); }); break;
    case 3: run_grid(gx, gy, bx, [=] { attention(P(const bf16_t*, 0), P(const bf16_t*, 1), P(const bf16_t*, 2), P(const int*, 3), P(float*, 4), P(float*, 5), P(int*, 6), P(bf16_t*, 7), L(8), L(9), L(10), L(11), L(12), D_(a[13]), P(u64*, 14), L(15), D_(a[16]), P(const bf16_t*, 17)); }); break;
    case 7: run_grid(gx, gy, bx, [=] { norm_add(P(const bf16_t*, 0), P(const bf16_t*, 1), P(bf16_t*, 2), L(3), D_(a[4])); }); break;
    case 4: run_grid(gx, gy, bx, [=] { argmax_partial(P(const float*, 0), P(const float*, 1), P(float*, 2), P(int*, 3), L(4)); }); break;
    case 6: run_grid(gx, gy, bx, [=] { qk_norm_rope(P(bf16_t*, 0), P(bf16_t*, 1), P(const int*, 2), P(const bf16_t*, 3), P(const bf16_t*, 4), P(const float*, 5), L(6), L(7), L(8), L(9), L(10), D_(a[11])); }); break;
    case 12: run_grid(gx, gy, bx, [=] { qk_norm_full_rope(P(bf16_t*, 0), P(bf16_t*, 1), P(const int*, 2), P(const bf16_t*, 3), P(const bf16_t*, 4), P(const float*, 5), L(6), L(7), L(8), L(9), L(10), L(11), D_(a[12])); }); break;
    case 8: run_grid(gx, gy, bx, [=] { moe_route(P(const bf16_t*, 0), P(int*, 1), P(float*, 2), L(3), L(4), L(5), L(6), P(const bf16_t*, 7)); }); break;
    case 9: run_grid(gx, gy, bx, [=] { matvec_experts(P(const void*, 0), P(const void*, 1), P(const bf16_t*, 2), P(const bf16_t*, 3), P(const bf16_t*, 4), P(const bf16_t*, 5), P(const bf16_t*, 6), P(const bf16_t*, 7), P(bf16_t*, 8), P(const int*, 9), L(10), L(11), L(12), L(13), L(14), D_(a[15]), L(16), L(17), P(u64*, 18), P(const bf16_t*, 19), P(const bf16_t*, 20)); }); break;
    case 10: run_grid(gx, gy, bx, [=] { moe_combine(P(const bf16_t*, 0), P(const float*, 1), P(bf16_t*, 2), L(3), L(4)); }); break;
    case 11: run_grid(gx, gy, bx, [=] { matvec_attn_out(P(const void*, 0), P(const bf16_t*, 1), P(const bf16_t*, 2), P(const float*, 3), P(const float*, 4), P(const int*, 5), P(const bf16_t*, 6), P(bf16_t*, 7), L(8), L(9), L(10), L(11), L(12), L(13), L(14), P(u64*, 15), D_(a[16])); }); break;
#if GRAPH_PERSIST
    case 13: run_grid_coop(gx, bx, [=] { persist_step(P(const u64*, 0), L(1), P(u64*, 2), L(3), P(u64*, 4)); }); break;
#endif
    case 5: run_grid(gx, gy, bx, [=] { argmax_pick(P(const float*, 0), P(const float*, 1), P(const float*, 2), P(int*, 3), P(int*, 4), P(int*, 5), L(6), L(7)); }); break;
  }
}
"""


ROWS = int(os.environ.get("GRAPH_EMU_ROWS", "2"))  # GraphOptions::rows_per_warp
BATCH = int(os.environ.get("GRAPH_EMU_BATCH", str(8 // ROWS)))  # GraphOptions::chunks_in_flight
# Prompt tokens: 150 puts the 8 steps' attention over 3 chunks of 64 (the combine by the
# last block runs over several).
PROMPT = int(os.environ.get("GRAPH_EMU_PROMPT", "150"))
# The one-wave cap on a matrix-vector grid (the GPU's resident blocks): small here, so that
# warps stream over several row groups as they do on the GPU for the large matrices.
RESIDENT = int(os.environ.get("GRAPH_EMU_RESIDENT", "3"))
# Sequences a step (GraphOptions::sequences): row 0 decodes the prompt as with one; rows
# 1.. their own prompts (shorter by 17 tokens a row, other tokens); row 1 leaves after step 4
# and, with 3 rows or more, the last row joins at step 2 (idle before).
NB = int(os.environ.get("GRAPH_EMU_NB", "1"))
# Tensor-core tiles (GraphOptions::tensor_cores_from; MV_MMA in the source): 4-bit weights in
# groups of 64 through mma.sync, emulated (mma_emulate above).
MMA = int(os.environ.get("GRAPH_EMU_MMA", "0"))
# The tensor-core tiles' staged inputs (MMA_KC in the source, `mma_chunk` in graph_decode.rs;
# a multiple of 512, 0: all of K): GRAPH_EMU_MMA_KC=512 runs every product of K > 512 in chunks.
MMA_KC = int(os.environ.get("GRAPH_EMU_MMA_KC", "0"))
# The tensor-core tiles' cp.async ring (MMA_ASYNC in the source, MLX_GRAPH_MMA_ASYNC=1 on the
# device): GRAPH_EMU_MMA_ASYNC=1 builds this tree's tiles with it (main's reference tile of
# mma_bit_check stays as it is).
MMA_ASYNC = int(os.environ.get("GRAPH_EMU_MMA_ASYNC", "0"))
# The tensor-core tiles' bank-conflict-free placement of the staged inputs, chunk sums and
# partial sums (MMA_BANKS in the source, MLX_GRAPH_MMA_BANKS=1 on the device):
# GRAPH_EMU_MMA_BANKS=1 builds this tree's tiles with it (mma_bit_check's reference stays main's).
MMA_BANKS = int(os.environ.get("GRAPH_EMU_MMA_BANKS", "0"))
# The tensor-core tiles' items of two rows blocks (MMA_PAIR in the source, MLX_GRAPH_MMA_PAIR=1
# on the device): GRAPH_EMU_MMA_PAIR=1 builds this tree's tiles with it (mma_bit_check's
# reference stays main's); GRAPH_EMU_MMA_PAIR_MUTATE=swap|scale breaks it on purpose.
MMA_PAIR = int(os.environ.get("GRAPH_EMU_MMA_PAIR", "0"))
MMA_PAIR_MUTATE = os.environ.get("GRAPH_EMU_MMA_PAIR_MUTATE", "")
# The tensor-core tiles' normed products with their 1 / rms applied at the epilogue (MMA_LATE_NORM
# in the source, MLX_GRAPH_MMA_LATE_NORM=1 or 2 on the device: matvec_qkv's products at 1, and at
# 2 gate/up's and the head's too, launched as matvec_norm): GRAPH_EMU_MMA_LATE=1 builds this
# tree's tiles at level 2 (level 1's matvec_qkv is the same code) and launches matvec_norm where
# the host then does (mv_kernel: the normed products of a model of 4-bit weights in groups of 64
# on the tensor cores); mma_bit_check then wants its norm modes bit-equal to this tree's own
# 5-sequence tile with it (every width alike) and within a bound of main's (tier L3), the other
# modes bit-equal to main's as before. GRAPH_EMU_MMA_LATE_MUTATE=drop leaves the 1 / rms out of
# the epilogue on purpose (the reference 5-sequence tile is built without the mutation).
MMA_LATE = int(os.environ.get("GRAPH_EMU_MMA_LATE", "0"))
MMA_LATE_MUTATE = os.environ.get("GRAPH_EMU_MMA_LATE_MUTATE", "")
# The FFMA row kernels' deferred scale/bias reads (MV_ASYNC in the source, MLX_GRAPH_MV_ASYNC=1
# on the device): GRAPH_EMU_MV_ASYNC=1 builds this tree's kernels with it; nb_bit_check's
# one-sequence reference is then main's kernel (MV_ASYNC_REF's source, before MV_ASYNC).
MV_ASYNC = int(os.environ.get("GRAPH_EMU_MV_ASYNC", "0"))
MV_ASYNC_REF = "c11b15b0"
# The FFMA tiles' constant-slot loop (MV_NB in the source, MLX_GRAPH_MV_NB=1 on the device):
# GRAPH_EMU_MV_NB=1 builds this tree's kernels with it; nb_bit_check then also runs the
# NB-sequence kernel without it (this tree's, the switch off) and compares the two.
MV_NB = int(os.environ.get("GRAPH_EMU_MV_NB", "0"))
# The FFMA tiles' 512-thread blocks (MV_WIDE in the source, MLX_GRAPH_MV_WIDE=1 on the device,
# which also sets MV_BATCH 1: run with GRAPH_EMU_BATCH=1): GRAPH_EMU_MV_WIDE=1 builds this tree's
# kernels with it and launches matvec and matvec_qkv of NB > 1 sequences with 512 threads (MV_T);
# nb_bit_check then also runs the NB-sequence kernel without it (this tree's, 256 threads, 8 / rows
# chunks in flight as the default) and compares the two.
MV_WIDE = int(os.environ.get("GRAPH_EMU_MV_WIDE", "0"))
# The mat-vecs compiled for some codes' widths only (MV_BITS in the source, which the device's
# host defines as GraphSpec::matvec_bits unless MLX_GRAPH_MV_BITS=0): GRAPH_EMU_MV_BITS=MASK (e.g.
# 0x10 for 4-bit models, 0x10000 for bfloat16) builds this tree's kernels with that mask; a
# product of another width then traps, so a run over fixtures of that width checks that the
# steps launch nothing outside it, and its outputs against a run without it that they are the
# same.
MV_BITS = os.environ.get("GRAPH_EMU_MV_BITS", "")
# A normed product's norm weights loaded before the wait and embed's values loaded 16 a thread
# at once (MV_EARLY_NORM and EMBED_BATCH 16 in the source, MLX_GRAPH_EARLY_PROLOGUE=1 on the
# device): GRAPH_EMU_EARLY_NORM=1 builds this tree's kernels with them (the emulator has no wait: the check is that the loaded pieces are the ones the
# prologue would load; with GRAPH_EMU_DUMP, every step's logits against main's).
EARLY_NORM = int(os.environ.get("GRAPH_EMU_EARLY_NORM", "0"))
DUMP = os.environ.get("GRAPH_EMU_DUMP")  # a folder: each step's logits saved there
# The persistent step (GRAPH_PERSIST in the source, MLX_GRAPH_PERSIST=1 on the device):
# GRAPH_EMU_PERSIST=1 builds it and runs each one-row llama step (embed, the layers' row and
# attention kernels, the head, the argmax pair) as the phases of one persistent_step grid of
# GRAPH_EMU_PERSIST_GRID blocks (4 by default; all at once, so that its grid barrier works;
# fewer than the kernels' grids, so that the blocks loop over their virtual blocks), its
# barrier's counter kept across the steps (never reset). Compare the steps' logits
# (GRAPH_EMU_DUMP, dump_compare.py) with a run without it: every step bit-equal.
# GRAPH_EMU_PERSIST_MUTATE=skip drops one phase (the last layer's down projection), =barrier
# lets the barrier's waiters through without waiting: both must show in the logits; =trace
# (with GRAPH_EMU_PERSIST_SPLIT and _TRACE) notes the split barrier's arrivals in the wrong
# slot: the trace check must fail.
# GRAPH_EMU_PERSIST=2: the barrier by a release atomic and acquire polls (PS_BARRIER_RA,
# MLX_GRAPH_PERSIST=2 on the device).
PERSIST = int(os.environ.get("GRAPH_EMU_PERSIST", "0"))
PERSIST_GRID = int(os.environ.get("GRAPH_EMU_PERSIST_GRID", "4"))
PERSIST_MUTATE = os.environ.get("GRAPH_EMU_PERSIST_MUTATE", "")

# The source edits of the mutation switches ((switch's value, name) -> (text, its replacement)),
# applied to the decoder's own source only (not a `cu` under test).
SOURCE_MUTATIONS = {
    # The split barrier's next arrival noted in the neighbouring block's slot of its row.
    (PERSIST_MUTATE, "trace"): ("slot ? slot + (ll)gridDim.x * PS_TW : nullptr",
                                "slot ? slot + PS_TW : nullptr"),
    # PS_LOOP: each layer's last two row products run in the wrong order (down before
    # gate/up; the last layer's: the head before down): every phase still a row product.
    (PERSIST_MUTATE, "loop_order"): (
        "PS_RUN(ps_matvec, st.i, 0)",
        "PS_RUN(ps_matvec, st.r == 2 ? st.i + 1 : st.r == 1 ? st.i - 1 : st.i, 0)"),
    # PS_LOOP: thread 0's barrier target not kept from one phase to the next (a stale one:
    # its block leaves the barrier before the others have arrived).
    (PERSIST_MUTATE, "loop_target"): ("if (threadIdx.x == 0) st.target = t_;", "(void)t_;"),
    (PERSIST_MUTATE, "barrier"): ("ps_load_acquire(ctr) < target;",
                                  "false && ps_load_acquire(ctr) < target;"),
    # The pair's rows blocks written with each other's sums.
    (MMA_PAIR_MUTATE, "swap"): (
        "epilogue(acc[0], early0);\n            if (two) epilogue(acc[1], early1);",
        "epilogue(two ? acc[1] : acc[0], early0);\n            if (two) epilogue(acc[0], early1);"),
    # MMA_LATE_NORM: the epilogues without the 1 / rms (both tiles' lines contain the text).
    (MMA_LATE_MUTATE, "drop"): ("      sums[n][r] = late ? v * invs[n] : v;",
                                "      sums[n][r] = v;"),
    # The second rows block's sums scaled by the first's scales and biases.
    (MMA_PAIR_MUTATE, "scale"): ("acc[p][nt][e] += lo2f(ss[p][e >> 1]) * d[p][nt][e]",
                                 "acc[p][nt][e] += lo2f(ss[0][e >> 1]) * d[p][nt][e]"),
}
# Session 41's levers, each a define (the host's switch in brackets), and the trace:
# GRAPH_EMU_PERSIST_SPLIT=1: PS_SPLIT (MLX_GRAPH_PERSIST_SPLIT=1: a block arrives at the end of
# its phase's work, waits after the next phase's early loads); GRAPH_EMU_PERSIST_POLL=1:
# PS_POLL_RELAXED (MLX_GRAPH_PERSIST_POLL=1); GRAPH_EMU_PERSIST_TRACE=1
# (MLX_GRAPH_PERSIST_TRACE=PATH): the step is given a trace buffer (the same source; without,
# a null one) and writes its trace, which the emulator checks: every block's entry, arrival and
# departure of every phase and the end written where they belong (the emulator's clocks read
# 0), nothing else.
PERSIST_SPLIT = int(os.environ.get("GRAPH_EMU_PERSIST_SPLIT", "0"))
PERSIST_POLL = int(os.environ.get("GRAPH_EMU_PERSIST_POLL", "0"))
PERSIST_TRACE = int(os.environ.get("GRAPH_EMU_PERSIST_TRACE", "0"))
# GRAPH_EMU_PERSIST_SMEM=1: PS_SMEM_TABLE (MLX_GRAPH_PERSIST_SMEM=1): the table and the phases'
# functions read from each block's shared memory.
PERSIST_SMEM = int(os.environ.get("GRAPH_EMU_PERSIST_SMEM", "0"))
# GRAPH_EMU_PERSIST_LOOP=1: PS_LOOP (MLX_GRAPH_PERSIST_LOOP=1): the step as a layer loop with
# the phases' bodies inlined in their fixed order (its state past the table, in the block's
# shared memory: PERSIST_ATTN_AT leaves room).
PERSIST_LOOP = int(os.environ.get("GRAPH_EMU_PERSIST_LOOP", "0"))
PS_TW = 8
# The persistent step's row phases' shared memory (the attention halves' after it).
PERSIST_ATTN_AT = 128 * 1024
# Words a phase (PS_WORDS in the source).
PS_WORDS = 32
# The output projection combines the attention's partials in its prologue (matvec_attn_out;
# attention launched without counters) where `attn_combine_in_output` in graph_decode.rs
# says so: one sequence a step and an attention width of at most ATTN_OUT_MAX_WIDTH; with
# GRAPH_EMU_ATTN_COMBINE=attention (MLX_GRAPH_ATTN_COMBINE=attention) attention's last block
# combines them, as before.
ATTN_OUT_MAX_WIDTH = int(re.search(r"const ATTN_OUT_MAX_WIDTH: usize = ([\d_]+);", RS).group(1).replace("_", ""))
ATTN_COMBINE = os.environ.get("GRAPH_EMU_ATTN_COMBINE", "output")


# matvec's and matvec_qkv's threads (mv_threads in graph_decode.rs).
MV_T = 512 if MV_WIDE and NB > 1 and not MMA else 256


def mv_grid(rows, threads=256):
    """mv_blocks in graph_decode.rs (blocks of `threads`)."""
    w = threads // 32
    return (max(1, min(((rows + ROWS - 1) // ROWS + w - 1) // w, RESIDENT)), 1)


# matvec's float32 output (MODE_F32) as the raw sums, not rounded to bfloat16 (nb_bit_check's
# builds only): a sum in another order then shows in the output bits.
RAW_F32 = (("((float*)out_b)[i] = fin(acc[r]);", "((float*)out_b)[i] = acc[r];"),
           ("if (has1) ((float*)out_b)[i + 1] = fin(acc[r + 1]);",
            "if (has1) ((float*)out_b)[i + 1] = acc[r + 1];"))


def rest_for_main():
    """This tree's sources after graph_decode.cu (graph_qk_norm.cu, graph_gemma.cu,
    graph_moe.cu), for a reference build over an earlier graph_decode.cu from git: the experts'
    products pass mv_run's later LATE (false) through MV_DISPATCH, whose earlier form takes no
    such argument, so it is left out."""
    rest = "".join((ROOT / "mlx-kernels" / "src" / f).read_text()
                   for f in ("graph_qk_norm.cu", "graph_gemma.cu", "graph_moe.cu"))
    late = "MV_DISPATCH(bits, false, wt,"
    assert rest.count(late) == 1, "matvec_experts' MV_DISPATCH"
    return rest.replace(late, "MV_DISPATCH(bits, wt,")


# matvec_norm's number in the launch glue (LAUNCH; compiled at MMA_LATE_NORM 2 alone).
MV_NORM = 14


def mv_kernel(mode, mma4):
    """matvec's launch for `mode` (mma4: tensor-core tiles of 4-bit weights in groups of 64):
    matvec_norm for the normed products with GRAPH_EMU_MMA_LATE (graph_decode.rs's
    matvec_tile at MLX_GRAPH_MMA_LATE_NORM=2), matvec (1) otherwise."""
    return MV_NORM if MMA_LATE and mma4 and mode & 1 else 1


def build(tmp, rows=None, batch=None, nb=None, mma=None, raw_f32=False, kc=None, cu=None, tag="",
          qkv_norm=True, sinks=False, oai=False, gptoss=False):
    """The kernels as a shared library; qkv_norm False: matvec_qkv without its pre-norm
    (MV_QKV_NORM 0, as GraphSpec::post_only's step source defines it); sinks: attention with
    gpt_oss's sinks compiled in (ATTN_SINKS 1); oai: matvec_experts with gpt_oss's expert
    biases and clamped SwiGLU (MOE_OAI 1); gptoss: what gpt_oss's step source defines (sinks,
    oai, matvec's biased output (MV_OUT_BIAS 1) and mxfp4 experts (MV_FP4 1))."""
    if gptoss:
        sinks = oai = True
    rows, batch, nb, mma = (ROWS if rows is None else rows, BATCH if batch is None else batch,
                            NB if nb is None else nb, MMA if mma is None else mma)
    kc = MMA_KC if kc is None else kc
    src = (f"#define MV_ROWS {rows}\n#define MV_BATCH {batch}\n#define NB {nb}\n#define MV_MMA {mma}\n"
           f"#define MMA_KC {kc}\n" + (f"#define MMA_ASYNC {MMA_ASYNC}\n" if cu is None else "")
           + (f"#define MMA_BANKS {MMA_BANKS}\n" if cu is None else "")
           + (f"#define MMA_PAIR {MMA_PAIR}\n" if cu is None else "")
           + ("#define MMA_LATE_NORM 2\n" if cu is None and MMA_LATE else "")
           + (f"#define MV_ASYNC {MV_ASYNC}\n" if cu is None else "")
           + ("#define MV_EARLY_NORM 1\n#define EMBED_BATCH 16\n" if cu is None and EARLY_NORM else "")
           + ("#define MV_NB 1\n" if cu is None and MV_NB else "")
           + ("#define MV_WIDE 1\n" if cu is None and MV_WIDE else "")
           + (f"#define MV_BITS {MV_BITS}\n" if cu is None and MV_BITS else "")
           + ("#define GRAPH_PERSIST 1\n" if cu is None and PERSIST else "")
           + ("#define PS_BARRIER_RA 1\n" if cu is None and PERSIST == 2 else "")
           + ("#define PS_SPLIT 1\n" if cu is None and PERSIST and PERSIST_SPLIT else "")
           + ("#define PS_POLL_RELAXED 1\n" if cu is None and PERSIST and PERSIST_POLL else "")
           + ("#define PS_SMEM_TABLE 1\n" if cu is None and PERSIST and PERSIST_SMEM else "")
           + ("#define PS_LOOP 1\n" if cu is None and PERSIST and PERSIST_LOOP else "")
           + (CU if cu is None else cu))
    if cu is None:
        for (switch, value), (a, b) in SOURCE_MUTATIONS.items():
            if switch == value:
                assert a in src, (value, a)
                src = src.replace(a, b)
    if not qkv_norm:
        src = "#define MV_QKV_NORM 0\n" + src
    if sinks:
        src = "#define ATTN_SINKS 1\n" + src
    if oai:
        src = "#define MOE_OAI 1\n" + src
    if gptoss:
        src = "#define MV_OUT_BIAS 1\n#define MV_FP4 1\n" + src
    src = src.replace("extern __shared__ __align__(16) unsigned char smem[];", "unsigned char* smem = g_smem;")
    if raw_f32:
        for a, b in RAW_F32:
            assert a in src, a
            src = src.replace(a, b)
    tag = (f"{rows}_{batch}_{nb}_{mma}_{kc}{'_async' if MMA_ASYNC and cu is None else ''}"
           f"{'_banks' if MMA_BANKS and cu is None else ''}"
           f"{'_pair' + MMA_PAIR_MUTATE if MMA_PAIR and cu is None else ''}"
           f"{'_late' + MMA_LATE_MUTATE if MMA_LATE and cu is None else ''}"
           f"{'_mvasync' if MV_ASYNC and cu is None else ''}"
           f"{'_earlynorm' if EARLY_NORM and cu is None else ''}"
           f"{'_mvnb' if MV_NB and cu is None else ''}"
           f"{'_mvwide' if MV_WIDE and cu is None else ''}"
           f"{'_bits' + MV_BITS if MV_BITS and cu is None else ''}"
           f"{'_persist' + str(PERSIST) + PERSIST_MUTATE if PERSIST and cu is None else ''}"
           f"{'_split' if PERSIST and PERSIST_SPLIT and cu is None else ''}"
           f"{'_poll' if PERSIST and PERSIST_POLL and cu is None else ''}"
           f"{'_smem' if PERSIST and PERSIST_SMEM and cu is None else ''}"
           f"{'_loop' if PERSIST and PERSIST_LOOP and cu is None else ''}"
           f"{'_raw' if raw_f32 else ''}{tag}"
           f"{'' if qkv_norm else '_post'}{'_sinks' if sinks else ''}{'_oai' if oai else ''}"
           f"{'_gptoss' if gptoss else ''}")
    cpp, so = os.path.join(tmp, f"emu{tag}.cpp"), os.path.join(tmp, f"emu{tag}.so")
    if not os.path.exists(so):  # built once a run (the olmo2 fixtures share theirs)
        open(cpp, "w").write(PRE + src + LAUNCH)
        subprocess.run(["g++", "-std=c++20", "-O1", "-w", "-fPIC", "-shared", "-pthread", cpp, "-o", so], check=True)
    lib = ctypes.CDLL(so)
    lib.emu.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_uint64)]
    return lib


def bits(a):
    """An mlx array's raw elements as numpy (bfloat16 as uint16)."""
    if a.dtype == mx.bfloat16:
        return np.array(a.view(mx.uint16))
    return np.array(a)


class Emu:
    def __init__(self, lib):
        self.lib, self.keep = lib, []
        # The persistent step's phases being collected (None: launches run), its counter.
        self.phases, self.ctr = None, np.zeros(1, np.uint64)
        self.persist_steps, self.persist_phases = 0, 0
        self.trace_bad = 0  # PERSIST_TRACE: steps whose trace was not as it must be

    def buf(self, arr):
        arr = np.ascontiguousarray(arr)
        self.keep.append(arr)
        return arr

    def launch(self, k, grid, block, args):
        if self.phases is not None and k in (0, 1, 2, 3, 4, 5, 11):
            self.phases.append((k, grid, args))
            return
        vals = []
        for x in args:
            if isinstance(x, np.ndarray):
                vals.append(x.ctypes.data)
            elif isinstance(x, float):
                vals.append(int(np.float64(x).view(np.uint64)))
            else:
                vals.append(int(x) & 0xFFFFFFFFFFFFFFFF)
        arr = (ctypes.c_uint64 * len(vals))(*vals)
        self.lib.emu(k, grid[0], grid[1], block, arr)

    def persist(self):
        """The collected phases as one persistent_step grid (graph_decode.cu: a row of PS_WORDS
        words a phase, the kernel, its grid, its arguments as the kernel's)."""
        ph, self.phases = self.phases, None
        if PERSIST_MUTATE == "skip":
            downs = [i for i, (k, _, a) in enumerate(ph) if k == 1 and a[14] == 2]
            del ph[downs[-1]]
        if PERSIST_LOOP and PERSIST_MUTATE == "":
            # The layer loop runs only the regular shape (graph_decode.rs persist_loop_shape):
            # embed, L x [q/k/v, attention, three row products], the head, the argmax pair.
            kinds = [k for k, _, _ in ph]
            layers = (len(kinds) - 4) // 5
            assert len(kinds) >= 9 and (len(kinds) - 4) % 5 == 0 and \
                kinds == [0] + [2, 3, 1, 1, 1] * layers + [1, 4, 5], (
                    "GRAPH_EMU_PERSIST_LOOP: the step is not the loop's shape (the combine in "
                    f"the output projection? set GRAPH_EMU_ATTN_COMBINE=attention): {kinds}")
        table = np.zeros((len(ph), PS_WORDS), np.uint64)
        for i, (k, grid, args) in enumerate(ph):
            row = [k, grid[0], grid[1]]
            for x in args:
                if isinstance(x, np.ndarray):
                    row.append(x.ctypes.data)
                elif isinstance(x, float):
                    row.append(int(np.float64(x).view(np.uint64)))
                else:
                    row.append(int(x) & 0xFFFFFFFFFFFFFFFF)
            assert len(row) <= PS_WORDS, (k, len(row))
            table[i, :len(row)] = row
        self.keep.append(table)
        n, g = len(ph), PERSIST_GRID
        ones = np.uint64(0xFFFFFFFFFFFFFFFF)
        trace = np.full((n + 1, g, PS_TW), ones, np.uint64) if PERSIST_TRACE else 0
        self.launch(13, (PERSIST_GRID, 1), 256, [table, n, self.ctr, PERSIST_ATTN_AT, trace])
        if PERSIST_TRACE:
            # Rows 0..n-1: entry, arrival, departure (the emulator's timer: a counter each read
            # advances), SM and the three clocks (0 here) written, the 8th word not; the last
            # row: the end (time, SM, clock) only.
            want = np.full((n + 1, g, PS_TW), ones, np.uint64)
            want[:n, :, 3:7] = 0
            want[n, :, [3, 4]] = 0
            times = trace[:n, :, :3].astype(np.int64)
            end = trace[n, :, 0].astype(np.int64)
            got = trace.copy()
            got[:n, :, :3] = want[:n, :, :3]
            got[n, :, 0] = want[n, :, 0]
            self.trace_bad += int(not (np.array_equal(got, want)
                                       and trace_in_order(times, end, PERSIST_SPLIT)))
        self.persist_steps += 1
        self.persist_phases += len(ph)


def trace_in_order(times, end, split):
    """Whether a persistent step's trace times ([phase][block][entry, arrival, departure], and
    each block's end) are in the order the step takes them: each block's entry before its
    barrier's arrival (PS_SPLIT: the arrival, made at the end of the phase before, first)
    before its departure before the next phase's; the end last; and no block departing a
    barrier before every block has arrived at it."""
    e, a, d = times[..., 0], times[..., 1], times[..., 2]
    if (times <= 0).any() or (end <= 0).any():
        return False
    first, second = (a, e) if split else (e, a)
    ok = (first < second).all() and (second < d).all()
    nxt = a[1:] if split else e[1:]
    ok = ok and (d[:-1] < nxt).all() and (d[-1] < end).all()
    return bool(ok and (d.min(axis=1) > a.max(axis=1)).all())


def pair_rope_rows(a, d, pairs):
    """pair_rope_rows in graph_decode.rs: each head's first 2 * pairs rows as rotation pairs
    (i, i + pairs) side by side, the rest in order."""
    rows = a.shape[0]
    idx = []
    for h in range(rows // d):
        for i in range(pairs):
            idx += [h * d + i, h * d + i + pairs]
        idx += [h * d + j for j in range(2 * pairs, d)]
    return a[idx]


def rope_of(model, i):
    """Layer i's RoPE as the engine maps it (mlx_engine::graph): (rotated pairs, traditional,
    float32 inverse frequencies, position scale, output scale); 0 pairs for a NoPE layer."""
    r = getattr(model.model.layers[i].self_attn, "rope", None)  # exaone4's global layers: none
    name = type(r).__name__
    if r is None or name == "NoPE":
        return 0, False, np.zeros(1, np.float32), 1.0, 1.0
    if hasattr(r, "_freqs"):
        inv = (np.float32(1.0) / np.array(r._freqs.astype(mx.float32))).astype(np.float32)
        # yarn's `mscale`, longrope's (SuScaledRoPE) `_scale`: the rotated features' factor.
        scale = getattr(r, "mscale", getattr(r, "_scale", 1.0))
        return len(inv), bool(getattr(r, "traditional", False)), inv, 1.0, float(scale)
    half = r.dims // 2
    lb = np.float32(np.log2(np.float32(r.base)))
    inv = np.exp2(-(np.arange(half, dtype=np.float32) / np.float32(half)) * lb).astype(np.float32)
    return half, bool(r.traditional), inv, float(r.scale), 1.0


MADE_BASE = dict(hidden_size=64, num_hidden_layers=3, intermediate_size=128, num_attention_heads=4,
                 num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=160, rope_theta=10000.0,
                 tie_word_embeddings=True)
# Rows made here (name: the config's own fields over MADE_BASE).
MADE = {
    "make_qwen2": dict(model_type="qwen2"),
    # Down's K of 25 groups: with GRAPH_EMU_MMA_KC=512 the tensor-core tiles stage it in chunks
    # (512, 512, 512, 64), as the 8B's down at 16 rows (graph_decode.rs's `mma_chunk`).
    "make_llama_i1600": dict(model_type="llama", intermediate_size=1600),
    "make_smollm3": dict(model_type="smollm3", no_rope_layer_interval=2),
    "make_qwen3": dict(model_type="qwen3", head_dim=16, max_position_embeddings=2048),
    "make_llama3": dict(model_type="llama", rope_theta=500000.0, max_position_embeddings=2048,
                        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                          high_freq_factor=4.0, original_max_position_embeddings=64)),
    "make_mistral_linear": dict(model_type="mistral", num_key_value_heads=1, head_dim=32,
                                rope_scaling=dict(type="linear", factor=2.0)),
    # Gemma 3: (1 + w) norms, sandwich norms, GeGLU, sqrt(hidden) embedding scale, q/k norms,
    # sliding layers (0 and 2 of 3) with their own RoPE base and a window of 40, shorter than
    # the prompt, so that the window masks and wholly masked chunks are exercised.
    "make_gemma3": dict(model_type="gemma3_text", head_dim=16, query_pre_attn_scalar=16,
                        sliding_window=40, sliding_window_pattern=2, rope_theta=1000000.0,
                        rope_local_base_freq=10000.0, max_position_embeddings=2048),
    # gemma2: its soft-caps small enough to bend the scores and logits (mlx-lm's defaults, 50
    # and 30, barely touch a random model's).
    # phi3: fused qkv_proj and gate_up_proj (split by rows, as mlx_engine::graph does), half
    # the head rotated, longrope's long factors and scale.
    "make_phi3": dict(model_type="phi3", hidden_size=128, num_attention_heads=8,
                      partial_rotary_factor=0.5, max_position_embeddings=2048,
                      original_max_position_embeddings=64,
                      rope_scaling=dict(type="longrope", short_factor=[1.0] * 4,
                                        long_factor=[1.0, 1.5, 3.0, 6.0])),
    # granite: embedding, attention and residual multipliers and the logits' scaling.
    "make_granite": dict(model_type="granite", embedding_multiplier=12.0, attention_multiplier=0.1,
                         residual_multiplier=0.22, logits_scaling=8.0, attention_bias=False,
                         mlp_bias=False, max_position_embeddings=2048),
    "make_gemma2": dict(model_type="gemma2", head_dim=16, query_pre_attn_scalar=16,
                        attn_logit_softcapping=5.0, final_logit_softcapping=3.0),
    # qwen3_moe: 8 experts of width 64, 2 a token, the weights renormalised (norm_topk_prob);
    # layer 1 a dense MLP (mlp_only_layers), per-head q/k norms, an untied head.
    "make_qwen3_moe": dict(model_type="qwen3_moe", head_dim=16, num_experts=8,
                           num_experts_per_tok=2, moe_intermediate_size=64, decoder_sparse_step=1,
                           mlp_only_layers=[1], norm_topk_prob=True, max_position_embeddings=2048,
                           tie_word_embeddings=False),
    # The same without renormalisation, 3 experts a token of 6 (not in the default list: its
    # 8 teacher-forced steps hold one pick whose reference logits are one bfloat16 step apart,
    # results/gpu/2026-12-05-s27-moe).
    "make_qwen3_moe_k3": dict(model_type="qwen3_moe", head_dim=16, num_experts=6,
                              num_experts_per_tok=3, moe_intermediate_size=64,
                              decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=False,
                              max_position_embeddings=2048, tie_word_embeddings=False),
    # mixtral: 4 experts of width 128 (its intermediate_size), 2 a token, top-k then softmax.
    "make_mixtral": dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2),
    # OLMo 2: post norms only (no pre-norms), RMSNorm over the whole q and k projections
    # (64 and 32 wide here) before RoPE, an untied head.
    "make_olmo2": dict(model_type="olmo2", max_position_embeddings=2048, tie_word_embeddings=False),
    # Wider (q 512 and k 128 values: qk_norm_full_rope's threads take several elements and
    # pairs each), traditional RoPE.
    "make_olmo2_wide": dict(model_type="olmo2", hidden_size=256, num_attention_heads=8, head_dim=64,
                            max_position_embeddings=2048, rope_traditional=True),
    # OLMo 3: olmo2's blocks with sliding layers (0 and 2, a window of 40) whose RoPE is plain,
    # the full layer's linearly scaled (the local table). Not in the default list: its 8 steps
    # hold one pick whose reference logits are 1.4% of the largest apart, against a largest
    # difference of 1.2% (results/gpu/2026-12-06-s34-cover).
    "make_olmo3": dict(model_type="olmo3", max_position_embeddings=2048, sliding_window=40,
                       layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                       rope_scaling=dict(type="linear", factor=2.0)),
    # EXAONE 4: post norms alone, per-head q/k norms, local layers (L) slide and rotate, the
    # global one (G) neither.
    # gpt_oss: attention sinks, q/k/v and o biases, sliding (0 and 2, a window of 40) and full
    # layers (layer_types), 8 experts of width 64 with biases and the clamped SwiGLU, 2 a token
    # (top-k then softmax over the biased router's logits), an untied head. `fp4e:` puts the
    # experts in mxfp4 (as gpt_oss's checkpoint holds them; the rest bfloat16).
    "make_gpt_oss": dict(model_type="gpt_oss", head_dim=16, num_local_experts=8,
                         num_experts_per_tok=2, intermediate_size=64, sliding_window=40,
                         layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                         rope_theta=150000.0, tie_word_embeddings=False),
    "make_exaone4": dict(model_type="exaone4", head_dim=16, max_position_embeddings=2048,
                         sliding_window=40, sliding_window_pattern="LGL", rope_scaling=None),
}


# The CUDA test's own rows (`graph_decoder_follows_the_mlx_forward`), written here as
# mlx-engine/tests/support/graph_models.rs `write` writes them (the same seeded draws in the
# same order: MLX's normal under key(1), key(2), ..., rounded to bfloat16): "rs:gpt_oss" and
# "rs:gpt_oss_mxfp4" (its experts in MLX's mxfp4). Such a row runs as the test runs it: a
# 40-token prompt, 24 teacher-forced steps, a cache of 128 positions, the reference mlx-lm's
# model over its own make_cache (RotatingKVCache(48) on the sliding layers), each step's
# difference and every layer-step's router margin printed.
RS_BASE = dict(hidden_size=64, num_hidden_layers=3, intermediate_size=128, num_attention_heads=4,
               num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=160, rope_theta=10000.0,
               tie_word_embeddings=True)
RS_ROWS = {
    "gpt_oss": dict(model_type="gpt_oss", head_dim=16, num_local_experts=8, num_experts_per_tok=2,
                    intermediate_size=64, sliding_window=48,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                    rope_theta=150000.0, tie_word_embeddings=False),
}
RS_ROWS["gpt_oss_mxfp4"] = RS_ROWS["gpt_oss"]
# follow_row's prompt length, steps and cache (GraphDecoder::new(spec, &weights, 128)).
RS_PROMPT, RS_STEPS, RS_CAP = 40, 24, 128


def write_rs_row(root, name):
    """graph_models.rs `write` for a gpt_oss row: config.json and model.safetensors under
    root/name (returned)."""
    import json
    cfg = dict(RS_BASE, **RS_ROWS[name])
    mxfp4 = name.endswith("_mxfp4")
    if mxfp4:
        cfg["quantization"] = dict(group_size=32, bits=4, mode="mxfp4")
    h, layers, heads, kv, vocab = (cfg[k] for k in ("hidden_size", "num_hidden_layers",
                                                     "num_attention_heads", "num_key_value_heads",
                                                     "vocab_size"))
    d, experts, width = cfg["head_dim"], cfg["num_local_experts"], cfg["intermediate_size"]
    seed = [0]

    def draw(shape, scale, loc=0.0):
        seed[0] += 1
        return mx.random.normal(shape, dtype=mx.float32, loc=loc, scale=scale,
                                key=mx.random.key(seed[0])).astype(mx.bfloat16)

    t = {"model.embed_tokens.weight": draw([vocab, h], 0.5)}
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = draw([vocab, h], 0.1)
    s = float(np.float32(1.0) / np.sqrt(np.float32(h)))
    for i in range(layers):
        pre = f"model.layers.{i}"
        for x, rows in (("q", heads * d), ("k", kv * d), ("v", kv * d)):
            t[f"{pre}.self_attn.{x}_proj.weight"] = draw([rows, h], s)
            t[f"{pre}.self_attn.{x}_proj.bias"] = draw([rows], 0.5)
        t[f"{pre}.self_attn.o_proj.weight"] = draw([h, heads * d], s)
        t[f"{pre}.self_attn.o_proj.bias"] = draw([h], 0.5)
        t[f"{pre}.self_attn.sinks"] = draw([heads], 1.0)
        t[f"{pre}.mlp.router.weight"] = draw([experts, h], 4.0 * s)
        t[f"{pre}.mlp.router.bias"] = draw([experts], 0.5)
        for x, rows, cols, scale in (("gate", width, h, 4.0 * s), ("up", width, h, 4.0 * s),
                                     ("down", h, width, float(np.float32(1.0) / np.sqrt(np.float32(width))))):
            w = draw([experts, rows, cols], scale)
            n = f"{pre}.mlp.experts.{x}_proj"
            if mxfp4:
                q = mx.quantize(w, group_size=32, bits=4, mode="mxfp4")
                t[f"{n}.weight"], t[f"{n}.scales"] = q[0], q[1]
            else:
                t[f"{n}.weight"] = w
            t[f"{n}.bias"] = draw([experts, rows], 0.5)
        for x in ("input_layernorm", "post_attention_layernorm"):
            t[f"{pre}.{x}.weight"] = draw([h], 0.1, 1.0)
    t["model.norm.weight"] = draw([h], 0.1, 1.0)
    dst = Path(root) / name
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text(json.dumps(cfg))
    mx.save_safetensors(str(dst / "model.safetensors"), t)
    return dst


def fingerprint(dst):
    """graph_models.rs `fingerprint`: FNV-1a (64 bits) over the tensors of dst's
    model.safetensors in name order, each name's bytes then its elements' raw bytes."""
    h, mask = 0xcbf29ce484222325, (1 << 64) - 1
    for name, a in sorted(mx.load(str(Path(dst) / "model.safetensors")).items()):
        raw = bits(a).tobytes()
        for b in name.encode() + raw:
            h = ((h ^ b) * 0x100000001b3) & mask
    return h


GATHER_MM = mx.gather_mm
from mlx_lm.models.switch_layers import SwitchGLU as _SwitchGLU  # noqa: E402

SWITCH_GLU_CALL = _SwitchGLU.__call__
from mlx_lm.models import gpt_oss as _gpt_oss  # noqa: E402

GPT_OSS_MLP_CALL = _gpt_oss.MLPBlock.__call__


def bf16_ulp(v):
    """One bfloat16 step at |v| (8 significant bits)."""
    v = abs(float(v))
    return 2.0 ** (np.floor(np.log2(v)) - 7) if v > 0 else 2.0 ** -133


def bf2f(u):
    """bfloat16 bits (uint16) as float32."""
    return (np.asarray(u, np.uint16).astype(np.uint32) << 16).view(np.float32)


def gather_mm_f32(a, b, *args, **kwargs):
    """mx.gather_mm for bfloat16 on the CPU (see run): float32 products rounded once."""
    if a.dtype == mx.bfloat16:
        return GATHER_MM(a.astype(mx.float32), b.astype(mx.float32), *args, **kwargs).astype(mx.bfloat16)
    return GATHER_MM(a, b, *args, **kwargs)


GATHER_QMM = mx.gather_qmm


def gather_qmm_fp4_f32(x, w, scales, biases=None, rhs_indices=None, transpose=True, group_size=32,
                       bits=4, mode="mxfp4", sorted_indices=False, **kwargs):
    """mx.gather_qmm for mxfp4 (fp4e, see run): the experts' products over the dequantized
    weights in float32, rounded to bfloat16 once (what a bfloat16 matmul computes). MLX's CPU
    mxfp4 product is itself ~1% of the largest output off float64 (results/gpu/
    2026-12-06-s35-gptoss: its inputs' or products' roundings), which a random 3-layer model's
    routers and clamps amplify into other experts."""
    if mode != "mxfp4":
        return GATHER_QMM(x, w, scales, biases, rhs_indices=rhs_indices, transpose=transpose,
                          group_size=group_size, bits=bits, mode=mode, sorted_indices=sorted_indices, **kwargs)
    dq = mx.dequantize(w, scales, group_size=group_size, bits=bits, mode=mode).astype(mx.float32)
    y = GATHER_MM(x.astype(mx.float32), dq.swapaxes(-1, -2) if transpose else dq, rhs_indices=rhs_indices,
                  sorted_indices=sorted_indices)
    return y.astype(x.dtype)


def run(lib, name, tmp=None):
    # "q4:FIXTURE": the fixture quantized here to 4 bits in groups of 64 (mlx's nn.quantize,
    # as mlx-lm's convert does), for the 4-bit path the fixtures lack in bfloat16.
    # "q4r8:FIXTURE": the same with the MoE router in 8 bits, as mlx-lm's convert quantizes
    # qwen3_moe (its `quant_predicate`: `mlp.gate` 8 bits in groups of 64).
    # "fp4e:FIXTURE": the experts alone in MLX's mxfp4 (e2m1 codes, e8m0 scales a group of
    # 32), the rest bfloat16: gpt_oss's checkpoint as mlx-lm loads it (quant_method mxfp4, its
    # attention, router, embedding and head not converted).
    # "rs:ROW": the CUDA test's row ROW (RS_ROWS), written as graph_models.rs writes it and run
    # as follow_row runs it.
    rs = name.startswith("rs:")
    fp4e = name.startswith("fp4e:") or (rs and name.endswith("_mxfp4"))
    quantize = name.startswith(("q4:", "q4r8:"))
    router8 = name.startswith("q4r8:")
    base = name.split(":", 1)[1] if quantize or fp4e or rs else name
    prompt_len, steps, cap = (RS_PROMPT, RS_STEPS, RS_CAP) if rs else (PROMPT, 8, 0)
    prompt_len = int(os.environ.get("GRAPH_EMU_PROMPT", prompt_len))
    steps = int(os.environ.get("GRAPH_EMU_STEPS", steps))
    f32_model = None
    if rs:
        rs_dir = write_rs_row(tmp, base)
        print(f"{name}: fingerprint {fingerprint(rs_dir):016x} (graph_models.rs's `fingerprint`)")
        model, config = load_model(rs_dir)
        # Only the experts are quantized (mxfp4: fp4e's paths); the other linears bfloat16.
        config = {k: v for k, v in config.items() if k != "quantization"}
        # A second reference: the same weights in float32, on the CPU (as the CUDA test's
        # MLX_GRAPH_FOLLOW_CPU=1 runs it beside the MLX forward on the GPU).
        f32_model, _ = load_model(rs_dir)
        f32_model.set_dtype(mx.float32)
    elif base in MADE:
        # A seeded random model of the row's own mlx-lm class (the dense fixtures of these
        # rows have heads of 8, below the decoder's smallest head).
        from mlx_lm.utils import _get_classes

        config = dict(MADE_BASE, **MADE[base])
        model_class, args_class = _get_classes(config)
        mx.random.seed(0)
        model = model_class(args_class.from_dict(config))
        if config["model_type"] == "gpt_oss":
            # Sinks, biases and experts drawn so that each matters: sinks and biases (zeros
            # at init) random; the routers wide (few bfloat16 ties among the scores); gate and
            # up large enough that the SwiGLU's clamp at 7 bites now and then. (Routers at 4x
            # left a pick one bfloat16 step from a tie in fp4e's 8 steps: the README.)
            for li in model.model.layers:
                a, m = li.self_attn, li.mlp
                a.sinks = mx.random.normal(a.sinks.shape)
                a.o_proj.bias = mx.random.normal(a.o_proj.bias.shape) * 0.5
                m.router.weight = m.router.weight * 8.0
                m.router.bias = mx.random.normal(m.router.bias.shape) * 0.5
                for n in ("gate_proj", "up_proj", "down_proj"):
                    lin = getattr(m.experts, n)
                    lin.weight = lin.weight * (8.0 if n != "down_proj" else 1.0)
                    lin.bias = mx.random.normal(lin.bias.shape) * 0.5
        mx.eval(model.parameters())
    else:
        # A fixture's name, or a model directory's path (a bench model written by
        # xtask/oracle/bench_models.py, say).
        path = Path(base) if base.startswith("/") else ROOT / "mlx-models" / "tests" / "models" / base
        model, config = load_model(path)
    # The decoder runs bfloat16 activations: float fixtures are cast, as `--dtype bfloat16`.
    model.set_dtype(mx.bfloat16)
    if quantize:
        import mlx.nn as nn
        if router8:
            nn.quantize(model, group_size=64, bits=4, class_predicate=lambda path, m: (
                {"group_size": 64, "bits": 8} if path.endswith("mlp.gate") else hasattr(m, "to_quantized")))
        else:
            nn.quantize(model, group_size=64, bits=4)
        config = dict(config, quantization={"group_size": 64, "bits": 4})
    if fp4e and not rs:
        import mlx.nn as nn
        nn.quantize(model, group_size=32, bits=4, mode="mxfp4",
                    class_predicate=lambda path, m: ".experts." in f".{path}." and hasattr(m, "to_quantized"))
    if fp4e:
        # The reference's mxfp4 products exact but for their one rounding (gather_qmm_fp4_f32);
        # GRAPH_EMU_FP4_MLX=1 keeps MLX's CPU product (the figure it gives: the README).
        mx.gather_qmm = GATHER_QMM if os.environ.get("GRAPH_EMU_FP4_MLX") else gather_qmm_fp4_f32
    p = dict(tree_flatten(model.parameters()))
    if any(".switch_mlp." in k or ".experts." in k for k in p) and not quantize and not fp4e:
        # MLX's CPU GatherMM takes float32 only: the bfloat16 experts' products of the
        # reference run in float32 and are rounded to bfloat16 once (what a bfloat16 matmul
        # computes: float32 sums, one rounding).
        mx.gather_mm = gather_mm_f32
    H, nl = config["hidden_size"], config["num_hidden_layers"]
    nh = config["num_attention_heads"]
    nkv = config.get("num_key_value_heads", nh)
    d = config.get("head_dim") or H // nh
    inter, V = config["intermediate_size"], config["vocab_size"]
    eps = config["rms_norm_eps"]
    ropes = [rope_of(model, i) for i in range(nl)]
    # Sliding layers (gemma3_text's is_sliding, exaone4's is_local, olmo3's layer_types), each
    # with its own RoPE where the row has one (the local table, after the global one).
    mt = config["model_type"]

    def layer_slides(i):
        a = model.model.layers[i].self_attn
        if mt in ("olmo3", "gpt_oss"):
            return model.args.layer_types[i] != "full_attention"
        return mt in ("gemma3_text", "exaone4") and bool(getattr(a, "is_sliding", getattr(a, "is_local", False)))

    slides = [layer_slides(i) for i in range(nl)]
    glob = [r for i, r in enumerate(ropes) if not slides[i] and r[0]]
    pairs, trad, inv_freq, pos_scale, out_scale = max(glob or ropes, key=lambda r: r[0])
    loc = [r for i, r in enumerate(ropes) if slides[i]]
    pairs2, _, inv_freq2, pos_scale2, out_scale2 = loc[0] if loc else (0, trad, inv_freq, 1.0, 1.0)
    tied = "lm_head.weight" not in p
    q = config.get("quantization")
    gs, nbits = (q["group_size"], q["bits"]) if q else (1, 16)
    parts = ["weight", "scales", "biases"] if q else ["weight"]
    if config["model_type"] == "phi3":
        # The fused projections' rows: q, k, v; gate, up (views in mlx_engine::graph).
        qn, kn = nh * d, nkv * d
        for i in range(nl):
            pre = f"model.layers.{i}"
            for part in parts:
                f = p.pop(f"{pre}.self_attn.qkv_proj.{part}")
                for x, (a, b) in zip("qkv", [(0, qn), (qn, qn + kn), (qn + kn, qn + 2 * kn)]):
                    p[f"{pre}.self_attn.{x}_proj.{part}"] = f[a:b]
                g = p.pop(f"{pre}.mlp.gate_up_proj.{part}")
                p[f"{pre}.mlp.gate_proj.{part}"], p[f"{pre}.mlp.up_proj.{part}"] = g[:inter], g[inter:]
    if "model.layers.0.post_feedforward_layernorm.weight" in p and \
            "model.layers.0.input_layernorm.weight" not in p:
        # OLMo 2's post norms alone: the step source's matvec_qkv without its pre-norm.
        lib = build(tmp, qkv_norm=False)
    e = Emu(lib)
    zero = e.buf(np.zeros(16, np.uint16))
    has_bias = f"model.layers.0.self_attn.q_proj.bias" in p
    # qwen3's per-head q/k norms: matvec_qkv's rows unpaired and unrotated, then qk_norm_rope;
    # OLMo 2's over the whole projections (GraphSpec::qk_norm_full: one block a projection).
    qk_norm = "model.layers.0.self_attn.q_norm.weight" in p
    qk_full = qk_norm and p["model.layers.0.self_attn.q_norm.weight"].shape[-1] != d
    # Gemma: (1 + w) norms (added here as the model adds them: bfloat16), sandwich norms,
    # GeGLU, the embedding scale; gemma3_text's sliding layers; gemma2's soft-caps.
    gemma = config["model_type"] in ("gemma2", "gemma3_text")
    sandwich = "model.layers.0.post_feedforward_layernorm.weight" in p
    # OLMo 2's post norms alone (GraphSpec::post_only): no pre-norm before q/k/v (a null
    # weight) nor before gate/up (no MODE_NORM).
    post_only = sandwich and "model.layers.0.input_layernorm.weight" not in p

    def norm_w(name):
        w = p[name]
        return bits(1.0 + w if gemma else w)

    def bf(x):
        return float(mx.array(x, mx.bfloat16).astype(mx.float32).item())

    emb_scale = bf(H ** 0.5) if gemma else 1.0
    # granite's multipliers (weak Python floats: bfloat16 values against bfloat16 activations).
    granite = config["model_type"] == "granite"
    res_scale, logit_div = (bf(config["residual_multiplier"]), bf(config["logits_scaling"])) if granite else (0.0, 0.0)
    if granite:
        emb_scale = bf(config["embedding_multiplier"])
    window = config.get("sliding_window", 0) if any(slides) else 0
    sliding = [slides[i] and window > 0 for i in range(nl)]
    attn_cap = float(config.get("attn_logit_softcapping", 0.0)) if config["model_type"] == "gemma2" else 0.0
    final_cap = float(config.get("final_logit_softcapping", 0.0)) if config["model_type"] == "gemma2" else 0.0

    def qkv_bias(pre, layer_pairs):
        """The q/k/v biases in the rows' order (q's and k's paired as their rows), or None."""
        if not has_bias:
            return None
        xs = [bits(p[f"{pre}.self_attn.{x}_proj.bias"]) for x in "qkv"]
        if not trad and layer_pairs and not qk_norm:
            xs = [pair_rope_rows(xs[0], d, layer_pairs), pair_rope_rows(xs[1], d, layer_pairs), xs[2]]
        return e.buf(np.concatenate(xs))

    def kernel_pairs(layer_pairs):
        """The RoPE pairs matvec_qkv maps by index (upload_lin_q): 0 for traditional RoPE or
        q/k norms, and for an odd count (the host pairs those rows in a copy)."""
        if trad or qk_norm or not layer_pairs or layer_pairs % 2:
            return 0
        return layer_pairs

    def lin(names, mode=None, layer_pairs=0):
        """A linear as upload_lin_q lays it out: each part's words, scales and biases as the
        model holds them (gate and up, q, k and v apart), as the kernels' Wts parameters."""
        host = layer_pairs if mode == "qkv" and not trad and not qk_norm and layer_pairs % 2 else 0
        ws = {part: [] for part in ("weight", "scales", "biases")}
        for j, n in enumerate(names):
            for part in parts:
                x = bits(p[f"{n}.{part}"])
                if host and j < 2:
                    x = pair_rope_rows(x, d, host)
                ws[part].append(e.buf(x))
        rows = sum(bits(p[f"{n}.weight"]).shape[0] for n in names)
        return wts(ws), rows

    def wts(ws):
        """The kernels' weight parameters W0..W2, S0..S2, B0..B2 (the unused ones repeating the
        last part; `zero` for bfloat16's scales and biases)."""
        out = []
        for part in ("weight", "scales", "biases"):
            xs = ws.get(part) or [zero]
            out.append([xs[min(i, len(xs) - 1)] for i in range(3)])
        return out

    # Mixture-of-experts layers (qwen3_moe, mixtral): the router, and the experts' stacked
    # gate/up (each stacked [E, I, K] flattened to [E I, K], read interleaved per expert) and down.
    mt = config["model_type"]
    moe_mod = "block_sparse_moe" if mt == "mixtral" else "mlp"
    # gpt_oss: its router `router`, experts `experts`, each with biases, the clamped SwiGLU.
    gptoss = mt == "gpt_oss"
    router_name, experts_name = ("router", "experts") if gptoss else ("gate", "switch_mlp")
    if gptoss:
        e.lib = build(tmp, gptoss=True)  # gpt_oss's step source (before any launch)
    # The experts' own quantization: mxfp4 (BITS_MXFP4 in the source, groups of 32, byte
    # scales, no biases) with fp4e, else the model's.
    BITS_MXFP4 = int(re.search(r"#define BITS_MXFP4 (0x[0-9a-fA-F]+)", CU).group(1), 16)
    ebits, egs = (BITS_MXFP4, 32) if fp4e else (nbits, gs)
    eparts = ["weight", "scales"] if fp4e else parts
    moe_k = config.get("num_experts_per_tok", 0)
    moe_e = config.get("num_experts", config.get("num_local_experts", 0))
    moe_i = config.get("moe_intermediate_size", inter) if mt != "mixtral" else inter
    # GraphRouter: 0 softmax then top-k (qwen3_moe; norm_topk_prob), 1 top-k then softmax.
    moe_kind = 1 if mt in ("mixtral", "gpt_oss") else 0
    moe_norm = int(bool(config.get("norm_topk_prob", False)))

    # Each layer-step's chosen experts: ours (moe_route's sel) and mlx-lm's (the indices its
    # SwitchGLU is called with, one token at a time), as sorted lists.
    chosen_ours, chosen_ref = [], []
    from mlx_lm.models import switch_layers

    # The float32 reference's calls (f32_model) record nothing.
    quiet = [False]

    def record(self, x, indices):
        if indices.size == moe_k and not quiet[0]:
            chosen_ref.append(sorted(np.array(indices).reshape(-1).tolist()))
        return SWITCH_GLU_CALL(self, x, indices)

    switch_layers.SwitchGLU.__call__ = record
    # Each decode step's router logits a layer: mlx-lm's (gpt_oss's MLPBlock, one token) and
    # ours (the router's matvec output, `gates`), for the top-k margins.
    router_ref, router_ours = [], []

    def record_router(self, x):
        if x.shape[-2] == 1 and not quiet[0]:
            router_ref.append(np.array(self.router(x).reshape(-1).astype(mx.float32)))
        return GPT_OSS_MLP_CALL(self, x)

    _gpt_oss.MLPBlock.__call__ = record_router

    def qparams(name, k):
        """A linear's own (group size, bits) from its arrays' shapes; (1, 16) for bfloat16."""
        if f"{name}.scales" not in p:
            return 1, 16
        return k // p[f"{name}.scales"].shape[-1], p[f"{name}.weight"].shape[-1] * 32 // k

    def expert_lin(names, mode):
        ws = {part: [] for part in ("weight", "scales", "biases")}
        for n in names:
            for part in eparts:
                x = bits(p[f"{n}.{part}"])
                ws[part].append(e.buf(x.reshape(-1, x.shape[-1])))  # [E, n, c] -> [E n, c]
        return wts(ws)

    def moe_layer(pre):
        sw = f"{pre}.{moe_mod}.{experts_name}"
        if f"{sw}.gate_proj.weight" not in p:
            return None
        router = f"{pre}.{moe_mod}.{router_name}"
        rparts = ["weight", "scales", "biases"] if f"{router}.scales" in p else ["weight"]
        rbuf = wts({x: [e.buf(bits(p[f"{router}.{x}"]))] for x in rparts})
        # gpt_oss's biases: the router's [E]; the experts' gate and up [E I] and down [E H].
        eb = {x: e.buf(bits(p[f"{sw}.{x}_proj.bias"]).reshape(-1)) for x in ("gate", "up", "down")} \
            if gptoss else None
        return dict(router=rbuf, rq=qparams(router, H),
                    rbias=e.buf(bits(p[f"{router}.bias"])) if gptoss else None, eb=eb,
                    gu=expert_lin([f"{sw}.gate_proj", f"{sw}.up_proj"], "gu"),
                    down=expert_lin([f"{sw}.down_proj"], None))

    cap = max(cap, -(-(prompt_len + steps) // 64) * 64)
    ns = cap // 64
    embed, _ = lin(["model.embed_tokens"])
    head = embed if tied else lin(["lm_head"])[0]
    final_norm = e.buf(norm_w("model.norm.weight"))
    layers = []
    for i in range(nl):
        pre = f"model.layers.{i}"
        ml = moe_layer(pre)
        layers.append(dict(
            inn=None if post_only else e.buf(norm_w(f"{pre}.input_layernorm.weight")),
            post=None if post_only else e.buf(norm_w(f"{pre}.pre_feedforward_layernorm.weight" if sandwich
                                                     else f"{pre}.post_attention_layernorm.weight")),
            pa=e.buf(norm_w(f"{pre}.post_attention_layernorm.weight")) if sandwich else None,
            pm=e.buf(norm_w(f"{pre}.post_feedforward_layernorm.weight")) if sandwich else None,
            rope_off=d if sliding[i] and pairs2 else 0,
            window=window if sliding[i] else 0,
            qkv=lin([f"{pre}.self_attn.{x}_proj" for x in "qkv"], "qkv", ropes[i][0]),
            nrot=ropes[i][0],
            qn=e.buf(norm_w(f"{pre}.self_attn.q_norm.weight")) if qk_norm else None,
            kn=e.buf(norm_w(f"{pre}.self_attn.k_norm.weight")) if qk_norm else None,
            bias=qkv_bias(pre, ropes[i][0]),
            o=lin([f"{pre}.self_attn.o_proj"]),
            obias=e.buf(bits(p[f"{pre}.self_attn.o_proj.bias"])) if f"{pre}.self_attn.o_proj.bias" in p else None,
            sinks=e.buf(bits(p[f"{pre}.self_attn.sinks"])) if f"{pre}.self_attn.sinks" in p else None,
            moe=ml,
            gu=None if ml else lin([f"{pre}.mlp.gate_proj", f"{pre}.mlp.up_proj"], "gu"),
            down=None if ml else lin([f"{pre}.mlp.down_proj"]),
            kc=e.buf(np.zeros(NB * nkv * cap * d, np.uint16)),
            vc=e.buf(np.zeros(NB * nkv * cap * d, np.uint16)),
        ))
    if NB > 1 and any(L["moe"] for L in layers):
        print(f"{name}: skipped with {NB} sequences (the decoder takes one for a model with experts)")
        return True
    # One row a sequence in every buffer.
    h = e.buf(np.zeros(NB * H, np.uint16))
    qb = e.buf(np.zeros(NB * (nh + 2 * nkv) * d, np.uint16))
    attn = e.buf(np.zeros(NB * nh * d, np.uint16))
    act = e.buf(np.zeros(NB * max(inter, moe_k * moe_i), np.uint16))
    gates = e.buf(np.zeros(max(moe_e, 1), np.uint16))  # the router's logits
    sel = e.buf(np.zeros(max(moe_k, 1), np.int32))  # the chosen experts
    wts = e.buf(np.zeros(max(moe_k, 1), np.float32))  # and their weights
    ey = e.buf(np.zeros(max(moe_k, 1) * H, np.uint16))  # the chosen experts' outputs
    logits = e.buf(np.zeros(NB * V, np.float32))
    state = e.buf(np.zeros(4 * NB, np.int32))
    tokens = e.buf(np.zeros(NB * 2 * cap, np.int32))  # token, log-probability bits
    po = e.buf(np.zeros(NB * nh * ns * d, np.float32))
    pml = e.buf(np.zeros(NB * nh * ns * 2, np.float32))
    counters = e.buf(np.zeros(NB * nh, np.int32))
    rope = e.buf(np.zeros(NB * 2 * d, np.float32))  # the step's RoPE tables (embed writes them)
    y = e.buf(np.zeros(NB * H, np.uint16))  # a projection's output before its sandwich norm
    am = -(-V // ARGMAX_SLICE)  # the sampler's blocks
    am_part = e.buf(np.zeros(NB * (2 * am + 2), np.float32))  # its partials
    am_ctl = e.buf(np.zeros(NB * 4, np.int32))
    bias = e.buf(np.zeros(NB * V, np.float32))  # the rows' logit biases (none)
    inv_buf = e.buf(inv_freq)
    inv_buf2 = e.buf(inv_freq2)
    _a0 = model.model.layers[0].self_attn
    scale = float(np.float32(getattr(_a0, "scale", getattr(_a0, "sm_scale", None))))  # gpt_oss: sm_scale

    def two(w):
        """matvec's and matvec_experts' weight parameters: W0, W1, S0, S1, B0, B1."""
        return [x for part in w for x in part[:2]]

    # Tensor-core tiles of 4-bit weights in groups of 64 (matvec_norm's, mv_kernel).
    mma4 = bool(MMA) and (gs, nbits) == (64, 4)

    def mv(l, x, norm, res, out, mode, bias=None):
        """matvec (matvec_norm: mv_kernel); with bias (MODE_BIAS 64, MV_OUT_BIAS): the linear's
        bias in B1's slot."""
        w, n = l
        cols = w[0][0].shape[-1]
        wp = two(w)
        if bias is not None:
            wp[5], mode = bias, mode | 64
        e.launch(mv_kernel(mode, mma4), mv_grid(n, MV_T), MV_T,
                 wp + [x, norm if norm is not None else x, res if res is not None else x, out,
                  n, cols * 32 // nbits if q else cols, nbits, gs, mode, float(np.float32(eps)),
                  0, (final_cap if final_cap > 0 else -logit_div) if mode & 8 else res_scale if mode & 2 else 0.0])  # no timeline

    # A biased output projection (gpt_oss) runs as matvec with MODE_BIAS, after attention's
    # own combine (`attn_combine_in_output` in graph_decode.rs: not with an o bias).
    in_out = NB == 1 and nh * d <= ATTN_OUT_MAX_WIDTH and ATTN_COMBINE != "attention" and \
        layers[0]["obias"] is None

    def o_proj(l, res, out, mode, bias=None):
        """The output projection: matvec over attention's output, or matvec_attn_out over its
        partials."""
        if not in_out:
            return mv(l, attn, None, res, out, mode, bias)
        w, n = l
        cols = w[0][0].shape[-1]
        e.launch(11, mv_grid(n), 256,
                 [w[0][0], w[1][0], w[2][0], po, pml, state, res if res is not None else attn, out, n,
                  cols * 32 // nbits if q else cols, nbits, gs, mode, nh, ns, 0, res_scale if mode & 2 else 0.0])

    # The persistent step takes one-row llama steps (graph_decode.rs's `persist_spec`): every
    # kernel besides embed and the sampler a row product or attention.
    persist = PERSIST and NB == 1 and not (qk_norm or sandwich or any(L["moe"] for L in layers)
                                           or layers[0]["obias"] is not None)

    def step():
        if persist:
            e.phases = []
        e.launch(0, (NB, 1), 256, [embed[0][0], embed[1][0], embed[2][0], state, h, H, nbits, gs, rope, d // 2, pairs, inv_buf,
                                   pos_scale, out_scale, emb_scale, pairs2, inv_buf2, pos_scale2, out_scale2])
        for L in layers:
            w, n = L["qkv"]
            e.launch(2, mv_grid(n, MV_T), MV_T,
                     [x for part in w for x in part] +
                     [h, 0 if L["inn"] is None else L["inn"], qb, L["kc"], L["vc"], state, H, nbits, gs, nh, nkv, d, cap,
                      int(trad), float(np.float32(eps)), rope[L["rope_off"]:], 0, 0 if qk_norm else L["nrot"],
                      L["bias"] if L["bias"] is not None else 0, kernel_pairs(L["nrot"])])
            if qk_norm:
                if qk_full:  # qk_norm_full_rope: one block a projection
                    e.launch(12, (2 * NB, 1), 256, [qb, L["kc"], state, L["qn"], L["kn"], rope[L["rope_off"]:], nh, nkv,
                                                    d, cap, L["nrot"], int(trad), float(np.float32(eps))])
                else:
                    e.launch(6, ((nh + nkv) * NB, 1), 128, [qb, L["kc"], state, L["qn"], L["kn"], rope[L["rope_off"]:], nh,
                                                           d, cap, L["nrot"], int(trad), float(np.float32(eps))])
            e.launch(3, (nh * NB, ns), 128, [qb, L["kc"], L["vc"], state, po, pml, 0 if in_out else counters, attn, nh,
                                        nkv, d, cap, ns, scale, 0, L["window"], attn_cap,
                                        L["sinks"] if L["sinks"] is not None else 0])
            if sandwich:
                o_proj(L["o"], None, y, 0)
                e.launch(7, (NB, 1), 256, [y, L["pa"], h, H, float(np.float32(eps))])
                mv(L["gu"], h, L["post"], None, act, (0 if post_only else 1) | 4 | (16 if gemma else 0))
                mv(L["down"], act, None, None, y, 0)
                e.launch(7, (NB, 1), 256, [y, L["pm"], h, H, float(np.float32(eps))])
            elif L["moe"]:
                m = L["moe"]
                o_proj(L["o"], h, h, 2, L["obias"])
                rw, (rgs, rbits) = m["router"], m["rq"]
                rp = two(rw)
                rmode = 1
                if m["rbias"] is not None:  # gpt_oss's router bias: matvec's MODE_BIAS
                    rp[5], rmode = m["rbias"], 1 | 64
                e.launch(mv_kernel(rmode, mma4), mv_grid(moe_e), 256,
                         rp + [h, L["post"], h, gates, moe_e, H, rbits, rgs, rmode, float(np.float32(eps)), 0,
                               0.0])
                e.launch(8, (1, 1), 32, [gates, sel, wts, moe_e, moe_k, moe_kind, moe_norm, 0])
                chosen_ours.append(sorted(sel.tolist()))
                router_ours.append(gates[:moe_e].copy())
                eb = m["eb"]
                e.launch(9, mv_grid(moe_k * 2 * moe_i), 256,
                         two(m["gu"]) + [h, L["post"], act, sel, moe_k * 2 * moe_i, H, ebits, egs,
                          1 | 4 | (32 if eb else 0), float(np.float32(eps)), 2 * moe_i, 0, 0,
                          eb["gate"] if eb else 0, eb["up"] if eb else 0])
                e.launch(9, mv_grid(moe_k * H), 256,
                         two(m["down"]) + [act, act, ey, sel, moe_k * H, moe_i, ebits, egs, 0,
                          float(np.float32(eps)), H, 1, 0, eb["down"] if eb else 0, 0])
                e.launch(10, (-(-H // 256), 1), 256, [ey, wts, h, H, moe_k])
            else:
                o_proj(L["o"], h, h, 2)
                mv(L["gu"], h, L["post"], None, act, 1 | 4)
                mv(L["down"], act, None, h, h, 2)
        mv((head, V), h, final_norm, None, logits, 1 | 8)
        e.launch(4, (am, NB), 256, [logits, bias, am_part, am_ctl, V])
        e.launch(5, (am, NB), 256, [logits, bias, am_part, am_ctl, state, tokens, V, cap])
        if persist:
            e.persist()

    from mlx_lm.models.cache import KVCache

    def start(b):
        """Row b's prompt through mlx-lm: its greedy token and its cache (the reference's);
        its keys and values into the row's cache slot."""
        # (Rows past 8 repeat the lengths of rows 0-7, with their own tokens.)
        prompt = [(i * 7919 + 13 + 101 * b) % V for i in range(prompt_len - 17 * (b % 8))]
        cache = make_prompt_cache(model)
        out = model(mx.array([prompt]), cache=cache)
        token = int(mx.argmax(out[0, -1]).item())
        # The prompt's keys at every position: a sliding layer's rotating cache keeps only its
        # window, so the prompt runs again over plain caches (the model's masks keep the window).
        full = [KVCache() for _ in range(nl)]
        model(mx.array([prompt]), cache=full)
        for i, c in enumerate(full):
            keys, values, n = c.keys, c.values, c.offset
            k, v = keys[..., :n, :], values[..., :n, :]
            kb, vb = bits(k[0]), bits(v[0])  # [nkv, n, d]
            layers[i]["kc"].reshape(NB, nkv, cap, d)[b, :, :n] = kb
            layers[i]["vc"].reshape(NB, nkv, cap, d)[b, :, :n] = vb
        row = dict(token=token, cache=cache, pos=len(prompt))
        if f32_model is not None and b == 0:
            row["f32_cache"] = make_prompt_cache(f32_model)
            first = f32_forward(mx.array([prompt]), row["f32_cache"])
            if os.environ.get("GRAPH_EMU_FOLLOW") == "f32":
                row["token"] = int(np.argmax(first))
        return row

    def f32_forward(x, cache):
        """The float32 reference's logits (MLX's own CPU products, mxfp4's too)."""
        quiet[0], patched = True, mx.gather_qmm
        mx.gather_qmm = GATHER_QMM
        try:
            return np.array(f32_model(x, cache=cache)[0, -1].astype(mx.float32))
        finally:
            quiet[0], mx.gather_qmm = False, patched

    joins = {b: 0 for b in range(NB)}
    leaves = {b: steps for b in range(NB)}
    if NB > 1:
        leaves[1] = 5
    if NB > 2:
        joins[NB - 1] = 2
    rows = {}
    worst, agree, count = 0.0, 0, 0
    margins = []
    rels = []  # each step's relative difference (row 0)
    f32_rels = []  # row 0's, against the float32 reference: (ours, mlx-lm's)
    ref_tokens, our_tokens = [], []  # row 0's picks: the reference's, ours
    for step_i in range(steps):
        for b in range(NB):
            if step_i == joins[b]:
                rows[b] = start(b)
            if step_i == leaves[b]:
                del rows[b]
        refs = {}
        for b in range(NB):
            if b in rows:
                r = rows[b]
                refs[b] = np.array(model(mx.array([[r["token"]]]), cache=r["cache"])[0, -1].astype(mx.float32))
                if "f32_cache" in r:
                    r["f32"] = f32_forward(mx.array([[r["token"]]]), r["f32_cache"])
                state[4 * b:4 * b + 4] = [r["token"], r["pos"], 0, 0]
            else:
                state[4 * b:4 * b + 4] = [0, -1, 0, 0]  # idle
        step()
        for b in range(NB):
            st = state[4 * b:4 * b + 4]
            if b not in rows:
                assert st[1] == -1, "an idle row's state changed"
                continue
            r, lg, tk = rows[b], logits[b * V:(b + 1) * V], tokens[b * 2 * cap:(b + 1) * 2 * cap]
            r["pos"] += 1
            assert st[1] == r["pos"] and st[0] == tk[0], "the step state did not advance"
            assert st[0] == mlx_lm_pick(lg), "the sampled token is not mlx-lm's pick"
            assert tk[1:2].view(np.float32)[0] == mlx_lm_logprob(lg, st[0]), \
                "the sampled token's log-probability is not mlx-lm's"
            if DUMP:  # every step's logits, to compare two versions of the kernels bit for bit
                np.save(Path(DUMP) / f"{name.replace(':', '_')}-row{b}-{r['pos']}.npy", lg)
            ref = refs[b]
            rel = float(np.max(np.abs(ref - lg)) / max(np.max(np.abs(ref)), 1e-6))
            worst = max(worst, rel)
            if b == 0:
                rels.append(rel)
                ref_tokens.append(int(np.argmax(ref)))
                our_tokens.append(int(np.argmax(lg)))
                if "f32" in r:
                    f = r["f32"]
                    fm = max(np.max(np.abs(f)), 1e-6)
                    f32_rels.append((float(np.max(np.abs(f - lg)) / fm), float(np.max(np.abs(f - ref)) / fm),
                                     int(np.argmax(f))))
            agree += int(np.argmax(ref) == np.argmax(lg))
            if np.argmax(ref) != np.argmax(lg):
                # How near a tie the reference had it: its pick's logit less ours, relative.
                margins.append(float((ref.max() - ref[np.argmax(lg)]) / max(np.max(np.abs(ref)), 1e-6)))
            count += 1
            r["token"] = int(np.argmax(ref))
            if os.environ.get("GRAPH_EMU_FOLLOW") == "ours":
                # Teacher-forced on our picks (a reference that chose as we did at a near tie:
                # the tokens a device run's GPU forward may have followed).
                r["token"] = int(np.argmax(lg))
            if "f32" in r and os.environ.get("GRAPH_EMU_FOLLOW") == "f32":
                # Teacher-forced on the float32 reference's picks (as MLX_GRAPH_FOLLOW_CPU=1
                # runs the CUDA test), so that a device run follows the same tokens.
                r["token"] = int(np.argmax(r["f32"]))
    steps = count
    share = agree / steps
    if rs or os.environ.get("GRAPH_EMU_PER_STEP"):
        # Each step: its position, its difference, and per MoE layer the routers' top-k margin
        # (the k-th largest logit less the (k+1)-th: mlx-lm's, in bfloat16 steps at the k-th,
        # and ours) and whether both sides chose the same experts.
        nmoe = sum(1 for L in layers if L["moe"])
        router_noise, ours_margins = [], []  # |ours - mlx-lm's| router logits; ours' margins
        follow = {"f32": "the float32 reference's", "ours": "our"}.get(os.environ.get("GRAPH_EMU_FOLLOW"), "mlx-lm's")
        print(f"{name}: each step (the prompt {prompt_len} positions, window {window}, cache {cap}; "
              f"teacher-forced on {follow} picks):")
        for j, rel in enumerate(rels):
            line = f"  step {j:2d} position {prompt_len + j:3d} pick {ref_tokens[j]:3d}"
            if f32_rels:
                line += f" (ours {our_tokens[j]:3d}, float32 CPU {f32_rels[j][2]:3d})"
            line += f": {rel:.5f}"
            if f32_rels:
                line += f" (float32 CPU against ours {f32_rels[j][0]:.5f}, against mlx-lm's {f32_rels[j][1]:.5f})"
            if nmoe and len(router_ref) == nmoe * len(rels):
                cells = []
                for li in range(nmoe):
                    dg = float(np.max(np.abs(router_ref[j * nmoe + li] - bf2f(router_ours[j * nmoe + li]))))
                    router_noise.append(dg)
                    gr = np.sort(router_ref[j * nmoe + li])[::-1]
                    go = np.sort(bf2f(router_ours[j * nmoe + li]))[::-1]
                    rm = float(go[moe_k - 1] - go[moe_k]) / max(float(np.max(np.abs(go))), 1e-6)
                    ours_margins.append((j, rm))
                    gap = gr[moe_k - 1] - gr[moe_k]
                    same = chosen_ours[j * nmoe + li] == chosen_ref[j * nmoe + li]
                    cells.append(f"L{li} {gap:.4f} ({gap / bf16_ulp(gr[moe_k - 1]):.0f} steps) "
                                 f"ours {go[moe_k - 1] - go[moe_k]:.4f} = {rm:.4f} relative (logits apart {dg:.4f})"
                                 f"{'' if same else ' OTHER EXPERTS'}")
                line += "; top-k margins " + ", ".join(cells)
            print(line)
        if router_noise:
            # The CUDA test's rule (ROUTER_NEAR_TIE in graph_decode.rs): a step over the bound
            # is a routing near tie where our router's relative top-k margin is under
            # ROUTER_NEAR_TIE in some layer, or where we are within the bound of the float32
            # reference and mlx-lm's forward is not; at most ROUTER_NEAR_TIES of them.
            over = [j for j, r in enumerate(rels) if r > BOUND_REL]
            ties = []
            for j in over:
                ours_tie = min(m for i, m in ours_margins if i == j) < NEAR_TIE
                ref_off = bool(f32_rels) and f32_rels[j][0] <= BOUND_REL < f32_rels[j][1]
                if ours_tie or ref_off:
                    ties.append((j, "our router" if ours_tie else "mlx-lm's forward"))
            rest = max([r for j, r in enumerate(rels) if j not in dict(ties)] or [0.0])
            print(f"{name}: router logits ours against mlx-lm's at most {max(router_noise):.4f} apart "
                  f"(median {float(np.median(router_noise)):.4f}); our smallest relative top-k margin "
                  f"{min(m for _, m in ours_margins):.4f}; steps over {BOUND_REL}: {over}, of them near "
                  f"routing ties {ties}; the other steps at most {rest:.5f}: "
                  f"{'ok' if len(ties) == len(over) and len(ties) <= NEAR_TIES else 'FAILED'} with the near "
                  f"ties apart")
    verify_ok = verify_check(e, name, NB, V, cap, nkv, d, layers, state, tokens, logits, step, start) if NB > 1 else True
    tie_note = f"; where the picks differ, the reference's margin between them: {margins}" if margins else ""
    moe_note = ""
    if any(L["moe"] for L in layers):
        rq = next(L["moe"]["rq"] for L in layers if L["moe"])
        moe_note = (f", experts {moe_e} choosing {moe_k} of width {moe_i} "
                    f"({'top-k then softmax' if moe_kind else 'softmax then top-k'}, norm {moe_norm}) "
                    f"in layers {[i for i, L in enumerate(layers) if L['moe']]}, router bits {rq[1]}, "
                    f"experts {'mxfp4' if fp4e else f'bits {nbits}'}{', gpt_oss biases, sinks, clamped SwiGLU' if gptoss else ''}; "
                    f"the same experts as mlx-lm's in {sum(a == b for a, b in zip(chosen_ours, chosen_ref))} "
                    f"of {len(chosen_ref)} layer-steps")
    ok = worst <= BOUND_REL and share >= BOUND_AGREE
    note = ""
    if q and not ok:
        # Which side is off: one projection against float64 over the dequantized weights.
        # (A dense down projection: layer 0's, or with experts the first dense layer's, or
        # the attention's output projection.)
        dense = [k[:-len(".weight")] for k in p
                 if k.endswith(".mlp.down_proj.weight") and ".switch_mlp." not in k] or \
            ["model.layers.0.self_attn.o_proj"]
        mlx_err, ours_err = projection_errors(e, p, dense[0], gs, nbits)
        note = (f"; {dense[0]} against float64: mlx-lm (CPU) {mlx_err:.4f}, "
                f"ours {ours_err:.4f}")
        ok = ours_err < mlx_err and share >= 0.75
    if PERSIST:
        # One arrival a block a phase: the counter, never reset, must hold exactly that many.
        arrivals = e.persist_phases * PERSIST_GRID
        ctr_ok = int(e.ctr[0]) == arrivals
        verify_ok = verify_ok and ctr_ok and (e.persist_steps > 0) == bool(persist)
        if PERSIST_TRACE:
            verify_ok = verify_ok and e.trace_bad == 0
            print(f"{name}: persistent step trace: {e.persist_steps - e.trace_bad} of "
                  f"{e.persist_steps} steps' traces as they must be "
                  f"{'ok' if e.trace_bad == 0 else 'FAILED'}")
        print(f"{name}: persistent step {'on' if persist else 'not taken (the kernels)'}: "
              f"{e.persist_steps} steps, {e.persist_phases // max(e.persist_steps, 1)} phases a step, "
              f"{PERSIST_GRID} blocks; barrier counter {int(e.ctr[0])} (expected {arrivals}) "
              f"{'ok' if ctr_ok else 'FAILED'}")
    print(f"{name} (rows per warp {ROWS}, sequences {NB}, row-steps {count}): max relative logit difference {worst:.5f}, greedy agreement {share:.2f} "
          f"(traditional RoPE {trad}, rotated pairs {[r[0] for r in ropes]}, q/k/v bias {has_bias}, "
          f"bits {nbits}, tied {tied}, sandwich {sandwich}, post-only {post_only}, q/k norm "
          f"{'over the projections' if qk_full else 'per head' if qk_norm else 'none'}, window {window} on {sliding}, soft-caps "
          f"{attn_cap}/{final_cap}{moe_note}){note}{tie_note} {'ok' if ok else 'FAILED'}")
    return ok and verify_ok


def verify_check(e, name, nb, V, cap, nkv, d, layers, state, tokens, logits, step, start):
    """Speculative decoding's verify pass (GraphDecoder::verify_greedy): nb tokens of ONE
    sequence as one batched step, rows 0 .. nb sharing row 0's cache slot at consecutive
    positions (row j's state[3] = j), against the same tokens as nb single steps (row 0 alone,
    the others idle): every row's logits, greedy token and log-probability bit for bit. The
    group starts at position 125, so that with 4 rows or more it straddles the attention's
    chunk boundary at 128; the slot's positions from there on, and the other rows' slots, are
    filled with garbage first (a row reading a key not written in this step, or a write to
    another slot, shows)."""
    start(0)  # slot 0 holds the prompt (150 positions); the group overwrites from p0 on
    p0 = 125
    toks = [(7 + 31 * i) % V for i in range(nb)]
    garbage = np.uint16(0x3F80 ^ 0x4321)
    caches = [c for L in layers for c in (L["kc"], L["vc"])]

    def spoil():
        for c in caches:
            v = c.reshape(nb, nkv, cap, d)
            v[0, :, p0:] = garbage
            v[1:] = garbage

    spoil()
    single = []
    for i, t in enumerate(toks):
        state[:] = 0
        state[1::4] = -1
        state[0:4] = [t, p0 + i, 0, 0]
        step()
        single.append((logits[:V].copy(), tokens[0:2].copy()))
    spoil()
    others = [c.reshape(nb, nkv, cap, d)[1:].copy() for c in caches]
    for j, t in enumerate(toks):
        state[4 * j:4 * j + 4] = [t, p0 + j, 0, j]
    step()
    equal = 0
    for j in range(nb):
        lg, tk = logits[j * V:(j + 1) * V], tokens[j * 2 * cap:j * 2 * cap + 2]
        equal += int(lg.tobytes() == single[j][0].tobytes() and tk.tobytes() == single[j][1].tobytes())
    untouched = all(np.array_equal(a, c.reshape(nb, nkv, cap, d)[1:]) for a, c in zip(others, caches))
    ok = equal == nb and untouched
    print(f"{name}: verify group of {nb} rows at positions {p0}..{p0 + nb - 1} against {nb} single steps: "
          f"{equal} of {nb} rows equal bit for bit (logits, token, log-probability), other slots "
          f"{'untouched' if untouched else 'WRITTEN'} {'ok' if ok else 'FAILED'}")
    return ok


def projection_errors(e, p, name, gs, nbits):
    """Largest error of MLX's quantized_matmul and of the emulated matvec against float64
    over the same dequantized weights, for one random bfloat16 input."""
    w, s, b = (p[f"{name}.{k}"] for k in ("weight", "scales", "biases"))
    n, k = w.shape[0], w.shape[1] * 32 // nbits
    x = mx.random.normal((k,), key=mx.random.key(0)).astype(mx.bfloat16)
    ref = np.array(mx.quantized_matmul(x[None], w, s, b, transpose=True, group_size=gs,
                                       bits=nbits)[0].astype(mx.float32))
    # Every one of the NB sequences a launch takes gets the same input (row 0's result is read).
    out = e.buf(np.zeros(NB * n, np.uint16))
    xb = e.buf(np.tile(bits(x), NB))
    e.launch(1, mv_grid(n), 256,
             [e.buf(bits(w)), e.buf(bits(w)), e.buf(bits(s)), e.buf(bits(s)), e.buf(bits(b)),
              e.buf(bits(b)), xb, xb, xb, out, n, k, nbits,
              gs, 0, 1e-5, 0, 0.0])
    ours = (out[:n].astype(np.uint32) << 16).view(np.float32)
    deq = np.array(mx.dequantize(w, s, b, group_size=gs, bits=nbits).astype(mx.float32))
    exact = deq.astype(np.float64) @ np.array(x.astype(mx.float32)).astype(np.float64)
    return float(np.max(np.abs(ref - exact))), float(np.max(np.abs(ours - exact)))


def sink_check(tmp):
    """The attention kernel with gpt_oss's sinks compiled in (ATTN_SINKS 1), alone, against
    mlx's own `mx.fast.scaled_dot_product_attention(..., sinks=)` (CPU, float32 over the same
    bfloat16 inputs) and float64: one query of 4 heads (2 kv heads) over a cache of L
    positions, full or over a window of 40 (a sliding layer), combined by the last block of a
    head (counters) over several chunks of 64; each head's sink logit drawn around the
    scores. The largest difference relative to the largest output must be within the
    output's bfloat16 rounding (5e-3); the same kernel with no sinks (a null pointer) against
    mlx without them, and the sinks must move the output by more than that (not vacuous)."""
    lib = build(tmp, sinks=True)
    e = Emu(lib)
    ok = True
    nh, nkv, D = 4, 2, 64
    for L, window in ((37, 0), (150, 0), (150, 40), (200, 40)):
        cap = -(-L // 64) * 64
        ns = cap // 64
        rng = np.random.default_rng(L + window)
        q = mx.array(rng.normal(size=(nh, D)).astype(np.float32)).astype(mx.bfloat16)
        k = mx.array(rng.normal(size=(nkv, L, D)).astype(np.float32)).astype(mx.bfloat16)
        v = mx.array(rng.normal(size=(nkv, L, D)).astype(np.float32)).astype(mx.bfloat16)
        sinks = mx.array(rng.uniform(-1.0, 4.0, size=(nh,)).astype(np.float32)).astype(mx.bfloat16)
        scale = float(np.float32(D ** -0.5))
        qb = e.buf(np.zeros(NB * (nh + 2 * nkv) * D, np.uint16))
        qb[:nh * D] = bits(q).reshape(-1)
        kc = e.buf(np.zeros(NB * nkv * cap * D, np.uint16))
        vc = e.buf(np.zeros(NB * nkv * cap * D, np.uint16))
        kc.reshape(NB, nkv, cap, D)[0, :, :L] = bits(k)
        vc.reshape(NB, nkv, cap, D)[0, :, :L] = bits(v)
        mask = None
        if window:
            mask = mx.array((np.arange(L) >= L - window)[None, None, None, :])
        qf, kf, vf = (x.astype(mx.float32)[None] for x in (q[:, None, :], k, v))
        for with_sinks in (True, False):
            state = e.buf(np.array([0, L - 1, 0, 0] + [0, -1, 0, 0] * (NB - 1), np.int32))
            po = e.buf(np.zeros(NB * nh * ns * D, np.float32))
            pml = e.buf(np.zeros(NB * nh * ns * 2, np.float32))
            counters = e.buf(np.zeros(NB * nh, np.int32))
            out = e.buf(np.zeros(NB * nh * D, np.uint16))
            sk = e.buf(bits(sinks)) if with_sinks else 0
            e.launch(3, (nh * NB, ns), 128, [qb, kc, vc, state, po, pml, counters, out, nh, nkv, D, cap, ns,
                                            scale, 0, window, 0.0, sk])
            ours = (out[:nh * D].astype(np.uint32) << 16).view(np.float32).reshape(nh, D).astype(np.float64)
            kw = dict(scale=scale, mask=mask)
            if with_sinks:
                kw["sinks"] = sinks.astype(mx.float32)
            ref = np.array(mx.fast.scaled_dot_product_attention(qf, kf, vf, **kw)[0, :, 0]).astype(np.float64)
            # float64: the scores, the sink as one more logit without a value.
            kk = np.repeat(np.array(kf[0]).astype(np.float64), nh // nkv, axis=0)
            vv = np.repeat(np.array(vf[0]).astype(np.float64), nh // nkv, axis=0)
            sc = np.einsum("hd,hld->hl", np.array(qf[0, :, 0]).astype(np.float64), kk) * scale
            if window:
                sc[:, :L - window] = -np.inf
            sk64 = np.array(sinks.astype(mx.float32)).astype(np.float64) if with_sinks else np.full(nh, -np.inf)
            mm = np.maximum(sc.max(axis=1), sk64)
            w = np.exp(sc - mm[:, None])
            exact = np.einsum("hl,hld->hd", w, vv) / (w.sum(axis=1) + np.exp(sk64 - mm))[:, None]
            big = np.max(np.abs(exact))
            rel, rel_mlx = np.max(np.abs(ours - exact)) / big, np.max(np.abs(ref - exact)) / big
            rel_ref = np.max(np.abs(ours - ref)) / big
            good = rel <= 5e-3 and rel_ref <= 5e-3
            if with_sinks:
                plain = np.einsum("hl,hld->hd", w, vv) / w.sum(axis=1)[:, None]
                moved = np.max(np.abs(plain - exact)) / big
                good &= moved > 5e-3
                note = f", the sinks move the output by {moved:.3f}"
            else:
                note = ""
            ok &= bool(good)
            print(f"sink check (L {L}, window {window}, sinks {with_sinks}): ours against float64 {rel:.5f}, "
                  f"against mlx's sdpa {rel_ref:.5f} (mlx's sdpa against float64 {rel_mlx:.5f}){note} "
                  f"{'ok' if good else 'FAILED'}")
    return ok


def oai_check(tmp):
    """gpt_oss's experts and router, alone (MOE_OAI 1): mlx-lm's own SwitchGLU with biases and
    its SwigluOAI activation (models/switch_layers.py, activations.py), 8 experts of width 64
    over hidden 64 (and 128 / 128 in 4 bits, groups of 64), bfloat16, against the two
    matvec_experts launches the step makes (gate/up with the biases and the clamped SwiGLU;
    down with its bias) for k = 2 chosen experts: each chosen expert's output, largest
    difference relative to the largest (bfloat16 rounding: within 1e-2, the products' sums in
    another order, the activation's roundings); the weights drawn so that the clamp bites.
    And moe_route with a router bias (top-k then softmax, gpt_oss's mlx_topk then softmax)
    against mlx-lm's MLPBlock order over bias-added bfloat16 logits: experts and weights bit
    for bit."""
    from mlx_lm.models.activations import SwigluOAI
    from mlx_lm.models.switch_layers import SwitchGLU
    import mlx.nn as nn
    lib = build(tmp, oai=True)
    e = Emu(lib)
    ok = True
    for H, I, quant in ((64, 64, False), (128, 128, True)):
        E, k = 8, 2
        mx.random.seed(H)
        sw = SwitchGLU(H, I, E, activation=SwigluOAI(), bias=True)
        # Larger weights than the default init, so that gate and up reach past the clamp (7).
        for name in ("gate_proj", "up_proj", "down_proj"):
            lin = getattr(sw, name)
            lin.weight = lin.weight * 12.0
            lin.bias = mx.random.normal(lin.bias.shape) * 0.5
        sw.set_dtype(mx.bfloat16)
        if quant:
            nn.quantize(sw, group_size=64, bits=4)
        x = (mx.random.normal((H,)) * 1.0).astype(mx.bfloat16)
        idx = mx.array([5, 2], mx.uint32)
        # MLX's CPU GatherMM takes float32 only: bfloat16 products in float32, rounded once (run).
        mx.gather_mm = gather_mm_f32
        try:
            ref = np.array(sw(x[None, None], idx[None, None])[0, 0].astype(mx.float32)).astype(np.float64)  # [k, H]
        finally:
            mx.gather_mm = GATHER_MM
        p = dict(tree_flatten(sw.parameters()))
        parts = ["weight", "scales", "biases"] if quant else ["weight"]
        gs, nbits = (64, 4) if quant else (1, 16)

        def wts_of(names):
            ws = {}
            for part in parts:
                ws[part] = [e.buf(bits(p[f"{n}.{part}"]).reshape(-1, bits(p[f"{n}.{part}"]).shape[-1]))
                            for n in names]
            z = e.buf(np.zeros(16, np.uint16))
            out = []
            for part in ("weight", "scales", "biases"):
                xs = ws.get(part) or [z]
                out += [xs[0], xs[min(1, len(xs) - 1)]]
            return out

        sel = e.buf(np.array(idx, np.int32))
        xb = e.buf(bits(x))
        act = e.buf(np.zeros(k * I, np.uint16))
        ey = e.buf(np.zeros(k * H, np.uint16))
        gb, ub, db = (e.buf(bits(p[f"{n}.bias"]).reshape(-1)) for n in ("gate_proj", "up_proj", "down_proj"))
        # Weights W0 W1 S0 S1 B0 B1 in wts_of's order (W0, W1, S0, S1, B0, B1).
        w_gu = wts_of(["gate_proj", "up_proj"])
        w_d = wts_of(["down_proj"])
        e.launch(9, mv_grid(k * 2 * I), 256,
                 w_gu + [xb, xb, act, sel, k * 2 * I, H, nbits, gs, 4 | 32, 1e-6, 2 * I, 0, 0, gb, ub])
        e.launch(9, mv_grid(k * H), 256,
                 w_d + [act, act, ey, sel, k * H, I, nbits, gs, 0, 1e-6, H, 1, 0, db, 0])
        ours = (ey.astype(np.uint32) << 16).view(np.float32).reshape(k, H).astype(np.float64)
        rel = float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))
        note = ""
        if quant:
            # MLX's CPU quantized products are themselves ~2-5% off (tile_check): both sides
            # against the same module in float32 over the dequantized weights.
            sf = SwitchGLU(H, I, E, activation=SwigluOAI(), bias=True)
            for n in ("gate_proj", "up_proj", "down_proj"):
                lin = getattr(sf, n)
                lin.weight = mx.dequantize(p[f"{n}.weight"], p[f"{n}.scales"], p[f"{n}.biases"], group_size=64,
                                           bits=4).astype(mx.float32)
                lin.bias = p[f"{n}.bias"].astype(mx.float32)
            f32 = np.array(sf(x.astype(mx.float32)[None, None], idx[None, None])[0, 0]).astype(np.float64)
            big = np.max(np.abs(f32))
            rel_f, rel_mlx = float(np.max(np.abs(ours - f32)) / big), float(np.max(np.abs(ref - f32)) / big)
            note = f"; against the float32 module over the dequantized weights: ours {rel_f:.5f}, mlx-lm's {rel_mlx:.5f}"
            rel = rel_f if rel_f < rel_mlx else rel
        # The clamp bites: gate or up values past 7 somewhere (float64 over the weights used).
        clamped = 0
        for n in ("gate_proj", "up_proj"):
            wq = p[f"{n}.weight"]
            if quant:
                wq = mx.dequantize(wq, p[f"{n}.scales"], p[f"{n}.biases"], group_size=64, bits=4)
            wf = np.array(wq.astype(mx.float32)).astype(np.float64)[np.array(idx)]  # [k, I, H]
            v = wf @ np.array(x.astype(mx.float32)).astype(np.float64) + \
                np.array(p[f"{n}.bias"].astype(mx.float32)).astype(np.float64)[np.array(idx)]
            clamped += int(np.sum(np.abs(v) > 7.0))
        good = rel <= 1e-2 and clamped > 0
        ok &= bool(good)
        print(f"oai check (hidden {H}, width {I}, {'4-bit g64' if quant else 'bfloat16'}): the chosen experts' "
              f"outputs against mlx-lm's SwitchGLU(SwigluOAI, bias): largest difference {rel:.5f} of the largest "
              f"({clamped} gate or up values past the clamp){note} {'ok' if good else 'FAILED'}")
    # The biased router (gpt_oss: g = router(x) + bias, mlx_topk, softmax precise).
    rng = np.random.default_rng(5)
    for n, kk in ((32, 4), (128, 4)):
        g = mx.array(rng.normal(0, 1.0, n).astype(np.float32)).astype(mx.bfloat16)
        b = mx.array(rng.normal(0, 1.0, n).astype(np.float32)).astype(mx.bfloat16)
        sel = e.buf(np.zeros(kk, np.int32))
        w = e.buf(np.zeros(kk, np.float32))
        e.launch(8, (1, 1), 32, [e.buf(bits(g)), sel, w, n, kk, 1, 0, e.buf(bits(b))])
        gg = g + b  # bfloat16: the quantized router's product plus its bias
        inds = mx.argpartition(gg, kth=-kk, axis=-1)[..., -kk:]
        scores = mx.softmax(mx.take_along_axis(gg, inds, axis=-1), axis=-1, precise=True)
        ref_w = dict(zip([int(i) for i in np.array(inds)], np.array(scores.astype(mx.float32)).tolist()))
        good = sorted(ref_w) == sorted(sel.tolist()) and all(ref_w[int(i)] == float(x) for i, x in zip(sel, w))
        ok &= bool(good)
        print(f"oai check (router bias, {n} experts, k {kk}): experts and weights "
              f"{'bit-equal to mlx-lm' if good else 'DIFFER'} {'ok' if good else 'FAILED'}")
    return ok


def fp4_check(tmp):
    """matvec_experts on mxfp4 experts (MV_FP4, bits BITS_MXFP4), alone: two chosen experts of
    3 (down's per-slot inputs off: one input), K 128 and 2,880 (gpt-oss-20b's hidden, 90 groups
    of 32), against float64 over MLX's own dequantized weights; MLX's CPU
    quantized_matmul(mode="mxfp4") against the same, for scale. Ours within 4e-3 of the largest
    output (its bfloat16 rounding) and no further than MLX's."""
    lib = build(tmp, gptoss=True)
    e = Emu(lib)
    bits_fp4 = int(re.search(r"#define BITS_MXFP4 (0x[0-9a-fA-F]+)", CU).group(1), 16)
    ok = True
    for N, K in ((64, 128), (64, 2880)):
        E = 3
        mx.random.seed(K)
        w = (mx.random.normal((E, N, K)) * 0.1).astype(mx.bfloat16)
        q, sc = mx.quantize(w, group_size=32, bits=4, mode="mxfp4")[:2]
        x = mx.random.normal((K,)).astype(mx.bfloat16)
        deq = np.array(mx.dequantize(q, sc, group_size=32, bits=4, mode="mxfp4").astype(mx.float32)).astype(np.float64)
        xf = np.array(x.astype(mx.float32)).astype(np.float64)
        chosen = [2, 0]
        ref = np.stack([deq[j] @ xf for j in chosen])
        mlx = np.stack([np.array(mx.quantized_matmul(x[None], q[j], sc[j], None, transpose=True, group_size=32, bits=4,
                                                     mode="mxfp4")[0].astype(mx.float32)) for j in chosen])
        out = e.buf(np.zeros(2 * N, np.uint16))
        qb, sb = e.buf(np.array(q).reshape(-1, q.shape[-1])), e.buf(np.array(sc).reshape(-1, sc.shape[-1]))
        z, xb = e.buf(np.zeros(16, np.uint16)), e.buf(bits(x))
        e.launch(9, mv_grid(2 * N), 256, [qb, qb, sb, sb, z, z, xb, xb, out, e.buf(np.array(chosen, np.int32)),
                                          2 * N, K, bits_fp4, 32, 0, 1e-6, N, 0, 0, 0, 0])
        ours = (out.astype(np.uint32) << 16).view(np.float32).reshape(2, N)
        big = np.max(np.abs(ref))
        r_ours, r_mlx = float(np.max(np.abs(ours - ref)) / big), float(np.max(np.abs(mlx - ref)) / big)
        good = r_ours <= 4e-3 and r_ours <= max(r_mlx, 4e-3)
        ok &= bool(good)
        print(f"fp4 check (mxfp4 experts, {N} rows, K {K}): against float64 over MLX's dequantized weights, "
              f"ours {r_ours:.5f} of the largest output, MLX's CPU quantized_matmul {r_mlx:.5f} "
              f"{'ok' if good else 'FAILED'}")
    return ok


def tile_check(lib):
    """The matvec kernel alone on random 4-bit weights in groups of 64, NB sequences with
    their own inputs (the tensor-core tiles with GRAPH_EMU_MMA=1): each sequence's outputs
    against float64 over the dequantized weights (largest difference relative to the largest
    output), beside MLX's CPU quantized_matmul's. Shapes: rows not a multiple of 16, fewer
    groups than warps, several 16-row blocks a block."""
    e = Emu(lib)
    ok = True
    for n, k in ((40, 320), (130, 64), (24, 1024), (130, 1600)):
        w = mx.random.normal((n, k), key=mx.random.key(n)).astype(mx.bfloat16)
        wq, s, b = mx.quantize(w, group_size=64, bits=4)
        x = mx.random.normal((NB, k), key=mx.random.key(k)).astype(mx.bfloat16)
        out = e.buf(np.zeros(NB * n, np.uint16))
        xb = e.buf(bits(x).reshape(-1))
        e.launch(1, mv_grid(n), 256,
                 [e.buf(bits(wq)), e.buf(bits(wq)), e.buf(bits(s)), e.buf(bits(s)), e.buf(bits(b)),
                  e.buf(bits(b)), xb, xb, xb, out, n, k,
                  4, 64, 0, 1e-5, 0, 0.0])
        ours = (out.astype(np.uint32) << 16).view(np.float32).reshape(NB, n).astype(np.float64)
        # The weights as the kernels take them: scale q + bias from the bfloat16 scales and
        # biases, unrounded (MLX's dequantize of bfloat16 scales rounds each weight).
        deq = np.array(mx.dequantize(wq, s.astype(mx.float32), b.astype(mx.float32), group_size=64,
                                     bits=4)).astype(np.float64)
        exact = np.array(x.astype(mx.float32)).astype(np.float64) @ deq.T
        ref = np.array(mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=64, bits=4)
                       .astype(mx.float32)).astype(np.float64)
        scale = np.max(np.abs(exact))
        rel, rel_mlx = np.max(np.abs(ours - exact)) / scale, np.max(np.abs(ref - exact)) / scale
        good = rel <= 5e-3  # the output's bfloat16 rounding: up to 2^-8 of a value
        ok &= bool(good)
        print(f"tile check (sequences {NB}, tensor cores {MMA}): {n} x {k}, largest difference to "
              f"float64 {rel:.5f} of the largest output (MLX CPU quantized_matmul {rel_mlx:.5f}) "
              f"{'ok' if good else 'FAILED'}")
    return ok


def nb_bit_check(lib, tmp):
    """The matvec kernel of NB sequences (this build: GRAPH_EMU_ROWS, GRAPH_EMU_BATCH) against
    the one-sequence kernel of the plain decoder (rows per warp 2, 4 chunks in flight), one
    sequence at a time over the same weights and inputs: every output bit for bit (tier L2:
    a verify row is a single step's row). 4-bit in groups of 64 and 32, 8-bit, bfloat16; the
    modes the step uses (plain, norm, norm + SwiGLU, residual, float32 logits). Both built with
    the float32 output unrounded (RAW_F32), and the inputs scaled by powers of two from 2^-12
    to 2^12, so that the float32 sums round: an order changed anywhere shows (a kernel summing
    the words of a chunk in reverse passed the bfloat16 outputs and fails this)."""
    if MV_NB or MV_WIDE:
        # This tree's one-sequence kernel, no switch but MV_ASYNC as this run builds it.
        one = build(tmp, rows=2, batch=4, nb=1, mma=0, raw_f32=True,
                    cu=f"#define MV_ASYNC {MV_ASYNC}\n" + CU, tag="_one")
    elif MV_ASYNC:
        # The reference: main's one-sequence kernel (before MV_ASYNC), from git.
        ref_cu = subprocess.run(["git", "-C", str(ROOT), "show",
                                 f"{MV_ASYNC_REF}:mlx-kernels/src/graph_decode.cu"],
                                check=True, capture_output=True, text=True).stdout
        assert "MV_ASYNC" not in ref_cu
        rest = rest_for_main()
        one = build(tmp, rows=2, batch=4, nb=1, mma=0, raw_f32=True, cu=ref_cu + rest,
                    tag="_main")
    else:
        one = build(tmp, rows=2, batch=4, nb=1, mma=0, raw_f32=True)
    e1, en = Emu(one), Emu(build(tmp, raw_f32=True))
    # MV_NB: the NB-sequence kernel without the switch too (this tree's, MV_ASYNC as built).
    # MV_WIDE: the same, with the default's chunks in flight (8 / rows) and 256 threads.
    eoff = (Emu(build(tmp, raw_f32=True, cu=f"#define MV_ASYNC {MV_ASYNC}\n" + CU, tag="_off",
                      batch=8 // ROWS if MV_WIDE else None))
            if MV_NB or MV_WIDE else None)
    # MV_NB: also rows of several chunks a lane (K 2,560: 3 at 4 bits, not a multiple of the 4
    # slots; K 4,096: 4) and warps of several row groups (130 and 66 rows over 24 warps), so
    # that items cross row groups in every slot.
    shapes = ((40, 320), (130, 64), (24, 1024)) + (((130, 2560), (66, 4096)) if MV_NB or MV_WIDE else ())
    grid = lambda n, rows: (max(1, min(((n + rows - 1) // rows + 7) // 8, RESIDENT)), 1)
    ok, count = True, 0
    # MV_NB: also 4-bit in groups of 128 and 8-bit in groups of 32.
    widths = ((4, 64), (4, 32), (8, 64), (16, 1)) + (((4, 128), (8, 32)) if MV_NB or MV_WIDE else ())
    for nbits, gs in widths:
        for n, k in shapes:
            if k % max(gs, 64):
                continue
            w = mx.random.normal((n, k), key=mx.random.key(n + nbits)).astype(mx.bfloat16)
            if nbits == 16:
                wb, sc_b, bi_b = bits(w), np.zeros(2, np.uint16), np.zeros(2, np.uint16)
            else:
                wq, sc, bi = mx.quantize(w, group_size=gs, bits=nbits)
                wb, sc_b, bi_b = bits(wq), bits(sc), bits(bi)

            def wargs(eng, mode):
                """matvec's W0, W1, S0, S1, B0, B1 as MLX holds them: with SWIGLU (WMAP_PAIR)
                the gate rows (even) and the up rows (odd) as two matrices, else one."""
                def half(a, i):
                    return np.ascontiguousarray(a[i::2]) if a.ndim == 2 else a
                if mode & 4:
                    ps = [half(a, i) for a in (wb, sc_b, bi_b) for i in (0, 1)]
                else:
                    ps = [a for a in (wb, sc_b, bi_b) for _ in (0, 1)]
                return [eng.buf(a) for a in ps]
            spread = mx.power(2.0, mx.random.randint(-12, 13, (NB, k), key=mx.random.key(k + 9)))
            x = bits((mx.random.normal((NB, k), key=mx.random.key(k + 7)) * spread).astype(mx.bfloat16))
            g = bits(mx.random.normal((k,), key=mx.random.key(3)).astype(mx.bfloat16))
            res = bits(mx.random.normal((NB, n), key=mx.random.key(5)).astype(mx.bfloat16))
            for mode in (0, 1, 1 | 4, 2, 1 | 8):
                out_n = n // 2 if mode & 4 else n
                dt = np.float32 if mode & 8 else np.uint16
                out = en.buf(np.zeros(NB * out_n, dt))
                xb, rb = en.buf(x.reshape(-1)), en.buf(res.reshape(-1))
                en.launch(1, mv_grid(n, MV_T), MV_T, wargs(en, mode) + [xb, en.buf(g), rb, out, n,
                                                  k, nbits, gs, mode, 1e-5, 0, 0.0])
                same = True
                if eoff is not None:
                    oo = eoff.buf(np.zeros(NB * out_n, dt))
                    eoff.launch(1, grid(n, ROWS), 256, wargs(eoff, mode) + [
                        eoff.buf(x.reshape(-1)), eoff.buf(g), eoff.buf(res.reshape(-1)), oo, n, k,
                        nbits, gs, mode, 1e-5, 0, 0.0])
                    if not np.array_equal(oo.view(np.uint8), out.view(np.uint8)):
                        same = False
                        print(f"nb bit check: bits {nbits} gs {gs} {n} x {k} mode {mode}: the "
                              "switch's rows differ from the kernel without it FAILED")
                for b in range(NB):
                    o1 = e1.buf(np.zeros(out_n, dt))
                    e1.launch(1, grid(n, 2), 256, wargs(e1, mode) + [e1.buf(x[b]), e1.buf(g),
                                                   e1.buf(res[b]), o1, n, k, nbits, gs, mode, 1e-5, 0,
                                                   0.0])
                    same &= bool(np.array_equal(o1.view(np.uint8), out[b * out_n:(b + 1) * out_n]
                                                .view(np.uint8)))
                count += 1
                ok &= same
                if not same:
                    print(f"nb bit check: bits {nbits} gs {gs} {n} x {k} mode {mode}: rows differ "
                          "from the one-sequence kernel FAILED")
    ref = (f" ({MV_ASYNC_REF}'s, MV_ASYNC against main)" if MV_ASYNC and not (MV_NB or MV_WIDE)
           else " (this tree's, no switch)" if MV_WIDE else "")
    if MV_NB or MV_WIDE:
        ref += (f" and to the {NB}-sequence kernel without {'MV_WIDE' if MV_WIDE else 'MV_NB'}"
                f" (this tree's{', MV_ASYNC' if MV_ASYNC else ''}"
                f"{f', {8 // ROWS} chunks in flight, 256 threads' if MV_WIDE else ''})")
    if MV_WIDE:
        ref += f"; the switch's kernel in blocks of {MV_T} threads"
    print(f"nb bit check (sequences {NB}, rows per warp {ROWS}, chunks in flight {BATCH}): "
          f"{count} products, every sequence's output bit-equal to the one-sequence kernel's{ref} "
          f"{'ok' if ok else 'FAILED'}")
    return ok


# MMA_LATE's bound against main's tile, a difference over the largest output of a product
# (bfloat16 inputs rounded once instead of twice, the 1 / rms applied to the sums).
LATE_BOUND = 2.0 ** -6


def mma_bit_check(tmp):
    """The tensor-core tile of NB sequences (this build: GRAPH_EMU_NB, GRAPH_EMU_MMA_KC) against
    main's tensor-core tile of 5 sequences (session 32's source, c6af23fc, the tile the device
    has run at 4-7), a slice of 5 sequences at a time over the same weights and inputs: every
    output bit for bit. Both with the float32 output unrounded (RAW_F32) and the inputs spread
    over 2^-12..2^12, as nb_bit_check. 4-bit weights in groups of 64; the modes the step uses
    (plain, norm, norm + SwiGLU, residual, float32 logits); shapes with rows not a multiple of
    16, several rows blocks a block (and more than MMA_RB), a K of 25 groups (chunks of 512
    leave a last chunk of one group)."""
    old_cu = subprocess.run(["git", "-C", str(ROOT), "show", "c6af23fc:mlx-kernels/src/graph_decode.cu"],
                            check=True, capture_output=True, text=True).stdout
    # The launch glue passes the attention kernel's later sinks argument (gpucover, s34); main's
    # attention takes one parameter fewer: added, unused (this check launches mat-vecs only).
    sig = "u64* trace, ll window, double softcap) {"
    assert old_cu.count(sig) == 1, "main's attention signature"
    old_cu = old_cu.replace(sig, "u64* trace, ll window, double softcap, const bf16_t* sinks) {")
    rest = rest_for_main()
    ref_nb = 5
    e5 = Emu(build(tmp, nb=ref_nb, mma=1, raw_f32=True, kc=0, cu=old_cu + rest, tag="_main"))
    en = Emu(build(tmp, mma=1, raw_f32=True))
    # MMA_LATE: the norm modes against this tree's own 5-sequence tile with it (bit for bit; an
    # explicit source, so none of this run's other switches or mutations), and within
    # LATE_BOUND of main's.
    el = None
    if MMA_LATE:
        el = Emu(build(tmp, nb=ref_nb, mma=1, raw_f32=True, kc=0, cu="#define MMA_LATE_NORM 2\n" + CU,
                       tag="_late5"))
    late_err = 0.0
    ok, count = True, 0
    # 200 x 1024: 13 rows blocks over 3 blocks (5, 4, 4: pairs, and an odd one's last alone);
    # 96 x 640: 2 rows blocks a block (pairs only; chunks of 512 leave one of 128).
    for n, k in ((40, 320), (130, 1600), (24, 1024), (200, 1024), (96, 640)):
        w = mx.random.normal((n, k), key=mx.random.key(n + 4)).astype(mx.bfloat16)
        wq, sc, bi = mx.quantize(w, group_size=64, bits=4)
        wb, sc_b, bi_b = bits(wq), bits(sc), bits(bi)

        def wargs(eng, mode):
            def half(a, i):
                return np.ascontiguousarray(a[i::2])
            if mode & 4:
                ps = [half(a, i) for a in (wb, sc_b, bi_b) for i in (0, 1)]
            else:
                ps = [a for a in (wb, sc_b, bi_b) for _ in (0, 1)]
            return [eng.buf(a) for a in ps]
        slices = (NB + ref_nb - 1) // ref_nb
        spread = mx.power(2.0, mx.random.randint(-12, 13, (NB, k), key=mx.random.key(k + 9)))
        x = bits((mx.random.normal((NB, k), key=mx.random.key(k + 7)) * spread).astype(mx.bfloat16))
        g = bits(mx.random.normal((k,), key=mx.random.key(3)).astype(mx.bfloat16))
        res = bits(mx.random.normal((NB, n), key=mx.random.key(5)).astype(mx.bfloat16))
        xp = np.zeros((slices * ref_nb, k), np.uint16)
        xp[:NB] = x
        rp = np.zeros((slices * ref_nb, n), np.uint16)
        rp[:NB] = res
        for mode in (0, 1, 1 | 4, 2, 1 | 8):
            out_n = n // 2 if mode & 4 else n
            dt = np.float32 if mode & 8 else np.uint16
            out = en.buf(np.zeros(NB * out_n, dt))
            en.launch(mv_kernel(mode, True), mv_grid(n), 256, wargs(en, mode) + [en.buf(x.reshape(-1)),
                      en.buf(g), en.buf(res.reshape(-1)), out, n, k, 4, 64, mode, 1e-5, 0, 0.0])
            def tile5(e, kernel=1):
                ref = np.zeros(slices * ref_nb * out_n, dt)
                for i in range(slices):
                    o5 = e.buf(np.zeros(ref_nb * out_n, dt))
                    sl = slice(i * ref_nb, (i + 1) * ref_nb)
                    e.launch(kernel, mv_grid(n), 256, wargs(e, mode) + [
                        e.buf(np.ascontiguousarray(xp[sl]).reshape(-1)), e.buf(g),
                        e.buf(np.ascontiguousarray(rp[sl]).reshape(-1)), o5, n, k, 4, 64, mode, 1e-5, 0, 0.0])
                    ref[i * ref_nb * out_n:(i + 1) * ref_nb * out_n] = o5
                return ref
            ref = tile5(e5)
            # (Chunks of K take the norm before the products, as main: late only with all of K.)
            if el is not None and mode & 1 and not (MMA_KC and k > MMA_KC):
                # Tier L3 against main's tile: the largest difference over the largest output.
                def val(a):
                    a = a[:NB * out_n]
                    return a.astype(np.float64) if dt == np.float32 else \
                        (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
                err = float(np.max(np.abs(val(out) - val(ref))) / max(np.max(np.abs(val(ref))), 1e-30))
                late_err = max(late_err, err)
                if not err < LATE_BOUND:
                    ok = False
                    print(f"mma bit check: {n} x {k} mode {mode}: late norm {err:.3g} of the largest "
                          f"output from main's tile (bound {LATE_BOUND}) FAILED")
                ref = tile5(el, mv_kernel(mode, True))
            same = bool(np.array_equal(ref[:NB * out_n].view(np.uint8), out.view(np.uint8)))
            count += 1
            ok &= same
            if not same:
                diff = np.flatnonzero(ref[:NB * out_n].view(dt) != out)
                print(f"mma bit check: {n} x {k} mode {mode}: {diff.size} outputs differ from main's "
                      f"5-sequence tile (first at sequence {diff[0] // out_n}) FAILED")
    late = (f" (late norm: the norm modes to this tree's 5-sequence tile with it, {late_err:.3g} of "
            f"the largest output from main's)" if el is not None else "")
    print(f"mma bit check (sequences {NB}, staged inputs {MMA_KC or 'all of K'}): {count} products, "
          f"every sequence's output bit-equal to main's 5-sequence tensor-core tile{late} "
          f"{'ok' if ok else 'FAILED'}")
    return ok


def route_check(lib):
    """moe_route alone against mlx-lm's routers over the same bfloat16 gate logits:
    qwen3_moe's (softmax, the k largest, optionally renormalised) and mixtral's (the k
    largest logits, softmax over them), for 4 to 130 experts and 1 to 8 a token, with
    near-ties. The chosen experts as a set and each one's weight, bit for bit; where two
    probabilities tie in bfloat16, the chosen values (which expert wins a tie is each side's
    own: MLX's argpartition leaves it open)."""
    e = Emu(lib)
    rng = np.random.default_rng(11)
    ok = True
    for n, k, kind, norm, spread in [(4, 2, 0, 1, 1.0), (8, 2, 0, 0, 1.0), (128, 8, 0, 1, 1.0),
                                     (128, 8, 0, 1, 0.05), (130, 3, 0, 0, 2.0), (8, 2, 1, 0, 1.0),
                                     (4, 1, 1, 0, 1.0), (64, 8, 1, 0, 0.05), (128, 8, 1, 0, 3.0)]:
        for trial in range(4):
            g = mx.array(rng.normal(0, spread, n).astype(np.float32)).astype(mx.bfloat16)
            gb = e.buf(bits(g))
            sel = e.buf(np.zeros(k, np.int32))
            w = e.buf(np.zeros(k, np.float32))
            e.launch(8, (1, 1), 32, [gb, sel, w, n, k, kind, norm, 0])
            if kind == 0:  # qwen3_moe.py
                gates = mx.softmax(g, axis=-1, precise=True)
                inds = mx.argpartition(gates, kth=-k, axis=-1)[..., -k:]
                scores = mx.take_along_axis(gates, inds, axis=-1)
                if norm:
                    scores /= mx.sum(scores, axis=-1, keepdims=True)
                chosen = mx.take_along_axis(gates, inds, axis=-1)
                ours_chosen = np.array(gates.astype(mx.float32))[sel]
            else:  # mixtral.py
                inds = mx.argpartition(-g, kth=k - 1, axis=-1)[..., :k]
                scores = mx.softmax(mx.take_along_axis(g, inds, axis=-1), axis=-1, precise=True)
                chosen = mx.take_along_axis(g, inds, axis=-1)
                ours_chosen = np.array(g.astype(mx.float32))[sel]
            ref_i = [int(x) for x in np.array(inds)]
            ref_w = dict(zip(ref_i, np.array(scores.astype(mx.float32)).tolist()))
            same_set = sorted(ref_i) == sorted(sel.tolist())
            same_vals = sorted(np.array(chosen.astype(mx.float32)).tolist()) == sorted(ours_chosen.tolist())
            if same_set:
                good = all(ref_w[int(i)] == float(x) for i, x in zip(sel, w))
            else:  # a tie resolved otherwise: the same values chosen, weights as multisets
                good = same_vals and sorted(ref_w.values()) == sorted(w.tolist())
            ok &= bool(good)
            if not good or trial == 0:
                print(f"route check ({'softmax, top-k' if kind == 0 else 'top-k, softmax'}, norm {norm}, "
                      f"{n} experts, k {k}, spread {spread}, trial {trial}): experts {'equal' if same_set else 'differ in a tie' if same_vals else 'DIFFER'}, "
                      f"weights {'bit-equal' if good else 'DIFFER'} {'ok' if good else 'FAILED'}")
    return ok


def embed_check(tmp):
    """embed with EMBED_BATCH 16 (MLX_GRAPH_EARLY_PROLOGUE=1) against EMBED_BATCH 1 (main's
    loop), alone, at widths the fixtures do not reach (a thread's 2nd to 16th values: H past
    the block's 256 threads): bfloat16, 4-bit and 8-bit tables, several tokens, a Gemma-like
    scale; every output bit (h and the RoPE table) equal."""
    libs = [build(tmp, cu=f"#define EMBED_BATCH {n}\n" + CU, tag=f"_embed{n}") for n in (1, 16)]
    rng = np.random.default_rng(7)
    ok = True
    for H, nbits, gs in ((4096, 16, 1), (576, 16, 1), (4096, 4, 64), (2048, 8, 32), (576, 4, 32),
                         (8192, 4, 64)):
        V, half = 5, 64
        if nbits == 16:
            table = rng.integers(0, 1 << 16, (V, H), dtype=np.uint16) & 0xBFFF
            S = B = np.zeros(1, np.uint16)
        else:
            table = rng.integers(0, 1 << 32, (V, H * nbits // 32), dtype=np.uint32)
            S = (rng.integers(0x3C00, 0x3F80, (V, H // gs))).astype(np.uint16)
            B = (rng.integers(0xBC00, 0xBF80, (V, H // gs))).astype(np.uint16)
        inv = (1.0 / (10000.0 ** (np.arange(half) / half))).astype(np.float32)
        for tok, pos, scale in ((3, 17, 1.0), (0, 0, 1.0), (4, 511, 24.0)):
            outs = []
            for lib in libs:
                e = Emu(lib)
                state = e.buf(np.array([tok, pos, 0, 0], np.int32))
                h = e.buf(np.zeros(H, np.uint16))
                rope = e.buf(np.zeros(4 * half, np.float32))
                e.launch(0, (1, 1), 256, [e.buf(table), e.buf(S), e.buf(B), state, h, H, nbits, gs, rope,
                                          half, half, e.buf(inv), 1.0, 1.0, scale, 0, e.buf(inv), 1.0,
                                          1.0])
                outs.append((h.copy(), rope.view(np.uint32).copy()))
            same = all(np.array_equal(a, b) for a, b in zip(outs[0], outs[1]))
            ok &= same
            print(f"embed check (H {H}, bits {nbits}, group {gs}, token {tok}, position {pos}, scale "
                  f"{scale}): EMBED_BATCH 16 against 1 {'bit-equal ok' if same else 'FAILED'}")
    return ok


def mlx_lm_pick(logits):
    """mlx-lm's greedy pick from bfloat16 logits: generate_step's log-probabilities
    (logits - logsumexp, in the logits' dtype) through sample_utils' greedy sampler."""
    from mlx_lm.sample_utils import make_sampler

    lg = mx.array(logits).astype(mx.bfloat16)[None]
    return int(make_sampler(0.0)(lg - mx.logsumexp(lg, axis=-1, keepdims=True)).item())


def make_sampler_greedy(lg):
    """mlx-lm's greedy pick from a (1, V) bfloat16 array of (processed) logits."""
    from mlx_lm.sample_utils import make_sampler

    return make_sampler(0.0)(lg - mx.logsumexp(lg, axis=-1, keepdims=True)).item()


def mlx_lm_logprob(logits, token):
    """generate_step's log-probability of `token` (bfloat16 logits minus their logsumexp)."""
    lg = mx.array(logits).astype(mx.bfloat16)
    return float((lg - mx.logsumexp(lg, axis=-1, keepdims=True))[int(token)].astype(mx.float32).item())


def sampler_check(lib):
    """The greedy sampler's kernels (argmax_partial, argmax_pick) alone, over vocabularies of
    one to many blocks, against mlx-lm's pick: random logits, exact ties, near ties (values
    whose log-probabilities round to the same bfloat16, the first index winning), -inf and
    NaN, each sampled twice in a row (the kernels reset their own counters)."""
    e = Emu(lib)
    rng = np.random.default_rng(7)
    cases = []
    for V in (1, 100, 2047, 2048, 2049, 10007, 50000):
        cases.append((f"random {V}", rng.normal(0, 3, V)))
    tie = rng.normal(0, 1, 10007)
    tie[[9000, 4000, 6000]] = tie.max() + 1
    cases.append(("exact ties", tie))
    # Near ties: most logits near 0.5, so that the log-probabilities of the top few (near
    # -10.3) round to steps of 1/16: 0.9765625 (index 20000) ties with the 1.0 (45000) and,
    # first, wins; 0.9 (10000) does not.
    near = 0.5 - rng.integers(0, 4, 50000) / 64
    near[[45000, 30000, 20000, 10000]] = [1.0, 0.984375, 0.9765625, 0.9]
    cases.append(("near ties", near))
    cases.append(("all -inf", np.full(5000, -np.inf)))
    nan = rng.normal(0, 1, 5000)
    nan[[3, 4100]] = np.nan
    cases.append(("NaN", nan))
    # A logit bias (the serve bench's EOS suppression, plus one that makes a new winner and
    # ones whose sums round in bfloat16): mlx-lm's logit_bias processor, then its pick.
    biased = rng.normal(0, 3, 50000)
    top = int(np.argmax(biased))
    bias_of = {top: -100.0, 123: 30.0, 7: 0.3, 49999: -0.01}
    cases.append(("logit bias", biased))
    ok = True
    for what, vals in cases:
        V = len(vals)
        # bfloat16 values held as float32, as the head kernel writes them.
        logits = e.buf(np.array(mx.array(np.asarray(vals, np.float32)).astype(mx.bfloat16)
                                .astype(mx.float32)))
        bias = e.buf(np.zeros(V, np.float32))
        if what == "logit bias":
            lg = mx.array(logits).astype(mx.bfloat16)[None]
            ids = list(bias_of)
            lg[:, ids] += mx.array([bias_of[i] for i in ids])
            want = int(make_sampler_greedy(lg))
            for i, v in bias_of.items():
                bias[i] = v
        else:
            want = mlx_lm_pick(logits)
        am = -(-V // ARGMAX_SLICE)
        part = e.buf(np.zeros(2 * am + 2, np.float32))
        ctl = e.buf(np.zeros(4, np.int32))
        state = e.buf(np.array([0, 5, 0, 0], np.int32))
        tokens = e.buf(np.zeros(8, np.int32))
        for _ in range(2):
            e.launch(4, (am, 1), 256, [logits, bias, part, ctl, V])
            e.launch(5, (am, 1), 256, [logits, bias, part, ctl, state, tokens, V, 4])
        got = [int(t) for t in tokens[0:4:2]]
        good = got == [want, want] and list(state[:3]) == [want, 7, 2] and not ctl.any()
        ok &= good
        print(f"sampler, {what} ({V} logits, {am} blocks): ours {got}, mlx-lm {want} "
              f"{'ok' if good else 'FAILED'}")
    return ok


def main():
    names = sys.argv[1:] or ["dense_bf16_mha", "dense_bf16_untied", "q8_g32_bf16", "q4:dense_bf16_untied",
                             "yarn_rope", "make_qwen2", "make_smollm3", "make_llama3", "q4:make_qwen2",
                             "make_mistral_linear", "make_qwen3", "q4:make_qwen3", "make_gemma3",
                             "q4:make_gemma3", "make_gemma2", "make_qwen3_moe", "q4:make_qwen3_moe",
                             "q4r8:make_qwen3_moe", "make_mixtral", "q4:make_mixtral", "make_olmo2",
                             "q4:make_olmo2", "make_olmo2_wide", "make_exaone4", "make_gpt_oss",
                             "fp4e:make_gpt_oss"]
    with tempfile.TemporaryDirectory() as tmp:
        lib = build(tmp)
        # GRAPH_EMU_SKIP_SAMPLER=1: the rows only (the sampler check takes minutes on a loaded
        # machine and does not depend on the model).
        sampler = [] if os.environ.get("GRAPH_EMU_SKIP_SAMPLER") else [sampler_check(lib)]
        # GRAPH_EMU_NB_CHECK_ONLY=1: the NB-sequence kernel against the one-sequence one only.
        nb_check = ([nb_bit_check(lib, tmp)] if (NB > 1 or MV_ASYNC) and MMA == 0
                    else [])
        nb_check += [embed_check(tmp)] if EARLY_NORM else []
        if MMA:
            nb_check.append(mma_bit_check(tmp))
        if os.environ.get("GRAPH_EMU_NB_CHECK_ONLY"):
            sys.exit(0 if all(nb_check) else 1)
        # GRAPH_EMU_SINKS=1: the attention kernel with gpt_oss's sinks, alone (sink_check).
        sinks = [sink_check(tmp)] if os.environ.get("GRAPH_EMU_SINKS") else []
        # GRAPH_EMU_OAI=1: gpt_oss's experts and router alone (oai_check).
        sinks += [oai_check(tmp)] if os.environ.get("GRAPH_EMU_OAI") else []
        # GRAPH_EMU_FP4=1: mxfp4 experts' products alone (fp4_check).
        sinks += [fp4_check(tmp)] if os.environ.get("GRAPH_EMU_FP4") else []
        # tile_check's products are 4-bit: not with a GRAPH_EMU_MV_BITS mask without 4 bits.
        tiles = [tile_check(lib)] if not MV_BITS or int(MV_BITS, 0) & (1 << 4) else []
        results = sampler + nb_check + sinks + tiles + [route_check(lib)] + \
            [run(lib, n, tmp) for n in names]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
