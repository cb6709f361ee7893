#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <fcntl.h>
#include <unistd.h>
__attribute__((destructor)) static void pm(void){const char*m=getenv("PM_MATCH");const char*o=getenv("PM_OUT");if(!m||!o)return;FILE*f=fopen("/proc/self/maps","r");FILE*out=fopen(o,"w");int fd=open("/proc/self/pagemap",O_RDONLY);char l[1024];
 while(fgets(l,sizeof l,f)){if(!strstr(l,m))continue;unsigned long a,b,off;char perm[8];sscanf(l,"%lx-%lx %7s %lx",&a,&b,perm,&off);size_t n=(b-a)/4096;uint64_t*e=malloc(n*8);pread(fd,e,n*8,(a/4096)*8);
  for(size_t i=0;i<n;i++) if(e[i]>>63&1) fprintf(out,"%s %lx\n",perm,off+i*4096);free(e);}
 fclose(out);}
