// The driver of flash_emulate.py (appended after the emulated kernels): random inputs rounded
// to the element type, the kernels launched as mlx-kernels launches them, and a dense attention
// in double over the same rounded values. Exits non-zero when an error (relative to the
// largest magnitude) exceeds flash_cuda.rs's bound for the type.
using namespace mlx::core::cu;
bool failed = false;

template <class F> void launch(int gx, int gy, int gz, F f) {
  for (int z = 0; z < gz; ++z) for (int y = 0; y < gy; ++y) for (int x = 0; x < gx; ++x) {
    std::barrier<> bar(128); g_bar = &bar;
    std::vector<std::thread> ts;
    for (int t = 0; t < 128; ++t) ts.emplace_back([=] { threadIdx = {t, 0, 0}; blockIdx = {x, y, z}; f(); });
    for (auto& t : ts) t.join();
  }
}

template <typename T> const char* type_name() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  else if constexpr (std::is_same_v<T, bf16>) return "bfloat16";
  else return "float16";
}
// The bounds, read from flash_cuda.rs by flash_emulate.py.
template <typename T> double bound() {
  if constexpr (std::is_same_v<T, float>) return FUSED_F32_REL_BOUND;
  else if constexpr (std::is_same_v<T, bf16>) return FUSED_BF16_REL_BOUND;
  else return FUSED_F16_REL_BOUND;
}

