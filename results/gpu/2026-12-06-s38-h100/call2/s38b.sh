#!/bin/bash
# Session 38 call 2: (1) gpt_oss follow rows with the reference also on MLX's CPU (which side
# is off at step 8); (2) MLX_GRAPH_MMA_BANKS=1's bit tests (batched rows against single rows,
# wide tiles against narrow).
PARTS="setup" MODELS="llama-135m-bf16" BUDGET_S=150 TAG=setup bash .gpu/c/measure.sh
mkdir -p $OUT/s && mv $OUT/*.log $OUT/*.tgz $OUT/s/ 2>/dev/null
MLX_GRAPH_GPT_OSS=1 MLX_GRAPH_FOLLOW_CPU=1 PARTS="test" TESTS=graph_decoder_follows_the_mlx_forward \
  MLX_GRAPH_FOLLOW_ROWS=gpt_oss,gpt_oss_mxfp4 TEST_S=200 BUDGET_S=220 TAG=gptoss bash .gpu/c/measure.sh
mkdir -p $OUT/g && mv $OUT/*.log $OUT/*.tgz $OUT/g/ 2>/dev/null
MLX_GRAPH_MMA_BANKS=1 PARTS="test" TESTS="batched_equals_single wide_tiles_equal_narrow_tiles" \
  TEST_S=$((580 - SECONDS)) BUDGET_S=$((585 - SECONDS)) TAG=banks bash .gpu/c/measure.sh
mkdir -p $OUT/b && mv $OUT/*.log $OUT/*.tgz $OUT/b/ 2>/dev/null
echo s38b-done at $SECONDS
