#!/bin/bash
# s32, what ran (in order, each step waiting for its inputs). The rule: 6 decisions, each a
# group of 5 consecutive blocks (30 / 6), in order; each group keeps the candidate whose
# linears give the least whole-model loss on 2,048 held-out tokens (80 Days, 4 x 512), earlier
# groups at their choices and later ones at the first candidate (= `mlx convert
# --q-select-text`). Per block was planned; at load 300-500 a float32 forward of 2,048 tokens
# cost ~2 CPU-minutes (MLX matmul at 4.6 GFLOP per CPU-second), so 46 of them did not fit.
#   1. among seeds 0-2 (s30's encodes) and its perplexity on 4,096 / 16,384 Exodus tokens;
#   2. among seeds 3-5 (enc_seeds.sh), the same; the random-per-group control among 3-5;
#   3. the single seeds 3-5.
cd $(dirname $0)
source /work/oracle-venv/bin/activate
W=/tmp/trellis; F32=/work/trellis-models/smol-f32; HT=/tmp/trellis/heldout_80days.txt
G="--tokens 2048 --groups 6 --later first"
sel() { # NAME RULE SEEDS...
  n=$1; r=$2; shift 2
  [ -d $W/t3-$n-g80 ] || python greedy_select.py $F32 $HT $W/t3-$n-g80 greedy_$n.json $(for s in "$@"; do echo $W/t3-s$s-g80; done) $G --rule $r > greedy_$n.log 2>&1
}
sel gr012 greedy 0 1 2
./ppl.sh t3-gr012-g80; ./ppl.sh t3-gr012-g80 32
until [ -f $W/t3-s5-g80/config.json ]; do sleep 20; done
sel gr345 greedy 3 4 5
./ppl.sh t3-gr345-g80; ./ppl.sh t3-gr345-g80 32
for s in 3 4 5; do ./ppl.sh t3-s$s-g80; done
sel rnd345 random 3 4 5
./ppl.sh t3-rnd345-g80; ./ppl.sh t3-rnd345-g80 32
for s in 3 4 5; do ./ppl.sh t3-s$s-g80 32; done
echo chain done
