// #33 session 30: attention scores with positions in the lanes, bit-identical to
// `x86::attend_part_g`'s (one position at a time: per head two 8-lane accumulators a0/a1 over
// the dimensions d+i (a0: d = 0, 16, 32, 48; a1: d = 8, 24, 40, 56), then
// hsum(a0 + a1) * scale with hsum = (v[i] + v[i+4]), then pairs (0,2),(1,3), then (0,1)).
// `scores_t`: 16 positions a vector; the float16 keys transposed per 16 positions (4 16x16
// 16-bit transposes, widened), shared by the G heads and the M query rows; each head's 16
// lane partial sums become 16 vector accumulators, the same FMAs in the same order, the
// tree vertical. Checks every score against `scores_ref`, times both (scores only; the
// exponentials and the values are unchanged and are not in either).
// gcc -O2 -march=native attn-scores-proto.c -o /tmp/spec/attn && /tmp/spec/attn 231
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>
#define HD 64
#define G 3
#define MAXM 6
static uint16_t *K;          // n x HD float16
static float Q[MAXM][G][HD];
static float *SR, *ST;       // [m][G][n]
static int N;

static inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
static inline __m256 load8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

__attribute__((always_inline)) static inline void scores_ref(int M, float scale) {
  for (int t = 0; t < M; t++)        // one pool item a row, as the kernel is called a row
    for (int j = 0; j < N; j++) {
      const uint16_t *kp = K + (size_t)j * HD;
      __m256 a0[G], a1[G];
      for (int h = 0; h < G; h++) { a0[h] = _mm256_setzero_ps(); a1[h] = _mm256_setzero_ps(); }
      for (int d = 0; d + 16 <= HD; d += 16) {
        __m256 k0 = load8(kp + d), k1 = load8(kp + d + 8);
        for (int h = 0; h < G; h++) {
          a0[h] = _mm256_fmadd_ps(_mm256_loadu_ps(Q[t][h] + d), k0, a0[h]);
          a1[h] = _mm256_fmadd_ps(_mm256_loadu_ps(Q[t][h] + d + 8), k1, a1[h]);
        }
      }
      for (int h = 0; h < G; h++) SR[((size_t)t * G + h) * N + j] = hsum(_mm256_add_ps(a0[h], a1[h])) * scale;
    }
}

// 16 rows of 16 halves (ymm) -> 16 columns: out[c] = halves c of rows 0..15 (lane r = row r).
static inline void tr16x16(__m256i r[16]) {
  __m256i t[16], u[16];
  for (int i = 0; i < 8; i++) { t[2 * i] = _mm256_unpacklo_epi16(r[2 * i], r[2 * i + 1]); t[2 * i + 1] = _mm256_unpackhi_epi16(r[2 * i], r[2 * i + 1]); }
  for (int i = 0; i < 4; i++) for (int k = 0; k < 2; k++) {
    u[4 * i + 2 * k] = _mm256_unpacklo_epi32(t[4 * i + k], t[4 * i + 2 + k]);
    u[4 * i + 2 * k + 1] = _mm256_unpackhi_epi32(t[4 * i + k], t[4 * i + 2 + k]);
  }
  for (int i = 0; i < 2; i++) for (int k = 0; k < 4; k++) {
    t[8 * i + 2 * k] = _mm256_unpacklo_epi64(u[8 * i + k], u[8 * i + 4 + k]);
    t[8 * i + 2 * k + 1] = _mm256_unpackhi_epi64(u[8 * i + k], u[8 * i + 4 + k]);
  }
  for (int k = 0; k < 8; k++) {
    r[k] = _mm256_permute2x128_si256(t[k], t[8 + k], 0x20);
    r[8 + k] = _mm256_permute2x128_si256(t[k], t[8 + k], 0x31);
  }
}
static int COLMAP[16];   // which r[] holds column c after tr16x16 (found once, checked)

