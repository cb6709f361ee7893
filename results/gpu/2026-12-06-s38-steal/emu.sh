#!/bin/bash
# The emulator runs of results/gpu/2026-12-06-s38-steal (one at a time, nice 15).
cd /work/wt-steal
PY=/work/oracle-venv/bin/python
OUT=results/gpu/2026-12-06-s38-steal/emulator
F="dense_bf16_mha dense_bf16_untied q8_g32_bf16 q4:dense_bf16_untied make_llama3 q4:make_qwen3 make_olmo2 make_gemma3 make_qwen3_moe q4:make_qwen3_moe"
export GRAPH_EMU_SKIP_SAMPLER=1 MLX_ORACLE_VENV=/work/oracle-venv
run() { # name env...
  local n=$1; shift
  rm -rf /tmp/steal/d_$n; mkdir -p /tmp/steal/d_$n
  env "$@" GRAPH_EMU_DUMP=/tmp/steal/d_$n nice -n 15 $PY xtask/gpu/graph_emulate.py $FIX > $OUT/$n.log 2>&1
  echo "$n rc $?" >> $OUT/rc.txt
}
: > $OUT/rc.txt
FIX=$F run off GRAPH_EMU_RESIDENT=3
FIX=$F run on GRAPH_EMU_RESIDENT=3 GRAPH_EMU_STEAL=1 GRAPH_EMU_STEAL_SEED=1
FIX=$F run off_r1 GRAPH_EMU_RESIDENT=1
FIX=$F run on_r1 GRAPH_EMU_RESIDENT=1 GRAPH_EMU_STEAL=1 GRAPH_EMU_STEAL_SEED=7
FIX="q4:dense_bf16_untied make_llama3 q4:make_qwen3_moe" run off_nb3 GRAPH_EMU_NB=3
FIX="q4:dense_bf16_untied make_llama3 q4:make_qwen3_moe" run on_nb3 GRAPH_EMU_NB=3 GRAPH_EMU_STEAL=1 GRAPH_EMU_STEAL_SEED=3
{
for pair in "off on" "off_r1 on_r1" "off_nb3 on_nb3"; do set -- $pair
  echo "== $1 vs $2"; $PY xtask/gpu/dump_compare.py /tmp/steal/d_$1 /tmp/steal/d_$2; echo "rc $?"
done
} > $OUT/compare.txt 2>&1
