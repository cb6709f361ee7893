import sys,collections,re
strs=[None]; ips=[None]; traces=[None]; allocs=[]
live=collections.Counter(); t=0; best=(0,None); snap=None
events=[]
lines=open(sys.argv[1]).read().split('\n')
# first pass find time of max R
maxR=0; tmax=0; cur=0
for l in lines:
    if l.startswith('c '): cur=int(l[2:],16)
    elif l.startswith('R '):
        r=int(l[2:],16)
        if r>maxR: maxR=r; tmax=cur
target=int(sys.argv[2]) if len(sys.argv)>2 and sys.argv[2] else tmax
print("max RSS pages",maxR,"KiB",maxR*4,"at ms",tmax,"snapshot at",target)
cur=0; done=False
for l in lines:
    if not l: continue
    c=l[0]
    if c=='s': strs.append(l[2:])
    elif c=='i':
        p=l.split()[1:]; fn=int(p[2],16) if len(p)>2 else 0
        ips.append(fn)
    elif c=='t':
        a,b=l.split()[1:]; traces.append((int(a,16),int(b,16)))
    elif c=='a':
        a,b=l.split()[1:]; allocs.append((int(a,16),int(b,16)))
    elif c=='+': live[int(l[2:],16)]+=1
    elif c=='-': live[int(l[2:],16)]-=1
    elif c=='c':
        cur=int(l[2:],16)
        if cur>=target: break
def frames(ti):
    out=[]
    while ti:
        ip,par=traces[ti]; fn=ips[ip]; out.append(strs[fn] if fn and fn<len(strs) else '?'); ti=par
    return out
agg=collections.Counter(); total=0
skip=re.compile(r'^(alloc::|__rust|_RNvCs|__rdl|__rg|core::|<alloc|_\$LT\$alloc|\?|std::|mlx::core::allocator|operator new|malloc|calloc|realloc|mlxs_|mlx_core::array::Array::from|_\$LT\$core|hashbrown)')
for ai,n in live.items():
    if n<=0: continue
    sz,ti=allocs[ai]; b=sz*n; total+=b
    fr=[re.sub(r'::h[0-9a-f]{16}$','',f) for f in frames(ti)]
    key=next((f for f in fr if not skip.match(f)), fr[0] if fr else '?')
    key2=next((f for f in fr if f.startswith(('mlx_','_\$LT\$mlx'))), '')
    agg[(key[:70],key2[:60])]+=b
print("live bytes",total)
for k,v in agg.most_common(int(sys.argv[3]) if len(sys.argv)>3 else 40): print("%10d  %s  | %s"%(v,k[0],k[1]))
