"""Held-out sweep: `mlx convert` against mlx-lm's `convert` (called in this process, as
`python -m mlx_lm convert` calls it) on the first float tiny fixture of each model type under
mlx-models/tests/models, each staged beside the tiny tokenizer, with `-q --q-group-size 32` and
with `--dtype bfloat16`; every output file compared whole (filecmp). Run in the oracle venv:
python sweep.py MLX_BINARY OUT_DIR."""
import filecmp
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MLX, OUT = sys.argv[1], Path(sys.argv[2])
TOK = ROOT / "mlx-cli" / "tests" / "models" / "tokenizer"
ARGS = {"q4_g32": ["-q", "--q-group-size", "32"], "bf16": ["--dtype", "bfloat16"]}
from mlx_lm.convert import convert as mlx_lm_convert  # noqa: E402

KW = {"q4_g32": dict(quantize=True, q_group_size=32), "bf16": dict(dtype="bfloat16")}
rows, seen = [], set()
for cfg in sorted((ROOT / "mlx-models" / "tests" / "models").rglob("config.json")):
    d = cfg.parent
    if d.is_symlink() or not list(d.glob("model*.safetensors")):
        continue
    c = json.loads(cfg.read_text())
    if "quantization" in c or "quantization_config" in c or c.get("model_type") in seen:
        continue
    seen.add(c.get("model_type"))
    rel = str(d.relative_to(ROOT / "mlx-models" / "tests" / "models"))
    stage = OUT / "src" / rel.replace("/", "__")
    if not stage.exists():
        shutil.copytree(d, stage)
        for f in ["tokenizer.json", "tokenizer_config.json"]:
            if not (stage / f).exists():
                shutil.copy(TOK / f, stage / f)
    for tag, args in ARGS.items():
        py, rs = OUT / "py" / tag / stage.name, OUT / "rs" / tag / stage.name
        for p in (py, rs):
            shutil.rmtree(p, ignore_errors=True)
            p.parent.mkdir(parents=True, exist_ok=True)
        print(f"{rel} {tag} ...", file=sys.stderr, flush=True)
        shutil.rmtree(py, ignore_errors=True)
        try:
            mlx_lm_convert(str(stage), str(py), **KW[tag])
            a = subprocess.CompletedProcess([], 0, "", "")
        except BaseException as e:  # noqa: BLE001
            a = subprocess.CompletedProcess([], 1, "", f"{type(e).__name__}: {e}")
        b = subprocess.run([MLX, "convert", "--hf-path", str(stage), "--mlx-path", str(rs), *args],
                           capture_output=True, text=True)
        if a.returncode != 0:
            what = "mlx-lm fails: " + (a.stderr.strip().splitlines() or ["?"])[-1][:150]
        elif b.returncode != 0:
            what = "OURS FAILS: " + (b.stderr.strip().splitlines() or ["?"])[-1][:200]
        else:
            names = sorted(p.name for p in py.iterdir())
            ours = sorted(p.name for p in rs.iterdir())
            diff = [n for n in names if n not in ours or not filecmp.cmp(py / n, rs / n, shallow=False)]
            diff += [f"+{n}" for n in ours if n not in names]
            what = "equal" if not diff else "DIFFERS: " + ",".join(diff)
        rows.append((rel, tag, what))
        print(f"{rel:40} {tag:7} {what}", flush=True)
ok = sum(1 for r in rows if r[2] == "equal")
print(f"{ok} equal of {len(rows)}; {sum(1 for r in rows if r[2].startswith('mlx-lm fails'))} mlx-lm itself fails")
