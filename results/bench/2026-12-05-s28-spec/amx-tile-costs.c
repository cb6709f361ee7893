#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <x86intrin.h>
typedef struct { uint8_t palette, start; uint8_t res[14]; uint16_t colsb[16]; uint8_t rows[16]; } __attribute__((packed)) cfg_t;
static uint8_t W[1<<20] __attribute__((aligned(64)));
static uint8_t X[1<<16] __attribute__((aligned(64)));
static int32_t C[1<<16] __attribute__((aligned(64)));
int main(int argc, char**argv){
  long r=syscall(SYS_arch_prctl, 0x1023, 18); printf("prctl %ld\n", r); fflush(stdout);
  int units = 4096; // 16-row x chunk units per iteration
  for (int M=1; M<=8; M++) {
   for (int variant=0; variant<3; variant++){
    cfg_t c __attribute__((aligned(64))); memset(&c,0,sizeof c); c.palette=1;
    int am = variant==1 ? 2*M : M;
    // tmm0,7: B (8 rows x 64B); tmm1,2: A (am rows x 32B); tmm3..6: C (am rows x 64B)
    c.rows[0]=8; c.colsb[0]=64; c.rows[7]=8; c.colsb[7]=64;
    c.rows[1]=am; c.colsb[1]=32; c.rows[2]=am; c.colsb[2]=32;
    for(int t=3;t<7;t++){c.rows[t]=am; c.colsb[t]=64;}
    _tile_loadconfig(&c);
    uint64_t best=~0ull;
    for (int rep=0; rep<20; rep++){
      uint64_t t0=__rdtsc();
      for (int u=0; u<units; u+=2){
        uint8_t* w0 = W + (u%1024)*512; uint8_t* w1 = w0+512;
        _tile_loadd(0, w0, 64);
        _tile_loadd(1, X + (u%32)*1024, 32);
        if (variant!=1) _tile_loadd(2, X + (u%32)*1024+512, 32);
        _tile_zero(3); 
        if (variant!=1) _tile_zero(4);
        _tile_dpbusd(3,1,0);
        if (variant==0) _tile_dpbuud(4,2,0);
        _tile_stored(3, C + (u%64)*256, 64);
        if (variant!=1) _tile_stored(4, C + (u%64)*256+128, 64);
        _tile_loadd(7, w1, 64);
        _tile_loadd(1, X + (u%32)*1024+64, 32);
        if (variant!=1) _tile_loadd(2, X + (u%32)*1024+512+64, 32);
        _tile_zero(5);
        if (variant!=1) _tile_zero(6);
        _tile_dpbusd(5,1,7);
        if (variant==0) _tile_dpbuud(6,2,7);
        _tile_stored(5, C + (u%64)*256+16*64, 64);
        if (variant!=1) _tile_stored(6, C + (u%64)*256+16*64+128, 64);
      }
      uint64_t dt=__rdtsc()-t0; if(dt<best)best=dt;
    }
    _tile_release();
    printf("M=%d variant=%s: %.1f tsc/unit(16 rows x chunk) = %.2f per row-chunk\n", M, variant==0?"2tdp":variant==1?"1tdp-2M":"1tdp-M", (double)best/units, (double)best/units/16); fflush(stdout);
   }
  }
}
