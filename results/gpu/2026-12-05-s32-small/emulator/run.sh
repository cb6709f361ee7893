#!/bin/bash
# Both paths of the attention's combine on the emulator, dumps compared after.
cd /work/wt-gpu135
PY=/work/oracle-venv/bin/python
FIX="dense_bf16_mha dense_bf16_untied q8_g32_bf16 q4:dense_bf16_untied make_qwen2 q4:make_qwen3 make_gemma2 make_granite q4:make_qwen3_moe"
for path in output attention; do
  d=/tmp/gpu135/emu/p150-$path; rm -rf $d; mkdir -p $d
  GRAPH_EMU_ATTN_COMBINE=$path GRAPH_EMU_SKIP_SAMPLER=1 GRAPH_EMU_DUMP=$d $PY xtask/gpu/graph_emulate.py $FIX > /tmp/gpu135/emu/p150-$path.log 2>&1
  echo "p150 $path rc=$?" >> /tmp/gpu135/emu/status
done
for path in output attention; do
  d=/tmp/gpu135/emu/p800-$path; rm -rf $d; mkdir -p $d
  GRAPH_EMU_PROMPT=800 GRAPH_EMU_ATTN_COMBINE=$path GRAPH_EMU_SKIP_SAMPLER=1 GRAPH_EMU_DUMP=$d $PY xtask/gpu/graph_emulate.py dense_bf16_untied q4:dense_bf16_untied make_gemma2 > /tmp/gpu135/emu/p800-$path.log 2>&1
  echo "p800 $path rc=$?" >> /tmp/gpu135/emu/status
done
