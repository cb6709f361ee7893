"""Batching and server goldens: what mlx-lm 0.32.2 generates (greedy) for the chat and completion requests
the mlx-engine batch tests and the mlx-server tests send, on the tiny seeded llama (mlx-models/tests/models/dense_f32) with the
character-level fixture tokenizer (mlx-engine/tests/fixtures/tiny_chat).

- `single`: each request alone through `stream_generate` (the chat template rendered by
  `apply_chat_template(add_generation_prompt=True)`, completions encoded with `encode`): the
  generated ids, text and finish reason. The server must return exactly these (L1).
- `batched`: the same prompts together through `batch_generate` (mlx-lm's left-padded
  BatchGenerator), to measure how often batched numerics change a greedy token in mlx-lm itself.

Writes mlx-engine/tests/goldens/batch.json. Run with `cargo xtask goldens batch`.
"""

import json
from pathlib import Path

import mlx.core as mx
from mlx_lm import batch_generate, load, stream_generate


MODEL = Path("mlx-engine/tests/fixtures/tiny_chat")
OUT = Path("mlx-engine/tests/goldens/batch.json")
MAX_TOKENS = 24

CHATS = [
    [{"role": "user", "content": "Hi there!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}],
    [{"role": "user", "content": "Count: 1 2 3"}],
    [{"role": "user", "content": "What is MLX?"}, {"role": "assistant", "content": "A library."},
     {"role": "user", "content": "For what?"}],
]
COMPLETIONS = ["Once upon a time", "The quick brown fox", "abc", "Hello, world"]

model, tokenizer = load(str(MODEL))

cases = []
for messages in CHATS:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    cases.append({"kind": "chat", "messages": messages, "prompt": list(ids)})
for text in COMPLETIONS:
    cases.append({"kind": "completion", "prompt_text": text, "prompt": tokenizer.encode(text)})

for c in cases:
    tokens, text, finish = [], "", None
    for r in stream_generate(model, tokenizer, mx.array(c["prompt"]), max_tokens=MAX_TOKENS):
        text += r.text
        if r.finish_reason is None or r.finish_reason == "length":
            # The final "length" response still carries the last token.
            if r.token is not None and r.token not in tokenizer.eos_token_ids:
                tokens.append(int(r.token))
        finish = r.finish_reason
    c["tokens"] = tokens
    c["text"] = text
    c["finish_reason"] = finish

batched = batch_generate(model, tokenizer, [c["prompt"] for c in cases], max_tokens=MAX_TOKENS,
                         return_token_ids=True)
for c, ids in zip(cases, batched.token_ids):
    c["batched_tokens"] = [int(t) for t in ids]

versions = f"mlx={mx.__version__} mlx_lm={__import__('mlx_lm').__version__}"
OUT.write_text(json.dumps({
    "__generator__": f"xtask/oracle/goldens_batch.py {versions}",
    "max_tokens": MAX_TOKENS,
    "cases": cases,
}, indent=1, ensure_ascii=False) + "\n")
