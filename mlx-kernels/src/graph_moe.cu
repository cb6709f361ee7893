
// Mixture-of-experts layers (appended to graph_decode.cu's source only for a model with them:
// GraphSpec::moe). One layer's feed-forward block is four launches after the output
// projection (graph_decode.rs records them):
// - the router, a matvec (MODE_NORM) of the post-attention-normed input: the E gate logits;
// - moe_route: the k chosen experts and their weights, as the row's mlx-lm block orders it;
// - matvec_experts over the k chosen experts' gate/up rows (interleaved per expert, as the
//   dense MLP's), SwiGLU in the epilogue: the k activations side by side;
// - matvec_experts over their down rows, each slot its own activation: the k outputs;
// - moe_combine: h += sum_j w_j y_j.
// Batched decode is not taken (each row would choose its own experts): NB is 1.

// The most experts a router chooses from (moe_route's shared memory; checked by the host).
#define MOE_MAX_EXPERTS 1024

// Router kinds (GraphRouter in graph_decode.rs).
// SOFTMAX_TOPK (qwen3_moe): p = softmax(g) (precise: float32, rounded to bfloat16), the k
//   largest p, w = those p; with norm, w / sum(w) (the sum in float32 in order, rounded; the
//   quotient rounded).
// TOPK_SOFTMAX (mixtral): the k largest g; w = softmax of those (precise, rounded).
#define MOE_SOFTMAX_TOPK 0
#define MOE_TOPK_SOFTMAX 1

