// The graph decoder's kernels (mlx-kernels/src/graph_decode.rs): one llama decode step as
// 7 kernels a layer, captured once into a CUDA graph and replayed for every token.
//
// Compiled by NVRTC at run time with no includes. Every parameter is 8 bytes wide (pointers,
// long long, double): the runtime checks launches against that. Activations are bfloat16
// values rounded where MLX rounds them (after each op), arithmetic in float32.
//
// The step state lives on the device: state[0] the token to embed, state[1] its position
// (where its keys and values go; attention covers state[1] + 1 positions), state[2] the
// number of steps taken (the index the next sampled token is written at).

typedef unsigned short bf16_t;
typedef unsigned int u32;
typedef long long ll;

#define NEG_INF __int_as_float(0xff800000)
#define MV_WARPS 8
#define MODE_NORM 1
#define MODE_RES 2
#define MODE_SWIGLU 4
#define MODE_F32 8
#define ATTN_CHUNK 64
#define ATTN_THREADS 128
// Rows a warp computes at once in the matrix-vector products: 2 or 4 (set by the host).
#ifndef MV_ROWS
#define MV_ROWS 2
#endif

__device__ __forceinline__ float bf2f(bf16_t h) { return __uint_as_float(((u32)h) << 16); }
__device__ __forceinline__ float lo2f(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi2f(u32 w) { return __uint_as_float(w & 0xffff0000u); }

// Round to nearest even, as MLX's bfloat16 conversion does; NaN stays NaN.
__device__ __forceinline__ bf16_t f2bf(float f) {
  u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (bf16_t)(u >> 16);
}
__device__ __forceinline__ float rbf(float f) { return bf2f(f2bf(f)); }

// Programmatic dependent launch (sm_90; no-ops when a kernel is launched without it): wait for
// the kernel before this one to finish and flush, then let the next one start its blocks.
__device__ __forceinline__ void pdl_wait_then_release() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void prefetch_l2(const void* p) {
#ifdef __CUDA_ARCH__
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// h = embedding row state[0] (bfloat16 table, or MLX affine-quantized: dequantize(w, s, b)).
extern "C" __global__ void embed(const void* table, const bf16_t* scales, const bf16_t* biases,
                                 const int* state, bf16_t* h, ll H, ll bits, ll gs) {
  pdl_wait_then_release();
  const ll tok = state[0];
  for (ll k = threadIdx.x; k < H; k += blockDim.x) {
    float v;
    if (bits == 16) {
      v = bf2f(((const bf16_t*)table)[tok * H + k]);
    } else {
      const ll per = 32 / bits;
      const u32* w = (const u32*)table + tok * (H / per);
      const u32 q = (w[k / per] >> ((k % per) * bits)) & ((1u << bits) - 1u);
      const ll g = tok * (H / gs) + k / gs;
      v = rbf(rbf(bf2f(scales[g]) * (float)q) + bf2f(biases[g]));
    }
    h[k] = f2bf(v);
  }
}

// Dot product of 8 bfloat16 weights with 8 bfloat16 inputs, added to acc.
__device__ __forceinline__ float dot8(const uint4 w, const uint4 x, float acc) {
  acc += lo2f(w.x) * lo2f(x.x);
  acc += hi2f(w.x) * hi2f(x.x);
  acc += lo2f(w.y) * lo2f(x.y);
  acc += hi2f(w.y) * hi2f(x.y);
  acc += lo2f(w.z) * lo2f(x.z);
  acc += hi2f(w.z) * hi2f(x.z);
  acc += lo2f(w.w) * lo2f(x.w);
  acc += hi2f(w.w) * hi2f(x.w);
  return acc;
}

// One 16-byte chunk of MV_ROWS quantized rows: 4 words of BITS-bit codes each (32 / BITS per
// word, the lowest bits first), against the matching inputs: d[r] = sum(q_r * x),
// xsum = sum(x).
template <int BITS>
__device__ __forceinline__ void qchunk(const uint4* w, const bf16_t* xs, float* d, float& xsum) {
  constexpr int PER = 32 / BITS;
  constexpr int VALS = 4 * PER;
  constexpr u32 MASK = (1u << BITS) - 1u;
  float x[VALS];
  const uint4* xv = (const uint4*)xs;
#pragma unroll
  for (int i = 0; i < VALS / 8; ++i) {
    const uint4 t = xv[i];
    x[8 * i + 0] = lo2f(t.x);
    x[8 * i + 1] = hi2f(t.x);
    x[8 * i + 2] = lo2f(t.y);
    x[8 * i + 3] = hi2f(t.y);
    x[8 * i + 4] = lo2f(t.z);
    x[8 * i + 5] = hi2f(t.z);
    x[8 * i + 6] = lo2f(t.w);
    x[8 * i + 7] = hi2f(t.w);
  }
  u32 words[MV_ROWS][4];
#pragma unroll
  for (int r = 0; r < MV_ROWS; ++r) {
    words[r][0] = w[r].x;
    words[r][1] = w[r].y;
    words[r][2] = w[r].z;
    words[r][3] = w[r].w;
    d[r] = 0.f;
  }
  xsum = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const float v = x[i * PER + j];
#pragma unroll
      for (int r = 0; r < MV_ROWS; ++r) {
        // q as a float without an integer conversion: 2^23 + q has q as its mantissa.
        d[r] += (__uint_as_float(0x4B000000u | ((words[r][i] >> (j * BITS)) & MASK)) -
                 8388608.f) *
                v;
      }
      xsum += v;
    }
  }
}

