#!/bin/bash
# The persistent step on the CPU emulator (xtask/gpu/graph_emulate.py), here, no GPU:
# whole steps' logits with GRAPH_EMU_PERSIST=1 against the kernels (the switch off), bit for bit
# (GRAPH_EMU_DUMP + xtask/gpu/dump_compare.py), for the attention combined by attention's last
# block (the device's default) and by the output projection (the emulator's default), grids of
# 4 and 7 blocks, the barrier's release/acquire variant (GRAPH_EMU_PERSIST=2); then two
# mutations the comparison must catch.
#   MLX_ORACLE_VENV=/work/oracle-venv bash results/gpu/2026-12-06-s40-persist/emu.sh
set -u
cd "$(dirname "$0")/../../.."
R=results/gpu/2026-12-06-s40-persist
PY=${MLX_ORACLE_VENV:-/work/oracle-venv}/bin/python
FIX="dense_bf16_mha dense_bf16_untied q4:dense_bf16_untied"
T=${TMPDIR:-/tmp}/s40emu
rm -rf $T && mkdir -p $T
run() {  # tag, env...
  local tag=$1; shift
  mkdir -p $T/$tag
  env GRAPH_EMU_SKIP_SAMPLER=1 GRAPH_EMU_MV_ASYNC=1 GRAPH_EMU_DUMP=$T/$tag "$@" \
    nice -n 15 $PY xtask/gpu/graph_emulate.py $FIX > $R/emu_$tag.log 2>&1
  echo "$tag rc=$?" | tee -a $R/emu_$tag.log
}
cmp() {  # ref, new, out
  $PY xtask/gpu/dump_compare.py $T/$1 $T/$2 > $R/emu_compare_$3.txt 2>&1
  echo "compare $1 $2 rc=$?" | tee -a $R/emu_compare_$3.txt
}
run off_attn GRAPH_EMU_ATTN_COMBINE=attention
run on_attn GRAPH_EMU_ATTN_COMBINE=attention GRAPH_EMU_PERSIST=1
cmp off_attn on_attn attn
run on_attn_g7 GRAPH_EMU_ATTN_COMBINE=attention GRAPH_EMU_PERSIST=1 GRAPH_EMU_PERSIST_GRID=7
cmp off_attn on_attn_g7 attn_g7
run on_attn_ra GRAPH_EMU_ATTN_COMBINE=attention GRAPH_EMU_PERSIST=2
cmp off_attn on_attn_ra attn_ra
run off_out
run on_out GRAPH_EMU_PERSIST=1
cmp off_out on_out out
run mut_skip GRAPH_EMU_ATTN_COMBINE=attention GRAPH_EMU_PERSIST=1 GRAPH_EMU_PERSIST_MUTATE=skip
cmp off_attn mut_skip mut_skip
run mut_barrier GRAPH_EMU_ATTN_COMBINE=attention GRAPH_EMU_PERSIST=1 GRAPH_EMU_PERSIST_MUTATE=barrier
cmp off_attn mut_barrier mut_barrier
# More rows the persistent step takes (q/k/v biases and a tied head: q4:make_qwen2; llama3 RoPE:
# make_llama3), and one it does not (make_qwen3: q/k norms, the kernels either way).
FIX="q4:make_qwen2 make_llama3 make_qwen3"
run off_more GRAPH_EMU_ATTN_COMBINE=attention
run on_more GRAPH_EMU_ATTN_COMBINE=attention GRAPH_EMU_PERSIST=1
cmp off_more on_more more
