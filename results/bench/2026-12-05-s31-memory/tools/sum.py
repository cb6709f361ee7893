import sys,re,collections
cur=None; agg=collections.OrderedDict(); tot=collections.Counter()
keys=['Rss','Private_Dirty','Private_Clean','Shared_Clean','Anonymous']
for line in open(sys.argv[1]):
    if re.match(r'^[0-9a-f]+-[0-9a-f]+ ',line):
        parts=line.split()
        name=parts[5] if len(parts)>5 else '[anon]'
        cur=(name.split('/')[-1],parts[1])
        agg.setdefault(cur,collections.Counter())
    else:
        k=line.split(':')[0]
        if k in keys: agg[cur][k]+=int(line.split()[1]); tot[k]+=int(line.split()[1])
print("%-40s %5s %8s %8s %8s %8s"%("mapping","perm","Rss","PrivDrt","PrivCln","Anon"))
for k,v in sorted(agg.items(),key=lambda x:-x[1]['Rss']):
    if v['Rss']>=32: print("%-40s %5s %8d %8d %8d %8d"%(k[0][:40],k[1],v['Rss'],v['Private_Dirty'],v['Private_Clean'],v['Anonymous']))
print("%-40s %5s %8d %8d %8d %8d"%("TOTAL","",tot['Rss'],tot['Private_Dirty'],tot['Private_Clean'],tot['Anonymous']))
