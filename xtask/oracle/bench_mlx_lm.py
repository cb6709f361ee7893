"""mlx-lm's side of `cargo xtask bench`: greedy generation speed of mlx-lm 0.32.2.

    python bench_mlx_lm.py --model PATH [--dtype float32|float16|bfloat16|keep]
        [--prompt-len 512] [--gen-len 32] [--seed 0] [--warmup 1]
        [--warmup-prompt-len N] [--warmup-gen-len N] [--trials 1]
        [--prefill-step-size 2048] [--device cpu|gpu]

PATH is an HF-style directory (loaded by `mlx_lm.utils.load_model`) or a llama `.gguf` file
(mapped to mlx-lm's names and loaded into `mlx_lm.models.llama` exactly as
`goldens_smollm2_logits.py` does). `--dtype` casts every floating parameter
(`Module.set_dtype`), `keep` leaves the stored dtypes.

The prompt is `--prompt-len` token ids drawn with splitmix64 from `--seed`, modulo the
vocabulary size; `mlx-models/examples/bench_generate.rs` draws the same ids. Generation is
`mlx_lm.generate.generate_step` with the greedy sampler and `max_tokens = --gen-len`, timed the
way `stream_generate` times it (and `mlx_lm.benchmark` reports it):
  prompt_tps     = prompt tokens / time from the call to the first token,
  generation_tps = gen_len / time from the first token to the last one
(stream_generate divides by the number of tokens yielded, not by the gen_len - 1 intervals).
EOS is ignored: exactly gen_len tokens are generated. After each trial the stream is
synchronized (the pipelined step started before the last token is drained, untimed). Warmup
runs (default one, with the warmup lengths, which default to the measured ones) come first and
are not reported.

Besides wall time, each phase's process CPU time (user + system, all threads, `os.times()`,
clock ticks as bench_generate.rs reads them from /proc/self/stat) is reported: on a loaded
machine it is much steadier than wall time.

Prints one JSON line on stdout.
"""

import argparse
import json
import os
import time

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama
from mlx_lm.sample_utils import make_sampler

MASK = (1 << 64) - 1


def prompt_ids(n, seed, vocab):
    """splitmix64 from `seed`, each output modulo `vocab` (as bench_generate.rs)."""
    state = seed & MASK
    out = []
    for _ in range(n):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        z ^= z >> 31
        out.append(z % vocab)
    return out


# GGUF (llama.cpp) names -> mlx-lm's, as in goldens_smollm2_logits.py.
NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def hf_name(name):
    base, suffix = name.rsplit(".", 1)
    if base == "token_embd":
        return f"model.embed_tokens.{suffix}"
    if base == "output_norm":
        return f"model.norm.{suffix}"
    if base == "output":
        return f"lm_head.{suffix}"
    _, layer, part = base.split(".", 2)
    return f"model.layers.{layer}.{NAMES[part]}.{suffix}"


