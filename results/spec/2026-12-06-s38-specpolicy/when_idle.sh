#!/bin/bash
# Runs "$@" once the machine's CPUs have been >= 85% idle for 3 s (sampled from /proc/stat),
# printing the idle share it saw; after $IDLE_WAIT seconds (default 600) it gives up without running (exit 3).
idle() { awk '/^cpu /{print $5+$6, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }
deadline=$(( $(date +%s) + ${IDLE_WAIT:-600} ))
while :; do
  read i0 t0 < <(idle); sleep 3; read i1 t1 < <(idle)
  pct=$(( 100 * (i1 - i0) / (t1 - t0 + 1) ))
  if [ "$pct" -ge 85 ]; then
    echo "idle ${pct}% over 3 s before: $(date -u +%T)"; break
  fi
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "never idle (last ${pct}%) by $(date -u +%T): not run"; exit 3
  fi
done
exec "$@"
