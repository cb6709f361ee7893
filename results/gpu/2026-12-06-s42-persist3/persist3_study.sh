#!/bin/bash
# persist3_study.py's rows as the README's table 3b (each ~35 s of NVRTC; cached by source):
# the matvec phase alone, in a loop or not, before PS_ZERO (NOZERO=1) and with it; the whole
# step without the opaque indices (NOSREG=1) and without ps_opaque too (NOOPAQUE=1).
#   NVRTC_LIB=... NVDISASM=... bash results/gpu/2026-12-06-s42-persist3/persist3_study.sh
cd "$(dirname "$0")/../../.."
P="python3 results/gpu/2026-12-06-s42-persist3/persist3_study.py"
T0="PS_BARRIER_RA PS_SMEM_TABLE PS_LOOP PS_TRACE=0"
NOZERO=1 $P mv1 "$T0"
NOZERO=1 $P mv2 "$T0"
NOZERO=1 $P mvfor "$T0"
NOZERO=1 CH=2 $P mvfor "$T0"
NOZERO=1 CH=1 $P mvfor "$T0"
$P mvfor "$T0"
$P full
NOSREG=1 $P full
NOSREG=1 NOOPAQUE=1 $P full
