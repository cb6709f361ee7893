#!/bin/bash
# CPU seconds of `mlx benchmark --decoder cpu` at 8 and 72 generated tokens: the difference / 64
# is the decoder's CPU time a decoded token (start-up, loading and prefill cancel out).

M=${M:-mlx}
for round in 1 2; do
for r in "$@"; do
  for g in 8 72; do
    /usr/bin/time -f "$r g=$g cpu %U %S wall %e" -a -o speed.txt $M benchmark --model $r --decoder cpu -p 32 -g $g -n 1 --threads ${T:-2} >> speed_out.txt 2>&1
    echo "load $(cut -d' ' -f1 /proc/loadavg)" >> speed.txt
  done
done
done
