#!/bin/bash
# graph_decoder_follows_the_mlx_forward's gpt_oss rows with MLX_GRAPH_MV_BITS off and on, at once.
T=$OUT
if [ ! -x /opt/bin/graph_test ]; then
  OUT=$T PARTS=setup MODELS=llama-135m-bf16 WARM=" " BUDGET_S=100 bash .gpu/c/measure.sh > $T/setup.txt 2>&1
  mkdir -p /opt/bin && xz -dc .gpu/c/graph_test.xz > /opt/bin/graph_test && chmod +x /opt/bin/graph_test
fi
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH="$SITE/mlx/lib" MLXS_GPURT_CACHE=/tmp/gpurt-cache MLX_GRAPH_FOLLOW_ROWS=gpt_oss,gpt_oss_mxfp4
mkdir -p mlx-models/tests/models && tar xJf .gpu/c/fixtures.tar.xz -C mlx-models/tests/models
for b in 0 1; do
  (MLX_GRAPH_MV_BITS=$b timeout ${CAP:-150} /opt/bin/graph_test --test-threads 1 --nocapture --exact \
     graph_decoder_follows_the_mlx_forward > $T/oss-$b.log 2>&1
   echo "bits=$b rc $? at $SECONDS s: $(grep -h 'relative logit difference\|row gpt\|test result' $T/oss-$b.log | cut -c1-330)" | tee -a $T/sum.txt) &
done
wait