template <typename T, int D, int DV, bool CAUSAL, int WINDOW>
void run_case(int B, int HQ, int HKV, int L, int S) {
  constexpr int TPR = (D > DV ? D : DV) <= 64 ? 4 : 8;
  constexpr int BK = [] { int bk = 64; while (bk > 1 && bk * (D + DV) * 4 > 32 * 1024) bk /= 2; return bk; }();
  constexpr int BR = 128 / TPR;
  const float scale = 1.0f / std::sqrt((float)D);
  unsigned bits; std::memcpy(&bits, &scale, 4);
  // The template takes the scale's bits at compile time: check they are 1/sqrt(D)'s.
  constexpr unsigned SB = D == 64 ? 0x3e000000u : D == 128 ? 0x3db504f3u : D == 16 ? 0x3e800000u : 0x3d800000u;
  if (bits != SB) { printf("scale bits %x\n", bits); exit(1); }
  constexpr int HI = SB >> 16, LO = SB & 0xffff;
  const int G = HQ / HKV, off = S - L;
  std::mt19937 rng(D * 7 + L); std::normal_distribution<float> nd;
  auto gen = [&](size_t n) { std::vector<T> v(n); for (auto& x : v) x = static_cast<T>(nd(rng)); return v; };
  auto q = gen((size_t)B * HQ * L * D), k = gen((size_t)B * HKV * S * D), v = gen((size_t)B * HKV * S * DV),
       dout = gen((size_t)B * HQ * L * DV);
  Shape qs{B, HQ, L, D}, ks{B, HKV, S, D};
  std::vector<T> out(B * HQ * L * DV), dq(q.size()), dk(k.size()), dv(v.size());
  std::vector<float> lse(B * HQ * L, NAN), delta(B * HQ * L);
  launch((L + BR - 1) / BR, HQ, B, [&] { fwd<T, D, DV, TPR, BK, CAUSAL, WINDOW, HI, LO>(q.data(), qs, k.data(), ks, v.data(), out.data(), lse.data()); });
  // delta = rowsum(do * o) in float32, as flash_cuda::backward computes it with plain ops.
  for (size_t r = 0; r < delta.size(); ++r) {
    float s = 0;
    for (int e = 0; e < DV; ++e) s += (float)dout[r * DV + e] * (float)out[r * DV + e];
    delta[r] = s;
  }
  launch((L + BR - 1) / BR, HQ, B, [&] { dqk<T, D, DV, TPR, BK, CAUSAL, WINDOW, HI, LO>(q.data(), qs, k.data(), ks, v.data(), dout.data(), lse.data(), delta.data(), dq.data()); });
  launch((S + BR - 1) / BR, HKV, B, [&] { dkdv<T, D, DV, TPR, BK, CAUSAL, WINDOW, HI, LO>(q.data(), qs, k.data(), ks, v.data(), dout.data(), lse.data(), delta.data(), dk.data(), dv.data()); });
  // Dense attention in double over the same values.
  auto at = [](const std::vector<T>& a, size_t i) { return (double)(float)a[i]; };
  std::vector<double> ro(out.size()), rdq(q.size()), rdk(k.size(), 0), rdv(v.size(), 0);
  for (int b = 0; b < B; ++b) for (int h = 0; h < HQ; ++h) {
    const int hk = h / G;
    for (int i = 0; i < L; ++i) {
      const int p = i + off;
      const size_t qr = (size_t)(b * HQ + h) * L + i;
      auto vis = [&](int j) { bool ok = true; if (CAUSAL) ok = ok && j <= p; if (WINDOW > 0) ok = ok && p - j < WINDOW; return ok; };
      std::vector<double> s(S), P(S), dP(S);
      double m = -1e300;
      for (int j = 0; j < S; ++j) {
        const size_t kr = (size_t)(b * HKV + hk) * S + j;
        double a = 0;
        for (int e = 0; e < D; ++e) a += at(q, qr * D + e) * scale * at(k, kr * D + e);
        s[j] = a;
        if (vis(j)) m = std::max(m, a);
      }
      double sum = 0;
      for (int j = 0; j < S; ++j) { P[j] = vis(j) ? std::exp(s[j] - m) : 0; sum += P[j]; }
      for (int j = 0; j < S; ++j) P[j] /= sum;
      for (int e = 0; e < DV; ++e) {
        double a = 0;
        for (int j = 0; j < S; ++j) a += P[j] * at(v, ((size_t)(b * HKV + hk) * S + j) * DV + e);
        ro[qr * DV + e] = a;
      }
      double dl = 0;
      for (int j = 0; j < S; ++j) {
        double a = 0;
        for (int e = 0; e < DV; ++e) a += at(dout, qr * DV + e) * at(v, ((size_t)(b * HKV + hk) * S + j) * DV + e);
        dP[j] = a;
        dl += a * P[j];
      }
      for (int j = 0; j < S; ++j) {
        const size_t kr = (size_t)(b * HKV + hk) * S + j;
        const double ds = P[j] * (dP[j] - dl);
        for (int e = 0; e < D; ++e) {
          rdq[qr * D + e] += ds * at(k, kr * D + e) * scale;
          rdk[kr * D + e] += ds * at(q, qr * D + e) * scale;
        }
        for (int e = 0; e < DV; ++e) rdv[kr * DV + e] += P[j] * at(dout, qr * DV + e);
      }
    }
  }
  auto err = [&](const std::vector<T>& a, const std::vector<double>& r) {
    double d = 0, mm = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      double x = std::fabs(at(a, i) - r[i]);
      if (!(x <= d)) d = x;  // NaN wins
      mm = std::max(mm, std::fabs(r[i]));
    }
    return d / std::max(mm, 1e-30);
  };
  const double e[4] = {err(out, ro), err(dq, rdq), err(dk, rdk), err(dv, rdv)};
  const double worst = std::max({e[0], e[1], e[2], e[3]});
  if (!(worst <= bound<T>())) failed = true;
  printf("%s %-8s D=%d DV=%d causal=%d window=%d B=%d HQ=%d HKV=%d L=%d S=%d: out %.2e dq %.2e dk %.2e dv %.2e (bound %.0e)\n",
         worst <= bound<T>() ? "ok  " : "FAIL", type_name<T>(), D, DV, CAUSAL, WINDOW, B, HQ, HKV, L, S, e[0], e[1], e[2], e[3],
         bound<T>());
  fflush(stdout);
}

template <typename T> void run_all() {
  run_case<T, 64, 64, true, 0>(1, 4, 2, 70, 70);
  run_case<T, 128, 128, true, 20>(1, 2, 1, 53, 53);
  run_case<T, 64, 64, true, 0>(2, 2, 2, 21, 50);
  run_case<T, 64, 64, false, 0>(1, 3, 1, 19, 41);
  run_case<T, 128, 128, true, 7>(1, 4, 2, 9, 40);
  run_case<T, 16, 8, true, 3>(1, 2, 1, 7, 7);
  run_case<T, 256, 256, true, 0>(1, 2, 1, 20, 20);
}

int main() {
  run_all<float>();
  run_all<bf16>();
  run_all<_Float16>();
  return failed ? 1 : 0;
}
