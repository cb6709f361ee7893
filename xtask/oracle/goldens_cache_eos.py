"""`mlx_lm.cache_prompt --eos-token TOKEN`, continued by `mlx_lm.generate --prompt-cache-file`,
for the `mlx` command's parity tests (mlx-lm 0.32.2's own entry points, run as
`python -m mlx_lm <tool>` from the repository root, on the dense_f32 fixture of
`goldens_cli.py`: its word-level tokenizer makes each word one token).

- A plain `cache_prompt` + `generate` first: the continuation without the option (recorded).
- The EOS token: the first word at least three tokens into that continuation that does not
  occur before it, so the continuation with the option stops there.
- `cache_prompt --eos-token WORD`: the cache file (mlx-cli/tests/goldens/prompt_cache_eos_dense
  .safetensors, its metadata's `tokenizer_config` `{"trust_remote_code": false, "eos_token":
  WORD}`), then `generate --prompt-cache-file` on it: the continued text and token count.
- The same with `--trust-remote-code` too: only the metadata string it writes (the file itself
  is not kept).

Goldens: mlx-cli/tests/goldens/cache_eos.json and the cache file. Run with
`cargo xtask goldens cache_eos`.
"""

import json
import sys
import tempfile

from mlx_lm.models.cache import load_prompt_cache

# goldens_cli.py's runner of `python -m mlx_lm <tool>` and its parser of generate's output
# (this script's folder is on the path when run).
from goldens_cli import mlx_lm, parse_generate

GOLDENS = "mlx-cli/tests/goldens"
MODEL = "mlx-cli/tests/models/dense_f32"
CACHED = "the cat and the dog"
PROMPT = "what is red ?"
MAX_TOKENS = "12"
FILE = f"{GOLDENS}/prompt_cache_eos_dense.safetensors"


def continue_cache(path):
    args = ["--model", MODEL, "--prompt-cache-file", path, "--prompt", PROMPT,
            "--max-tokens", MAX_TOKENS]
    return args, parse_generate(mlx_lm("generate", args))


def tokenizer_config(path):
    _, metadata = load_prompt_cache(path, return_metadata=True)
    return metadata["tokenizer_config"]


def main():
    out = {"generator": "xtask/oracle/goldens_cache_eos.py", "model": MODEL,
           "cached_prompt": CACHED}
    with tempfile.TemporaryDirectory() as tmp:
        plain = f"{tmp}/plain.safetensors"
        mlx_lm("cache_prompt", ["--model", MODEL, "--prompt", CACHED,
                                "--prompt-cache-file", plain])
        _, r = continue_cache(plain)
        out["plain"] = r
        words = r["text"].split(" ")
        word = next(w for i, w in enumerate(words) if i >= 3 and w not in words[:i])
        out["eos_token"] = word

        cache_args = ["--model", MODEL, "--prompt", CACHED, "--eos-token", word,
                      "--prompt-cache-file", FILE]
        mlx_lm("cache_prompt", cache_args)
        out["cache_prompt_args"] = cache_args
        out["file"] = FILE
        out["tokenizer_config"] = tokenizer_config(FILE)
        args, r = continue_cache(FILE)
        # It stops at the EOS word: the words before it, the EOS counted as a generated token.
        assert r["text"] == " ".join(words[:words.index(word)]), (r, words)
        out["args"] = args
        out.update(r)

        trusted = f"{tmp}/trusted.safetensors"
        args = ["--model", MODEL, "--prompt", CACHED, "--eos-token", word,
                "--trust-remote-code", "--prompt-cache-file", trusted]
        mlx_lm("cache_prompt", args)
        out["trust_remote_code"] = {"cache_prompt_args": args[:-2],
                                    "tokenizer_config": tokenizer_config(trusted)}
    path = f"{GOLDENS}/cache_eos.json"
    with open(path, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {path} and {FILE}", file=sys.stderr)


if __name__ == "__main__":
    main()
