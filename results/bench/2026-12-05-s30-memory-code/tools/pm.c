#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <fcntl.h>
#include <unistd.h>
__attribute__((destructor)) static void pm(void){const char*m=getenv("PM_MATCH");if(!m)return;FILE*f=fopen("/proc/self/maps","r");int fd=open("/proc/self/pagemap",O_RDONLY);char l[1024];
 while(fgets(l,sizeof l,f)){if(!strstr(l,m)||!strstr(l,"r-xp"))continue;unsigned long a,b;sscanf(l,"%lx-%lx",&a,&b);size_t n=(b-a)/4096;uint64_t*e=malloc(n*8);pread(fd,e,n*8,(a/4096)*8);
  size_t pres=0,win=0,winfull=0,hist[17]={0};for(size_t w=0;w<n;w+=16){int c=0;for(size_t i=w;i<w+16&&i<n;i++)if(e[i]>>63&1)c++;pres+=c;if(c){win++;hist[c]++;}}
  fprintf(stderr,"PM %s pages %zu present %zu windows64k touched %zu; hist:",m,n,pres,win);for(int i=1;i<=16;i++)fprintf(stderr," %d:%zu",i,hist[i]);fprintf(stderr,"\n");}
}