// MV_ROWS rows of W (row indices in rows[]) against xs (in shared memory), one warp; each
// lane's partial sums in acc[].
template <int BITS>
__device__ __forceinline__ void rows_dot(const void* W, const bf16_t* S, const bf16_t* B,
                                         const bf16_t* xs, const ll* rows, int K, int gs_shift,
                                         int lane, float* acc) {
  if (BITS == 16) {
    const uint4* w[MV_ROWS];
#pragma unroll
    for (int r = 0; r < MV_ROWS; ++r) w[r] = (const uint4*)((const bf16_t*)W + rows[r] * K);
    const uint4* x = (const uint4*)xs;
    const int C = K / 8;
#pragma unroll 4
    for (int c = lane; c < C; c += 32) {
      const uint4 xv = x[c];
#pragma unroll
      for (int r = 0; r < MV_ROWS; ++r) acc[r] = dot8(w[r][c], xv, acc[r]);
    }
  } else {
    constexpr int VALS = 4 * (32 / BITS);  // inputs per 16-byte chunk
    const int words = K / (32 / BITS);
    const int G = K >> gs_shift;
    const uint4* w[MV_ROWS];
    const bf16_t* sc[MV_ROWS];
    const bf16_t* bi[MV_ROWS];
#pragma unroll
    for (int r = 0; r < MV_ROWS; ++r) {
      w[r] = (const uint4*)((const u32*)W + rows[r] * words);
      sc[r] = S + rows[r] * G;
      bi[r] = B + rows[r] * G;
    }
    const int C = words / 4;
#pragma unroll 4
    for (int c = lane; c < C; c += 32) {
      const int g = (c * VALS) >> gs_shift;
      uint4 q[MV_ROWS];
#pragma unroll
      for (int r = 0; r < MV_ROWS; ++r) q[r] = w[r][c];
      float d[MV_ROWS], xsum;
      qchunk<BITS>(q, xs + c * VALS, d, xsum);
#pragma unroll
      for (int r = 0; r < MV_ROWS; ++r) acc[r] += bf2f(sc[r][g]) * d[r] + bf2f(bi[r][g]) * xsum;
    }
  }
}

