import sys,re,bisect,collections
syms=[]
for l in open('nm.txt'):
    p=l.rstrip('\n').split(' ',2)
    if len(p)<3 or p[1] not in 'tTwW': continue
    syms.append((int(p[0],16),p[2]))
syms.sort(); addrs=[a for a,_ in syms]
def crate(n):
    n=re.sub(r'^(<|_<)+','',n)
    n=n.lstrip('&*').replace('dyn ','').replace('mut ','')
    m=re.match(r'([A-Za-z_][A-Za-z0-9_]*)(::|$| )',n)
    c=m.group(1) if m else n[:20]
    if c in('core','alloc','std') :
        # look for a later crate name in impl
        m2=re.search(r' for (?:&|\*)?(?:mut )?([a-z_][a-z0-9_]*)::',n)
        if m2 and m2.group(1) not in('core','alloc','std'): return m2.group(1)
    return c
agg=collections.Counter(); pages=0
for l in open(sys.argv[1]):
    perm,off=l.split(); off=int(off,16)
    if perm!='r-xp': continue
    pages+=1
    va=off+0x1000
    i=bisect.bisect_right(addrs,va)-1
    seen=collections.Counter()
    j=max(i,0)
    while j<len(syms) and syms[j][0]<va+4096:
        a=syms[j][0]; b=syms[j+1][0] if j+1<len(syms) else a+1
        lo=max(a,va); hi=min(b,va+4096)
        if hi>lo: seen[crate(syms[j][1])]+=hi-lo
        j+=1
    for k,v in seen.items(): agg[k]+=v
print(pages,"text pages =",pages*4/1024,"MiB")
for k,v in agg.most_common(30): print(f"{v/1048576:6.2f} MiB {k}")
