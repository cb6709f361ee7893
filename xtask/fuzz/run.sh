#!/usr/bin/env bash
# Runs fuzz campaigns from a bundle made by xtask/fuzz/bundle.sh, sharded over processes.
#
#   OUT=DIR ./run.sh [TARGET ...]           (default: every target)
#
# Environment: RUNS (inputs per target, default 1000000), START (first input, default 0),
# SEED (default 12), JOBS (processes, default nproc), SHARDS (shards per target, default
# JOBS), SECONDS_LIMIT (stop each shard after this long; what ran is still counted),
# MEM_KB (address-space limit per process, default 16 GiB: a runaway allocation aborts
# instead of exhausting the machine). Shard i of a target covers inputs
# [START + i*RUNS/SHARDS, START + (i+1)*RUNS/SHARDS) of SEED: disjoint, so a target's total is
# the sum of its shards. Logs go to $OUT/<target>.<start>.log, the summary to $OUT/summary.txt.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${OUT:?set OUT to a directory for the logs}"
mkdir -p "$OUT"
RUNS=${RUNS:-1000000}
START=${START:-0}
SEED=${SEED:-12}
JOBS=${JOBS:-$(nproc)}
SHARDS=${SHARDS:-$JOBS}
MEM_KB=${MEM_KB:-16777216}
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(config safetensors gguf tokenizer template prompt_cache argv)
fi
export LD_LIBRARY_PATH="$here/mlx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MLX_FUZZ_MODELS="$here/models"
export here OUT SEED MEM_KB
jobs_file=$OUT/jobs.txt
: > "$jobs_file"
for t in "${targets[@]}"; do
    for ((i = 0; i < SHARDS; i++)); do
        s=$((START + i * RUNS / SHARDS))
        e=$((START + (i + 1) * RUNS / SHARDS))
        [ "$e" -gt "$s" ] && echo "$t $s $((e - s))" >> "$jobs_file"
    done
done
shard() {
    local t=$1 s=$2 n=$3
    local work; work=$(mktemp -d "${TMPDIR:-/tmp}/mlx-fuzz-$t-$s.XXXX")
    local limit=()
    [ -n "${SECONDS_LIMIT:-}" ] && limit=(--seconds "$SECONDS_LIMIT")
    (
        ulimit -v "$MEM_KB"
        "$here/bin/mlx-fuzz" "$t" --seed "$SEED" --start "$s" --runs "$n" \
            --work "$work" "${limit[@]}" < /dev/null
    ) > "$OUT/$t.$s.log" 2>&1
    echo "exit $?" >> "$OUT/$t.$s.log"
    # Keep the work files of a crash (current.* holds its input).
    grep -q "^exit 0$" "$OUT/$t.$s.log" && rm -rf "$work"
}
export -f shard
export SECONDS_LIMIT="${SECONDS_LIMIT:-}"
xargs -P "$JOBS" -L 1 bash -c 'shard $0 $1 $2' < "$jobs_file"
# Summary: per target the executions (sum of the shards' disjoint ranges) and findings.
{
    echo "seed $SEED, inputs from $START, $RUNS per target in $SHARDS shards"
    for t in "${targets[@]}"; do
        total=0 findings=0 bad=0
        for f in "$OUT/$t".*.log; do
            [ -f "$f" ] || continue
            n=$(sed -n "s/^$t: \([0-9]*\) executions.*/\1/p" "$f" | tail -1)
            k=$(sed -n "s/^$t: .* \([0-9]*\) findings.*/\1/p" "$f" | tail -1)
            total=$((total + ${n:-0}))
            findings=$((findings + ${k:-0}))
            grep -q "^exit 0$" "$f" || bad=$((bad + 1))
        done
        echo "$t: $total executions, $findings findings, $bad shards failed"
    done
} | tee "$OUT/summary.txt"
