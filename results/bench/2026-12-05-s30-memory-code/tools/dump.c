#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static void cp(const char* src, const char* dst){FILE*i=fopen(src,"r");FILE*o=fopen(dst,"w");if(!i||!o)return;char b[65536];size_t n;while((n=fread(b,1,sizeof b,i))>0)fwrite(b,1,n,o);fclose(i);fclose(o);}
__attribute__((destructor)) static void dumpit(void){const char*p=getenv("SMAPS_OUT");if(!p)return;char f[512];snprintf(f,sizeof f,"%s.smaps",p);cp("/proc/self/smaps",f);snprintf(f,sizeof f,"%s.status",p);cp("/proc/self/status",f);}
