// #33 session 30, direction A: can AMX int8 tiles give the default 4-bit kernel's bits
// (`x86::dot4_512_s`, int16 inputs split into bytes) for K+1 verify rows at a fraction of the
// per-row cost?  `ref_rows` is dot4_512_s in C (s29's `old_row` generalized to any chunk count
// with dot4_512_s's masks, group 32, float scales/biases).  `amx_rows` computes the same
// per-lane integer sums (8 codes x int16 input = hi byte plane * 256 + lo byte plane) on tiles:
//   B tile  = 16 weight rows x 64 codes: the packed dwords transposed (lane n = weight row n),
//             split into low / high nibbles (B row 2d / 2d+1 = dword d's even / odd codes);
//   A tiles = inputs, block diagonal: A row 8u+s holds input row (2p+u)'s 8 codes of sub s
//             (byte plane hi: tdpbsud, lo: tdpbuud); built once a call, outside the timing;
//   C tile  = row 8u+s = the sub-s sums of one plane for 16 weight rows;
// and then the one-row kernel's float epilogue transposed (vectors over 16 weight rows, one
// accumulator per lane position and quad parity, the same halving reduction), so the bits are
// dot4_512_s's by construction; main() checks them against ref_rows for every output.
// gcc -O2 -march=native -mamx-tile -mamx-int8 amx-subsum-proto.c -o /tmp/spec/amxp
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <x86intrin.h>
#define MAXT 6
typedef struct { uint8_t palette, start; uint8_t res[14]; uint16_t colsb[16]; uint8_t rows[16]; } __attribute__((packed)) cfg_t;

static int R, C, CH, NQ, HS;              // rows, cols, chunks, quads (rounded up), split stride
static uint8_t *W;                          // R x C/2 packed nibbles (byte b: code 2b low, 2b+1 high)
static float *SC, *BI;                      // R x CH
static int16_t *X;                          // MAXT x C
static uint8_t *XH;                         // MAXT x HS split layout (dot4_512_s's qx.h)
static float *XD, *XS;                      // MAXT x CH (input scale, input sum per chunk)
static float *OUTR, *OUTA;                  // MAXT x R
static uint8_t *AB;                         // A tiles: [span][pair][plane] 1 KiB each

static inline __mmask16 mask_of(int k) { return k == 16 ? 0xffff : (__mmask16)((1u << k) - 1); }

