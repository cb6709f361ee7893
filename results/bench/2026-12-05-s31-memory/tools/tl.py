import sys,collections,re
strs=[None]; ips=[None]; traces=[None]; allocs=[]
lines=open(sys.argv[1]).read().split('\n'); cur=0; lo=int(sys.argv[2])
per=collections.defaultdict(collections.Counter)
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
    elif c=='c': cur=int(l[2:],16)
    elif c=='+':
        ai=int(l[2:],16); sz,ti=allocs[ai]
        if sz>=lo: per[cur//1000][ai]+=1
def frames(ti):
    out=[]
    while ti:
        ip,par=traces[ti]; fn=ips[ip]; out.append(re.sub(r'::h[0-9a-f]{16}$','',strs[fn]) if fn and fn<len(strs) else '?'); ti=par
    return out
for s in sorted(per):
    tot=sum(allocs[a][0]*n for a,n in per[s].items())
    print("second",s,"allocs>=lo",sum(per[s].values()),"bytes",tot)
    for ai,n in per[s].most_common(4):
        sz,ti=allocs[ai]; fr=[f for f in frames(ti) if not f.startswith(('alloc::','_R','__','std::','core::','<','_$','?','mlx::core::alloc','malloc','operator'))]
        print("   ",sz,n," <- ".join(f[:50] for f in fr[:4]))
