#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <fcntl.h>
#include <unistd.h>
#include <link.h>
static uintptr_t bias;
static int cb(struct dl_phdr_info *i, size_t s, void *d){ if(i->dlpi_name&&i->dlpi_name[0])return 0; bias=i->dlpi_addr; return 1; }
__attribute__((destructor)) static void pm(void){const char*m=getenv("PMR_MATCH"),*o=getenv("PMR_OUT");if(!m||!o)return;dl_iterate_phdr(cb,0);FILE*f=fopen("/proc/self/maps","r");FILE*out=fopen(o,"w");int fd=open("/proc/self/pagemap",O_RDONLY);char l[1024];
 while(fgets(l,sizeof l,f)){if(!strstr(l,m))continue;unsigned long a,b;char perm[8];sscanf(l,"%lx-%lx %7s",&a,&b,perm);size_t n=(b-a)/4096;uint64_t*e=malloc(n*8);pread(fd,e,n*8,(a/4096)*8);
  for(size_t i=0;i<n;i++)if(e[i]>>63&1)fprintf(out,"%s %lx\n",perm,a+i*4096-bias);free(e);}
 fclose(out);}
