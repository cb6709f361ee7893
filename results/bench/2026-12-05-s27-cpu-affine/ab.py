#!/usr/bin/env python3
"""A/B of `mlx generate` decode (and prefill) between binaries, interleaved with llama-bench,
on the official #31 rows: prompt 512 ids of the Genesis fixture, 128 greedy tokens, 2 threads.

ab.py OUT.json ROUNDS name=BIN [name=BIN ...] -- row=MODEL[:gguf_for_llama] ...
Each round runs every (row, binary) once, plus llama-bench decode (-p 0 -n 128 -d 512) on rows
that name a GGUF; the order of the binaries rotates each round. Writes every sample with the
load average, and prints medians and ratios.
"""
import json, os, subprocess, sys, time, statistics

WT = os.path.dirname(os.path.abspath(__file__))
GEN = "/work/wt-cpuaffine/mlx-engine/tests/fixtures/genesis_kjv.txt"
LLAMA = "/work/llama-cpp/build/bin/llama-bench"
P, G, T = 512, 128, "2"

def loadavg():
    return open("/proc/loadavg").read().split()[:3]

def prompt_ids(binary, model):
    text = open(GEN).read()[: P * 8]
    out = subprocess.run([binary, "generate", "--model", model, "--prompt", text,
                          "--ignore-chat-template", "--max-tokens", "1", "--json", "--threads", T],
                         capture_output=True, text=True, check=True).stdout
    v = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
    return v["prompt_ids"][:P]

def ours(binary, model, ids, extra=()):
    out = subprocess.run([binary, "generate", "--model", model, "--prompt-ids",
                          ",".join(map(str, ids)), "--max-tokens", str(G), "--temp", "0",
                          "--json", "--threads", T, *extra],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{binary} {model}: {out.stderr[-2000:]}")
    v = json.loads([l for l in out.stdout.splitlines() if l.startswith("{")][-1])
    return {"prefill": v.get("prompt_tps"), "decode": v.get("generation_tps"),
            "generated": v.get("generation_tokens"), "decoder": v.get("decoder"),
            "text_md5": __import__("hashlib").md5(str(v.get("text")).encode()).hexdigest()[:12]}

def llama(gguf):
    out = subprocess.run([LLAMA, "-m", gguf, "-t", T, "-p", "0", "-n", str(G), "-d", str(P),
                          "-r", "1", "-o", "json"], capture_output=True, text=True, check=True).stdout
    v = json.loads(out)
    return {"decode": v[0]["avg_ts"]}

def main():
    out_path, rounds = sys.argv[1], int(sys.argv[2])
    i = sys.argv.index("--")
    bins = [a.split("=", 1) for a in sys.argv[3:i]]
    rows = []
    for a in sys.argv[i + 1:]:
        name, spec = a.split("=", 1)
        model, _, gguf = spec.partition(":")
        rows.append((name, model, gguf or None))
    ids = {}
    for name, model, _ in rows:
        ids[name] = prompt_ids(bins[0][1], model)
    samples = []
    for r in range(rounds):
        order = bins[r % len(bins):] + bins[: r % len(bins)]
        for name, model, gguf in rows:
            for bname, b in order:
                s = ours(b, model, ids[name])
                s.update(row=name, side=bname, round=r, load=loadavg())
                samples.append(s)
                print(json.dumps(s), flush=True)
            if gguf and os.path.exists(LLAMA):
                s = llama(gguf)
                s.update(row=name, side="llama.cpp", round=r, load=loadavg())
                samples.append(s)
                print(json.dumps(s), flush=True)
        json.dump(samples, open(out_path, "w"), indent=1)
    print("\nmedians (decode tok/s; prefill tok/s):")
    for name, _, _ in rows:
        sides = sorted({s["side"] for s in samples if s["row"] == name})
        med = {}
        for side in sides:
            d = [s["decode"] for s in samples if s["row"] == name and s["side"] == side]
            p = [s.get("prefill") for s in samples if s["row"] == name and s["side"] == side and s.get("prefill")]
            med[side] = statistics.median(d)
            print(f"  {name:<14} {side:<10} decode {statistics.median(d):8.2f}"
                  + (f"  prefill {statistics.median(p):8.2f}" if p else "") + f"  (n={len(d)})")
        if "llama.cpp" in med:
            for side in sides:
                if side != "llama.cpp":
                    print(f"  {name:<14} {side:<10} / llama.cpp = {med[side] / med['llama.cpp']:.3f}")

main()
