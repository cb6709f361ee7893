#!/bin/bash
# Session 50's first call: an H200 is rare here (every call since session 41 got an H100), so
# when one comes, issue #30's H200 rows (h200_rows.sh) run first; on an H100, the late-norm
# levels (s50.sh). Both scripts are in .gpu/c:
#   run(carry=[".gpu/a", ".gpu/c"], command="bash .gpu/c/pick.sh", timeout_s=590)
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $G"
case "$G" in
  *H200*) bash .gpu/c/h200_rows.sh ;;
  *) bash .gpu/c/s50.sh ;;
esac
