import re,sys
lines=open(sys.argv[1]).read().split('\n'); want=sys.argv[2]
funcs={};cur=None
for l in lines:
    m=re.match(r'\.text\.(\w+):',l)
    if m: cur=m.group(1); funcs[cur]=[]; continue
    if cur: funcs[cur].append(l)
ls=funcs[want]; labels={};ins=[]
for l in ls:
    m=re.match(r'\s*(\.L_x_\d+):',l)
    if m: labels[m.group(1)]=len(ins); continue
    m=re.search(r'/\*([0-9a-f]{4,})\*/\s+(.*?);',l)
    if m: ins.append(m.group(2))
import collections
for i,t in enumerate(ins):
    m=re.search(r'BRA\s+`\((\.L_x_\d+)\)',t)
    if m and m.group(1) in labels and labels[m.group(1)]<=i:
        body=ins[labels[m.group(1)]:i+1]
        c=collections.Counter(b.split()[0] if not b.startswith('@') else b.split()[1] for b in body)
        if len(body)<1000 and ('SHFL.BFLY' in c or c['FADD']>=4) and 'IDP' not in c:
            print(len(body), dict(c.most_common(8)))
print('total', len(ins))
