#!/bin/bash
# Issue #35's bench in ONE device call on the 2-GPU kind (`kind: nvidia-h200-x2`), from the
# bundle `prepare_product.sh` makes (the lead's): `.gpu/a` (libmlx-sm90.so.xz, support.tar.xz,
# the mlx cp312 and mlx-lm wheels, tok.tar.xz, bench_models.py; the nvidia-cuda-crt wheel if
# present there or in .gpu/w) and `.gpu/c/mlx.xz` (release `mlx`, `--features cuda`). Only those
# files are read: leave graph_test.xz and fixtures.tar.xz out of the carry if space is short.
#
#   run(kind="nvidia-h200-x2", carry=[".gpu/a", ".gpu/c", ".gpu/w"], timeout_s=600,
#       command="bash xtask/gpu/dist_bench.sh")
#
# In order, each step bounded by `timeout` and by what is left of BUDGET_S (default 560 s of
# the call's 600), logs and a summary under $OUT:
#  1. setup: the wheels into the image's venv, libmlx and its support files, the 8B-shaped bf16
#     llama (bench_models.py `llama-8b-bf16`, 16 GB, with the Llama 3 tokenizer) under /opt;
#  2. `mlx launch -n 2 --backend nccl --check` (the group forms over NCCL), `ldd` of libmlx;
#  3. ROUNDS rounds alternating `mlx benchmark` on one GPU, `mlx launch -n 2 --backend nccl --
#     benchmark` (tensor parallel) and mlx-lm's `mlx_lm benchmark` under `mlx.launch -n 2
#     --backend nccl` (its sharded_load), prompt P, generation G, N trials;
#  4. LoRA (rank 8, NUM_LAYERS layers, batch BATCH, LORA_ITERS iterations, sequences of about
#     SEQ tokens): `mlx train` on one GPU, `mlx launch -n 2 --backend nccl -- train`
#     (data-parallel, gradients averaged) and `mlx_lm.lora` under `mlx.launch -n 2 --backend
#     nccl`; their `Tokens/sec` reports;
#  5. summary.txt: per side the medians of prompt/generation tok/s and of LoRA tokens/s, with
#     the ratios the issue's targets name (tp2 / one >= 1.5, tp2 / mlx-lm tp2 >= 1, LoRA dp2 /
#     one >= 1.8).
#
# DRY=1 runs the same steps on this CPU machine, without a GPU (a check of the script, not a
# measurement): the ring backend instead of NCCL, the debug `mlx` of $CARGO_TARGET_DIR, the
# oracle venv's python ($MLX_ORACLE_VENV), the tiny fixture mlx-cli/tests/models/dense_f32,
# short runs; OUT defaults to target/dist-bench-dry.
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-560}
ROUNDS=${ROUNDS:-2}
DRY=${DRY:-0}
if [ "$DRY" = 1 ]; then
  : "${OUT:=target/dist-bench-dry}"
  MLX=${MLX:-${CARGO_TARGET_DIR:-target}/debug/mlx}
  PY=${MLX_ORACLE_VENV:-/work/oracle-venv}/bin/python
  BACKEND=ring
  M=${MODEL_DIR:-mlx-cli/tests/models/dense_f32}
  P=${P:-16} G=${G:-4} N=${N:-1}
  LORA_ITERS=${LORA_ITERS:-2} BATCH=${BATCH:-2} SEQ=${SEQ:-24} NUM_LAYERS=${NUM_LAYERS:-2}
  export MLX_DEVICE=cpu
else
  A=.gpu/a C=.gpu/c
  MLX=/opt/bin/mlx
  PY=python3
  BACKEND=nccl
  M=${MODEL_DIR:-/opt/models/${MODEL:-llama-8b-bf16}}
  P=${P:-512} G=${G:-128} N=${N:-2}
  LORA_ITERS=${LORA_ITERS:-12} BATCH=${BATCH:-4} SEQ=${SEQ:-512} NUM_LAYERS=${NUM_LAYERS:-16}
fi
: "${OUT:?the device tool sets OUT}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
LOG=$OUT/dist_bench.log

