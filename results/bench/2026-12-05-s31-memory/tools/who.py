import sys,collections,re
strs=[None]; ips=[None]; traces=[None]; allocs=[]
live=collections.Counter()
lines=open(sys.argv[1]).read().split('\n')
maxR=0; tmax=0; cur=0
for l in lines:
    if l.startswith('c '): cur=int(l[2:],16)
    elif l.startswith('R '):
        r=int(l[2:],16)
        if r>maxR: maxR=r; tmax=cur
cur=0
for l in lines:
    if not l: continue
    c=l[0]
    if c=='s': strs.append(l[2:].split(' ',1)[1] if ' ' in l[2:] else l[2:])
    elif c=='i':
        p=l.split()[1:]; ips.append(int(p[2],16) if len(p)>2 else 0)
    elif c=='t':
        a,b=l.split()[1:]; traces.append((int(a,16),int(b,16)))
    elif c=='a':
        a,b=l.split()[1:]; allocs.append((int(a,16),int(b,16)))
    elif c=='+': live[int(l[2:],16)]+=1
    elif c=='-': live[int(l[2:],16)]-=1
    elif c=='c':
        cur=int(l[2:],16)
        if cur>=tmax: break
def frames(ti):
    out=[]
    while ti:
        ip,par=traces[ti]; fn=ips[ip]; out.append(re.sub(r'::h[0-9a-f]{16}$','',strs[fn]) if fn and fn<len(strs) else '?'); ti=par
    return out
pat=sys.argv[2]
agg=collections.Counter()
for ai,n in live.items():
    if n<=0: continue
    sz,ti=allocs[ai]; fr=frames(ti)
    if any(pat in f for f in fr[:3]):
        key=" <- ".join(f[:45] for f in fr[:9] if not f.startswith(('alloc::','_R','__r','core::','?')))
        agg[key]+=sz*n
for k,v in agg.most_common(6): print(v,k,"\n")
