#!/bin/bash
# Device call 3 for the graph decoder (issue #15), after the thirds' calls 1 and 2
# (prepare_thirds.sh), carrying .gpu-t3/c, started as `source .gpu-t3/c/links.sh && bash
# .gpu-t3/c/ab/graph.sh`:
# 1. for each model of MODELS, `bench_generate --graph-check CHECK`: teacher-forced logits of
#    the graph decoder against the model's MLX forward on the GPU (one JSON line each in
#    $OUT/check.jsonl);
# 2. ab.sh with the modes in MODES_AB (default `graph auto`: the graph decoder and our
#    compiled MLX step) against mlx-lm, one round (set ROUNDS, TRIALS, BUDGET_S as for ab.sh).
#    GRAPH_EXTRA: more flags for the graph modes, say `--graph-breakdown 20`, whose parts are
#    printed at the end. TRACE=1: one step's timeline a graph mode, summarised at the end by
#    trace_summary.py.
set -x
G=${G:-.gpu-gpu/b}
source "$G/env.sh"
python3 -m pip install -q --no-index --no-deps --no-compile .gpu-t3/c/train/*.whl 2>&1 | tail -2
python3 -c 'import mlx.core as mx; print(mx.__version__, mx.default_device())' || exit 1
xz -d -k -f "$G/bench_generate.xz" && chmod +x "$G/bench_generate"
MODELS=${MODELS:-"llama-135m-q4 llama-135m-bf16 llama-8b-q4"}
CHECK=${CHECK:-48}
if [ "${SKIP_CHECK:-0}" != 1 ]; then
  for m in $MODELS; do
    python3 "$G/bench_models.py" /tmp/bench-models "$m" || continue
    { timeout "${CHECK_TIMEOUT:-240}" "$G/bench_generate" --model "/tmp/bench-models/$m" --dtype keep \
        --prompt-len "${PROMPT:-512}" --device gpu --graph-check "$CHECK" \
        | sed "s/^{/{\"name\": \"$m\", /"; } >> "$OUT/check.jsonl" 2>> "$OUT/check.err"
    echo "$m checked at ${SECONDS}s"
  done
  python3 - "$OUT/check.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line); c = r["graph_check"]
    print(r["name"], "max_rel", c["max_rel_diff"], "mean_rel", round(c["mean_rel_diff"], 5),
          "agree", c["greedy_agreement"], "ok", c["within_bounds"])
PY
  tail -5 "$OUT/check.err"
fi
# 3. (at the end) the cuda test set's graph_decode_cuda, if its stripped binary was carried as
#    graph_test.xz (SKIP_TEST=1 skips it): $OUT/graph_test.log.
run_test() {
  [ "${SKIP_TEST:-0}" = 1 ] || [ ! -f "$G/graph_test.xz" ] && return 0
  xz -d -k -f "$G/graph_test.xz" && chmod +x "$G/graph_test"
  timeout "${TEST_TIMEOUT:-120}" "$G/graph_test" > "$OUT/graph_test.log" 2>&1
  echo "graph_decode_cuda rc=$?"; tail -3 "$OUT/graph_test.log"
}
[ "${SKIP_AB:-0}" = 1 ] && { run_test; exit 0; }
MODELS="$MODELS" R1_MODES="${MODES_AB:-graph auto}" ROUNDS=${ROUNDS:-1} TRIALS=${TRIALS:-3} \
  bash "$G/ab.sh"
# The step's parts timed alone (GRAPH_EXTRA="--graph-breakdown N").
python3 - "$OUT/ab.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    for p in r.get("breakdown", []):
        print(r["name"], r["side"], p["part"], p["kernels"], "kernels", round(p["us"], 1), "us",
              round(p["gb_s"]), "GB/s")
PY
# One step's timeline a graph mode (TRACE=1), summarised.
for f in "$OUT"/trace-*.txt; do [ -f "$f" ] && python3 "$G/trace_summary.py" "$f"; done
run_test
