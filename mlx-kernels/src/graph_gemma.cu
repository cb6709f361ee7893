
// Gemma's sandwich norms (appended to graph_decode.cu's source only for a model with them:
// GraphSpec::sandwich): h = h + rms_norm(y, w, eps), y the output projection's or the down
// projection's bfloat16 output (a matvec without a residual), w the post-norm's weight (Gemma's
// 1 + weight, added by the host as MLX adds it). Rounded as MLX rounds: the norm as
// fast.rms_norm (w * rbf(y * inv), norm2), then the sum (clip_residual is x + y in bfloat16).
// One block of 256 threads over the H values.
extern "C" __global__ void __launch_bounds__(256) norm_add(const bf16_t* y, const bf16_t* w,
                                                           bf16_t* h, ll H, double eps) {
  __shared__ float red[8];
  pdl_wait_then_release();
  const int t = threadIdx.x;
  // Block b: sequence b's row (grid NB).
  y += (ll)blockIdx.x * H;
  h += (ll)blockIdx.x * H;
  float ss = 0.f;
  for (ll k = t; k < H; k += 256) {
    const float v = bf2f(y[k]);
    ss += v * v;
  }
  ss = warp_sum(ss);
  if ((t & 31) == 0) red[t >> 5] = ss;
  __syncthreads();
  float tot = 0.f;
  for (int i = 0; i < 8; ++i) tot += red[i];
  const float inv = rsqrtf(tot / (float)H + (float)eps);
  for (ll k = t; k < H; k += 256) {
    const float n = rbf(bf2f(w[k]) * rbf(bf2f(y[k]) * inv));
    h[k] = f2bf(bf2f(h[k]) + n);
  }
}
