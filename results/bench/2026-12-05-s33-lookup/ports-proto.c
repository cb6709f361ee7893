#include <immintrin.h>
#include <stdio.h>
#include <x86intrin.h>
#define N 100000
#define T(name, body) { unsigned long long best=~0ULL; for(int it=0;it<50;it++){ unsigned long long t0=__rdtsc(); for(int i=0;i<N;i++){ body } unsigned long long d=__rdtsc()-t0; if(d<best)best=d;} printf("%-28s %.3f ticks per instruction\n", name, (double)best/N/8); }
int main(){
  __m512i a0=_mm512_set1_epi32(1),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0, b=_mm512_set1_epi32(3), c=_mm512_set1_epi32(5);
  __m512 f0=_mm512_set1_ps(1),f1=f0,f2=f0,f3=f0,f4=f0,f5=f0,f6=f0,f7=f0, g=_mm512_set1_ps(1.0000001f), h=_mm512_set1_ps(0.9999999f);
  __m512i idx=_mm512_set1_epi32(3);
  for(int rep=0;rep<2;rep++){
  T("vpdpbusd zmm", a0=_mm512_dpbusd_epi32(a0,b,c);a1=_mm512_dpbusd_epi32(a1,b,c);a2=_mm512_dpbusd_epi32(a2,b,c);a3=_mm512_dpbusd_epi32(a3,b,c);a4=_mm512_dpbusd_epi32(a4,b,c);a5=_mm512_dpbusd_epi32(a5,b,c);a6=_mm512_dpbusd_epi32(a6,b,c);a7=_mm512_dpbusd_epi32(a7,b,c);__asm__ volatile(""::"v"(a0),"v"(a1),"v"(a2),"v"(a3),"v"(a4),"v"(a5),"v"(a6),"v"(a7));)
  T("vfmadd zmm", f0=_mm512_fmadd_ps(f0,g,h);f1=_mm512_fmadd_ps(f1,g,h);f2=_mm512_fmadd_ps(f2,g,h);f3=_mm512_fmadd_ps(f3,g,h);f4=_mm512_fmadd_ps(f4,g,h);f5=_mm512_fmadd_ps(f5,g,h);f6=_mm512_fmadd_ps(f6,g,h);f7=_mm512_fmadd_ps(f7,g,h);__asm__ volatile(""::"v"(f0),"v"(f1),"v"(f2),"v"(f3),"v"(f4),"v"(f5),"v"(f6),"v"(f7));)
  T("vpslld zmm", a0=_mm512_slli_epi32(a0,1);a1=_mm512_slli_epi32(a1,1);a2=_mm512_slli_epi32(a2,1);a3=_mm512_slli_epi32(a3,1);a4=_mm512_slli_epi32(a4,1);a5=_mm512_slli_epi32(a5,1);a6=_mm512_slli_epi32(a6,1);a7=_mm512_slli_epi32(a7,1);__asm__ volatile(""::"v"(a0),"v"(a1),"v"(a2),"v"(a3),"v"(a4),"v"(a5),"v"(a6),"v"(a7));)
  T("vcvtdq2ps zmm", f0=_mm512_cvtepi32_ps(a0);f1=_mm512_cvtepi32_ps(a1);f2=_mm512_cvtepi32_ps(a2);f3=_mm512_cvtepi32_ps(a3);f4=_mm512_cvtepi32_ps(a4);f5=_mm512_cvtepi32_ps(a5);f6=_mm512_cvtepi32_ps(a6);f7=_mm512_cvtepi32_ps(a7);__asm__ volatile(""::"v"(f0),"v"(f1),"v"(f2),"v"(f3),"v"(f4),"v"(f5),"v"(f6),"v"(f7));a0=_mm512_add_epi32(a0,b);)
  T("vpermps zmm", f0=_mm512_permutexvar_ps(idx,f0);f1=_mm512_permutexvar_ps(idx,f1);f2=_mm512_permutexvar_ps(idx,f2);f3=_mm512_permutexvar_ps(idx,f3);f4=_mm512_permutexvar_ps(idx,f4);f5=_mm512_permutexvar_ps(idx,f5);f6=_mm512_permutexvar_ps(idx,f6);f7=_mm512_permutexvar_ps(idx,f7);__asm__ volatile(""::"v"(f0),"v"(f1),"v"(f2),"v"(f3),"v"(f4),"v"(f5),"v"(f6),"v"(f7));)
  T("dpbusd+fma mixed (4+4)", a0=_mm512_dpbusd_epi32(a0,b,c);a1=_mm512_dpbusd_epi32(a1,b,c);a2=_mm512_dpbusd_epi32(a2,b,c);a3=_mm512_dpbusd_epi32(a3,b,c);f4=_mm512_fmadd_ps(f4,g,h);f5=_mm512_fmadd_ps(f5,g,h);f6=_mm512_fmadd_ps(f6,g,h);f7=_mm512_fmadd_ps(f7,g,h);__asm__ volatile(""::"v"(a0),"v"(a1),"v"(a2),"v"(a3),"v"(f4),"v"(f5),"v"(f6),"v"(f7));)
  T("dpbusd+vpermps mixed (4+4)", a0=_mm512_dpbusd_epi32(a0,b,c);a1=_mm512_dpbusd_epi32(a1,b,c);a2=_mm512_dpbusd_epi32(a2,b,c);a3=_mm512_dpbusd_epi32(a3,b,c);f4=_mm512_permutexvar_ps(idx,f4);f5=_mm512_permutexvar_ps(idx,f5);f6=_mm512_permutexvar_ps(idx,f6);f7=_mm512_permutexvar_ps(idx,f7);__asm__ volatile(""::"v"(a0),"v"(a1),"v"(a2),"v"(a3),"v"(f4),"v"(f5),"v"(f6),"v"(f7));)
  }
}
