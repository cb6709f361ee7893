/* freeze MIN_KIB OUT -- cmd args...: runs cmd; polls its RSS every 200 us; at each new maximum
   (>= 64 KiB above the last) over MIN_KIB, stops it (SIGSTOP), copies /proc/PID/smaps to OUT and
   /proc/PID/status to OUT.status, and lets it go on (SIGCONT). The last copy is the peak. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <fcntl.h>
static char big[1<<23];
static long rss(pid_t p){char f[64],b[256];snprintf(f,64,"/proc/%d/statm",p);int fd=open(f,O_RDONLY);if(fd<0)return -1;int n=read(fd,b,255);close(fd);if(n<=0)return -1;b[n]=0;char*q=strchr(b,' ');return q?atol(q+1)*4:-1;}
static void cp(pid_t p,const char*what,const char*out){char f[64];snprintf(f,64,"/proc/%d/%s",p,what);int fd=open(f,O_RDONLY);if(fd<0)return;size_t n=0;ssize_t k;while(n<sizeof big&&(k=read(fd,big+n,sizeof big-n))>0)n+=k;close(fd);int o=open(out,O_WRONLY|O_CREAT|O_TRUNC,0644);write(o,big,n);close(o);}
int main(int c,char**v){long min=atol(v[1]);const char*out=v[2];char outs[600];snprintf(outs,600,"%s.status",out);
 pid_t p=fork();if(!p){execvp(v[4],v+4);_exit(127);}
 long last=min;int st;int arm=getenv("ARM_DROPS")?atoi(getenv("ARM_DROPS")):0;long hi=0;int drops=0;
 for(;;){pid_t w=waitpid(p,&st,WNOHANG);if(w==p)break;long r=rss(p);
  if(drops<arm){if(r>hi)hi=r;if(r<hi-2048){drops++;hi=r;if(drops==arm){fprintf(stderr,"[freeze] armed at %ld\n",r);last=r;}}usleep(200);continue;}
  if(r>last+64){kill(p,SIGSTOP);waitpid(p,&st,WUNTRACED);long r2=rss(p);cp(p,"smaps",out);cp(p,"status",outs);{const char*fc=getenv("FREEZE_CMD");if(fc){char cmd[1024];snprintf(cmd,1024,"%s %d",fc,p);system(cmd);}}fprintf(stderr,"[freeze] %ld KiB (stopped at %ld)\n",r,r2);last=r2>r?r2:r;kill(p,SIGCONT);}
  usleep(200);}
 return WIFEXITED(st)?WEXITSTATUS(st):1;}
