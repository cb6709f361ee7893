import sys,re
cur=None
for line in open(sys.argv[1]):
    m=re.match(r'^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$',line)
    if m:
        a,b,perm,name=m.groups(); cur=[name or '[anon]',perm,(int(b,16)-int(a,16))//1024,0,0]
    elif line.startswith('Rss:') and cur:
        cur[3]=int(line.split()[1])
    elif line.startswith('Anonymous:') and cur:
        cur[4]=int(line.split()[1])
        if cur[0] in ('[anon]','[heap]','[stack]') and cur[3]>0: print(*cur)
