/* Throughput of pairs of independent 512-bit ops on this machine (session 44): 16 ops an
   iteration on 16 registers, cycles per pair at 0.266 ns a cycle (a dependent scalar add, 3.76
   GHz). gcc -O2 -mavx512f -o port_mix port_mix.c && ./port_mix. Output at 04:37 UTC:
   dpbusd+dpbusd 0.94, dpbusd+cvt 0.55, dpbusd+permps 0.76, dpbusd+fma 0.95, dpbusd+slld 0.53,
   dpbusd+mulps 0.93, dpbusd+paddd 0.52, fma+cvt 0.53, fma+permps 0.75, cvt+permps 0.67,
   dpbusd+load 1.06, load+load 2.11, dpbusd(mem)+dpbusd(mem) 2.10, dpwssd+dpbusd 0.94,
   pmaddwd+dpbusd 0.94: vpdpbusd, vpdpwssd, vpmaddwd, vfmadd and vmulps share two ports;
   512-bit loads issue one a cycle. */
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define N 20000000L
#define MIX(name,a,b) { double t=now(); for(long i=0;i<N;i++){__asm__ volatile( \
 a "%%zmm8\n" b "%%zmm9\n" a "%%zmm10\n" b "%%zmm11\n" a "%%zmm12\n" b "%%zmm13\n" a "%%zmm14\n" b "%%zmm15\n" \
 a "%%zmm16\n" b "%%zmm17\n" a "%%zmm18\n" b "%%zmm19\n" a "%%zmm20\n" b "%%zmm21\n" a "%%zmm22\n" b "%%zmm23\n" \
 :::"xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","xmm16","xmm17","xmm18","xmm19","xmm20","xmm21","xmm22","xmm23");} t=now()-t; printf("%-28s %.3f cycles per pair\n",name,t/N/8*1e9/0.266);}
int main(){
 MIX("dpbusd+dpbusd","vpdpbusd %%zmm1,%%zmm2,","vpdpbusd %%zmm1,%%zmm2,")
 MIX("dpbusd+cvt","vpdpbusd %%zmm1,%%zmm2,","vcvtdq2ps %%zmm1,")
 MIX("dpbusd+permps","vpdpbusd %%zmm1,%%zmm2,","vpermps %%zmm1,%%zmm2,")
 MIX("dpbusd+fma","vpdpbusd %%zmm1,%%zmm2,","vfmadd231ps %%zmm1,%%zmm2,")
 MIX("dpbusd+slld","vpdpbusd %%zmm1,%%zmm2,","vpslld $8,%%zmm1,")
 MIX("dpbusd+mulps","vpdpbusd %%zmm1,%%zmm2,","vmulps %%zmm1,%%zmm2,")
 MIX("dpbusd+paddd","vpdpbusd %%zmm1,%%zmm2,","vpaddd %%zmm1,%%zmm2,")
 MIX("fma+cvt","vfmadd231ps %%zmm1,%%zmm2,","vcvtdq2ps %%zmm1,")
 MIX("fma+permps","vfmadd231ps %%zmm1,%%zmm2,","vpermps %%zmm1,%%zmm2,")
 MIX("cvt+permps","vcvtdq2ps %%zmm1,","vpermps %%zmm1,%%zmm2,")
 MIX("dpbusd+load","vpdpbusd %%zmm1,%%zmm2,","vmovdqu64 (%%rsp),")
 MIX("load+load","vmovdqu64 (%%rsp),","vmovdqu64 64(%%rsp),")
 MIX("dpbusd mem + dpbusd mem","vpdpbusd (%%rsp),%%zmm2,","vpdpbusd 64(%%rsp),%%zmm2,")
 MIX("dpwssd+dpbusd","vpdpwssd %%zmm1,%%zmm2,","vpdpbusd %%zmm1,%%zmm2,")
 MIX("pmaddwd+dpbusd","vpmaddwd %%zmm1,%%zmm2,","vpdpbusd %%zmm1,%%zmm2,")
}
