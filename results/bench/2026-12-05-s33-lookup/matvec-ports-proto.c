// Prototype: per quad-row cost of dot4_512_s's int16-split arithmetic vs a vpdpwssd form
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>
#define COLS 512
#define CH (COLS/32)
#define ROWS 64
#define MAXT 6
static unsigned char W[ROWS][COLS/2] __attribute__((aligned(64)));
static float S[ROWS][CH], B[ROWS][CH];
static unsigned char XH[MAXT][CH/4*256] __attribute__((aligned(64)));
static short XW[MAXT][COLS] __attribute__((aligned(64)));
static float XD[MAXT][CH], XS[MAXT][CH], XDE[MAXT][CH*4] __attribute__((aligned(64)));
static float OUT[MAXT][ROWS];

static __m512i SHL8;
static float VB[MAXT][16][16] __attribute__((aligned(64)));
__attribute__((always_inline)) static inline void old_row(int r, int MT){
  __m512 a0[MAXT], a1[MAXT], f[MAXT];
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++){a0[t]=_mm512_setzero_ps();a1[t]=_mm512_setzero_ps();}
  __m512 bv=_mm512_loadu_ps(B[r]);
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) a0[t]=_mm512_fmadd_ps(bv,_mm512_loadu_ps(XS[t]),a0[t]);
  __m512 sv=_mm512_loadu_ps(S[r]);
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) f[t]=_mm512_mul_ps(sv,_mm512_loadu_ps(XD[t]));
  __m512i nib=_mm512_set1_epi8(0x0f), zero=_mm512_setzero_si512();
  __m512i quad=_mm512_set_epi32(3,3,3,3,2,2,2,2,1,1,1,1,0,0,0,0);
  _Pragma("GCC unroll 4") for(int j=0;j<16;j+=4){
    __m512i wv=_mm512_loadu_si512(W[r]+j*16);
    __m512i lo=_mm512_and_si512(wv,nib), hi=_mm512_and_si512(_mm512_srli_epi16(wv,4),nib);
    __m512i idx=_mm512_add_epi32(quad,_mm512_set1_epi32(j));
    _Pragma("GCC unroll 8") for(int t=0;t<MT;t++){
      const unsigned char*xp=XH[t]+j/4*256;
      __m512i s=_mm512_dpbusd_epi32(zero,lo,_mm512_loadu_si512(xp));
      s=_mm512_dpbusd_epi32(s,hi,_mm512_loadu_si512(xp+64));
      s=_mm512_slli_epi32(s,8);
      s=_mm512_dpbusd_epi32(s,_mm512_loadu_si512(xp+128),lo);
      s=_mm512_dpbusd_epi32(s,_mm512_loadu_si512(xp+192),hi);
      __m512 fv=_mm512_permutexvar_ps(idx,f[t]);
      if((j&4)==0) a0[t]=_mm512_fmadd_ps(_mm512_cvtepi32_ps(s),fv,a0[t]);
      else a1[t]=_mm512_fmadd_ps(_mm512_cvtepi32_ps(s),fv,a1[t]);
    }
  }
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) OUT[t][r]=_mm512_reduce_add_ps(_mm512_add_ps(a0[t],a1[t]));
}
__attribute__((always_inline)) static inline void vst_row(int r, int MT){
  __m512 a0[MAXT], a1[MAXT], f[MAXT];
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++){a0[t]=_mm512_setzero_ps();a1[t]=_mm512_setzero_ps();}
  __m512 bv=_mm512_loadu_ps(B[r]);
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) a0[t]=_mm512_fmadd_ps(bv,_mm512_loadu_ps(XS[t]),a0[t]);
  __m512 sv=_mm512_loadu_ps(S[r]);
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) f[t]=_mm512_mul_ps(sv,_mm512_loadu_ps(XD[t]));
  __m512i nib=_mm512_set1_epi8(0x0f), zero=_mm512_setzero_si512();
  __m512i quad=_mm512_set_epi32(3,3,3,3,2,2,2,2,1,1,1,1,0,0,0,0);
  _Pragma("GCC unroll 4") for(int j=0;j<16;j+=4){
    __m512i wv=_mm512_loadu_si512(W[r]+j*16);
    __m512i lo=_mm512_and_si512(wv,nib), hi=_mm512_and_si512(_mm512_srli_epi16(wv,4),nib);
    __m512i idx=_mm512_add_epi32(quad,_mm512_set1_epi32(j));
    _Pragma("GCC unroll 8") for(int t=0;t<MT;t++){
      const unsigned char*xp=XH[t]+j/4*256;
      __m512i s=_mm512_dpbusd_epi32(zero,lo,_mm512_loadu_si512(xp));
      s=_mm512_dpbusd_epi32(s,hi,_mm512_loadu_si512(xp+64));
      s=_mm512_slli_epi32(s,8);
      s=_mm512_dpbusd_epi32(s,_mm512_loadu_si512(xp+128),lo);
      s=_mm512_dpbusd_epi32(s,_mm512_loadu_si512(xp+192),hi);
      __m512 fv=_mm512_permutexvar_ps(idx,f[t]);
      if((j&4)==0) a0[t]=_mm512_fmadd_ps(_mm512_cvtepi32_ps(s),fv,a0[t]);
      else a1[t]=_mm512_fmadd_ps(_mm512_cvtepi32_ps(s),fv,a1[t]);
    }
  }
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) _mm512_store_ps(VB[t][r&15],_mm512_add_ps(a0[t],a1[t]));
}
__attribute__((always_inline)) static inline void shuf_row(int r, int MT){
  __m512 a0[MAXT], a1[MAXT], f[MAXT];
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++){a0[t]=_mm512_setzero_ps();a1[t]=_mm512_setzero_ps();}
  __m512 bv=_mm512_loadu_ps(B[r]);
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) a0[t]=_mm512_fmadd_ps(bv,_mm512_loadu_ps(XS[t]),a0[t]);
  __m512 sv=_mm512_loadu_ps(S[r]);
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) f[t]=_mm512_mul_ps(sv,_mm512_loadu_ps(XD[t]));
  __m512i nib=_mm512_set1_epi8(0x0f), zero=_mm512_setzero_si512();
  __m512i quad=_mm512_set_epi32(3,3,3,3,2,2,2,2,1,1,1,1,0,0,0,0);
  _Pragma("GCC unroll 4") for(int j=0;j<16;j+=4){
    __m512i wv=_mm512_loadu_si512(W[r]+j*16);
    __m512i lo=_mm512_and_si512(wv,nib), hi=_mm512_and_si512(_mm512_srli_epi16(wv,4),nib);
    __m512i idx=_mm512_add_epi32(quad,_mm512_set1_epi32(j));
    _Pragma("GCC unroll 8") for(int t=0;t<MT;t++){
      const unsigned char*xp=XH[t]+j/4*256;
      __m512i s=_mm512_dpbusd_epi32(zero,lo,_mm512_loadu_si512(xp));
      s=_mm512_dpbusd_epi32(s,hi,_mm512_loadu_si512(xp+64));
      s=_mm512_shuffle_epi8(s,SHL8);
      s=_mm512_dpbusd_epi32(s,_mm512_loadu_si512(xp+128),lo);
      s=_mm512_dpbusd_epi32(s,_mm512_loadu_si512(xp+192),hi);
      __m512 fv=_mm512_permutexvar_ps(idx,f[t]);
      if((j&4)==0) a0[t]=_mm512_fmadd_ps(_mm512_cvtepi32_ps(s),fv,a0[t]);
      else a1[t]=_mm512_fmadd_ps(_mm512_cvtepi32_ps(s),fv,a1[t]);
    }
  }
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) OUT[t][r]=_mm512_reduce_add_ps(_mm512_add_ps(a0[t],a1[t]));
}
__attribute__((always_inline)) static inline void bc_row(int r, int MT){
  __m512 a0[MAXT], a1[MAXT], f[MAXT];
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++){a0[t]=_mm512_setzero_ps();a1[t]=_mm512_setzero_ps();}
  __m512 bv=_mm512_loadu_ps(B[r]);
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) a0[t]=_mm512_fmadd_ps(bv,_mm512_loadu_ps(XS[t]),a0[t]);
  __m512 sv=_mm512_loadu_ps(S[r]);
  float FD[MAXT][16] __attribute__((aligned(64))); _Pragma("GCC unroll 8") for(int t=0;t<MT;t++){ f[t]=_mm512_mul_ps(sv,_mm512_loadu_ps(XD[t])); _mm512_store_ps(FD[t],f[t]);}
  __m512i nib=_mm512_set1_epi8(0x0f), zero=_mm512_setzero_si512();
  __m512i quad=_mm512_set_epi32(3,3,3,3,2,2,2,2,1,1,1,1,0,0,0,0);
  _Pragma("GCC unroll 4") for(int j=0;j<16;j+=4){
    __m512i wv=_mm512_loadu_si512(W[r]+j*16);
    __m512i lo=_mm512_and_si512(wv,nib), hi=_mm512_and_si512(_mm512_srli_epi16(wv,4),nib);
    __m512i idx=_mm512_add_epi32(quad,_mm512_set1_epi32(j));
    _Pragma("GCC unroll 8") for(int t=0;t<MT;t++){
      const unsigned char*xp=XH[t]+j/4*256;
      __m512i s=_mm512_dpbusd_epi32(zero,lo,_mm512_loadu_si512(xp));
      s=_mm512_dpbusd_epi32(s,hi,_mm512_loadu_si512(xp+64));
      s=_mm512_slli_epi32(s,8);
      s=_mm512_dpbusd_epi32(s,_mm512_loadu_si512(xp+128),lo);
      s=_mm512_dpbusd_epi32(s,_mm512_loadu_si512(xp+192),hi);
      __m512 fv=_mm512_broadcast_f32x4(_mm_load_ps(FD[t]+j));
      if((j&4)==0) a0[t]=_mm512_fmadd_ps(_mm512_cvtepi32_ps(s),fv,a0[t]);
      else a1[t]=_mm512_fmadd_ps(_mm512_cvtepi32_ps(s),fv,a1[t]);
    }
  }
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) OUT[t][r]=_mm512_reduce_add_ps(_mm512_add_ps(a0[t],a1[t]));
}
__attribute__((always_inline)) static inline void nosh_row(int r, int MT){
  __m512 a0[MAXT], a1[MAXT], f[MAXT];
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++){a0[t]=_mm512_setzero_ps();a1[t]=_mm512_setzero_ps();}
  __m512 bv=_mm512_loadu_ps(B[r]);
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) a0[t]=_mm512_fmadd_ps(bv,_mm512_loadu_ps(XS[t]),a0[t]);
  __m512 sv=_mm512_loadu_ps(S[r]);
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) f[t]=_mm512_mul_ps(sv,_mm512_loadu_ps(XD[t]));
  __m512i nib=_mm512_set1_epi8(0x0f), zero=_mm512_setzero_si512();
  __m512i quad=_mm512_set_epi32(3,3,3,3,2,2,2,2,1,1,1,1,0,0,0,0);
  _Pragma("GCC unroll 4") for(int j=0;j<16;j+=4){
    __m512i wv=_mm512_loadu_si512(W[r]+j*16);
    __m512i lo=_mm512_and_si512(wv,nib), hi=_mm512_and_si512(_mm512_srli_epi16(wv,4),nib);
    __m512i idx=_mm512_add_epi32(quad,_mm512_set1_epi32(j));
    _Pragma("GCC unroll 8") for(int t=0;t<MT;t++){
      const unsigned char*xp=XH[t]+j/4*256;
      __m512i s=_mm512_dpbusd_epi32(zero,lo,_mm512_loadu_si512(xp));
      s=_mm512_dpbusd_epi32(s,hi,_mm512_loadu_si512(xp+64));
      
      s=_mm512_dpbusd_epi32(s,_mm512_loadu_si512(xp+128),lo);
      s=_mm512_dpbusd_epi32(s,_mm512_loadu_si512(xp+192),hi);
      __m512 fv=_mm512_permutexvar_ps(idx,f[t]);
      if((j&4)==0) a0[t]=_mm512_fmadd_ps(_mm512_cvtepi32_ps(s),fv,a0[t]);
      else a1[t]=_mm512_fmadd_ps(_mm512_cvtepi32_ps(s),fv,a1[t]);
    }
  }
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) OUT[t][r]=_mm512_reduce_add_ps(_mm512_add_ps(a0[t],a1[t]));
}
__attribute__((always_inline)) static inline void nop_row(int r, int MT){
  __m512 a0[MAXT], a1[MAXT], f[MAXT];
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++){a0[t]=_mm512_setzero_ps();a1[t]=_mm512_setzero_ps();}
  __m512 bv=_mm512_loadu_ps(B[r]);
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) a0[t]=_mm512_fmadd_ps(bv,_mm512_loadu_ps(XS[t]),a0[t]);
  __m512 sv=_mm512_loadu_ps(S[r]);
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) f[t]=_mm512_mul_ps(sv,_mm512_loadu_ps(XD[t]));
  __m512i nib=_mm512_set1_epi8(0x0f), zero=_mm512_setzero_si512();
  __m512i quad=_mm512_set_epi32(3,3,3,3,2,2,2,2,1,1,1,1,0,0,0,0);
  _Pragma("GCC unroll 4") for(int j=0;j<16;j+=4){
    __m512i wv=_mm512_loadu_si512(W[r]+j*16);
    __m512i lo=_mm512_and_si512(wv,nib), hi=_mm512_and_si512(_mm512_srli_epi16(wv,4),nib);
    __m512i idx=_mm512_add_epi32(quad,_mm512_set1_epi32(j));
    _Pragma("GCC unroll 8") for(int t=0;t<MT;t++){
      const unsigned char*xp=XH[t]+j/4*256;
      __m512i s=_mm512_dpbusd_epi32(zero,lo,_mm512_loadu_si512(xp));
      s=_mm512_dpbusd_epi32(s,hi,_mm512_loadu_si512(xp+64));
      s=_mm512_slli_epi32(s,8);
      s=_mm512_dpbusd_epi32(s,_mm512_loadu_si512(xp+128),lo);
      s=_mm512_dpbusd_epi32(s,_mm512_loadu_si512(xp+192),hi);
      __m512 fv=f[t];
      if((j&4)==0) a0[t]=_mm512_fmadd_ps(_mm512_cvtepi32_ps(s),fv,a0[t]);
      else a1[t]=_mm512_fmadd_ps(_mm512_cvtepi32_ps(s),fv,a1[t]);
    }
  }
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) OUT[t][r]=_mm512_reduce_add_ps(_mm512_add_ps(a0[t],a1[t]));
}
static __m512i IDX[4];
__attribute__((always_inline)) static inline void new_row(int r, int MT){
  __m512 a0[MAXT], a1[MAXT];
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++){a0[t]=_mm512_setzero_ps();a1[t]=_mm512_setzero_ps();}
  __m512 bv=_mm512_loadu_ps(B[r]);
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) a0[t]=_mm512_fmadd_ps(bv,_mm512_loadu_ps(XS[t]),a0[t]);
  __m512 sv=_mm512_loadu_ps(S[r]);
  __m512i nib=_mm512_set1_epi8(0x0f), zero=_mm512_setzero_si512();
  __m512i quad=_mm512_set_epi32(3,3,3,3,2,2,2,2,1,1,1,1,0,0,0,0);
  __mmask64 m=0x5555555555555555ULL;
  _Pragma("GCC unroll 4") for(int j=0;j<16;j+=4){
    __m512i wv=_mm512_loadu_si512(W[r]+j*16);
    __m512i lo=_mm512_and_si512(wv,nib), hi=_mm512_and_si512(_mm512_srli_epi16(wv,4),nib);
    __m512i w0=_mm512_maskz_permutex2var_epi8(m,lo,IDX[0],hi);
    __m512i w1=_mm512_maskz_permutex2var_epi8(m,lo,IDX[1],hi);
    __m512i w2=_mm512_maskz_permutex2var_epi8(m,lo,IDX[2],hi);
    __m512i w3=_mm512_maskz_permutex2var_epi8(m,lo,IDX[3],hi);
    __m512 svp=_mm512_permutexvar_ps(_mm512_add_epi32(quad,_mm512_set1_epi32(j)),sv);
    _Pragma("GCC unroll 8") for(int t=0;t<MT;t++){
      const short*xp=XW[t]+j*32;
      __m512i s=_mm512_dpwssd_epi32(zero,w0,_mm512_loadu_si512(xp));
      s=_mm512_dpwssd_epi32(s,w1,_mm512_loadu_si512(xp+32));
      s=_mm512_dpwssd_epi32(s,w2,_mm512_loadu_si512(xp+64));
      s=_mm512_dpwssd_epi32(s,w3,_mm512_loadu_si512(xp+96));
      __m512 fv=_mm512_mul_ps(svp,_mm512_loadu_ps(XDE[t]+j*4));
      if((j&4)==0) a0[t]=_mm512_fmadd_ps(_mm512_cvtepi32_ps(s),fv,a0[t]);
      else a1[t]=_mm512_fmadd_ps(_mm512_cvtepi32_ps(s),fv,a1[t]);
    }
  }
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) OUT[t][r]=_mm512_reduce_add_ps(_mm512_add_ps(a0[t],a1[t]));
}
__attribute__((always_inline)) static inline void new2_row(int r, int MT){
  __m512 a0[MAXT], a1[MAXT], f[MAXT];
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++){a0[t]=_mm512_setzero_ps();a1[t]=_mm512_setzero_ps();}
  __m512 bv=_mm512_loadu_ps(B[r]);
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) a0[t]=_mm512_fmadd_ps(bv,_mm512_loadu_ps(XS[t]),a0[t]);
  __m512 sv=_mm512_loadu_ps(S[r]);
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) f[t]=_mm512_mul_ps(sv,_mm512_loadu_ps(XD[t]));
  __m512i nib=_mm512_set1_epi8(0x0f), zero=_mm512_setzero_si512();
  __m512i quad=_mm512_set_epi32(3,3,3,3,2,2,2,2,1,1,1,1,0,0,0,0);
  __mmask64 m=0x5555555555555555ULL;
  _Pragma("GCC unroll 4") for(int j=0;j<16;j+=4){
    __m512i wv=_mm512_loadu_si512(W[r]+j*16);
    __m512i lo=_mm512_and_si512(wv,nib), hi=_mm512_and_si512(_mm512_srli_epi16(wv,4),nib);
    __m512i w0=_mm512_maskz_permutex2var_epi8(m,lo,IDX[0],hi);
    __m512i w1=_mm512_maskz_permutex2var_epi8(m,lo,IDX[1],hi);
    __m512i w2=_mm512_maskz_permutex2var_epi8(m,lo,IDX[2],hi);
    __m512i w3=_mm512_maskz_permutex2var_epi8(m,lo,IDX[3],hi);
    __m512i idx=_mm512_add_epi32(quad,_mm512_set1_epi32(j));
    _Pragma("GCC unroll 8") for(int t=0;t<MT;t++){
      const short*xp=XW[t]+j*32;
      __m512i s=_mm512_dpwssd_epi32(zero,w0,_mm512_loadu_si512(xp));
      s=_mm512_dpwssd_epi32(s,w1,_mm512_loadu_si512(xp+32));
      s=_mm512_dpwssd_epi32(s,w2,_mm512_loadu_si512(xp+64));
      s=_mm512_dpwssd_epi32(s,w3,_mm512_loadu_si512(xp+96));
      __m512 fv=_mm512_permutexvar_ps(idx,f[t]);
      if((j&4)==0) a0[t]=_mm512_fmadd_ps(_mm512_cvtepi32_ps(s),fv,a0[t]);
      else a1[t]=_mm512_fmadd_ps(_mm512_cvtepi32_ps(s),fv,a1[t]);
    }
  }
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) OUT[t][r]=_mm512_reduce_add_ps(_mm512_add_ps(a0[t],a1[t]));
}
__attribute__((always_inline)) static inline void oldb_row(int r, int MT){
  __m512 a0[MAXT], a1[MAXT], f[MAXT];
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++){a0[t]=_mm512_setzero_ps();a1[t]=_mm512_setzero_ps();}
  __m512 bv=_mm512_loadu_ps(B[r]);
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) a0[t]=_mm512_fmadd_ps(bv,_mm512_loadu_ps(XS[t]),a0[t]);
  __m512 sv=_mm512_loadu_ps(S[r]);
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) f[t]=_mm512_mul_ps(sv,_mm512_loadu_ps(XD[t]));
  __m512i nib=_mm512_set1_epi8(0x0f), zero=_mm512_setzero_si512();
  __m512i quad=_mm512_set_epi32(3,3,3,3,2,2,2,2,1,1,1,1,0,0,0,0);
  _Pragma("GCC unroll 4") for(int j=0;j<16;j+=4){
    __m512i wv=_mm512_loadu_si512(W[r]+j*16);
    __m512i lo=_mm512_and_si512(wv,nib), hi=_mm512_and_si512(_mm512_srli_epi16(wv,4),nib);
    __m512i idx=_mm512_add_epi32(quad,_mm512_set1_epi32(j));
    _Pragma("GCC unroll 8") for(int t=0;t<MT;t++){
      const unsigned char*xp=XH[t]+j/4*256;
      __m512i sh=_mm512_dpbusd_epi32(zero,lo,_mm512_loadu_si512(xp));
      sh=_mm512_dpbusd_epi32(sh,hi,_mm512_loadu_si512(xp+64));
      __m512i sl=_mm512_dpbusd_epi32(zero,_mm512_loadu_si512(xp+128),lo);
      sl=_mm512_dpbusd_epi32(sl,_mm512_loadu_si512(xp+192),hi);
      __m512i s=_mm512_add_epi32(_mm512_slli_epi32(sh,8),sl);
      __m512 fv=_mm512_permutexvar_ps(idx,f[t]);
      if((j&4)==0) a0[t]=_mm512_fmadd_ps(_mm512_cvtepi32_ps(s),fv,a0[t]);
      else a1[t]=_mm512_fmadd_ps(_mm512_cvtepi32_ps(s),fv,a1[t]);
    }
  }
  _Pragma("GCC unroll 8") for(int t=0;t<MT;t++) OUT[t][r]=_mm512_reduce_add_ps(_mm512_add_ps(a0[t],a1[t]));
}
__attribute__((noinline)) static void old_row_1(int r){ old_row(r,1); }
__attribute__((noinline)) static void old_row_2(int r){ old_row(r,2); }
__attribute__((noinline)) static void old_row_3(int r){ old_row(r,3); }
__attribute__((noinline)) static void old_row_4(int r){ old_row(r,4); }
__attribute__((noinline)) static void old_row_5(int r){ old_row(r,5); }
__attribute__((noinline)) static void old_row_6(int r){ old_row(r,6); }
__attribute__((noinline)) static void oldb_row_1(int r){ oldb_row(r,1); }
__attribute__((noinline)) static void oldb_row_2(int r){ oldb_row(r,2); }
__attribute__((noinline)) static void oldb_row_3(int r){ oldb_row(r,3); }
__attribute__((noinline)) static void oldb_row_4(int r){ oldb_row(r,4); }
__attribute__((noinline)) static void oldb_row_5(int r){ oldb_row(r,5); }
__attribute__((noinline)) static void oldb_row_6(int r){ oldb_row(r,6); }
__attribute__((noinline)) static void new_row_1(int r){ new_row(r,1); }
__attribute__((noinline)) static void new_row_2(int r){ new_row(r,2); }
__attribute__((noinline)) static void new_row_3(int r){ new_row(r,3); }
__attribute__((noinline)) static void new_row_4(int r){ new_row(r,4); }
__attribute__((noinline)) static void new_row_5(int r){ new_row(r,5); }
__attribute__((noinline)) static void new_row_6(int r){ new_row(r,6); }
__attribute__((noinline)) static void new2_row_1(int r){ new2_row(r,1); }
__attribute__((noinline)) static void new2_row_2(int r){ new2_row(r,2); }
__attribute__((noinline)) static void new2_row_3(int r){ new2_row(r,3); }
__attribute__((noinline)) static void new2_row_4(int r){ new2_row(r,4); }
__attribute__((noinline)) static void new2_row_5(int r){ new2_row(r,5); }
__attribute__((noinline)) static void new2_row_6(int r){ new2_row(r,6); }
__attribute__((noinline)) static void bc_row_1(int r){ bc_row(r,1); }
__attribute__((noinline)) static void bc_row_2(int r){ bc_row(r,2); }
__attribute__((noinline)) static void bc_row_3(int r){ bc_row(r,3); }
__attribute__((noinline)) static void bc_row_4(int r){ bc_row(r,4); }
__attribute__((noinline)) static void bc_row_5(int r){ bc_row(r,5); }
__attribute__((noinline)) static void bc_row_6(int r){ bc_row(r,6); }
__attribute__((noinline)) static void nosh_row_1(int r){ nosh_row(r,1); }
__attribute__((noinline)) static void nosh_row_2(int r){ nosh_row(r,2); }
__attribute__((noinline)) static void nosh_row_3(int r){ nosh_row(r,3); }
__attribute__((noinline)) static void nosh_row_4(int r){ nosh_row(r,4); }
__attribute__((noinline)) static void nosh_row_5(int r){ nosh_row(r,5); }
__attribute__((noinline)) static void nosh_row_6(int r){ nosh_row(r,6); }
__attribute__((noinline)) static void nop_row_1(int r){ nop_row(r,1); }
__attribute__((noinline)) static void nop_row_2(int r){ nop_row(r,2); }
__attribute__((noinline)) static void nop_row_3(int r){ nop_row(r,3); }
__attribute__((noinline)) static void nop_row_4(int r){ nop_row(r,4); }
__attribute__((noinline)) static void nop_row_5(int r){ nop_row(r,5); }
__attribute__((noinline)) static void nop_row_6(int r){ nop_row(r,6); }
__attribute__((noinline)) static void shuf_row_1(int r){ shuf_row(r,1); }
__attribute__((noinline)) static void shuf_row_2(int r){ shuf_row(r,2); }
__attribute__((noinline)) static void shuf_row_3(int r){ shuf_row(r,3); }
__attribute__((noinline)) static void shuf_row_4(int r){ shuf_row(r,4); }
__attribute__((noinline)) static void shuf_row_5(int r){ shuf_row(r,5); }
__attribute__((noinline)) static void shuf_row_6(int r){ shuf_row(r,6); }
__attribute__((noinline)) static void vst_row_1(int r){ vst_row(r,1); }
__attribute__((noinline)) static void vst_row_2(int r){ vst_row(r,2); }
__attribute__((noinline)) static void vst_row_3(int r){ vst_row(r,3); }
__attribute__((noinline)) static void vst_row_4(int r){ vst_row(r,4); }
__attribute__((noinline)) static void vst_row_5(int r){ vst_row(r,5); }
__attribute__((noinline)) static void vst_row_6(int r){ vst_row(r,6); }
#define BENCH(fn,MT) ({ unsigned long long best=~0ULL; for(int it=0;it<300;it++){unsigned long long t0=__rdtsc(); for(int r=0;r<ROWS;r++) fn##_##MT(r); unsigned long long d=__rdtsc()-t0; if(d<best)best=d;} (double)best/ROWS/4; })
#define ALL(fn) {double v[7]; v[1]=BENCH(fn,1);v[2]=BENCH(fn,2);v[3]=BENCH(fn,3);v[4]=BENCH(fn,4);v[5]=BENCH(fn,5);v[6]=BENCH(fn,6); printf("%s ticks/quad-row-pass:",#fn); for(int i=1;i<=6;i++)printf(" m%d %.1f",i,v[i]); printf("\n");}
int main(){
  srand(1);
  for(int r=0;r<ROWS;r++){for(int i=0;i<COLS/2;i++)W[r][i]=rand();for(int c=0;c<CH;c++){S[r][c]=(rand()%1000)/999.0f;B[r][c]=(rand()%1000)/999.0f;}}
  for(int t=0;t<MAXT;t++){for(int i=0;i<COLS;i++)XW[t][i]=(short)(rand()%65536-32768);
    for(int c=0;c<CH;c++){XD[t][c]=(rand()%1000)/999.0f;XS[t][c]=(rand()%1000)/999.0f;}}
  // split layout
  for(int t=0;t<MAXT;t++){ short*x=XW[t]; unsigned char*h=XH[t];
    for(int c=0;c<CH;c++){int base=c/4*256+c%4*16; for(int j=0;j<16;j++){short e=x[c*32+2*j],o=x[c*32+2*j+1]; h[base+j]=(unsigned char)(e>>8); h[base+64+j]=(unsigned char)(o>>8); h[base+128+j]=(unsigned char)e; h[base+192+j]=(unsigned char)o;}}}
  // new layout: per quad (128 codes) X_i words (2l,2l+1) = x[8l+2i], x[8l+2i+1]
  static short XN[MAXT][COLS];
  for(int t=0;t<MAXT;t++) for(int q=0;q<COLS/128;q++) for(int i=0;i<4;i++) for(int l=0;l<16;l++){XN[t][q*128+i*32+2*l]=XW[t][q*128+8*l+2*i]; XN[t][q*128+i*32+2*l+1]=XW[t][q*128+8*l+2*i+1];}
  for(int t=0;t<MAXT;t++) for(int c=0;c<CH;c++) for(int k=0;k<4;k++) XDE[t][c*4+k]=XD[t][c];
  // idx: out byte 4l -> lo[4l+i]; out byte 4l+2 -> 64 + hi[4l+i]
  for(int i=0;i<4;i++){unsigned char b[64]; for(int l=0;l<16;l++){b[4*l]=4*l+i;b[4*l+1]=0;b[4*l+2]=64+4*l+i;b[4*l+3]=0;} IDX[i]=_mm512_loadu_si512(b);}
  { signed char b[64]; for(int i=0;i<64;i++){int k=i%4; b[i]= k==0? (signed char)0x80 : (signed char)(((i%16)/4)*4 + k-1);} SHL8=_mm512_loadu_si512(b);}
  float ref[MAXT][ROWS];
  for(int r=0;r<ROWS;r++) old_row(r,6); memcpy(ref,OUT,sizeof ref);
  memcpy(XW,XN,sizeof XN);
  for(int r=0;r<ROWS;r++) new_row(r,6);
  int same=!memcmp(ref,OUT,sizeof ref); printf("bit-identical: %s (%g vs %g)\n", same?"yes":"NO", ref[2][5], OUT[2][5]);
  for(int r=0;r<ROWS;r++) new2_row(r,6);
  printf("new2 bit-identical: %s\n", !memcmp(ref,OUT,sizeof ref)?"yes":"NO");
  for(int r=0;r<ROWS;r++) shuf_row(r,6);
  printf("shuf bit-identical: %s\n", !memcmp(ref,OUT,sizeof ref)?"yes":"NO");
  for(int r=0;r<ROWS;r++) oldb_row(r,6);
  printf("oldb bit-identical: %s\n", !memcmp(ref,OUT,sizeof ref)?"yes":"NO");
  for(int k=0;k<4;k++){ ALL(old_row) ALL(vst_row) }
}
