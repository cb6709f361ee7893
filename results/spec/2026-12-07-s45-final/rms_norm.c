#include <math.h>
#include <stdio.h>
#include <time.h>
// rms_norm of one 576-wide row as cpu::rms_norm writes it (a sequential f32 sum, then the
// scaling by f32 weights), one call timed over N.
int main(){ float x[576],w[576],o[576]; for(int i=0;i<576;i++){x[i]=sinf(i);w[i]=1.f+i*1e-3f;}
 volatile float sink=0; struct timespec t0,t1; int N=200000;
 clock_gettime(CLOCK_MONOTONIC,&t0);
 for(int it=0;it<N;it++){ float ss=0; for(int i=0;i<576;i++) ss+=x[i]*x[i];
   float n=1.f/sqrtf(ss/576.f+1e-5f); for(int i=0;i<576;i++) o[i]=w[i]*(x[i]*n); x[it%576]+=o[7]*1e-9f; sink+=o[3];}
 clock_gettime(CLOCK_MONOTONIC,&t1);
 printf("rms_norm 576: %.0f ns a row\n",((t1.tv_sec-t0.tv_sec)*1e9+(t1.tv_nsec-t0.tv_nsec))/N); return 0;}
