"""Generation goldens: mlx-lm 0.32.2 `generate_step` on tiny seeded llama models with every
sampler option and logits processor, from fixed seeds (`mx.random.seed`).

Each case records the generated ids (param `ids`) and the log-probabilities of every step
(outputs, one (vocab,) array per step). Also covers chunked prefill (prefill_step_size smaller
than the prompt), a quantized KV cache switching on mid-prompt (kv_bits, quantized_kv_start)
and rotating caches: `max_kv_size` (which llama ignores, since its class defines `make_cache`)
and an explicit `RotatingKVCache(max_size=8, keep=4)` per layer, what `make_prompt_cache` gives a
model without `make_cache`, which wraps during the prompt and the decode.
Writes mlx-engine/tests/goldens/generate.safetensors. Run with `cargo xtask goldens generate`.
"""

from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import RotatingKVCache
from mlx_lm.sample_utils import make_logits_processors, make_sampler
from mlx_lm.utils import load_model

from golden import Golden

g = Golden("mlx-engine/tests/goldens/generate.safetensors", __file__)
PROMPT = [1, 17, 99, 5, 42, 42, 7, 120, 3, 64, 9, 9, 33]

CASES = [
    # name, model, seed, sampler kwargs, processor kwargs, generate kwargs
    ("greedy", "dense_f32", 0, {}, {}, {}),
    ("temp", "dense_f32", 1, {"temp": 0.8}, {}, {}),
    ("temp_bf16", "dense_bf16_untied", 2, {"temp": 1.3}, {}, {}),
    ("top_p", "dense_f32", 3, {"temp": 1.0, "top_p": 0.9}, {}, {}),
    ("min_p", "dense_f32", 4, {"temp": 1.0, "min_p": 0.05}, {}, {}),
    ("min_p_keep", "dense_f32", 5, {"temp": 1.0, "min_p": 0.3, "min_tokens_to_keep": 3}, {}, {}),
    ("top_k", "dense_f32", 6, {"temp": 1.0, "top_k": 5}, {}, {}),
    ("xtc", "dense_f32", 7, {"temp": 1.0, "xtc_probability": 0.5, "xtc_threshold": 0.05,
                             "xtc_special_tokens": [2, 5]}, {}, {}),
    ("all_samplers", "q4_g32", 8, {"temp": 0.7, "top_p": 0.95, "min_p": 0.02, "top_k": 20}, {}, {}),
    ("repetition", "dense_f32", 9, {"temp": 0.9}, {"repetition_penalty": 1.3, "repetition_context_size": 6}, {}),
    ("presence", "dense_f32", 10, {}, {"presence_penalty": 0.7, "presence_context_size": 30}, {}),
    ("frequency", "dense_f32", 11, {"temp": 1.0}, {"frequency_penalty": 0.4}, {}),
    ("logit_bias", "dense_f32", 12, {}, {"logit_bias": {3: 5.0, 17: -2.5, 100: 1.25}}, {}),
    ("all_processors", "dense_f16", 13, {"temp": 1.1, "top_k": 30},
     {"repetition_penalty": 1.1, "presence_penalty": 0.2, "frequency_penalty": 0.3, "logit_bias": {7: 2.0}}, {}),
    ("chunked_prefill", "dense_f32", 14, {}, {}, {"prefill_step_size": 4}),
    ("kv_quant", "mistral_bias_llama3rope", 15, {"temp": 0.5}, {},
     {"kv_bits": 4, "kv_group_size": 32, "quantized_kv_start": 8, "prefill_step_size": 5}),
    ("rotating", "dense_f32", 16, {}, {}, {"max_kv_size": 8}),
    ("rotating_keep4", "dense_f32", 17, {"temp": 0.7}, {}, {"rotating_cache": 8}),
    ("rotating_keep4_chunked", "q4_g32", 18, {}, {}, {"rotating_cache": 6, "prefill_step_size": 5}),
]
STEPS = 12

for name, model_name, seed, skw, pkw, gkw in CASES:
    model, _ = load_model(Path(f"mlx-models/tests/models/{model_name}"))
    mx.random.seed(seed)
    sampler = make_sampler(**skw)
    procs = make_logits_processors(**pkw)
    ids, lps = [], []
    call = dict(gkw)
    if "rotating_cache" in call:
        n = call.pop("rotating_cache")
        call["prompt_cache"] = [RotatingKVCache(max_size=n, keep=4) for _ in model.layers]
    for tok, lp in generate_step(mx.array(PROMPT), model, max_tokens=STEPS, sampler=sampler,
                                 logits_processors=procs, **call):
        ids.append(int(tok))
        lps.append(lp)
    params = {"model": model_name, "seed": seed, "ids": ids}
    for k, v in {**skw, **pkw, **gkw}.items():
        if k == "logit_bias":
            params["bias_ids"] = list(v.keys())
            params["bias_values"] = [float(x) for x in v.values()]
        else:
            params[k] = v
    g.case(name, "generate", [mx.array(PROMPT)], lps, **params)

g.save()
