#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>
static FILE* out; static struct timespec t0;
static void* loop(void*x){char buf[4096];long last=-1;for(;;){FILE*f=fopen("/proc/self/status","r");if(!f)break;size_t n=fread(buf,1,sizeof buf-1,f);fclose(f);buf[n]=0;
 long anon=0,file=0;char*p=strstr(buf,"RssAnon:");if(p)anon=atol(p+8);p=strstr(buf,"RssFile:");if(p)file=atol(p+8);
 long tot=anon+file; if(labs(tot-last)>=64){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);double s=(t.tv_sec-t0.tv_sec)+(t.tv_nsec-t0.tv_nsec)/1e9;fprintf(out,"%.3f %ld %ld %ld\n",s,tot,anon,file);fflush(out);last=tot;}
 usleep(1000);}return 0;}
__attribute__((constructor)) static void st(void){const char*p=getenv("SAMP_OUT");if(!p)return;out=fopen(p,"w");clock_gettime(CLOCK_MONOTONIC,&t0);pthread_t th;pthread_create(&th,0,loop,0);pthread_detach(th);}