// Fills xs (shared) with the input vector: xin, or rms_norm(xin, normw, eps) rounded as MLX's
// fast.rms_norm rounds it. All threads of the block take part.
__device__ __forceinline__ void mv_prologue(bf16_t* xs, float* red, const bf16_t* xin,
                                            const bf16_t* normw, ll K, bool norm, double eps) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (norm) {
    float ss = 0.f;
    for (ll k = tid; k < K; k += blockDim.x) {
      const float v = bf2f(xin[k]);
      ss += v * v;
    }
    ss = warp_sum(ss);
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    float tot = 0.f;
    for (int i = 0; i < MV_WARPS; ++i) tot += red[i];
    const float inv = rsqrtf(tot / (float)K + (float)eps);
    for (ll k = tid; k < K; k += blockDim.x) {
      xs[k] = f2bf(bf2f(normw[k]) * rbf(bf2f(xin[k]) * inv));
    }
  } else {
    for (ll k = tid; k < K; k += blockDim.x) xs[k] = xin[k];
  }
  __syncthreads();
}

// Before waiting for the previous kernel: pulls the first bytes of a warp's first rows (what
// it loads first) into L2. Weights do not depend on the previous kernel.
__device__ __forceinline__ void mv_prefetch(const void* W, ll p, ll groups, ll K, ll bits,
                                            int lane) {
  if (p >= groups) return;
  const ll row_bytes = K * bits / 8;
  const char* base = (const char*)W + MV_ROWS * p * row_bytes;
  for (ll off = (ll)lane * 128; off < MV_ROWS * row_bytes && off < 4096; off += 32 * 128) {
    prefetch_l2(base + off);
  }
}

// Rows rows[0..MV_ROWS) of W x, summed over the warp (every lane gets the sums).
__device__ __forceinline__ void mv_rows(const void* W, const bf16_t* S, const bf16_t* B,
                                        const bf16_t* xs, const ll* rows, ll K, ll bits,
                                        int gs_shift, float* acc) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < MV_ROWS; ++r) acc[r] = 0.f;
  switch (bits) {
    case 4: rows_dot<4>(W, S, B, xs, rows, (int)K, gs_shift, lane, acc); break;
    case 8: rows_dot<8>(W, S, B, xs, rows, (int)K, gs_shift, lane, acc); break;
    default: rows_dot<16>(W, S, B, xs, rows, (int)K, gs_shift, lane, acc); break;
  }
#pragma unroll
  for (int r = 0; r < MV_ROWS; ++r) acc[r] = warp_sum(acc[r]);
}

// out = W x for W [N, K] (bfloat16, or MLX affine-quantized with BITS-bit codes, group gs,
// bfloat16 scales and biases), x [K] bfloat16.
// mode: NORM: x = rms_norm(xin, normw, eps) first;
//       RES: out = res + (W x) (out may be res; each element is read and written by one lane);
//       SWIGLU: rows are interleaved (gate_i, up_i); out[i] = silu(gate_i) * up_i;
//       F32: out is float32 (the bfloat16-rounded values).
// Each warp computes a pair of rows; blocks stride over the pairs.
extern "C" __global__ void matvec(const void* W, const bf16_t* S, const bf16_t* B,
                                  const bf16_t* xin, const bf16_t* normw, const bf16_t* res,
                                  void* out, ll N, ll K, ll bits, ll gs, ll mode, double eps) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16_t* xs = (bf16_t*)smem;
  __shared__ float red[MV_WARPS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const ll groups = (N + MV_ROWS - 1) / MV_ROWS;
  mv_prefetch(W, blockIdx.x * MV_WARPS + warp, groups, K, bits, lane);
  pdl_wait_then_release();
  mv_prologue(xs, red, xin, normw, K, (mode & MODE_NORM) != 0, eps);
  const int gs_shift = __ffsll(gs) - 1;  // gs is a power of two
  for (ll p = (ll)blockIdx.x * MV_WARPS + warp; p < groups; p += (ll)gridDim.x * MV_WARPS) {
    const ll r0 = MV_ROWS * p;
    ll rows[MV_ROWS];
#pragma unroll
    for (int r = 0; r < MV_ROWS; ++r) rows[r] = r0 + r < N ? r0 + r : N - 1;
    float acc[MV_ROWS];
    mv_rows(W, S, B, xs, rows, K, bits, gs_shift, acc);
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < MV_ROWS; r += 2) {
        const ll i = r0 + r;  // rows i and i + 1
        if (i >= N) break;
        const bool has1 = i + 1 < N;
        if (mode & MODE_SWIGLU) {
          const float g = rbf(acc[r]), u = rbf(acc[r + 1]);
          const float sg = rbf(1.f / (1.f + expf(-g)));
          ((bf16_t*)out)[i / 2] = f2bf(rbf(g * sg) * u);
        } else if (mode & MODE_F32) {
          ((float*)out)[i] = rbf(acc[r]);
          if (has1) ((float*)out)[i + 1] = rbf(acc[r + 1]);
        } else if (mode & MODE_RES) {
          ((bf16_t*)out)[i] = f2bf(bf2f(res[i]) + rbf(acc[r]));
          if (has1) ((bf16_t*)out)[i + 1] = f2bf(bf2f(res[i + 1]) + rbf(acc[r + 1]));
        } else {
          ((bf16_t*)out)[i] = f2bf(acc[r]);
          if (has1) ((bf16_t*)out)[i + 1] = f2bf(acc[r + 1]);
        }
      }
    }
  }
}