__attribute__((always_inline)) static inline void ref_row(int r, int MT) {
  __m512 a0[MAXT], a1[MAXT], f[MAXT];
  for (int t = 0; t < MT; t++) { a0[t] = _mm512_setzero_ps(); a1[t] = _mm512_setzero_ps(); }
  const float *s0 = SC + (size_t)r * CH, *b0 = BI + (size_t)r * CH;
  const uint8_t *rb = W + (size_t)r * (C / 2);
  for (int c0 = 0; c0 < CH; c0 += 16) {
    int k = CH - c0 < 16 ? CH - c0 : 16; __mmask16 m = mask_of(k);
    __m512 bv = _mm512_maskz_loadu_ps(m, b0 + c0);
    for (int t = 0; t < MT; t++) a0[t] = _mm512_fmadd_ps(bv, _mm512_maskz_loadu_ps(m, XS + t * CH + c0), a0[t]);
  }
  __m512i nib = _mm512_set1_epi8(0x0f), zero = _mm512_setzero_si512();
  __m512i quad = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  for (int c0 = 0; c0 < CH; c0 += 16) {
    int k = CH - c0 < 16 ? CH - c0 : 16; __mmask16 m = mask_of(k);
    __m512 sv = _mm512_maskz_loadu_ps(m, s0 + c0);
    for (int t = 0; t < MT; t++) f[t] = _mm512_mul_ps(sv, _mm512_maskz_loadu_ps(m, XD + t * CH + c0));
    for (int j = 0; j < k; j += 4) {
      int c = c0 + j, n = (k - j < 4 ? k - j : 4) * 16;
      __m512i wv = n == 64 ? _mm512_loadu_si512(rb + c * 16) : _mm512_maskz_loadu_epi8((1ULL << n) - 1, rb + c * 16);
      __m512i lo = _mm512_and_si512(wv, nib), hi = _mm512_and_si512(_mm512_srli_epi16(wv, 4), nib);
      __m512i idx = _mm512_add_epi32(quad, _mm512_set1_epi32(j));
      for (int t = 0; t < MT; t++) {
        const uint8_t *xp = XH + t * HS + c / 4 * 256;
        __m512i s = _mm512_dpbusd_epi32(zero, lo, _mm512_loadu_si512(xp));
        s = _mm512_dpbusd_epi32(s, hi, _mm512_loadu_si512(xp + 64));
        s = _mm512_slli_epi32(s, 8);
        s = _mm512_dpbusd_epi32(s, _mm512_loadu_si512(xp + 128), lo);
        s = _mm512_dpbusd_epi32(s, _mm512_loadu_si512(xp + 192), hi);
        __m512 fv = _mm512_permutexvar_ps(idx, f[t]);
        if ((j & 4) == 0) a0[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), fv, a0[t]);
        else a1[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), fv, a1[t]);
      }
    }
  }
  for (int t = 0; t < MT; t++) OUTR[t * R + r] = _mm512_reduce_add_ps(_mm512_add_ps(a0[t], a1[t]));
}
#define REFN(n) __attribute__((noinline)) static void ref_all_##n(void) { for (int r = 0; r < R; r++) { if (r + 4 < R) _mm_prefetch((const char *)(W + (size_t)(r + 4) * (C / 2)), _MM_HINT_T0); ref_row(r, n); } }
REFN(1) REFN(2) REFN(3) REFN(4) REFN(5) REFN(6)
static void (*REF[7])(void) = {0, ref_all_1, ref_all_2, ref_all_3, ref_all_4, ref_all_5, ref_all_6};

// Inputs in the A layout: once a call (outside the timing: it is per input, not per weight).
static void build_a(int MT) {
  int NS = C / 64, NP = (MT + 1) / 2;
  memset(AB, 0, (size_t)NS * 3 * 2 * 1024);
  for (int g = 0; g < NS; g++) for (int p = 0; p < NP; p++) for (int u = 0; u < 2; u++) {
    int t = 2 * p + u; if (t >= MT) continue;
    for (int s = 0; s < 8; s++) for (int i = 0; i < 8; i++) {
      int code = g * 64 + 8 * s + (i < 4 ? 2 * i : 2 * (i - 4) + 1);
      int16_t x = X[t * C + code];
      AB[((size_t)(g * 3 + p) * 2 + 0) * 1024 + (8 * u + s) * 64 + 8 * s + i] = (uint8_t)(x >> 8);   // hi, signed
      AB[((size_t)(g * 3 + p) * 2 + 1) * 1024 + (8 * u + s) * 64 + 8 * s + i] = (uint8_t)(x & 0xff); // lo, unsigned
    }
  }
}