left() { echo $((BUDGET_S - ($(date +%s) - T0))); }
# step NAME LIMIT_S CMD...: runs CMD under min(LIMIT_S, budget left), its output into
# $OUT/NAME.log (appended) and the tail on the console; skipped once the budget is spent.
step() {
  local name=$1 limit=$2
  shift 2
  local l
  l=$(left)
  if [ "$l" -le 5 ]; then
    echo "== $name: skipped, budget spent" | tee -a "$LOG"
    return 124
  fi
  [ "$limit" -gt "$l" ] && limit=$l
  echo "== $name (limit ${limit} s, $(($(date +%s) - T0)) s in)" | tee -a "$LOG" "$OUT/$name.log"
  timeout -k 5 "$limit" "$@" >>"$OUT/$name.log" 2>&1
  local rc=$?
  grep -v '^== ' "$OUT/$name.log" | tail -4
  echo "== $name rc=$rc" | tee -a "$LOG"
  return $rc
}

# mlx.launch runs python on each rank (its console script may be absent after `pip --no-deps`);
# an array, not a function, so that `timeout` can run it.
MLX_LAUNCH=("$PY" -c 'import sys; from mlx._distributed_utils.launch import main; sys.argv[0] = "mlx.launch"; sys.exit(main())')

# 1. Setup.
if [ "$DRY" != 1 ]; then
  setup() {
    set -e
    SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    python3 -m pip install -q --no-index --no-deps --no-compile $A/mlx-0.32.4-*.whl $A/mlx_lm-0.32.2-*.whl
    tar xJf $A/support.tar.xz -C "$SITE"
    mkdir -p "$SITE/mlx/lib" /opt/bin
    xz -dc $A/libmlx-sm90.so.xz > "$SITE/mlx/lib/libmlx.so"
    for w in $A/nvidia_cuda_crt-*.whl .gpu/w/nvidia_cuda_crt-*.whl; do
      if [ -f "$w" ]; then python3 -m pip install -q --no-index --no-deps --no-compile "$w"; break; fi
    done
    xz -dc $C/mlx.xz > $MLX && chmod +x $MLX
    nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv
    mkdir -p /opt/models /opt/tok && tar xJf $A/tok.tar.xz -C /opt/tok
    python3 $A/bench_models.py /opt/models "$(basename "$M")"
    cp /opt/tok/tokenizer*.json "$M/"
    ls -la "$M"
  }
  step setup 240 bash -c "$(declare -f setup); A=$A C=$C MLX=$MLX M=$M; setup" || {
    echo "setup failed: see $OUT/setup.log"; exit 1; }
  SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  export LD_LIBRARY_PATH="$SITE/mlx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  ldd "$SITE/mlx/lib/libmlx.so" | grep -i nccl | tee "$OUT/nccl.log"
fi
"$MLX" --version | tee -a "$LOG"

# 2. The group forms.
step check 60 "$MLX" launch -n 2 --backend $BACKEND --timeout 50 --check
cat "$OUT/check.log"

# 3. Inference: one GPU, tensor parallel over 2, mlx-lm's sharded run over 2.
BENCH="-p $P -g $G -n $N"
for r in $(seq "$ROUNDS"); do
  step "bench_one_$r" 120 "$MLX" benchmark --model "$M" $BENCH --json --decoder mlx
  step "bench_tp2_$r" 150 "$MLX" launch -n 2 --backend $BACKEND --timeout 120 -- \
    benchmark --model "$M" $BENCH --json --decoder mlx
  step "bench_mlxlm_tp2_$r" 150 "${MLX_LAUNCH[@]}" -n 2 --backend $BACKEND --python "$PY" -- \
    -m mlx_lm benchmark --model "$M" $BENCH
done

# 4. LoRA: one GPU, data-parallel over 2 (ours, mlx-lm's).
DATA=$OUT/lora_data
"$PY" - "$DATA" "$SEQ" <<'PY'
import json, os, random, sys
out, seq = sys.argv[1], int(sys.argv[2])
os.makedirs(out, exist_ok=True)
rng = random.Random(35)
words = "the of and to in is was for on that with as by at from it an be this are or which".split()
words += [f"w{i}" for i in range(200)]
def line():
    # About `seq` tokens: ~1.3 tokens a word with this vocabulary.
    return {"text": " ".join(rng.choice(words) for _ in range(int(seq / 1.3)))}
