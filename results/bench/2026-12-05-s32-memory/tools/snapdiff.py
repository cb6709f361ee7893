import sys,collections,re
# usage: snapdiff.py heaptrack.txt T1 T2 [T3...]: live bytes by stack at each time (ms) and differences
lines=open(sys.argv[1]).read().split('\n'); times=[int(x) for x in sys.argv[2:]]
strs=[None]; ips=[None]; traces=[None]; allocs=[]
live=collections.Counter(); cur=0; snaps={}; rss=0; ti=0; peakbytes=0
def frames(t):
    out=[]
    while t:
        ip,par=traces[t]; fn=ips[ip]; out.append(strs[fn] if fn and fn<len(strs) else '?'); t=par
    return out
def take():
    return {k:v for k,v in live.items() if v>0}
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
    elif c=='R': rss=int(l[2:],16)*4
    elif c=='c':
        cur=int(l[2:],16)
        while ti<len(times) and cur>=times[ti]:
            snaps[times[ti]]=(take(),rss); ti+=1
skip=re.compile(r'^(alloc::|__rust|_RNv|__rdl|__rg|core::|<alloc|_\$LT\$alloc|\?|std::|mlx::core::allocator|operator new|malloc|calloc|realloc|mlxs_|_\$LT\$core|hashbrown|_ZN)')
def agg(s):
    a=collections.Counter()
    for ai,n in s.items():
        sz,t=allocs[ai]
        fr=[re.sub(r'::h[0-9a-f]{16}$','',f) for f in frames(t)]
        key=next((f for f in fr if not skip.match(f)), fr[0] if fr else '?')
        key2=next((f for f in fr if f.startswith(('mlx_','_$LT$mlx'))), '')
        a[(key[:60],key2[:60])]+=sz*n
    return a
prev=None
for t in times:
    s,r=snaps[t]; a=agg(s); tot=sum(a.values())
    print("== t=%d ms: RSS %d KiB, live %d B = %d KiB"%(t,r,tot,tot//1024))
    for k,v in a.most_common(25): print("   %10d  %s | %s"%(v,k[0],k[1]))
    if prev:
        d=collections.Counter(a); d.subtract(prev)
        print("   -- change since previous:")
        for k,v in sorted(d.items(),key=lambda x:-abs(x[1]))[:15]:
            if v: print("   %+10d  %s | %s"%(v,k[0],k[1]))
    prev=a
