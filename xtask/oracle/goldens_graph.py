"""Graph goldens: what mlx-lm 0.32.2's own `generate_step` evaluates, as primitive counts.

For each tiny fixture model (mlx-models/tests/models/NAME) `generate_step` runs on the CPU with
the greedy sampler, a PROMPT-token prompt, prefill_step_size 4 (so the prefill takes chunks)
and 3 new tokens, while `mx.eval` and `mx.async_eval` are wrapped to export each graph they are
given to DOT first (`mx.export_to_dot`): the prefill chunks' `mx.eval([c.state for c in
cache])` and each step's `mx.async_eval(y, logprobs)`. Each graph is recorded as a count of
primitive nodes per kind (the DOT labels). Ours (`mlx-engine/tests/graph_parity.rs`) records
the same through `GenerateOptions::eval_probe` and must build the same primitives: a lost
compile (an unfused activation), an extra cast, a dequantize in place of a quantized matmul, an
explicit mask where mlx-lm passes "causal", or an lm_head over the whole prompt would each show.
Writes mlx-engine/tests/goldens/graph.json. Run with `cargo xtask goldens graph`.
"""

import importlib
import io
import json
import re
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model

gen = importlib.import_module("mlx_lm.generate")

OUT = Path("mlx-engine/tests/goldens/graph.json")
# Every fixture of `mlx-cli/tests/goldens/cli_models.json` (one or more per served model_type)
# but olmo: mlx-lm's olmo needs the `ai2-olmo` package, not in the oracle venv.
# The prompt's ids fit the smallest fixture vocabulary (96).
MODELS = [
    "dense/apertus", "dense/cohere", "dense/cohere2", "dense/cohere2_f16", "dense/cohere_bias",
    "dense/ernie4_5", "dense/exaone", "dense/exaone4", "dense/exaone4_plain", "dense/gemma",
    "dense/gemma2", "dense/gemma2_bf16", "dense/gemma3_text", "dense/gemma3_text_q4",
    "dense/gemma3_wrapper", "dense/glm",
    "dense/glm4", "dense/glm4_bf16", "dense/gpt2", "dense/gpt2_hf", "dense/gpt_bigcode",
    "dense/gpt_bigcode_mha_bf16", "dense/gpt_neox", "dense/gpt_neox_hf",
    "dense/gpt_neox_sequential_q4", "dense/gptj", "dense/gptj_hf", "dense/granite",
    "dense/helium", "dense/hunyuan_v1_dense", "dense/hunyuan_v1_dense_plain", "dense/internlm2",
    "dense/internlm2_q4", "dense/internlm3", "dense/llama4_text", "dense/llama4_text_q4",
    "dense/mimo", "dense/minicpm", "dense/ministral3", "dense/ministral3_bf16",
    "dense/mistral3_wrapper", "dense/nanochat", "dense/nanochat_gqa_bf16", "dense/nemotron",
    "dense/olmo2",
    "dense/olmo2_bf16", "dense/olmo3", "dense/phi", "dense/phi3", "dense/phi3_partial",
    "dense/phi3_q4", "dense/phi_bf16", "dense/qwen2", "dense/qwen2_q4", "dense/qwen3",
    "dense/qwen3_bf16", "dense/seed_oss", "dense/smollm3", "dense/smollm3_q4",
    "dense/smollm3_sliding", "dense/spark2_5", "dense/stablelm",
    "dense/stablelm_parallel_qknorm", "dense/starcoder2",
    "dense/starcoder2_bf16", "dense/telechat3", "dense_bf16_mha", "dense_bf16_untied",
    "dense_f16", "dense_f32",
    "gemma4_text", "gemma4_text_bf16", "gemma4_text_kv_eq", "gpt_oss", "gpt_oss_q4",
    "gpt_oss_q8_bf16", "lfm2", "lfm2_bf16", "linear_rope_sliding", "mistral_bias_llama3rope",
    "mixtral", "olmoe", "olmoe_q8", "q4_g32", "q4_g64_untied", "q8_g32_bf16", "q8_g64",
    "qwen2_moe", "qwen3_5", "qwen3_5_bf16", "qwen3_5_moe", "qwen3_5_q4", "qwen3_moe",
    "qwen3_moe_q4", "qwen3_moe_q8_bf16", "qwen3_next", "yarn_rope",
]
PROMPT = [1, 17, 89, 5, 42, 42, 7, 70, 3, 64]
PREFILL_STEP = 4
MAX_TOKENS = 3
LABEL = re.compile(r'\[label ="([^"]*)", shape=rectangle\]')


def counts(arrays):
    buf = io.StringIO()
    mx.export_to_dot(buf, *arrays)
    out = {}
    for m in LABEL.finditer(buf.getvalue()):
        out[m.group(1)] = out.get(m.group(1), 0) + 1
    return dict(sorted(out.items()))


def arrays_of(args):
    return [a for _, a in tree_flatten(list(args)) if isinstance(a, mx.array)]


def capture(model):
    graphs = []
    real_eval, real_async = mx.eval, mx.async_eval

    def probe_eval(*args):
        graphs.append(["eval", counts(arrays_of(args))])
        return real_eval(*args)

    def probe_async(*args):
        graphs.append(["async_eval", counts(arrays_of(args))])
        return real_async(*args)

    mx.eval, mx.async_eval = probe_eval, probe_async
    try:
        prompt = mx.array(PROMPT, dtype=mx.int32)
        for _ in gen.generate_step(prompt, model, max_tokens=MAX_TOKENS,
                                   prefill_step_size=PREFILL_STEP):
            pass
    finally:
        mx.eval, mx.async_eval = real_eval, real_async
    # `mx.eval(y)` on the first token evaluates an array already scheduled: no graph.
    return [g for g in graphs if g[1]]


def main():
    mx.set_default_device(mx.cpu)
    out = {"prompt": PROMPT, "prefill_step_size": PREFILL_STEP, "max_tokens": MAX_TOKENS,
           "models": {}}
    for name in MODELS:
        model, _ = load_model(Path(f"mlx-models/tests/models/{name}"))
        out["models"][name] = capture(model)
    OUT.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")


main()
