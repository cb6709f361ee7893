import sys,struct,os
pid=int(sys.argv[2]); rng=[l.split() for l in open(sys.argv[1])]
f=open(f'/proc/{pid}/pagemap','rb'); tot=res=0
for a,b in rng:
    a=int(a,16); b=int(b); p0=a//4096; p1=(a+b-1)//4096+1
    f.seek(p0*8); d=f.read((p1-p0)*8)
    for i in range(p1-p0):
        v=struct.unpack_from('<Q',d,i*8)[0]; tot+=1; res+= (v>>63)&1
open("/tmp/cpumem/s32/kvres.txt",'w').write(f"{len(rng)} callocs >=100k, pages {tot}, resident {res} ({res*4} KiB of {tot*4})\n")
