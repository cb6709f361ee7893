cd /work/wt-bits
PY=/work/oracle-venv/bin/python
E="GRAPH_EMU_SKIP_SAMPLER=1"
run() { # name mask fixtures...
  local n=$1 m=$2; shift 2
  rm -rf /tmp/emu_$n; mkdir -p /tmp/emu_$n
  if [ -n "$m" ]; then env GRAPH_EMU_SKIP_SAMPLER=1 GRAPH_EMU_MV_BITS=$m GRAPH_EMU_DUMP=/tmp/emu_$n $PY xtask/gpu/graph_emulate.py "$@" > /tmp/emu_$n.log 2>&1
  else env GRAPH_EMU_SKIP_SAMPLER=1 GRAPH_EMU_DUMP=/tmp/emu_$n $PY xtask/gpu/graph_emulate.py "$@" > /tmp/emu_$n.log 2>&1; fi
  echo "== $n mask=$m rc=$? $(date +%T)"
}
run base "" q4:dense_bf16_untied dense_bf16_untied q8_g32_bf16 q4r8:make_qwen3_moe
run b4 0x10 q4:dense_bf16_untied
run b16 0x10000 dense_bf16_untied
run b8 0x100 q8_g32_bf16
run bmoe 0x110 q4r8:make_qwen3_moe
run wrong 0x100 q4:dense_bf16_untied
for n in b4 b16 b8 bmoe; do echo "-- compare base $n"; $PY xtask/gpu/dump_compare.py /tmp/emu_base /tmp/emu_$n 2>&1 | tail -4; done
echo done
