#!/usr/bin/env python3
"""Pools every round of the run*.md tables here (cargo xtask bench spec --cli --out runN.md):
medians of plain and lookup tok/s, their ratio, the median of the rounds ratios, and the
series halves. usage: python3 pool_all.py (in this folder)."""
import glob,re,statistics as st
P=[];L=[];R=[]
for f in sorted(glob.glob('run*.md'), key=lambda s:int(re.findall(r'\d+',s)[-1])):
    for line in open(f):
        m=re.match(r'\| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)x \| 74 \| 48 / 60 \| 27 \| yes',line)
        if m: P.append(float(m[2]));L.append(float(m[3]));R.append(float(m[4]))
q=st.quantiles(R,n=4)
print(f"Pooled over the ten runs' {len(R)} rounds (every round: 74 tokens, 48 / 60 drafts, 27 passes, plain decoding's tokens):")
print(f"plain median {st.median(P):.1f} tok/s, prompt lookup median {st.median(L):.1f} tok/s, ratio of the medians {st.median(L)/st.median(P):.2f}x, median of the rounds' ratios {st.median(R):.2f}x (quartiles {q[0]:.2f}-{q[2]:.2f}x).")
h=len(R)//2
for name,(a,b) in (("runs 1-5",(0,h)),("runs 6-10",(h,len(R)))):
    print(f"{name}: ratio of medians {st.median(L[a:b])/st.median(P[a:b]):.2f}x, median of ratios {st.median(R[a:b]):.2f}x.")
