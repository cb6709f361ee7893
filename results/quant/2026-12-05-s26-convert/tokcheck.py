"""Tokenizer files on held-out tokenizer sources: `mlx_lm.convert` (in this process) against
`mlx convert`, `--dtype bfloat16`, for every tokenizer source x `tokenizer_class` x model type
(llama: the config's class is taken; qwen2: transformers forces Qwen2Tokenizer), every output
file compared whole. Sources: a byte-level BPE (mlx-train's dense fixture, compact JSON, no
post-processor), the tiny word-level tokenizer, the metaspace BPE of the llama tokenizer golden,
the byte-level BPE under Qwen2.5-style and Llama-3-style Hub configs (`qwen2_hub`, `llama3_hub`),
and (when TOKSRC holds them) SmolLM2's and Gemma 3's real tokenizers as `mlx convert` writes
them from their GGUF files (`mlx convert --hf-path X.gguf --mlx-path D`, then D's tokenizer
files copied to TOKSRC/smollm2, TOKSRC/gemma3). Run in the oracle venv:
python tokcheck.py MLX_BINARY OUT_DIR [CASE_SUBSTRING ...]."""
import os
import filecmp, json, shutil, subprocess, sys
from pathlib import Path
from mlx_lm.convert import convert as mlx_lm_convert
W = Path(__file__).resolve().parents[3]; MLX = sys.argv[1]; OUT = Path(sys.argv[2]); only = sys.argv[3:]
LLAMA = W / "mlx-cli/tests/convert/llama"; QWEN2 = W / "mlx-cli/tests/models/qwen2_f32"
SRCS = {"bytelevel": W / "mlx-train/tests/models/dense", "wordlevel": W / "mlx-cli/tests/models/tokenizer",
        "metaspace": W / "mlx-cli/tests/convert/tokenizers/llama",
        "qwen2_hub": W / "mlx-cli/tests/convert/tokenizers/qwen2_hub",
        "llama3_hub": W / "mlx-cli/tests/convert/tokenizers/llama3_hub",
        "smollm2": Path(os.environ.get("TOKSRC", "/nonexistent")) / "smollm2",
        "gemma3": Path(os.environ.get("TOKSRC", "/nonexistent")) / "gemma3"}
CLASSES = [None, "PreTrainedTokenizerFast", "Qwen2Tokenizer", "Qwen2TokenizerFast", "GPT2Tokenizer", "GPT2TokenizerFast",
           "LlamaTokenizer", "LlamaTokenizerFast", "GemmaTokenizer", "GemmaTokenizerFast", "Qwen3_5Tokenizer", "BertTokenizer"]
rows = []
for sname, sdir in SRCS.items():
    if not sdir.exists(): continue
    for cls in CLASSES:
        for mname, mdir in [("llama", LLAMA), ("qwen2", QWEN2)]:
            case = f"{sname}-{cls}-{mname}"
            if only and not any(o in case for o in only): continue
            st = OUT / "src" / case; shutil.rmtree(st, ignore_errors=True); shutil.copytree(mdir, st)
            for f in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]:
                (st / f).unlink(missing_ok=True)
                if (sdir / f).exists(): shutil.copy(sdir / f, st / f)
            if cls:
                tc = json.loads((st / "tokenizer_config.json").read_text()); tc["tokenizer_class"] = cls
                (st / "tokenizer_config.json").write_text(json.dumps(tc, indent=2))
            py, rs = OUT / "py" / case, OUT / "rs" / case
            for p in (py, rs): shutil.rmtree(p, ignore_errors=True); p.parent.mkdir(parents=True, exist_ok=True)
            try:
                mlx_lm_convert(str(st), str(py), dtype="bfloat16"); err = None
            except BaseException as e: err = f"{type(e).__name__}: {e}"
            b = subprocess.run([MLX, "convert", "--hf-path", str(st), "--mlx-path", str(rs), "--dtype", "bfloat16"], capture_output=True, text=True)
            note = [l for l in b.stderr.splitlines() if "tokenizer class" in l]
            if err: what = "mlx-lm fails: " + err[:120]
            elif b.returncode: what = "OURS FAILS: " + (b.stderr.strip().splitlines() or ["?"])[-1][:200]
            else:
                names = sorted(p.name for p in py.iterdir()); ours = sorted(p.name for p in rs.iterdir())
                diff = [n for n in names if n not in ours or not filecmp.cmp(py / n, rs / n, shallow=False)]
                diff += [f"+{n}" for n in ours if n not in names]
                what = ("equal" if not diff else "DIFFERS: " + ",".join(diff)) + (" (" + note[0].strip()[:80] + ")" if note else "")
            rows.append((case, what)); print(f"{case:55} {what}", flush=True)
print(sum(1 for r in rows if r[1].startswith("equal")), "equal of", len(rows))
