"""End-to-end check of the "done when" of issue 14: `mlx generate --model DIR --prompt-ids ...
--top-logprobs 5 --json` on each tiny seeded model of `goldens_models.py` against mlx-lm's own
`generate_step` (greedy ids, chosen log-probabilities, per-step top-5 ids and log-probabilities,
compared exactly). Not a golden set (it needs the built `mlx` binary): run it by hand in the
oracle venv after `cargo build -p mlx-cli`:

    python xtask/oracle/check_cli_generate.py ROW [ROW ...]

A WordLevel tokenizer over `t0`..`t127` is written beside each copied model (ids are what is
compared; mlx-lm's side needs no tokenizer).
"""
import json, subprocess, shutil, sys, os
from pathlib import Path
import mlx.core as mx
from mlx_lm.utils import load_model
from mlx_lm.generate import generate_step

ROOT = Path(__file__).resolve().parents[2]
WORK = Path(os.environ.get("TMPDIR", "/tmp")) / "mlx-check-cli"
PROMPT = [(7 * i + 3) % 128 for i in range(40)]


def write_tokenizer(d):
    vocab = {f"t{i}": i for i in range(128)}
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
        "decoder": None, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"},
    }
    (d / "tokenizer.json").write_text(json.dumps(tok))
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))

rows = sys.argv[1:]
for name in rows:
    d = WORK / name
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(ROOT / "mlx-models/tests/models" / name, d)
    write_tokenizer(d)
    out = subprocess.run(
        [str(ROOT / "target/debug/mlx"), "generate", "--model", str(d), "--prompt-ids",
         ",".join(map(str, PROMPT)), "--max-tokens", "8", "--top-logprobs", "5", "--json", "--decoder", "mlx"] + (["--dtype", "bf16"] if "bf16" in name else []),
        capture_output=True, text=True, env={**os.environ, "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH", "")})
    if out.returncode != 0:
        print(name, "CLI failed:", out.stderr[-500:]); continue
    ours = json.loads(out.stdout)
    model, _ = load_model(d)
    toks, tops = [], []
    for (tok, lp), _ in zip(generate_step(mx.array(PROMPT), model, max_tokens=8), range(8)):
        toks.append(int(tok))
        order = mx.argsort(-lp)[:5].tolist()
        tops.append([[i, lp[i].item()] for i in order])
    same_ids = ours["tokens"] == toks
    same_top = ours["top_logprobs"] == tops
    same_lp = ours["logprobs"] == [t[0][1] if t[0][0] == k else None for t, k in zip(tops, toks)]
    print(f"{name}: greedy ids equal={same_ids} top-5 (ids and log-probs) equal={same_top} chosen logprobs equal={same_lp}")
    if not same_top:
        print("  ours", ours["top_logprobs"][0], "\n  mlx-lm", tops[0])
