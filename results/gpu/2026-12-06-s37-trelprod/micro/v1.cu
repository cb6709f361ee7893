__device__ __forceinline__ float blk(const u32* w, const float* xs, const float* lut, u32 lane4) {
  constexpr int KB = 3, L = 12, BLOCK = 64, BITS = 192, BW = 6;
  float acc0 = 0.f, acc1 = 0.f;
#pragma unroll
  for (int t = 0; t < BLOCK; ++t) {
    const int start = ((t + 1) * KB + BITS - L) % BITS;
    const int a = start >> 5, off = start & 31;
    u32 sb;
    if (off + L <= 32) { const int sh = 32 - off - L - 5; sb = sh >= 0 ? w[a] >> sh : w[a] << -sh; }
    else sb = __funnelshift_r(w[a + 1 == BW ? 0 : a + 1], w[a], 64 - off - L - 5);
    const u32 q = *(const u32*)((const char*)lut + ((sb & 0x1FF80u) | lane4));
    const u32 v = __byte_perm(q, 0x4B000000u, 0x7650u + ((sb << 25) >> 30));
    const float c = __uint_as_float(v) - 8388736.f;
    if (t & 1) acc1 = fmaf(c, xs[t + (t >> 5)], acc1); else acc0 = fmaf(c, xs[t + (t >> 5)], acc0);
  }
  return acc0 + acc1;
}
