
// Thread t's element of a normed head (xs, shared: every element written before the block's
// barrier) rotated by the step's RoPE table and stored at x[t] (t < D): pairs (i, i + nrot),
// or (2i, 2i + 1) when traditional; the rest as they are.
__device__ __forceinline__ void qk_rope_store(const float* xs, bf16_t* x, const float* rope,
                                              int t, int Di, int nr, ll traditional) {
  const int half = Di / 2;
  if (t < Di) {
    float out = xs[t];
    if (traditional) {
      const int i = t / 2;
      if (i < nr) {
        const float c = rope[i], s = rope[half + i];
        const float x1 = xs[2 * i], x2 = xs[2 * i + 1];
        out = (t & 1) ? x1 * s + x2 * c : x1 * c - x2 * s;
      }
    } else if (t < 2 * nr) {
      const int i = t < nr ? t : t - nr;
      const float c = rope[i], s = rope[half + i];
      const float x1 = xs[i], x2 = xs[i + nr];
      out = t < nr ? x1 * c - x2 * s : x1 * s + x2 * c;
    }
    x[t] = f2bf(out);
  }
}

// Qwen 3's q/k norms (appended to graph_decode.cu's source only for a model that has them):
// per head, RMSNorm over head_dim (qw for q's heads, kw for k's), then RoPE, in place, as
// mlx-lm's qwen3.py orders them (norm, then rope). matvec_qkv ran first with nrot 0 (its rows
// in their usual order, nothing rotated): q's heads in q, k's in the cache at position
// state[1]. Block b < nh: q's head b, else k's head b - nh. 128 threads, D <= 128. The norm
// rounds as MLX's fast.rms_norm (norm8: w * rbf(x * inv)); the rotation as matvec_qkv's
// (rope: the step's cosines then sines; pairs (i, i + nrot), or (2i, 2i + 1) when traditional).
extern "C" __global__ void __launch_bounds__(128) qk_norm_rope(
    bf16_t* q, bf16_t* kc, const int* state, const bf16_t* qw, const bf16_t* kw,
    const float* rope, ll nh, ll D, ll cap, ll nrot, ll traditional, double eps) {
  __shared__ float red[4];
  __shared__ float xs[128];
  pdl_wait_then_release();
  // Block (row nh + nkv) + b: sequence row's head b (q heads, then k heads).
  const ll per = gridDim.x / NB, nkv = per - nh, row = blockIdx.x / per;
  const int t = threadIdx.x, Di = (int)D, b = (int)(blockIdx.x % per), nr = (int)nrot;
  state += 4 * row;
  if (state[1] < 0) return;  // an idle row
  q += row * (nh + 2 * nkv) * D;
  kc += (row - state[3]) * nkv * cap * D;  // a verify group's rows share its first row's slot
  rope += row * 2 * D;
  const bool isq = b < nh;
  bf16_t* x = isq ? q + (ll)b * D : kc + ((ll)(b - nh) * cap + state[1]) * D;
  const bf16_t* w = isq ? qw : kw;
  const float v = t < Di ? bf2f(x[t]) : 0.f;
  const float ss = warp_sum(v * v);
  if ((t & 31) == 0) red[t >> 5] = ss;
  __syncthreads();
  float tot = 0.f;
  for (int i = 0; i < 4; ++i) tot += red[i];
  const float inv = rsqrtf(tot / (float)D + (float)eps);
  if (t < Di) xs[t] = rbf(bf2f(w[t]) * rbf(v * inv));
  __syncthreads();
  qk_rope_store(xs, x, rope, t, Di, nr, traditional);
}

// OLMo 2's q/k norms (appended with qk_norm_rope, GraphSpec::qk_norm_full): RMSNorm over the
// whole q projection (nh D values, weights qw [nh D]) and the whole k projection (nkv D, kw
// [nkv D]), then RoPE, in place, as mlx-lm's olmo2.py orders them. matvec_qkv ran first with
// nrot 0, as for qk_norm_rope. Block 2 row + 0 takes sequence row's q heads, + 1 its k heads
// (at position state[1] of the cache): one block a projection, since the sum of squares spans
// every head and the norm writes in place. The sum first (each thread's elements t, t + 256,
// ..., then the warps' sums in order), one barrier, then each thread norms and rotates whole
// rotation pairs (a head's unit u of D / 2: the pair (u, u + nrot) for u < nrot, or (2u,
// 2u + 1) when traditional; the unrotated rest two at a time), reading each value it writes
// itself: no element is written before the barrier or read by another thread after it.
// 256 threads. Rounded as qk_norm_rope (the norm as fast.rms_norm, the rotation as
// qk_rope_store).
extern "C" __global__ void __launch_bounds__(256) qk_norm_full_rope(
    bf16_t* q, bf16_t* kc, const int* state, const bf16_t* qw, const bf16_t* kw,
    const float* rope, ll nh, ll nkv, ll D, ll cap, ll nrot, ll traditional, double eps) {
  __shared__ float red[8];
  pdl_wait_then_release();
  const ll row = blockIdx.x / 2;
  const int t = threadIdx.x, nr = (int)nrot, half = (int)(D / 2);
  const bool isq = blockIdx.x % 2 == 0;
  state += 4 * row;
  if (state[1] < 0) return;  // an idle row
  q += row * (nh + 2 * nkv) * D;
  kc += (row - state[3]) * nkv * cap * D;  // a verify group's rows share its first row's slot
  rope += row * 2 * D;
  // D is a power of two (16 to 128): heads and elements by shifts; the projection's width
  // fits in 31 bits (the host checks the rows).
  const int heads = (int)(isq ? nh : nkv), ds = __ffsll(D) - 1, n = heads << ds;
  const ll pos = state[1];
  // Element i of head h.
  auto at = [&](int h, int i) {
    return isq ? q + ((ll)h << ds) + i : kc + ((ll)h * cap + pos) * D + i;
  };
  float ss = 0.f;
  for (int j = t; j < n; j += 256) {
    const float v = bf2f(*at(j >> ds, j & ((1 << ds) - 1)));
    ss += v * v;
  }
  // graph_decode.cu's block sum over the 8 warps (lanes, then warps in turn).
  const float tot = block_sum(ss, red);
  const float inv = rsqrtf(tot / (float)n + (float)eps);
  const bf16_t* w = isq ? qw : kw;
  for (int u = t; u < (heads << (ds - 1)); u += 256) {
    const int h = u >> (ds - 1), i = u & (half - 1);
    // The unit's two elements, and whether (and by which angle) they rotate.
    int a, b;
    if (traditional) {
      a = 2 * i;
      b = a + 1;
    } else if (i < nr) {
      a = i;
      b = i + nr;
    } else {
      a = 2 * nr + 2 * (i - nr);
      b = a + 1;
    }
    bf16_t* xa = at(h, a);
    bf16_t* xb = at(h, b);
    const float x1 = rbf(bf2f(w[(h << ds) + a]) * rbf(bf2f(*xa) * inv));
    const float x2 = rbf(bf2f(w[(h << ds) + b]) * rbf(bf2f(*xb) * inv));
    if (i < nr) {
      const float c = rope[i], s = rope[half + i];
      *xa = f2bf(x1 * c - x2 * s);
      *xb = f2bf(x1 * s + x2 * c);
    } else {
      *xa = f2bf(x1);
      *xb = f2bf(x2);
    }
  }
}
