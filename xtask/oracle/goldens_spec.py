"""Speculative decoding through mlx-lm 0.32.2's own entry points, for `mlx-engine/tests/speculative.rs`.

Fixture (written here, deterministic): `mlx-cli/tests/models/dense_f32_draft`, a 1-layer draft
of the 2-layer tiny llama `dense_f32` (its embedding, first layer and final norm; the same
word-level tokenizer), so that the draft agrees with the target on some tokens and not on
others (partial acceptance).

Goldens (`mlx-engine/tests/goldens/speculative.json`): for each case, `mlx_lm.load` of the
target and of the draft, `mx.random.seed(S)` when the case samples, then
`mlx_lm.generate.stream_generate(model, tokenizer, prompt_ids, draft_model=draft,
num_draft_tokens=K, ...)` (which runs `speculative_generate_step`): every response's token,
`from_draft` mark and the token's log-probability, plus the finish reason. Greedy and seeded
sampling, logits processors (the per-position path with its `prev_tokens`), a quantized KV
cache, one draft token and a max_tokens that ends inside a drafted run.

`cli` holds `python -m mlx_lm generate --draft-model ... --seed S` runs (the streamed text and
the generated token count), for the `mlx generate --draft-model` parity test.

Run with `cargo xtask goldens spec`.
"""

import json
import os
import subprocess
import sys

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import stream_generate
from mlx_lm.sample_utils import make_logits_processors, make_sampler

ROOT_MODELS = "mlx-models/tests/models"
CLI_MODELS = "mlx-cli/tests/models"
TARGET = f"{CLI_MODELS}/dense_f32"
DRAFT = f"{CLI_MODELS}/dense_f32_draft"
OUT = "mlx-engine/tests/goldens/speculative.json"

PROMPTS = {
    "a": [1, 10, 22, 37, 5, 64, 9, 15],
    "b": [1, 44, 3, 91, 12, 7, 7, 30, 100, 2, 58],
}

CASES = [
    # name, prompt, num_draft_tokens, max_tokens, sampler kwargs, processor kwargs, seed, kv_bits
    ("greedy_k2", "a", 2, 40, {}, {}, None, None),
    ("greedy_k3", "b", 3, 40, {}, {}, None, None),
    ("greedy_k1", "a", 1, 24, {}, {}, None, None),
    ("greedy_k4_short", "a", 4, 18, {}, {}, None, None),
    ("greedy_k5", "a", 5, 40, {}, {}, None, None),
    ("seed_temp", "a", 3, 40, {"temp": 0.05}, {}, 7, None),
    ("seed_top_p", "b", 2, 40, {"temp": 0.1, "top_p": 0.9}, {}, 3, None),
    ("seed_top_k_min_p", "a", 4, 40, {"temp": 0.08, "top_k": 20, "min_p": 0.05}, {}, 11, None),
    ("greedy_repetition", "b", 3, 40, {}, {"repetition_penalty": 1.3}, None, None),
    ("seed_penalties", "a", 2, 40, {"temp": 0.05},
     {"presence_penalty": 0.5, "frequency_penalty": 0.3, "logit_bias": {5: 1.5}}, 5, None),
]

CLI = [
    # name, args
    ("cli_greedy", ["--prompt", "the cat is big", "--num-draft-tokens", "3", "-m", "30"]),
    ("cli_seed", ["--prompt", "hello world", "--num-draft-tokens", "2", "-m", "30",
                  "--seed", "9", "--temp", "0.05"]),
]


def write_draft():
    os.makedirs(DRAFT, exist_ok=True)
    with open(f"{ROOT_MODELS}/dense_f32/config.json") as f:
        config = json.load(f)
    config["num_hidden_layers"] = 1
    with open(f"{DRAFT}/config.json", "w") as f:
        json.dump(config, f, indent=2)
    w = mx.load(f"{ROOT_MODELS}/dense_f32/model.safetensors")
    keep = {k: v for k, v in w.items() if not k.startswith("model.layers.1.")}
    mx.save_safetensors(f"{DRAFT}/model.safetensors", keep)
    for name in ["tokenizer.json", "tokenizer_config.json"]:
        link = f"{DRAFT}/{name}"
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(f"../tokenizer/{name}", link)


def run_case(model, tokenizer, draft, case):
    name, prompt, k, max_tokens, samp, procs, seed, kv_bits = case
    if seed is not None:
        mx.random.seed(seed)
    kwargs = {}
    if samp:
        kwargs["sampler"] = make_sampler(**samp)
    if procs:
        kwargs["logits_processors"] = make_logits_processors(**procs)
    if kv_bits is not None:
        kwargs["kv_bits"] = kv_bits
        kwargs["kv_group_size"] = 32
        kwargs["quantized_kv_start"] = 0
    tokens, from_draft, logprobs = [], [], []
    finish = None
    for r in stream_generate(model, tokenizer, PROMPTS[prompt], max_tokens=max_tokens,
                             draft_model=draft, num_draft_tokens=k, **kwargs):
        tokens.append(r.token)
        from_draft.append(bool(r.from_draft))
        logprobs.append(float(r.logprobs[r.token].item()))
        finish = r.finish_reason
    return {
        "name": name,
        "prompt": PROMPTS[prompt],
        "num_draft_tokens": k,
        "max_tokens": max_tokens,
        "sampler": samp,
        "processors": {key: ({str(i): v for i, v in val.items()} if isinstance(val, dict) else val)
                       for key, val in procs.items()},
        "seed": seed,
        "kv_bits": kv_bits,
        "tokens": tokens,
        "from_draft": from_draft,
        "logprobs": logprobs,
        "finish_reason": finish,
    }


def run_cli(name, args):
    r = subprocess.run([sys.executable, "-m", "mlx_lm", "generate", "--model", TARGET,
                        "--draft-model", DRAFT, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"mlx_lm generate {args} failed:\n{r.stdout}\n{r.stderr}")
    out = r.stdout
    text = out.split("==========\n", 1)[1].rsplit("\n==========", 1)[0]
    gen = int(out.split("Generation: ", 1)[1].split(" tokens", 1)[0])
    return {"name": name, "args": args, "text": text, "generation_tokens": gen}


def main():
    write_draft()
    model, tokenizer = load(TARGET)
    draft, _ = load(DRAFT)
    cases = [run_case(model, tokenizer, draft, c) for c in CASES]
    for c in cases:
        acc = sum(c["from_draft"])
        print(f"{c['name']}: {len(c['tokens'])} tokens, {acc} from the draft", file=sys.stderr)
    cli = [run_cli(n, a) for n, a in CLI]
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({"cases": cases, "cli": cli}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