// Warp-wide (largest value, then smallest index) reduction: every lane gets the winner.
__device__ __forceinline__ void warp_best(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov > v || (ov == v && oi < i)) {
      v = ov;
      i = oi;
    }
  }
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The k chosen experts (sel, in order of choice: the largest first, the smallest index among
// equals) and their weights (w, bfloat16 values as floats) from the router's E logits g
// (bfloat16). One warp. A NaN counts as -inf; every sel is in [0, E) and none repeats.
// gbias (gpt_oss's biased router; null: none): the router's bias, added to each logit and
// rounded, as mlx adds a linear's bias after a quantized product (a bfloat16 router's addmm
// rounds once: one rounding more here).
extern "C" __global__ void __launch_bounds__(32) moe_route(const bf16_t* g, int* sel, float* w,
                                                           ll E, ll k, ll kind, ll norm,
                                                           const bf16_t* gbias) {
  __shared__ float v[MOE_MAX_EXPERTS];
  __shared__ int taken[MOE_MAX_EXPERTS];
  __shared__ float chosen[32];
  pdl_wait_then_release();
  const int lane = threadIdx.x;
  const int n = (int)E;
  for (int e = lane; e < n; e += 32) {
    const float x = gbias ? rbf(bf2f(g[e]) + bf2f(gbias[e])) : bf2f(g[e]);
    v[e] = x != x ? NEG_INF : x;
    taken[e] = 0;
  }
  __syncwarp();
  if (kind == MOE_SOFTMAX_TOPK) {
    // softmax(g, precise=True): exp(g - max) / sum in float32, rounded to bfloat16.
    float m = NEG_INF;
    for (int e = lane; e < n; e += 32) m = fmaxf(m, v[e]);
    m = warp_max(m);
    float s = 0.f;
    for (int e = lane; e < n; e += 32) s += expf(v[e] - m);
    s = warp_sum(s);
    __syncwarp();
    for (int e = lane; e < n; e += 32) v[e] = rbf(expf(v[e] - m) / s);
    __syncwarp();
  }
  // k rounds of the largest value not yet taken.
  for (int j = 0; j < (int)k; ++j) {
    float best = NEG_INF;
    int bi = n;
    for (int e = lane; e < n; e += 32) {
      if (!taken[e] && (bi == n || v[e] > best)) {
        best = v[e];
        bi = e;
      }
    }
    warp_best(best, bi);
    __syncwarp();
    if (lane == 0) {
      sel[j] = bi;
      chosen[j] = best;
      taken[bi] = 1;
    }
    __syncwarp();
  }
  if (lane != 0) return;
  if (kind == MOE_SOFTMAX_TOPK) {
    float s = 0.f;
    for (int j = 0; j < (int)k; ++j) s += chosen[j];
    s = rbf(s);
    for (int j = 0; j < (int)k; ++j) w[j] = norm ? rbf(chosen[j] / s) : chosen[j];
  } else {
    float m = NEG_INF;
    for (int j = 0; j < (int)k; ++j) m = fmaxf(m, chosen[j]);
    float s = 0.f;
    for (int j = 0; j < (int)k; ++j) s += expf(chosen[j] - m);
    for (int j = 0; j < (int)k; ++j) w[j] = rbf(expf(chosen[j] - m) / s);
  }
}

// The chosen experts' matrix-vector products (mv_run with sel): rows [j rpe, (j + 1) rpe) of
// the N = k rpe rows are expert sel[j]'s rows of the stacked W [E rpe, K]. mode:
// NORM | SWIGLU: gate/up, each expert's rows read interleaved (gate_i, up_i: rows of W0 and W1,
//   the stacked gate [E rpe / 2, K] and up as the model holds them, WMAP_PAIR): out[i / 2] =
//   silu(gate_i) up_i, rounded as matvec's SwiGLU (the k activations side by side);
// 0 with per_slot: down, slot j's input xin + j K (the activations): out[i] = W_i x (the k
//   outputs side by side).
// gpt_oss's experts (compiled only where MOE_OAI is 1): with EB0
// (and EB1 for gate/up) not null, each expert's biases (EB0 [E rpe] for down, or the gate's
// [E rpe / 2] and EB1 the up's), added to the rounded product and rounded, as mlx-lm's
// SwitchLinear adds them after gather_(q)mm; with MODE_OAI (and SWIGLU) the activation is
// swiglu_oai: (clip(up, -7, 7) + 1) (g sigmoid(1.702 g)), g = min(gate, 7), each op in
// bfloat16 as mlx computes it on bfloat16 activations.
// The experts are known only once moe_route has run: the first weights load after the wait.
#ifndef MOE_OAI
#define MOE_OAI 0
#endif
#define MODE_OAI 32
extern "C" __global__ void __launch_bounds__(256, MV_MIN_BLOCKS) matvec_experts(
    const void* W0, const void* W1, const bf16_t* S0, const bf16_t* S1, const bf16_t* B0,
    const bf16_t* B1, const bf16_t* xin, const bf16_t* normw, bf16_t* out, const int* sel, ll N,
    ll K, ll bits, ll gs, ll mode, double eps, ll rpe, ll per_slot, u64* trace,
    const bf16_t* EB0, const bf16_t* EB1) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float red[MV_WARPS];
  Trace tr{trace, {0, 0, 0, 0}};
  tr.mark(0);
  pdl_wait_then_release();
  struct None {};
  auto pre = [&](ll, int) { return None{}; };
  auto epi = [&](ll r0, int, const float* acc, const None&) {
#pragma unroll
    for (int r = 0; r < MV_ROWS; r += 2) {
      const ll i = r0 + r;  // rows i and i + 1 (N is even)
      if (i >= N) break;
#if MOE_OAI
      // Slot j = i / rpe is expert sel[j]'s; its bias row of this pair (a gate/up pair's
      // index q, or down's rows i, i + 1).
      const ll j = i / rpe, e = sel[j], ri = i - j * rpe;
      float v0 = rbf(acc[r]), v1 = rbf(acc[r + 1]);
      if (EB0) {
        if (mode & MODE_SWIGLU) {
          const ll q = e * (rpe / 2) + ri / 2;
          v0 = rbf(v0 + bf2f(EB0[q]));
          v1 = rbf(v1 + bf2f(EB1[q]));
        } else {
          v0 = rbf(v0 + bf2f(EB0[e * rpe + ri]));
          v1 = rbf(v1 + bf2f(EB0[e * rpe + ri + 1]));
        }
      }
      if ((mode & MODE_SWIGLU) && (mode & MODE_OAI)) {
        const float lim = 7.f, alpha = rbf(1.702f);
        const float gt = fminf(v0, lim), u = fminf(fmaxf(v1, -lim), lim);
        const float sg = rbf(1.f / (1.f + expf(-rbf(alpha * gt))));
        out[i / 2] = f2bf(rbf(u + 1.f) * rbf(gt * sg));
      } else if (mode & MODE_SWIGLU) {
        const float sg = rbf(1.f / (1.f + expf(-v0)));
        out[i / 2] = f2bf(rbf(v0 * sg) * v1);
      } else {
        out[i] = f2bf(v0);
        out[i + 1] = f2bf(v1);
      }
#else
      if (mode & MODE_SWIGLU) {
        const float gt = rbf(acc[r]), u = rbf(acc[r + 1]);
        const float sg = rbf(1.f / (1.f + expf(-gt)));
        out[i / 2] = f2bf(rbf(gt * sg) * u);
      } else {
        out[i] = f2bf(acc[r]);
        out[i + 1] = f2bf(acc[r + 1]);
      }
#endif
    }
  };
  const Wts wt = make_wts(W0, W1, W1, S0, S1, S1, B0, B1, B1,
                          (mode & MODE_SWIGLU) ? WMAP_PAIR : WMAP_ONE);
#if MV_FP4
  // mxfp4 experts (gpt_oss: bits BITS_MXFP4, groups of 32, byte scales in S0 and S1, no B).
  if (bits == BITS_MXFP4) {
    if (wt.map == WMAP_PAIR) {
      mv_run<4, WMAP_PAIR, true>(wt, xin, normw, (mode & MODE_NORM) != 0, N, K, gs, eps, smem,
                                 red, tr, pre, epi, sel, rpe, per_slot != 0);
    } else {
      mv_run<4, WMAP_ONE, true>(wt, xin, normw, (mode & MODE_NORM) != 0, N, K, gs, eps, smem,
                                red, tr, pre, epi, sel, rpe, per_slot != 0);
    }
  } else
#endif
  {
    MV_DISPATCH(bits, false, wt, xin, normw, (mode & MODE_NORM) != 0, N, K, gs, eps, smem, red,
                tr, pre, epi, sel, rpe, per_slot != 0)
  }
  tr.done(TRACE_MATVEC | (u64)mode << 8 | (u64)K << 16);
}

// h = h + sum_j w_j y_j for the k expert outputs y (bfloat16, H each) and their weights w,
// as mlx-lm's block computes it in bfloat16: each product rounded, their sum (float32, in
// order) rounded, then the residual add rounded. Blocks of 256 over H.
extern "C" __global__ void __launch_bounds__(256) moe_combine(const bf16_t* y, const float* w,
                                                              bf16_t* h, ll H, ll k) {
  pdl_wait_then_release();
  const ll i = (ll)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= H) return;
  float s = 0.f;
  for (int j = 0; j < (int)k; ++j) s += rbf(bf2f(y[j * H + i]) * w[j]);
  h[i] = f2bf(bf2f(h[i]) + rbf(s));
}
