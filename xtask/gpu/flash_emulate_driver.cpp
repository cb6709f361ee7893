// The driver of flash_emulate.py (appended after the emulated kernels): random inputs, the
// kernels launched as mlx-kernels launches them, and a dense attention in double to compare.
// Exits non-zero when an error exceeds 1e-5 relative to the largest magnitude.
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
template <int D, int DV, bool CAUSAL, int WINDOW>
void run_case(int B, int HQ, int HKV, int L, int S) {
  constexpr int TPR = (D > DV ? D : DV) <= 64 ? 4 : 8;
  constexpr int BK = [] { int bk = 64; while (bk > 1 && bk * (D + DV) * 4 > 32 * 1024) bk /= 2; return bk; }();
  const float scale = 1.0f / std::sqrt((float)D);
  unsigned bits; std::memcpy(&bits, &scale, 4);
  // The template needs the bits at compile time: check they match the chosen D.
  constexpr unsigned SB = D == 64 ? 0x3e000000u : D == 128 ? 0x3db504f3u : D == 16 ? 0x3e800000u : 0x3d800000u;
  if (bits != SB) { printf("scale bits %x\n", bits); exit(1); }
  int G = HQ / HKV, off = S - L;
  std::mt19937 rng(D * 7 + L); std::normal_distribution<float> nd;
  auto gen = [&](size_t n) { std::vector<float> v(n); for (auto& x : v) x = nd(rng); return v; };
  auto q = gen((size_t)B * HQ * L * D), k = gen((size_t)B * HKV * S * D), v = gen((size_t)B * HKV * S * DV), dout = gen((size_t)B * HQ * L * DV);
  Shape qs{B, HQ, L, D}, ks{B, HKV, S, D};
  std::vector<float> out(B * HQ * L * DV, NAN), lse(B * HQ * L, NAN), delta(B * HQ * L), dq(q.size(), NAN), dk(k.size(), NAN), dv(v.size(), NAN);
  constexpr int BR = 128 / TPR;
  launch((L + BR - 1) / BR, HQ, B, [&] { fwd<D, DV, TPR, BK, CAUSAL, WINDOW, (SB >> 16), (SB & 0xffff)>(q.data(), qs, k.data(), ks, v.data(), out.data(), lse.data()); });
  for (size_t r = 0; r < delta.size(); ++r) { float s = 0; for (int e = 0; e < DV; ++e) s += dout[r * DV + e] * out[r * DV + e]; delta[r] = s; }
  launch((L + BR - 1) / BR, HQ, B, [&] { dqk<D, DV, TPR, BK, CAUSAL, WINDOW, (SB >> 16), (SB & 0xffff)>(q.data(), qs, k.data(), ks, v.data(), dout.data(), lse.data(), delta.data(), dq.data()); });
  launch((S + BR - 1) / BR, HKV, B, [&] { dkdv<D, DV, TPR, BK, CAUSAL, WINDOW, (SB >> 16), (SB & 0xffff)>(q.data(), qs, k.data(), ks, v.data(), dout.data(), lse.data(), delta.data(), dk.data(), dv.data()); });
  // Dense reference in double.
  std::vector<double> ro(out.size()), rdq(q.size()), rdk(k.size(), 0), rdv(v.size(), 0);
  for (int b = 0; b < B; ++b) for (int h = 0; h < HQ; ++h) {
    int hk = h / G;
    for (int i = 0; i < L; ++i) {
      int p = i + off;
      std::vector<double> s(S), P(S), dP(S);
      double m = -1e300;
      auto vis = [&](int j) { bool ok = true; if (CAUSAL) ok = ok && j <= p; if (WINDOW > 0) ok = ok && p - j < WINDOW; return ok; };
      for (int j = 0; j < S; ++j) { double a = 0; for (int e = 0; e < D; ++e) a += (double)q[((size_t)(b*HQ+h)*L+i)*D+e]*scale*k[((size_t)(b*HKV+hk)*S+j)*D+e]; s[j] = a; if (vis(j)) m = std::max(m, a); }
      double sum = 0; for (int j = 0; j < S; ++j) { P[j] = vis(j) ? std::exp(s[j] - m) : 0; sum += P[j]; }
      for (int j = 0; j < S; ++j) P[j] /= sum;
      const float* dor = &dout[((size_t)(b*HQ+h)*L+i)*DV];
      for (int e = 0; e < DV; ++e) { double a = 0; for (int j = 0; j < S; ++j) a += P[j] * v[((size_t)(b*HKV+hk)*S+j)*DV+e]; ro[((size_t)(b*HQ+h)*L+i)*DV+e] = a; }
      double dl = 0;
      for (int j = 0; j < S; ++j) { double a = 0; for (int e = 0; e < DV; ++e) a += dor[e] * v[((size_t)(b*HKV+hk)*S+j)*DV+e]; dP[j] = a; dl += a * P[j]; }
      for (int j = 0; j < S; ++j) {
        double ds = P[j] * (dP[j] - dl);
        for (int e = 0; e < D; ++e) { rdq[((size_t)(b*HQ+h)*L+i)*D+e] += ds * k[((size_t)(b*HKV+hk)*S+j)*D+e] * scale;
          rdk[((size_t)(b*HKV+hk)*S+j)*D+e] += ds * q[((size_t)(b*HQ+h)*L+i)*D+e] * scale; }
        for (int e = 0; e < DV; ++e) rdv[((size_t)(b*HKV+hk)*S+j)*DV+e] += P[j] * dor[e];
      }
    }
  }
  auto err = [](const std::vector<float>& a, const std::vector<double>& r) { double d = 0, mm = 0; for (size_t i = 0; i < a.size(); ++i) { double x = std::fabs(a[i] - r[i]); if (!(x <= d)) d = x; mm = std::max(mm, std::fabs(r[i])); } return d / std::max(mm, 1e-30); };
  double worst = std::max({err(out, ro), err(dq, rdq), err(dk, rdk), err(dv, rdv)});
  if (!(worst <= 1e-5)) failed = true;
  printf("%s D=%d DV=%d causal=%d window=%d B=%d HQ=%d HKV=%d L=%d S=%d: out %.2e dq %.2e dk %.2e dv %.2e\n", worst <= 1e-5 ? "ok  " : "FAIL", D, DV, CAUSAL, WINDOW, B, HQ, HKV, L, S,
         err(out, ro), err(dq, rdq), err(dk, rdk), err(dv, rdv));
}
int main() {
  run_case<64, 64, true, 0>(1, 4, 2, 70, 70);
  run_case<128, 128, true, 20>(1, 2, 1, 53, 53);
  run_case<64, 64, true, 0>(2, 2, 2, 21, 50);
  run_case<64, 64, false, 0>(1, 3, 1, 19, 41);
  run_case<128, 128, true, 7>(1, 4, 2, 9, 40);
  run_case<16, 8, true, 3>(1, 2, 1, 7, 7);
  run_case<256, 256, true, 0>(1, 2, 1, 20, 20);
  return failed ? 1 : 0;
}
