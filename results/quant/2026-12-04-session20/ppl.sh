# usage: ppl.sh ROW...  (CPU decoder, L3)
M=/tmp/trellis/mlx1
R=/work/wt-trellis/results/quant
t() { local s=$(date +%s); "$@"; echo "$*: $(( $(date +%s) - s )) s, load $(cut -d' ' -f1 /proc/loadavg)" >> times.txt; }
for r in "$@"; do
  [ -s cpu_ppl_$r.json ] || t $M perplexity --model $r --data-path $R/exodus_kjv_1-16.txt --sequence-length 512 --num-samples 8 --batch-size 8 --seed 123 --json --decoder cpu > cpu_ppl_$r.json
done
