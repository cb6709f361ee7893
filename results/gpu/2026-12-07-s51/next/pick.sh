#!/bin/bash
# The next session's first call: #30's product table (`h200_rows.sh`: `mlx benchmark` beside
# `mlx_lm benchmark` on the 8B, Qwen3-8B and 135M shapes, the copy bandwidth, then the MoE) with
# session 50's defaults (MLX_GRAPH_MV_BITS on, the late norm's level 1). Its targets are H200
# figures; on an H100 it still updates the table (the copy-bandwidth shares, Qwen3-8B with the
# new defaults). Session 50 ran this file's first version, which sent an H100 to s50.sh.
#   run(carry=[".gpu/a", ".gpu/c"], command="bash .gpu/c/pick.sh", timeout_s=590)
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $G"
bash .gpu/c/h200_rows.sh
