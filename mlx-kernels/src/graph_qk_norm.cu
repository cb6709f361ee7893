
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
  const int t = threadIdx.x, Di = (int)D, b = (int)(blockIdx.x % per), half = Di / 2,
            nr = (int)nrot;
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