for name, n in (("train", 64), ("valid", 8)):
    with open(os.path.join(out, f"{name}.jsonl"), "w") as f:
        for _ in range(n):
            f.write(json.dumps(line()) + "\n")
PY
LORA="--model $M --train --data $DATA --iters $LORA_ITERS --batch-size $BATCH \
  --num-layers $NUM_LAYERS --max-seq-length $((SEQ + 64)) --steps-per-report $(( LORA_ITERS > 4 ? LORA_ITERS / 3 : 1 )) \
  --steps-per-eval 100000 --val-batches 1 --seed 0"
step lora_one 150 "$MLX" train $LORA --adapter-path "$OUT/adapters_one"
step lora_dp2 150 "$MLX" launch -n 2 --backend $BACKEND --timeout 120 -- \
  train $LORA --adapter-path "$OUT/adapters_dp2"
step lora_mlxlm_dp2 150 "${MLX_LAUNCH[@]}" -n 2 --backend $BACKEND --python "$PY" -- \
  -m mlx_lm lora $LORA --adapter-path "$OUT/adapters_mlxlm_dp2"

# 5. Summary.
python3 - "$OUT" "$ROUNDS" <<'PY' | tee "$OUT/summary.txt"
import json, re, statistics, sys
from pathlib import Path
out, rounds = Path(sys.argv[1]), int(sys.argv[2])
def med(v):
    return statistics.median(v) if v else float("nan")
def bench(side):
    pp, tg = [], []
    for r in range(1, rounds + 1):
        f = out / f"bench_{side}_{r}.log"
        if not f.exists():
            continue
        # Per-trial figures only (ours --json: {"trial": i, "prompt_tps": ...}; mlx-lm:
        # "Trial i:  prompt_tps=..., generation_tps=..."), not the averages lines.
        for line in f.read_text(errors="replace").splitlines():
            if "verages" in line:
                continue
            for key, dst in (("prompt_tps", pp), ("generation_tps", tg)):
                m = re.search(r'"?' + key + r'"?\s*[:=]\s*([0-9.]+)', line)
                if m:
                    dst.append(float(m.group(1)))
    return med(pp), med(tg)
def lora(side):
    f = out / f"lora_{side}.log"
    if not f.exists():
        return float("nan")
    t = re.sub(r"\x1b\[[0-9;]*m", "", f.read_text(errors="replace"))
    # ours: "Iter N: ... Tokens/sec X"; mlx_lm.lora 0.32.2's table: "iter train_loss tok/s tokens"
    # rows such as "     2    5.096 ▲      290      0.1k".
    v = [float(x) for x in re.findall(r"Tokens/sec[ :]+([0-9.]+)", t)]
    v += [float(m.group(1).replace(",", "")) for m in re.finditer(r"(?m)^\s*\d+\s+[0-9.]+\s+\S?\s*([0-9.,]+)\s+[0-9.]+k\s*$", t)]
    return med(v[1:] if len(v) > 1 else v)  # the first report holds the warm-up
rows = {s: bench(s) for s in ("one", "tp2", "mlxlm_tp2")}
print("side          prompt tok/s  generation tok/s  (medians over rounds and trials)")
for s, (pp, tg) in rows.items():
    print(f"{s:12s}  {pp:12.1f}  {tg:16.1f}")
one, tp2, ref = rows["one"][1], rows["tp2"][1], rows["mlxlm_tp2"][1]
print(f"decode tp2 / one: {tp2 / one:.2f} (target >= 1.5); tp2 / mlx-lm tp2: {tp2 / ref:.2f} (target >= 1)")
l = {s: lora(s) for s in ("one", "dp2", "mlxlm_dp2")}
print("LoRA tokens/s: " + ", ".join(f"{s} {v:.1f}" for s, v in l.items()))
print(f"LoRA dp2 / one: {l['dp2'] / l['one']:.2f} (target >= 1.8); dp2 / mlx-lm dp2: {l['dp2'] / l['mlxlm_dp2']:.2f}")
PY
echo "dist-bench-done in $(($(date +%s) - T0)) s" | tee -a "$LOG"
