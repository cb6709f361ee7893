// Head-like Q8 rows kernel (x86::rows_int16_512_m's 8-bit path): factor via masked store + broadcast
// load (A, as the tree), via plain store (B), or from a register by permute (C). Timing only.
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>
#define COLS 576
#define CH (COLS/32)
#define MAXT 6
static int ROWS;
static unsigned char *W; static unsigned short *SH, *BH;
static short XQ[MAXT][COLS] __attribute__((aligned(64)));
static float XD[MAXT][CH+16], XS[MAXT][CH+16];
static float *OUT;
#define KERNEL(NAME, MODE) \
__attribute__((always_inline)) static inline void NAME(int r, int MT){ \
  float FP[MAXT*CH+32] __attribute__((aligned(64))); \
  __m512 bacc[MAXT], fr[MAXT][2]; \
  for(int t=0;t<MT;t++) bacc[t]=_mm512_setzero_ps(); \
  for(int c0=0,g=0;c0<CH;c0+=16,g++){ int k=CH-c0<16?CH-c0:16; __mmask16 mask=k==16?0xffff:(1u<<k)-1; \
    __m512 sv=_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask,SH+(size_t)r*CH+c0)); \
    __m512 bv=_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask,BH+(size_t)r*CH+c0)); \
    for(int t=0;t<MT;t++){ __m512 dv=_mm512_maskz_loadu_ps(mask,XD[t]+c0); __m512 f=_mm512_mul_ps(sv,dv); \
      if(MODE==0) _mm512_mask_storeu_ps(FP+t*CH+c0,mask,f); else if(MODE==1) _mm512_storeu_ps(FP+t*CH+c0,f); else fr[t][g]=f; \
      __m512 xs=_mm512_maskz_loadu_ps(mask,XS[t]+c0); bacc[t]=_mm512_fmadd_ps(bv,xs,bacc[t]); } } \
  __m512 a0[MAXT], a1[MAXT]; for(int t=0;t<MT;t++){a0[t]=bacc[t];a1[t]=_mm512_setzero_ps();} \
  const unsigned char* rb=W+(size_t)r*COLS; \
  for(int c=0;c<CH;c++){ __m512i wq=_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(rb+c*32))); \
    for(int t=0;t<MT;t++){ __m512i prod=_mm512_madd_epi16(wq,_mm512_loadu_si512(XQ[t]+c*32)); \
      __m512 f = MODE==2 ? _mm512_permutexvar_ps(_mm512_set1_epi32(c&15), fr[t][c>>4]) : _mm512_set1_ps(FP[t*CH+c]); \
      if(c&1) a1[t]=_mm512_fmadd_ps(_mm512_cvtepi32_ps(prod),f,a1[t]); else a0[t]=_mm512_fmadd_ps(_mm512_cvtepi32_ps(prod),f,a0[t]); } } \
  for(int t=0;t<MT;t++) OUT[(size_t)t*ROWS+r]=_mm512_reduce_add_ps(_mm512_add_ps(a0[t],a1[t])); }
KERNEL(kA,0) KERNEL(kB,1) KERNEL(kC,2)
#define INST(K) \
__attribute__((noinline)) static void K##_1(int n){for(int r=0;r<n;r++)K(r,1);} \
__attribute__((noinline)) static void K##_2(int n){for(int r=0;r<n;r++)K(r,2);} \
__attribute__((noinline)) static void K##_3(int n){for(int r=0;r<n;r++)K(r,3);} \
__attribute__((noinline)) static void K##_4(int n){for(int r=0;r<n;r++)K(r,4);} \
__attribute__((noinline)) static void K##_5(int n){for(int r=0;r<n;r++)K(r,5);} \
__attribute__((noinline)) static void K##_6(int n){for(int r=0;r<n;r++)K(r,6);}
INST(kA) INST(kB) INST(kC)
#define BENCH(fn,MT,n,it) ({ unsigned long long best=~0ULL; for(int i=0;i<it;i++){unsigned long long t0=__rdtsc(); fn##_##MT(n); unsigned long long d=__rdtsc()-t0; if(d<best)best=d;} (double)best/n/CH; })
#define ALL(fn,n,it) {double v[7]; v[1]=BENCH(fn,1,n,it);v[2]=BENCH(fn,2,n,it);v[3]=BENCH(fn,3,n,it);v[4]=BENCH(fn,4,n,it);v[5]=BENCH(fn,5,n,it);v[6]=BENCH(fn,6,n,it); printf("%s rows=%d ticks/chunk-row-pass:",#fn,n); for(int i=1;i<=6;i++)printf(" m%d %.2f",i,v[i]); printf("  extra/first %.2f\n",(v[5]-v[1])/4/v[1]);}
int main(){
  ROWS=49152; W=aligned_alloc(64,(size_t)ROWS*COLS); SH=malloc(ROWS*CH*2); BH=malloc(ROWS*CH*2); OUT=malloc(sizeof(float)*ROWS*MAXT);
  srand(1); for(size_t i=0;i<(size_t)ROWS*COLS;i++)W[i]=rand();
  for(int i=0;i<ROWS*CH;i++){SH[i]=0x3c00+(rand()&0xff);BH[i]=0xbc00+(rand()&0xff);}
  for(int t=0;t<MAXT;t++){for(int i=0;i<COLS;i++)XQ[t][i]=rand()%65536-32768; for(int c=0;c<CH;c++){XD[t][c]=(rand()%1000)/999.0f;XS[t][c]=(rand()%1000)/999.0f;}}
  for(int k=0;k<2;k++){ ALL(kA,64,3000) ALL(kB,64,3000) ALL(kC,64,3000) }
  for(int k=0;k<2;k++){ ALL(kA,49152,5) ALL(kB,49152,5) ALL(kC,49152,5) }
}
