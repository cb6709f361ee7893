import re,sys
lines=open(sys.argv[1]).read().split('\n')
# split per function
funcs={};cur=None
for l in lines:
    m=re.match(r'\.text\.(\w+):',l)
    if m: cur=m.group(1); funcs[cur]=[]; continue
    if cur: funcs[cur].append(l)
for f,ls in funcs.items():
    if not f.startswith('trellis'): continue
    labels={};ins=[]
    for l in ls:
        m=re.match(r'\s*(\.L_x_\d+):',l)
        if m: labels[m.group(1)]=len(ins); continue
        m=re.search(r'/\*([0-9a-f]{4,})\*/\s+(.*?);',l)
        if m: ins.append(m.group(2))
    hot=0;bad=0
    for i,t in enumerate(ins):
        m=re.search(r'BRA\s+`\((\.L_x_\d+)\)',t)
        if m and m.group(1) in labels and labels[m.group(1)]<=i:
            body=ins[labels[m.group(1)]:i+1]
            idp=sum('IDP' in b for b in body)
            if idp>=16 and len(body)<1000:
                hot+=1
                sp=sum(('LDL' in b or 'STL' in b) for b in body)
                if sp: bad+=1; print(f, 'loop', len(body), 'IDP', idp, 'spill ops', sp)
    print(f, 'hot loops', hot, 'with spills', bad, 'total LDL/STL', sum(('LDL' in b or 'STL' in b) for b in ins))