// RoPE of one pair (x1, x2) = (x[i], x[i + D/2]) at position pos, as MLX's fast.rope computes
// it (non-traditional layout, base given as log2(base)).
__device__ __forceinline__ void rope_pair(float x1, float x2, ll i, ll half, ll pos,
                                          double log2_base, bf16_t& o1, bf16_t& o2) {
  const float d = (float)i / (float)half;
  const float inv_freq = exp2f(-d * (float)log2_base);
  const float theta = (float)pos * inv_freq;
  const float c = cosf(theta), s = sinf(theta);
  o1 = f2bf(x1 * c - x2 * s);
  o2 = f2bf(x1 * s + x2 * c);
}

// The attention projections with RoPE and the cache write in the epilogue:
// [q; k; v] = W rms_norm(xin) with W's q and k rows permuted per head so that rows 2i and
// 2i + 1 are the rotation pair (i, i + D/2) (the host permutes them); with traditional RoPE
// the pairs are (2i, 2i + 1) already. q goes to qout (its
// usual layout, roped), k (roped) and v to the caches at position state[1].
extern "C" __global__ void matvec_qkv(const void* W, const bf16_t* S, const bf16_t* B,
                                      const bf16_t* xin, const bf16_t* normw, bf16_t* qout,
                                      bf16_t* kc, bf16_t* vc, const int* state, ll K, ll bits,
                                      ll gs, ll nh, ll nkv, ll D, ll cap, ll traditional,
                                      double eps, double log2_base) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16_t* xs = (bf16_t*)smem;
  __shared__ float red[MV_WARPS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const ll groups = (nh + 2 * nkv) * D / MV_ROWS;  // D is a multiple of MV_ROWS
  mv_prefetch(W, blockIdx.x * MV_WARPS + warp, groups, K, bits, lane);
  pdl_wait_then_release();
  mv_prologue(xs, red, xin, normw, K, true, eps);
  const int gs_shift = __ffsll(gs) - 1;
  const ll pos = state[1];
  const ll half = D / 2;
  for (ll p = (ll)blockIdx.x * MV_WARPS + warp; p < groups; p += (ll)gridDim.x * MV_WARPS) {
    const ll r0 = MV_ROWS * p;
    ll rows[MV_ROWS];
#pragma unroll
    for (int r = 0; r < MV_ROWS; ++r) rows[r] = r0 + r;
    float acc[MV_ROWS];
    mv_rows(W, S, B, xs, rows, K, bits, gs_shift, acc);
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < MV_ROWS; r += 2) {
        const ll i0 = r0 + r;  // rows i0 and i0 + 1: a rotation pair of q or k, or two of v
        const float x1 = rbf(acc[r]), x2 = rbf(acc[r + 1]);
        if (i0 < nh * D) {
          const ll h = i0 / D, i = (i0 % D) / 2;
          bf16_t o1, o2;
          rope_pair(x1, x2, i, half, pos, log2_base, o1, o2);
          qout[h * D + (traditional ? 2 * i : i)] = o1;
          qout[h * D + (traditional ? 2 * i + 1 : i + half)] = o2;
        } else if (i0 < (nh + nkv) * D) {
          const ll j = i0 - nh * D;
          const ll h = j / D, i = (j % D) / 2;
          bf16_t o1, o2;
          rope_pair(x1, x2, i, half, pos, log2_base, o1, o2);
          bf16_t* kd = kc + (h * cap + pos) * D;
          kd[traditional ? 2 * i : i] = o1;
          kd[traditional ? 2 * i + 1 : i + half] = o2;
        } else {
          const ll j = i0 - (nh + nkv) * D;
          const ll h = j / D, dd = j % D;
          bf16_t* vd = vc + (h * cap + pos) * D;
          vd[dd] = f2bf(acc[r]);
          vd[dd + 1] = f2bf(acc[r + 1]);
        }
      }
    }
  }
}

