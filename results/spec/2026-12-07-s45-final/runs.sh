#!/bin/bash
# Session 45: N idle-gated runs of the #33 CPU bench on main's release binary (two threads),
# each after s38's when_idle.sh; run i with --out run$i.md; the idle lines into idle.log.
cd "$(git rev-parse --show-toplevel)"
D=${D:-results/spec/2026-12-07-s45-final}  # session 46: D=results/spec/2026-12-07-s46-final
G=results/spec/2026-12-06-s38-specpolicy/when_idle.sh
for i in $(seq 1 ${N:-10}); do
  bash $G true >> $D/idle.log
  cargo xtask bench spec --cli --rounds 7 --bin /work/tgt-rel/release/mlx --out $D/run$i.md \
    > $D/run$i.log 2>&1
  grep -h "median over" $D/run$i.md | head -1
done
