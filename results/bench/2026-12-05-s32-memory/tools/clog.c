#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <fcntl.h>
extern void* __libc_calloc(size_t,size_t);
static int fd=-2;
void* calloc(size_t n,size_t s){void*p=__libc_calloc(n,s);size_t b=n*s;if(b>=100000){if(fd==-2){const char*f=getenv("CLOG");fd=f?open(f,O_WRONLY|O_CREAT|O_TRUNC,0644):-1;}if(fd>=0){char l[64];int k=snprintf(l,64,"%lx %lu\n",(unsigned long)p,(unsigned long)b);write(fd,l,k);}}return p;}