def unpermute(w, heads):
    rows, cols = w.shape
    return w.reshape(heads, rows // heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def load_gguf(path):
    weights, meta = mx.load(path, return_metadata=True)

    def scalar(key):
        return meta[key].item()

    heads = scalar("llama.attention.head_count")
    kv_heads = scalar("llama.attention.head_count_kv")
    mapped = {}
    for k, v in weights.items():
        n = hf_name(k)
        if ".q_proj." in n:
            v = unpermute(v, heads)
        elif ".k_proj." in n:
            v = unpermute(v, kv_heads)
        mapped[n] = v
    config = {
        "model_type": "llama",
        "hidden_size": scalar("llama.embedding_length"),
        "num_hidden_layers": scalar("llama.block_count"),
        "intermediate_size": scalar("llama.feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": scalar("llama.attention.layer_norm_rms_epsilon"),
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "rope_theta": scalar("llama.rope.freq_base"),
        "max_position_embeddings": scalar("llama.context_length"),
        "tie_word_embeddings": "lm_head.weight" not in mapped,
    }
    model = llama.Model(llama.ModelArgs.from_dict(config))

    def predicate(p, m):
        if f"{p}.scales" not in mapped:
            return False
        in_dims = m.weight.shape[-1]
        gs = in_dims // mapped[f"{p}.scales"].shape[-1]
        bits = mapped[f"{p}.weight"].shape[-1] * 32 // in_dims
        return {"group_size": gs, "bits": bits, "mode": "affine"}

    nn.quantize(model, class_predicate=predicate)
    model.load_weights(list(mapped.items()), strict=True)
    return model, config


def load(path, dtype):
    if path.endswith(".gguf"):
        model, config = load_gguf(path)
    else:
        from pathlib import Path

        from mlx_lm.utils import load_model

        model, config = load_model(Path(path))
    if dtype != "keep":
        model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    vocab = config.get("vocab_size") or config["text_config"]["vocab_size"]
    return model, vocab


def cpu_seconds():
    t = os.times()
    return t.user + t.system


def trial(model, prompt, gen_len, prefill_step_size):
    """One generation, timed as stream_generate times it."""
    # Imported late: mlx-lm makes its generation stream on the default device at import.
    from mlx_lm.generate import generate_step, generation_stream

    sampler = make_sampler(0.0)
    tokens = []
    mx.reset_peak_memory()
    cpu0 = cpu_seconds()
    tic = time.perf_counter()
    prompt_time = None
    for n, (token, _logprobs) in enumerate(
        generate_step(
            prompt, model, max_tokens=gen_len, sampler=sampler,
            prefill_step_size=prefill_step_size,
        )
    ):
        if n == 0:
            prompt_time = time.perf_counter() - tic
            cpu1 = cpu_seconds()
            tic = time.perf_counter()
        tokens.append(token)
        if n + 1 == gen_len:
            break
    gen_time = time.perf_counter() - tic
    cpu2 = cpu_seconds()
    mx.synchronize(generation_stream)
    return {
        "prompt_tps": prompt.size / prompt_time,
        "generation_tps": len(tokens) / gen_time,
        "prompt_time_s": prompt_time,
        "generation_time_s": gen_time,
        "prompt_cpu_s": cpu1 - cpu0,
        "generation_cpu_s": cpu2 - cpu1,
        "peak_memory_gb": mx.get_peak_memory() / 1e9,
    }, tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="float32",
                    choices=["float32", "float16", "bfloat16", "keep"])
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen-len", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--warmup-prompt-len", type=int, default=None)
    ap.add_argument("--warmup-gen-len", type=int, default=None)
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--prefill-step-size", type=int, default=2048)
    ap.add_argument("--device", choices=["cpu", "gpu"], default=None)
    a = ap.parse_args()
    if a.prompt_len < 1 or a.gen_len < 1:
        ap.error("--prompt-len and --gen-len must be positive")

    if a.device is not None:
        mx.set_default_device(mx.cpu if a.device == "cpu" else mx.gpu)
    t = time.perf_counter()
    model, vocab = load(a.model, a.dtype)
    load_s = time.perf_counter() - t
    prompt = mx.array(prompt_ids(a.prompt_len, a.seed, vocab), dtype=mx.int32)
    wp = min(a.warmup_prompt_len or a.prompt_len, a.prompt_len)
    wg = max(a.warmup_gen_len or a.gen_len, 1)
    for _ in range(a.warmup):
        trial(model, prompt[:wp], wg, a.prefill_step_size)
    trials = []
    tokens = None
    for _ in range(a.trials):
        r, tokens = trial(model, prompt, a.gen_len, a.prefill_step_size)
        trials.append(r)
    print(json.dumps({
        "impl": "mlx-lm",
        "version": __import__("mlx_lm").__version__,
        "mlx": mx.__version__,
        "device": str(mx.default_device()),
        "model": os.path.abspath(a.model),
        "dtype": a.dtype,
        "prompt_len": a.prompt_len,
        "gen_len": a.gen_len,
        "seed": a.seed,
        "load_s": load_s,
        "trials": trials,
        "tokens": tokens,
    }))


main()
