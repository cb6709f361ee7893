#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <malloc.h>
#include <string.h>
static char big[1<<22]; static const char* dir;
static void* loop(void*x){for(int i=0;;i++){char f[512];snprintf(f,512,"%s/%04d.smaps",dir,i);int fd=open("/proc/self/smaps",O_RDONLY);if(fd<0)break;size_t n=0;ssize_t k;while(n<sizeof big&&(k=read(fd,big+n,sizeof big-n))>0)n+=k;close(fd);struct mallinfo2 mi=mallinfo2();n+=snprintf(big+n,200,"MALLINFO arena %zu inuse %zu free %zu mmap %zu\n",mi.arena,mi.uordblks,mi.fordblks,mi.hblkhd);int o=open(f,O_WRONLY|O_CREAT|O_TRUNC,0644);write(o,big,n);close(o);usleep(100000);}return 0;}
__attribute__((constructor)) static void st(void){dir=getenv("SNAP_DIR");if(!dir)return;pthread_t th;pthread_attr_t a;pthread_attr_init(&a);pthread_attr_setstacksize(&a,65536);pthread_create(&th,&a,loop,0);pthread_detach(th);}
