#!/bin/bash
# Mutations of MV_STEAL: each applied to graph_decode.cu, two fixtures run with the switch at
# RESIDENT=3 against the switch-off dumps (d_off), then the source restored.
cd /work/wt-steal
PY=/work/oracle-venv/bin/python
OUT=results/gpu/2026-12-06-s38-steal/emulator
export GRAPH_EMU_SKIP_SAMPLER=1 MLX_ORACLE_VENV=/work/oracle-venv
: > $OUT/mutation.txt
mut() { # name python-replace-old python-replace-new
  local n=$1
  python3 - "$2" "$3" <<'PY'
import sys
from pathlib import Path
p = Path("mlx-kernels/src/graph_decode.cu"); s = p.read_text()
assert s.count(sys.argv[1]) == 1, sys.argv[1]
p.write_text(s.replace(sys.argv[1], sys.argv[2]))
PY
  rm -rf /tmp/steal/d_$n; mkdir -p /tmp/steal/d_$n
  GRAPH_EMU_RESIDENT=3 GRAPH_EMU_STEAL=1 GRAPH_EMU_DUMP=/tmp/steal/d_$n nice -n 15 timeout 600 $PY xtask/gpu/graph_emulate.py dense_bf16_untied q4:dense_bf16_untied > /tmp/steal/$n.log 2>&1
  local rc=$?
  git checkout -q mlx-kernels/src/graph_decode.cu
  { echo "== $n: $2  ->  $3"; echo "emulator rc $rc"
    grep -h "^steal\|greedy agreement" /tmp/steal/$n.log | grep -v "route\|tile" | cut -c1-160
    $PY xtask/gpu/dump_compare.py /tmp/steal/d_off /tmp/steal/d_$n | grep -v "^only in the reference"; echo "compare rc ${PIPESTATUS[0]}"; } >> $OUT/mutation.txt 2>&1
}
mut m1_sums_static '#define MV_NEXT_GROUP(p) m.pop()' '#define MV_NEXT_GROUP(p) (m.pop(), (p) + m.stride)'
mut m2_no_reset 'if (lane == 0 && (ll)t == rest + stride - 1) atomicExch(&mv_steal_ctr, 0u);' 'if (lane == 0 && (ll)t == rest + stride - 1) {}'
mut m3_base_plus1 'base = (int)(lp - lp0 + stride);' 'base = (int)(lp - lp0 + stride + 1);'
echo mut-done >> $OUT/mutation.txt