// Attention of one query over the cache, split over the sequence: block (h, s) covers
// positions [64 s, 64 s + 64) and writes its unnormalised output, max and sum; the last block
// of a head to finish (counted in counters[h], which it resets) combines them:
// out[h] = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s.
// 128 threads; D a multiple of 8, at most 128.
extern "C" __global__ void attention(const bf16_t* qb, const bf16_t* kc, const bf16_t* vc,
                                     const int* state, float* po, float* pml, int* counters,
                                     bf16_t* out, ll nh, ll nkv, ll D, ll cap, ll NS,
                                     double scale) {
  pdl_wait_then_release();
  const ll h = blockIdx.x, s = blockIdx.y;
  const ll L = (ll)state[1] + 1;
  const ll start = s * ATTN_CHUNK;
  if (start >= L) return;
  const ll ns = (L + ATTN_CHUNK - 1) / ATTN_CHUNK;
  const ll n = (L - start) < ATTN_CHUNK ? (L - start) : ATTN_CHUNK;
  const ll kvh = h / (nh / nkv);
  __shared__ __align__(16) float q[128];
  __shared__ float p[ATTN_CHUNK];
  __shared__ float part[ATTN_THREADS];
  __shared__ int last;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (ll d = tid; d < D; d += ATTN_THREADS) q[d] = (float)scale * bf2f(qb[h * D + d]);
  __syncthreads();
  float sc = NEG_INF;
  if (tid < n) {
    const uint4* k = (const uint4*)(kc + (kvh * cap + start + tid) * D);
    sc = 0.f;
    for (ll c = 0; c < D / 8; ++c) {
      const uint4 w = k[c];
      const float* qq = q + 8 * c;
      sc += qq[0] * lo2f(w.x) + qq[1] * hi2f(w.x) + qq[2] * lo2f(w.y) + qq[3] * hi2f(w.y) +
            qq[4] * lo2f(w.z) + qq[5] * hi2f(w.z) + qq[6] * lo2f(w.w) + qq[7] * hi2f(w.w);
    }
  }
  // Max and sum over the chunk: the chunk's 64 scores sit in warps 0 and 1.
  float m = sc;
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) part[warp] = m;
  __syncthreads();
  m = fmaxf(part[0], part[1]);
  const float e = tid < n ? expf(sc - m) : 0.f;
  if (tid < ATTN_CHUNK) p[tid] = e;
  float l = warp_sum(e);
  __syncthreads();
  if (lane == 0) part[warp] = l;
  __syncthreads();
  l = part[0] + part[1];
  __syncthreads();
  const ll sub = ATTN_THREADS / D;  // 2 for D = 64, 1 for D = 128
  const ll d = tid % D, which = tid / D;
  float o = 0.f;
  if (which < sub) {
    for (ll j = which; j < n; j += sub) o += p[j] * bf2f(vc[(kvh * cap + start + j) * D + d]);
  }
  part[tid] = o;
  __syncthreads();
  if (tid < D) {
    float t = 0.f;
    for (ll w = 0; w < sub; ++w) t += part[w * D + tid];
    po[(h * NS + s) * D + tid] = t;
  }
  if (tid == 0) {
    pml[(h * NS + s) * 2] = m;
    pml[(h * NS + s) * 2 + 1] = l;
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(&counters[h], 1) == (int)(ns - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  float M = NEG_INF;
  for (ll t = 0; t < ns; ++t) M = fmaxf(M, __ldcg(&pml[(h * NS + t) * 2]));
  float den = 0.f;
  for (ll t = 0; t < ns; ++t) {
    den += __ldcg(&pml[(h * NS + t) * 2 + 1]) * expf(__ldcg(&pml[(h * NS + t) * 2]) - M);
  }
  for (ll dd = tid; dd < D; dd += ATTN_THREADS) {
    float num = 0.f;
    for (ll t = 0; t < ns; ++t) {
      num += __ldcg(&po[(h * NS + t) * D + dd]) * expf(__ldcg(&pml[(h * NS + t) * 2]) - M);
    }
    out[h * D + dd] = f2bf(num / den);
  }
  if (tid == 0) counters[h] = 0;
}

// Warp-wide (max, first index) reduction; every lane gets the result.
__device__ __forceinline__ void warp_argmax(float& best, int& idx) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ob > best || (ob == best && oi < idx)) {
      best = ob;
      idx = oi;
    }
  }
}

