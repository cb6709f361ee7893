# BASE/NEW memory columns of the official bench's tables (run-bench.sh's four files): medians
# per side of the peak (VmHWM) and the two ratios. Usage: python3 table.py official-*.md
import re,statistics,sys,collections
peak=collections.defaultdict(list); mkv={}; ratio=collections.defaultdict(list)
for f in sys.argv[1:]:
    side='BASE' if 'BASE' in f else 'NEW'
    for l in open(f):
        c=[x.strip() for x in l.split('|')]
        if len(c)>12 and c[2]=='ours':
            peak[(c[1],side)].append(float(c[9])); mkv[c[1]]=float(c[10]); ratio[(c[1],side)].append((float(c[11]),float(c[12])))
print('| row | model + KV MB | BASE peak MB | NEW peak MB | NEW - BASE | peak / (model + KV), BASE -> NEW | less the process baseline, BASE -> NEW |')
print('|---|---|---|---|---|---|---|')
for r in mkv:
    b=statistics.median(peak[(r,'BASE')]); n=statistics.median(peak[(r,'NEW')])
    rb=[statistics.median(x) for x in zip(*ratio[(r,'BASE')])]; rn=[statistics.median(x) for x in zip(*ratio[(r,'NEW')])]
    print(f"| {r} | {mkv[r]:.1f} | {b:.1f} | {n:.1f} | {n-b:+.1f} | {rb[0]:.2f} -> **{rn[0]:.2f}** | {rb[1]:.2f} -> {rn[1]:.2f} |")