__attribute__((always_inline)) static inline void scores_t(int M, float scale) {
  static __m512 KT[HD];
  for (int p0 = 0; p0 < N; p0 += 16) {
    int c = N - p0 < 16 ? N - p0 : 16;
    for (int blk = 0; blk < HD / 16; blk++) {
      __m256i r[16];
      for (int i = 0; i < 16; i++) r[i] = i < c ? _mm256_loadu_si256((const __m256i *)(K + (size_t)(p0 + i) * HD + blk * 16)) : _mm256_setzero_si256();
      tr16x16(r);
      for (int d = 0; d < 16; d++) KT[blk * 16 + d] = _mm512_cvtph_ps(r[COLMAP[d]]);
    }
    for (int t = 0; t < M; t++) for (int h = 0; h < G; h++) {
      const float *q = Q[t][h];
      __m512 a0[8], a1[8];
      for (int i = 0; i < 8; i++) { a0[i] = _mm512_setzero_ps(); a1[i] = _mm512_setzero_ps(); }
      // the same FMAs from zero as the kernel (a multiply would differ in the sign of a zero)
      for (int d = 0; d < HD; d += 16)
        for (int i = 0; i < 8; i++) {
          a0[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[d + i]), KT[d + i], a0[i]);
          a1[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 8 + i]), KT[d + 8 + i], a1[i]);
        }
      __m512 s[8];
      for (int i = 0; i < 8; i++) s[i] = _mm512_add_ps(a0[i], a1[i]);
      for (int i = 0; i < 4; i++) s[i] = _mm512_add_ps(s[i], s[i + 4]);
      for (int i = 0; i < 2; i++) s[i] = _mm512_add_ps(s[i], s[i + 2]);
      __m512 v = _mm512_mul_ps(_mm512_add_ps(s[0], s[1]), _mm512_set1_ps(scale));
      _mm512_mask_storeu_ps(ST + ((size_t)t * G + h) * N + p0, (__mmask16)((1u << c) - 1), v);
    }
  }
}
#define FN(n) __attribute__((noinline)) static void ref_##n(void) { scores_ref(n, 0.125f); } \
              __attribute__((noinline)) static void tr_##n(void) { scores_t(n, 0.125f); }
FN(1) FN(2) FN(3) FN(4) FN(5) FN(6)
static void (*REF[7])(void) = {0, ref_1, ref_2, ref_3, ref_4, ref_5, ref_6};
static void (*TR[7])(void) = {0, tr_1, tr_2, tr_3, tr_4, tr_5, tr_6};
static double best(void (*fn)(void), int it) { unsigned long long b = ~0ULL; for (int i = 0; i < it; i++) { unsigned long long t0 = __rdtsc(); fn(); unsigned long long d = __rdtsc() - t0; if (d < b) b = d; } return (double)b; }

int main(int argc, char **argv) {
  N = argc > 1 ? atoi(argv[1]) : 231;
  K = aligned_alloc(64, (size_t)(N + 16) * HD * 2);
  SR = malloc(4 * (size_t)MAXM * G * N); ST = malloc(4 * (size_t)MAXM * G * N);
  srand(3);
  for (size_t i = 0; i < (size_t)N * HD; i++) K[i] = _cvtss_sh(((rand() % 20001) - 10000) / 2500.0f, 0);
  for (int t = 0; t < MAXM; t++) for (int h = 0; h < G; h++) for (int d = 0; d < HD; d++) Q[t][h][d] = ((rand() % 20001) - 10000) / 3000.0f;
  { // find the column map of tr16x16
    __m256i r[16]; uint16_t b[16][16];
    for (int i = 0; i < 16; i++) { for (int c = 0; c < 16; c++) b[i][c] = i * 16 + c; r[i] = _mm256_loadu_si256((const __m256i *)b[i]); }
    tr16x16(r);
    for (int c = 0; c < 16; c++) { COLMAP[c] = -1; for (int k = 0; k < 16; k++) { uint16_t o[16]; _mm256_storeu_si256((__m256i *)o, r[k]); int ok = 1; for (int i = 0; i < 16; i++) ok &= o[i] == i * 16 + c; if (ok) COLMAP[c] = k; } if (COLMAP[c] < 0) { printf("transpose broken at column %d\n", c); return 1; } }
  }
  int ok = 1;
  for (int m = 1; m <= MAXM; m++) { REF[m](); TR[m](); if (memcmp(SR, ST, 4 * (size_t)m * G * N)) { ok = 0; printf("m %d differs\n", m); } }
  printf("%d positions, %d heads of %d: transposed scores = attend_part_g's bits for 1..%d rows: %s\n", N, G, HD, MAXM, ok ? "yes" : "NO");
  for (int round = 0; round < 3; round++) {
    double r[7], t[7];
    for (int m = 1; m <= MAXM; m++) { r[m] = best(REF[m], 200); t[m] = best(TR[m], 200); }
    printf("round %d ticks (in one-row ref units):", round);
    for (int m = 1; m <= MAXM; m++) printf(" m%d ref %.0f (%.2f) tr %.0f (%.2f) |", m, r[m], r[m] / r[1], t[m], t[m] / r[1]);
    printf("\n");
  }
  return 0;
}
