# codepages.py BIN MODEL: runs mlx generate (bench shape); once the prompt's release drop is seen
# (RSS falls > 2 MiB after passing 100 MiB) waits 1 s, stops it, lists the resident pages of
# BIN's r-xp mapping by the functions they hold (nm), continues.
import subprocess,sys,time,os,signal,struct,bisect,re
B,M=sys.argv[1],sys.argv[2]
ids=open('/tmp/cpumem/ids.txt').read().strip()
env=dict(os.environ,LD_LIBRARY_PATH='/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib')
p=subprocess.Popen([B,'generate','--model',M,'--prompt-ids',ids,'--max-tokens','128','--temp','0','--json','--threads','2'],stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL,env=env)
def rss():
    try: return int(open(f'/proc/{p.pid}/statm').read().split()[1])*4
    except: return None
hi=0;phase=0
while p.poll() is None:
    r=rss()
    if r is None: break
    hi=max(hi,r)
    if hi>100000 and r<hi-2048:
        phase+=1; hi=r
        if phase==2: break
    time.sleep(0.0005)
time.sleep(1.0)
os.kill(p.pid,signal.SIGSTOP)
maps=[l.split() for l in open(f'/proc/{p.pid}/maps')]
rx=[m for m in maps if m[1]=='r-xp' and len(m)>5 and os.path.basename(m[5])==os.path.basename(B)][0]
a,b=[int(x,16) for x in rx[0].split('-')]
f=open(f'/proc/{p.pid}/pagemap','rb'); f.seek(a//4096*8); d=f.read((b-a)//4096*8)
res=[a+i*4096 for i in range((b-a)//4096) if struct.unpack_from('<Q',d,i*8)[0]>>63]
os.kill(p.pid,signal.SIGCONT); p.wait()
syms=[]
for l in subprocess.run(['nm','-n','-C','--defined-only',B],capture_output=True,text=True).stdout.splitlines():
    x=l.split(' ',2)
    if len(x)==3 and x[1] in 'tTwW': syms.append((int(x[0],16),x[2]))
addrs=[s[0] for s in syms]
print(f"resident r-xp pages: {len(res)} ({len(res)*4} KiB) of {(b-a)//4096}")
# group into runs
runs=[]
for r in res:
    if runs and runs[-1][1]==r: runs[-1][1]=r+4096
    else: runs.append([r,r+4096])
for s,e in runs:
    i=bisect.bisect_right(addrs,s)-1
    print(f"{hex(s)}-{hex(e)} {(e-s)//1024:5d} KiB  first: {syms[i][1][:110] if i>=0 else '?'}")