// Block-wide (max, first index) reduction; every thread gets the result. 1024 threads.
__device__ __forceinline__ void block_argmax(float& best, int& idx, float* sb, int* si) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  warp_argmax(best, idx);
  if (lane == 0) {
    sb[warp] = best;
    si[warp] = idx;
  }
  __syncthreads();
  const int nw = (blockDim.x + 31) / 32;
  best = lane < nw ? sb[lane] : NEG_INF;
  idx = lane < nw ? si[lane] : 0x7fffffff;
  warp_argmax(best, idx);
  __syncthreads();
}

// Greedy sampling as mlx-lm samples: the first index of the largest log-probability
// (logits - logsumexp(logits), both rounded to bfloat16 as MLX computes them in the logits'
// dtype) becomes the next token; the state advances one position. One block of 1024 threads.
extern "C" __global__ void argmax_next(const float* logits, int* state, int* tokens, ll V,
                                       ll max_steps) {
  __shared__ float sb[32];
  __shared__ int si[32];
  __shared__ float red[32];
  pdl_wait_then_release();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float best = NEG_INF;
  int idx = 0x7fffffff;
  for (ll i = tid; i < V; i += blockDim.x) {
    const float v = logits[i];
    if (v > best) {
      best = v;
      idx = (int)i;
    }
  }
  block_argmax(best, idx, sb, si);
  const float mx = best;
  float sum = 0.f;
  if (mx > NEG_INF) {
    for (ll i = tid; i < V; i += blockDim.x) sum += expf(logits[i] - mx);
  }
  sum = warp_sum(sum);
  if (lane == 0) red[warp] = sum;
  __syncthreads();
  float tot = 0.f;
  for (int i = 0; i < (int)((blockDim.x + 31) / 32); ++i) tot += red[i];
  const float lse = rbf(logf(tot) + mx);
  best = NEG_INF;
  idx = 0x7fffffff;
  for (ll i = tid; i < V; i += blockDim.x) {
    const float v = rbf(logits[i] - lse);
    if (v > best) {
      best = v;
      idx = (int)i;
    }
  }
  block_argmax(best, idx, sb, si);
  if (tid == 0) {
    if (idx == 0x7fffffff) idx = 0;
    const int step = state[2];
    if (step < max_steps) tokens[step] = idx;
    state[0] = idx;
    state[1] += 1;
    state[2] = step + 1;
  }
}