static inline void tload(int r, const void *p) { switch (r) { case 0: _tile_loadd(0, p, 64); break; case 1: _tile_loadd(1, p, 64); break; case 2: _tile_loadd(2, p, 64); break; case 3: _tile_loadd(3, p, 64); break; case 4: _tile_loadd(4, p, 64); break; case 5: _tile_loadd(5, p, 64); break; case 6: _tile_loadd(6, p, 64); break; case 7: _tile_loadd(7, p, 64); break; } }
static inline void tstore(int r, void *p) { switch (r) { case 0: _tile_stored(0, p, 64); break; case 1: _tile_stored(1, p, 64); break; case 2: _tile_stored(2, p, 64); break; case 3: _tile_stored(3, p, 64); break; case 4: _tile_stored(4, p, 64); break; case 5: _tile_stored(5, p, 64); break; case 6: _tile_stored(6, p, 64); break; case 7: _tile_stored(7, p, 64); break; } }
static inline void tzero(int r) { switch (r) { case 0: _tile_zero(0); break; case 1: _tile_zero(1); break; case 2: _tile_zero(2); break; case 3: _tile_zero(3); break; case 4: _tile_zero(4); break; case 5: _tile_zero(5); break; case 6: _tile_zero(6); break; case 7: _tile_zero(7); break; } }
static inline void tdp(int c, int a, int b, int hi) { switch (c * 100 + a * 10 + b) { case 210: if (hi) _tile_dpbsud(2, 1, 0); else _tile_dpbuud(2, 1, 0); break; case 217: if (hi) _tile_dpbsud(2, 1, 7); else _tile_dpbuud(2, 1, 7); break; case 260: if (hi) _tile_dpbsud(2, 6, 0); else _tile_dpbuud(2, 6, 0); break; case 267: if (hi) _tile_dpbsud(2, 6, 7); else _tile_dpbuud(2, 6, 7); break; case 310: if (hi) _tile_dpbsud(3, 1, 0); else _tile_dpbuud(3, 1, 0); break; case 317: if (hi) _tile_dpbsud(3, 1, 7); else _tile_dpbuud(3, 1, 7); break; case 360: if (hi) _tile_dpbsud(3, 6, 0); else _tile_dpbuud(3, 6, 0); break; case 367: if (hi) _tile_dpbsud(3, 6, 7); else _tile_dpbuud(3, 6, 7); break; case 410: if (hi) _tile_dpbsud(4, 1, 0); else _tile_dpbuud(4, 1, 0); break; case 417: if (hi) _tile_dpbsud(4, 1, 7); else _tile_dpbuud(4, 1, 7); break; case 460: if (hi) _tile_dpbsud(4, 6, 0); else _tile_dpbuud(4, 6, 0); break; case 467: if (hi) _tile_dpbsud(4, 6, 7); else _tile_dpbuud(4, 6, 7); break; case 510: if (hi) _tile_dpbsud(5, 1, 0); else _tile_dpbuud(5, 1, 0); break; case 517: if (hi) _tile_dpbsud(5, 1, 7); else _tile_dpbuud(5, 1, 7); break; case 560: if (hi) _tile_dpbsud(5, 6, 0); else _tile_dpbuud(5, 6, 0); break; case 567: if (hi) _tile_dpbsud(5, 6, 7); else _tile_dpbuud(5, 6, 7); break; } }
static _Alignas(64) uint8_t BB[2048];
static int JOB; static int32_t *PEND[4];
static int32_t *CBIG;                      // a block's C tiles, all spans: [span][6][256]
static float *STG, *BTG;                   // scales / biases transposed per 16-row block: [R/16][CH][16]
// (a kernel transposes them per block with 16x16 vector transposes, ~0.25 op a weight row and
// chunk, shared by all input rows; here outside the timing)

