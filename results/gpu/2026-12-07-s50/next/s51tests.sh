#!/bin/bash
# graph_decode_cuda's eleven tests under MLX_GRAPH_MV_BITS=1, at once, each capped at 400 s.
T=$OUT
if [ ! -x /opt/bin/graph_test ]; then
  OUT=$T PARTS=setup MODELS=llama31-8b-q4 WARM=" " BUDGET_S=150 bash .gpu/c/measure.sh > $T/setup.txt 2>&1
  mkdir -p /opt/bin && xz -dc .gpu/c/graph_test.xz > /opt/bin/graph_test && chmod +x /opt/bin/graph_test
fi
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH="$SITE/mlx/lib" MLXS_GPURT_CACHE=/tmp/gpurt-cache MLX_GRAPH_MV_BITS=1
mkdir -p mlx-models/tests/models && tar xJf .gpu/c/fixtures.tar.xz -C mlx-models/tests/models
for t in graph_decoder_follows_the_mlx_forward engine_backend_seeded_sampling_first \
  compiled_kernels_are_cached_on_disk batched_equals_single wide_tiles_equal_narrow_tiles \
  verify_equals_single_steps graph_speculative_equals_plain attn_combine_in_output_is_bit_equal \
  the_dense_prompt_follows_the_exact_prompt trellis_chat_keeps_its_decoder \
  persistent_step_equals_the_kernels; do
  (timeout ${CAP:-400} /opt/bin/graph_test --test-threads 1 --nocapture --exact $t > $T/$t.log 2>&1
   echo "$t rc $? at $SECONDS s: $(grep -h 'test result' $T/$t.log)" | tee -a $T/sum.txt) &
done
wait
cd $T && tar czf logs.tgz *.log && rm -f *.log
