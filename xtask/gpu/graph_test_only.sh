#!/bin/bash
# The graph decoder's CUDA test set alone (no bench models): install MLX (CUDA) + the crt wheel,
# unpack the test binary and its fixtures, run it with a time cap. Tests run by name: the kernel
# cache, then the engine backend with seeded sampling on two rows (quick), then the long
# teacher-forced test over every row.
set -x
A=.gpu/a; C=.gpu/c
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python3 -m pip install -q --no-index --no-deps --no-compile $A/mlx-0.32.4-*.whl $A/nvidia_cuda_crt-*.whl
tar xJf $A/support.tar.xz -C "$SITE"
mkdir -p "$SITE/mlx/lib" && xz -dc $A/libmlx-sm90.so.xz > "$SITE/mlx/lib/libmlx.so"
export LD_LIBRARY_PATH="$SITE/mlx/lib"
mkdir -p /opt/bin && xz -dc $C/graph_test.xz > /opt/bin/graph_test && chmod +x /opt/bin/graph_test
mkdir -p mlx-models/tests/models && tar xJf $C/fixtures.tar.xz -C mlx-models/tests/models
export MLXS_GPURT_CACHE=/tmp/gpurt-cache
timeout ${TEST_S:-500} /opt/bin/graph_test --test-threads 1 --nocapture 2>&1 | tee $OUT/graph_test.log | tail -40
