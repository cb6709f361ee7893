import sys,re,collections
cur=None; agg=collections.OrderedDict()
for line in open(sys.argv[1]):
    if re.match(r'^[0-9a-f]+-[0-9a-f]+ ',line):
        parts=line.split()
        name=parts[5] if len(parts)>5 else '[anon]'
        perm=parts[1]
        cur=(name.split('/')[-1],perm)
    elif line.startswith('Rss:'):
        agg[cur]=agg.get(cur,0)+int(line.split()[1])
tot=sum(agg.values())
for k,v in sorted(agg.items(),key=lambda x:-x[1]):
    if v>=64: print(f"{v:8d} KiB  {k[1]} {k[0]}")
print(f"{tot:8d} KiB total")