__attribute__((always_inline)) static inline void amx_block(int r0, int MT) {
  int NS = C / 64, NP = (MT + 1) / 2;
  const float *ST = STG + (size_t)(r0 / 16) * CH * 16, *BT = BTG + (size_t)(r0 / 16) * CH * 16;
  __m512i nib = _mm512_set1_epi8(0x0f);
  const __m512i ilo = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0), ihi = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
  for (int g = 0; g < NS; g++) {
    __m512i v[8], t8[8], u8[8];
    for (int i = 0; i < 8; i++) {
      const uint8_t *p0 = W + (size_t)(r0 + i) * (C / 2) + g * 32, *p1 = W + (size_t)(r0 + i + 8) * (C / 2) + g * 32;
      v[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p0)), _mm256_loadu_si256((const __m256i *)p1), 1);
      if (g == 0 && r0 + 16 < R) { _mm_prefetch((const char *)(p0 + 16 * (C / 2)), _MM_HINT_T0); _mm_prefetch((const char *)(p1 + 16 * (C / 2)), _MM_HINT_T0); }
    }
    for (int i = 0; i < 4; i++) { t8[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]); t8[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]); }
    u8[0] = _mm512_unpacklo_epi64(t8[0], t8[2]); u8[1] = _mm512_unpackhi_epi64(t8[0], t8[2]);
    u8[2] = _mm512_unpacklo_epi64(t8[1], t8[3]); u8[3] = _mm512_unpackhi_epi64(t8[1], t8[3]);
    u8[4] = _mm512_unpacklo_epi64(t8[4], t8[6]); u8[5] = _mm512_unpackhi_epi64(t8[4], t8[6]);
    u8[6] = _mm512_unpacklo_epi64(t8[5], t8[7]); u8[7] = _mm512_unpackhi_epi64(t8[5], t8[7]);
    for (int d = 0; d < 4; d++) {
      __m512i a = _mm512_permutex2var_epi64(u8[d], ilo, u8[d + 4]);
      __m512i b = _mm512_permutex2var_epi64(u8[d], ihi, u8[d + 4]);
      _mm512_store_si512(BB + (g & 1) * 1024 + (2 * d) * 64, _mm512_and_si512(a, nib));
      _mm512_store_si512(BB + (g & 1) * 1024 + (2 * d + 1) * 64, _mm512_and_si512(_mm512_srli_epi16(a, 4), nib));
      _mm512_store_si512(BB + (g & 1) * 1024 + (2 * d + 8) * 64, _mm512_and_si512(b, nib));
      _mm512_store_si512(BB + (g & 1) * 1024 + (2 * d + 9) * 64, _mm512_and_si512(_mm512_srli_epi16(b, 4), nib));
    }
    const uint8_t *ab = AB + (size_t)g * 3 * 2 * 1024;
    int32_t *cb = CBIG + (size_t)g * 6 * 256;
    // one tile product a (pair, plane); registers rotate (B 0/7 by span, A 1/6, C 2-5), and
    // each C is stored two products later, so no product waits for a store or an A reload
    // for the product just before it.
    int breg = (g & 1) ? 7 : 0;
    tload(breg, BB + (g & 1) * 1024);
    for (int p = 0; p < NP; p++) for (int pl = 0; pl < 2; pl++) {
      int j = JOB++, a = (j & 1) ? 6 : 1, c = 2 + (j & 3);
      if (PEND[j & 3]) { tstore(c, PEND[j & 3]); PEND[j & 3] = 0; }
      tload(a, ab + (p * 2 + pl) * 1024);
      tzero(c);
      tdp(c, a, breg, pl == 0);
      PEND[j & 3] = cb + (2 * p + pl) * 256;
    }
  }
  for (int q = 0; q < 4; q++) if (PEND[(JOB + q) & 3]) { tstore(2 + ((JOB + q) & 3), PEND[(JOB + q) & 3]); PEND[(JOB + q) & 3] = 0; }
  for (int t = 0; t < MT; t++) {
    __m512 acc[2][16];
    for (int l = 0; l < 16; l++) { acc[0][l] = _mm512_setzero_ps(); acc[1][l] = _mm512_setzero_ps(); }
    for (int c0 = 0; c0 < CH; c0 += 16) for (int l = 0; l < 16 && c0 + l < CH; l++)
      acc[0][l] = _mm512_fmadd_ps(_mm512_load_ps(BT + (c0 + l) * 16), _mm512_set1_ps(XS[t * CH + c0 + l]), acc[0][l]);
    const float *xd = XD + t * CH;
    int co = (2 * (t / 2)) * 256 + (8 * (t & 1)) * 16;
    for (int par = 0; par < 2; par++) for (int h = 0; h < 2; h++) {
      __m512 a0 = acc[par][8 * h + 0], a1 = acc[par][8 * h + 1], a2 = acc[par][8 * h + 2], a3 = acc[par][8 * h + 3];
      __m512 a4 = acc[par][8 * h + 4], a5 = acc[par][8 * h + 5], a6 = acc[par][8 * h + 6], a7 = acc[par][8 * h + 7];
      for (int g = 2 * par + h; g < NS; g += 4) {
        const int32_t *ch = CBIG + (size_t)g * 6 * 256 + co, *cl = ch + 256;
        __m512 f0 = _mm512_mul_ps(_mm512_load_ps(ST + (2 * g) * 16), _mm512_set1_ps(xd[2 * g]));
        __m512 f1 = _mm512_mul_ps(_mm512_load_ps(ST + (2 * g + 1) * 16), _mm512_set1_ps(xd[2 * g + 1]));
#define SUB(s, A, F) { __m512i S = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(ch + s * 16), 8), _mm512_load_si512(cl + s * 16)); A = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S), F, A); }
        SUB(0, a0, f0) SUB(1, a1, f0) SUB(2, a2, f0) SUB(3, a3, f0) SUB(4, a4, f1) SUB(5, a5, f1) SUB(6, a6, f1) SUB(7, a7, f1)
      }
      acc[par][8 * h + 0] = a0; acc[par][8 * h + 1] = a1; acc[par][8 * h + 2] = a2; acc[par][8 * h + 3] = a3;
      acc[par][8 * h + 4] = a4; acc[par][8 * h + 5] = a5; acc[par][8 * h + 6] = a6; acc[par][8 * h + 7] = a7;
    }
    __m512 w[16];
    for (int l = 0; l < 16; l++) w[l] = _mm512_add_ps(acc[0][l], acc[1][l]);
    for (int l = 0; l < 8; l++) w[l] = _mm512_add_ps(w[l + 8], w[l]);
    for (int l = 0; l < 4; l++) w[l] = _mm512_add_ps(w[l + 4], w[l]);
    for (int l = 0; l < 2; l++) w[l] = _mm512_add_ps(w[l], w[l + 2]);
    _mm512_storeu_ps(OUTA + t * R + r0, _mm512_add_ps(w[0], w[1]));
  }
}
#define AMXN(n) __attribute__((noinline)) static void amx_all_##n(void) { for (int r = 0; r < R; r += 16) amx_block(r, n); }
AMXN(1) AMXN(2) AMXN(3) AMXN(4) AMXN(5) AMXN(6)
static void (*AMX[7])(void) = {0, amx_all_1, amx_all_2, amx_all_3, amx_all_4, amx_all_5, amx_all_6};
// The same arithmetic, software-pipelined: span g's tile products run on the tile unit while
// the vector units do span g-1's epilogue (accumulators in memory, 32 vectors an input row).
static _Alignas(64) int32_t CS[2][6 * 256];
__attribute__((always_inline)) static inline void amx_block_p(int r0, int MT) {
  int NS = C / 64, NP = (MT + 1) / 2;
  const float *ST = STG + (size_t)(r0 / 16) * CH * 16, *BT = BTG + (size_t)(r0 / 16) * CH * 16;
  __m512 accm[MAXT][2][16];
  for (int t = 0; t < MT; t++) {
    for (int l = 0; l < 16; l++) { accm[t][0][l] = _mm512_setzero_ps(); accm[t][1][l] = _mm512_setzero_ps(); }
    for (int c0 = 0; c0 < CH; c0 += 16) for (int l = 0; l < 16 && c0 + l < CH; l++)
      accm[t][0][l] = _mm512_fmadd_ps(_mm512_load_ps(BT + (c0 + l) * 16), _mm512_set1_ps(XS[t * CH + c0 + l]), accm[t][0][l]);
  }
  __m512i nib = _mm512_set1_epi8(0x0f);
  const __m512i ilo = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0), ihi = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
  for (int g = 0; g <= NS; g++) {
    if (g < NS) {
      __m512i v[8], t8[8], u8[8];
      for (int i = 0; i < 8; i++) {
        const uint8_t *p0 = W + (size_t)(r0 + i) * (C / 2) + g * 32, *p1 = W + (size_t)(r0 + i + 8) * (C / 2) + g * 32;
        v[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p0)), _mm256_loadu_si256((const __m256i *)p1), 1);
        if (g == 0 && r0 + 16 < R) { _mm_prefetch((const char *)(p0 + 16 * (C / 2)), _MM_HINT_T0); _mm_prefetch((const char *)(p1 + 16 * (C / 2)), _MM_HINT_T0); }
      }
      for (int i = 0; i < 4; i++) { t8[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]); t8[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]); }
      u8[0] = _mm512_unpacklo_epi64(t8[0], t8[2]); u8[1] = _mm512_unpackhi_epi64(t8[0], t8[2]);
      u8[2] = _mm512_unpacklo_epi64(t8[1], t8[3]); u8[3] = _mm512_unpackhi_epi64(t8[1], t8[3]);
      u8[4] = _mm512_unpacklo_epi64(t8[4], t8[6]); u8[5] = _mm512_unpackhi_epi64(t8[4], t8[6]);
      u8[6] = _mm512_unpacklo_epi64(t8[5], t8[7]); u8[7] = _mm512_unpackhi_epi64(t8[5], t8[7]);
      uint8_t *bb = BB + (g & 1) * 1024;
      for (int d = 0; d < 4; d++) {
        __m512i a = _mm512_permutex2var_epi64(u8[d], ilo, u8[d + 4]);
        __m512i b = _mm512_permutex2var_epi64(u8[d], ihi, u8[d + 4]);
        _mm512_store_si512(bb + (2 * d) * 64, _mm512_and_si512(a, nib));
        _mm512_store_si512(bb + (2 * d + 1) * 64, _mm512_and_si512(_mm512_srli_epi16(a, 4), nib));
        _mm512_store_si512(bb + (2 * d + 8) * 64, _mm512_and_si512(b, nib));
        _mm512_store_si512(bb + (2 * d + 9) * 64, _mm512_and_si512(_mm512_srli_epi16(b, 4), nib));
      }
    }
    if (g > 0) {  // span g-1's sums out of the tiles
      int32_t *cs = CS[(g - 1) & 1];
      _tile_stored(2, cs, 64); _tile_stored(3, cs + 256, 64);
      if (NP > 1) { _tile_stored(4, cs + 512, 64); _tile_stored(5, cs + 768, 64); }
      if (NP > 2) { _tile_stored(6, cs + 1024, 64); _tile_stored(7, cs + 1280, 64); }
    }
    if (g < NS) {  // span g's products (tile unit, asynchronous to what follows)
      const uint8_t *ab = AB + (size_t)g * 3 * 2 * 1024;
      _tile_loadd(0, BB + (g & 1) * 1024, 64);
      _tile_loadd(1, ab, 64); _tile_zero(2); _tile_dpbsud(2, 1, 0);
      if (NP == 1) { _tile_loadd(6, ab + 1024, 64); _tile_zero(3); _tile_dpbuud(3, 6, 0); }
      else if (NP == 2) {
        _tile_loadd(6, ab + 1024, 64); _tile_zero(3); _tile_dpbuud(3, 6, 0);
        _tile_loadd(7, ab + 2048, 64); _tile_zero(4); _tile_dpbsud(4, 7, 0);
        _tile_loadd(1, ab + 3072, 64); _tile_zero(5); _tile_dpbuud(5, 1, 0);
      } else {
        _tile_loadd(1, ab + 1024, 64); _tile_zero(3); _tile_dpbuud(3, 1, 0);
        _tile_loadd(1, ab + 2048, 64); _tile_zero(4); _tile_dpbsud(4, 1, 0);
        _tile_loadd(1, ab + 3072, 64); _tile_zero(5); _tile_dpbuud(5, 1, 0);
        _tile_loadd(1, ab + 4096, 64); _tile_zero(6); _tile_dpbsud(6, 1, 0);
        _tile_loadd(1, ab + 5120, 64); _tile_zero(7); _tile_dpbuud(7, 1, 0);
      }
    }
    if (g > 0) {  // span g-1's epilogue (vector units)
      int h = g - 1, par = (h / 2) & 1, lb = 8 * (h & 1);
      const int32_t *cs = CS[h & 1];
      for (int t = 0; t < MT; t++) {
        const int32_t *ch = cs + (2 * (t / 2)) * 256 + (8 * (t & 1)) * 16, *cl = ch + 256;
        const float *xd = XD + t * CH;
        __m512 f0 = _mm512_mul_ps(_mm512_load_ps(ST + (2 * h) * 16), _mm512_set1_ps(xd[2 * h]));
        __m512 f1 = _mm512_mul_ps(_mm512_load_ps(ST + (2 * h + 1) * 16), _mm512_set1_ps(xd[2 * h + 1]));
        __m512 *A = accm[t][par] + lb;
#define SUBM(s, F) { __m512i S = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(ch + s * 16), 8), _mm512_load_si512(cl + s * 16)); A[s] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S), F, A[s]); }
        SUBM(0, f0) SUBM(1, f0) SUBM(2, f0) SUBM(3, f0) SUBM(4, f1) SUBM(5, f1) SUBM(6, f1) SUBM(7, f1)
      }
    }
  }
  for (int t = 0; t < MT; t++) {
    __m512 w[16];
    for (int l = 0; l < 16; l++) w[l] = _mm512_add_ps(accm[t][0][l], accm[t][1][l]);
    for (int l = 0; l < 8; l++) w[l] = _mm512_add_ps(w[l + 8], w[l]);
    for (int l = 0; l < 4; l++) w[l] = _mm512_add_ps(w[l + 4], w[l]);
    for (int l = 0; l < 2; l++) w[l] = _mm512_add_ps(w[l], w[l + 2]);
    _mm512_storeu_ps(OUTA + t * R + r0, _mm512_add_ps(w[0], w[1]));
  }
}
#define AMXPN(n) __attribute__((noinline)) static void amxp_all_##n(void) { for (int r = 0; r < R; r += 16) amx_block_p(r, n); }
AMXPN(1) AMXPN(2) AMXPN(3) AMXPN(4) AMXPN(5) AMXPN(6)
static void (*AMXP[7])(void) = {0, amxp_all_1, amxp_all_2, amxp_all_3, amxp_all_4, amxp_all_5, amxp_all_6};


