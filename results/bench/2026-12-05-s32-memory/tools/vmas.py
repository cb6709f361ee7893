import sys,re
cur=None;d={}
def out():
    if cur and d.get('Rss',0)>0: print("%-14s %s %-22s Rss %6d PrivCln %6d PrivDrt %6d ShCln %6d Anon %6d"%(cur[0][-14:],cur[1],cur[2][-22:],d.get('Rss',0),d.get('Private_Clean',0),d.get('Private_Dirty',0),d.get('Shared_Clean',0),d.get('Anonymous',0)))
for line in open(sys.argv[1]):
    m=re.match(r'^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$',line)
    if m:
        out(); a,b,perm,name=m.groups(); cur=(a,perm,name.split('/')[-1] or '[anon]'); d={}
    else:
        k=line.split(':')[0]
        if k in ('Rss','Private_Clean','Private_Dirty','Shared_Clean','Anonymous'): d[k]=int(line.split()[1])
out()
