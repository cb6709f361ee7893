#!/bin/bash
# The CPU emulator runs of this folder (section 3 of the README). Fixtures from
# `cargo run -p mlx-engine --example trellis_graph_fixture -- DIR BLOCK [CODE [VCODE]]` into /tmp/trelmix;
# main's kernels (d713014b) from `git show d713014b:mlx-kernels/src/F` into /tmp/trelmix/mainsrc;
# the mutation (the TRELLIS_V_L assignment deleted) in /tmp/trelmix/mut.
set -u
R=results/gpu/2026-12-06-s36-trelmix
PY=${MLX_ORACLE_VENV:-/work/oracle-venv}/bin/python
E=xtask/gpu/trellis_step_emulate.py
run() { local log=$1; shift; echo "\$ $*" > $R/$log; env "$@" >> $R/$log 2>&1; echo "rc=$?" >> $R/$log; tail -2 $R/$log; }
# 1. The hybrid (gauss7s L 12 blocks of 64, v_proj 1mad L 12), the host's lanes and one lane a row.
run emulate-step-hybrid.log $PY $E /tmp/trelmix/hy
run emulate-step-hybrid-lpr1.log TRELLIS_STEP_LPR=1 $PY $E /tmp/trelmix/hy
# 2. The mutation: trellis_qkv's v slice without TRELLIS_V_L (decodes v's 1mad words as gauss7s).
run emulate-step-hybrid-mutation.log TRELLIS_STEP_SRC=/tmp/trelmix/mut $PY $E /tmp/trelmix/hy
# Side check: gauss7s with 1mad8h value projections (two table codes in one launch; fixture
# `/tmp/trelmix/hy8h 64 gauss7s 1mad8h`).
run emulate-step-hybrid-1mad8h.log $PY $E /tmp/trelmix/hy8h
# 3. One-spec fixtures: this branch's kernels and main's, logits saved, compared bit for bit.
for f in g7 m32 m8h; do
  run emulate-step-$f-branch.log TRELLIS_STEP_SAVE=/tmp/trelmix/$f-branch.npy $PY $E /tmp/trelmix/$f
  run emulate-step-$f-main.log TRELLIS_STEP_SRC=/tmp/trelmix/mainsrc TRELLIS_STEP_SAVE=/tmp/trelmix/$f-main.npy $PY $E /tmp/trelmix/$f
  cmp /tmp/trelmix/$f-branch.npy /tmp/trelmix/$f-main.npy && echo "$f: branch and main logits bit-equal (cmp of the .npy files)" | tee -a $R/emulate-one-spec-cmp.txt
done