static double best(void (*fn)(void), int iters) {
  unsigned long long b = ~0ULL;
  for (int it = 0; it < iters; it++) { unsigned long long t0 = __rdtsc(); fn(); unsigned long long d = __rdtsc() - t0; if (d < b) b = d; }
  return (double)b;
}
static float frand(void) { return (rand() % 20001 - 10000) / 10000.0f; }

int main(int argc, char **argv) {
  R = atoi(argv[1]); C = atoi(argv[2]); int iters = argc > 3 ? atoi(argv[3]) : 50;
  CH = C / 32; NQ = (CH + 3) / 4; HS = NQ * 256;
  if (syscall(SYS_arch_prctl, 0x1023, 18)) { printf("no AMX permission\n"); return 1; }
  W = aligned_alloc(64, (size_t)R * C / 2); SC = malloc(sizeof(float) * R * CH); BI = malloc(sizeof(float) * R * CH);
  X = malloc(2 * MAXT * C); XH = aligned_alloc(64, MAXT * HS); XD = malloc(4 * MAXT * CH); XS = malloc(4 * MAXT * CH);
  OUTR = malloc(4 * MAXT * R); CBIG = aligned_alloc(64, (size_t)(C / 64) * 6 * 1024); STG = aligned_alloc(64, 4 * (size_t)R * CH); BTG = aligned_alloc(64, 4 * (size_t)R * CH); OUTA = malloc(4 * MAXT * R); AB = aligned_alloc(64, (size_t)(C / 64) * 6 * 1024);
  srand(7);
  for (size_t i = 0; i < (size_t)R * C / 2; i++) W[i] = rand();
  for (size_t i = 0; i < (size_t)R * CH; i++) { SC[i] = frand() * 0.02f; BI[i] = frand() * 0.1f; }
  for (int t = 0; t < MAXT; t++) {
    for (int i = 0; i < C; i++) X[t * C + i] = (int16_t)(rand() % 65535 - 32767);
    for (int c = 0; c < CH; c++) { XD[t * CH + c] = frand() * 0.001f; XS[t * CH + c] = frand() * 3.0f; }
  }
  for (int r = 0; r < R; r++) for (int c = 0; c < CH; c++) { STG[((size_t)(r / 16) * CH + c) * 16 + r % 16] = SC[(size_t)r * CH + c]; BTG[((size_t)(r / 16) * CH + c) * 16 + r % 16] = BI[(size_t)r * CH + c]; }
  // a few extreme codes
  X[0] = 32767; X[1] = -32767; X[C + 5] = -32767;
  memset(XH, 0, MAXT * HS);
  for (int t = 0; t < MAXT; t++) for (int c = 0; c < CH; c++) {
    int base = c / 4 * 256 + c % 4 * 16;
    for (int j = 0; j < 16; j++) {
      int16_t e = X[t * C + c * 32 + 2 * j], o = X[t * C + c * 32 + 2 * j + 1];
      XH[t * HS + base + j] = (uint8_t)(e >> 8); XH[t * HS + base + 64 + j] = (uint8_t)(o >> 8);
      XH[t * HS + base + 128 + j] = (uint8_t)e; XH[t * HS + base + 192 + j] = (uint8_t)o;
    }
  }
  cfg_t cfg __attribute__((aligned(64))); memset(&cfg, 0, sizeof cfg); cfg.palette = 1;
  for (int i = 0; i < 8; i++) { cfg.colsb[i] = 64; cfg.rows[i] = 16; }
  _tile_loadconfig(&cfg);
  int ok = 1;
  for (int m = 1; m <= 6; m++) {
    build_a(m); REF[m](); AMX[m]();
    { float *keep = OUTA; static float *o2; if (!o2) o2 = malloc(4 * MAXT * R); OUTA = o2; AMXP[m](); if (memcmp(OUTR, OUTA, 4 * m * R)) { ok = 0; printf("pipelined m %d differs\n", m); } OUTA = keep; }
    if (memcmp(OUTR, OUTA, 4 * m * R)) { ok = 0; for (int i = 0; i < m * R; i++) if (OUTR[i] != OUTA[i]) { printf("m %d: first difference at %d: %.9g vs %.9g\n", m, i, OUTR[i], OUTA[i]); break; } }
    // also: each row's bits equal the one-row call's
    float one[MAXT * 1]; (void)one;
  }
  build_a(1); REF[1](); memcpy(OUTA, OUTR, 4 * R); build_a(6); REF[6]();
  int rows_alone = !memcmp(OUTA, OUTR, 4 * R);
  printf("shape %d x %d: amx and amx-pipe bits = dot4_512_s bits for m 1..6: %s; ref row 0 of m=6 = its m=1 bits: %s\n", R, C, ok ? "yes" : "NO", rows_alone ? "yes" : "NO");
  double ref[7], amx[7], amxp[7];
  for (int round = 0; round < 3; round++) {
    for (int m = 1; m <= 6; m++) { build_a(m); ref[m] = best(REF[m], iters); amx[m] = best(AMX[m], iters); amxp[m] = best(AMXP[m], iters); }
    printf("round %d ticks/call (in VNNI m=1 units)  ", round);
    for (int m = 1; m <= 6; m++) printf(" m%d vnni %.0f (%.2f) amx %.0f (%.2f) amx-pipe %.0f (%.2f) |", m, ref[m], ref[m] / ref[1], amx[m], amx[m] / ref[1], amxp[m], amxp[m] / ref[1]);
    printf("\n  extra row (m1->m5)/4 in VNNI m=1 units: vnni %.3f amx %.3f amx-pipe %.3f\n", (ref[5] - ref[1]) / 4 / ref[1], (amx[5] - amx[1]) / 4 / ref[1], (amxp[5] - amxp[1]) / 4 / ref[1]);
    fflush(stdout);
  }
  _tile_release();
  return 0;
}
