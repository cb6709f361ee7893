# The A/B table of README.md from ab.sh's output (session 28's table.py, adapted: the md5 is
# field 11 (NEW's lines carry --json's process_peak_rss_bytes after it), and each side's own
# process baseline (its median on dense_f32) is subtracted for the last two columns).
import statistics,sys
KV135=2*30*3*64*640*2; KV360=2*32*5*64*640*2
model={'SmolLM2-135M-Instruct.Q4_1.gguf':(98362432,KV135),'smollm2-g64':(84265225,KV135),'smollm2-g32':(101075628,KV135),
'smollm2-360m-q4_0.gguf':(229118304,KV360),'smollm2-360m-q8_0.gguf':(386404704,KV360),'360m-g64':(226430023,KV360),'360m-g32':(271650023,KV360)}
rows={}
for f in sys.argv[1:]:
  for l in open(f):
    if l.startswith('#'): continue
    p=l.split()
    if len(p)<11 or p[3]=='FAILED': continue
    rows.setdefault(p[1],{}).setdefault(p[2],[]).append((int(p[3]),int(p[4]),int(p[5]),p[10]))
K=1024
base={s:statistics.median([x[0] for x in rows['dense_f32'][s]])*K for s in ('BASE','NEW')}
print(f"process baseline (dense_f32, 1 token in, 1 out; VmHWM): BASE {base['BASE']/1e6:.1f} MB, NEW {base['NEW']/1e6:.1f} MB\n")
print("| row | model + KV MB | runs | BASE peak MB | NEW peak MB | NEW - BASE MB | RssAnon max MB, BASE -> NEW | BASE / (model + KV) | **NEW / (model + KV)** | (peak - own baseline) / (model + KV), BASE -> NEW | text md5 equal |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for n,(mb,kv) in model.items():
    if n not in rows: continue
    v=rows[n]; tot=mb+kv
    b=statistics.median([x[0] for x in v['BASE']])*K; w=statistics.median([x[0] for x in v['NEW']])*K
    an=[x[1] for x in v['NEW'] if x[1]>0]; ab=[x[1] for x in v['BASE'] if x[1]>0]
    anb=f"{statistics.median(ab)*K/1e6:.1f}" if ab else '?'
    ann=f"{statistics.median(an)*K/1e6:.1f}" if an else '?'
    eq='yes' if {x[3] for x in v['BASE']}=={x[3] for x in v['NEW']} else 'no'
    print(f"| {n} | {mb/1e6:.1f} + {kv/1e6:.1f} = {tot/1e6:.1f} | {len(v['BASE'])}+{len(v['NEW'])} | {b/1e6:.1f} | {w/1e6:.1f} | {(w-b)/1e6:+.1f} | {anb} -> {ann} | {b/tot:.3f} | **{w/tot:.3f}** | {(b-base['BASE'])/tot:.3f} -> {(w-base['NEW'])/tot:.3f} | {eq} |")
