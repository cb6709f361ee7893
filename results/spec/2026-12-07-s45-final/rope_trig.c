#include <math.h>
#include <stdio.h>
#include <time.h>
int main(){ float inv[32]; for(int i=0;i<32;i++) inv[i]=powf(10000.f,-2.f*i/64.f);
 float q[12*64]; for(int i=0;i<12*64;i++) q[i]=i*0.001f;
 volatile float sink=0; struct timespec t0,t1; int N=200000;
 clock_gettime(CLOCK_MONOTONIC,&t0);
 for(int it=0;it<N;it++){ float p=(float)(it%300); float cs[32],sn[32];
   for(int i=0;i<32;i++){float th=p*inv[i]; cs[i]=cosf(th); sn[i]=sinf(th);} sink+=cs[3]+sn[5];}
 clock_gettime(CLOCK_MONOTONIC,&t1);
 double trig=((t1.tv_sec-t0.tv_sec)*1e9+(t1.tv_nsec-t0.tv_nsec))/N;
 clock_gettime(CLOCK_MONOTONIC,&t0);
 float cs[32],sn[32]; for(int i=0;i<32;i++){cs[i]=cosf(i);sn[i]=sinf(i);}
 for(int it=0;it<N;it++){ for(int h=0;h<12;h++){float*x=q+h*64; for(int i=0;i<32;i++){float a=x[i],b=x[i+32]; x[i]=a*cs[i]-b*sn[i]; x[i+32]=a*sn[i]+b*cs[i];}} sink+=q[7];}
 clock_gettime(CLOCK_MONOTONIC,&t1);
 double rot=((t1.tv_sec-t0.tv_sec)*1e9+(t1.tv_nsec-t0.tv_nsec))/N;
 printf("trig %.0f ns a call, rotation %.0f ns a call\n",trig,rot); return 0;}
