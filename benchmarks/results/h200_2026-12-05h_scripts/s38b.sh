#!/usr/bin/env bash
# Session 38, one call for whichever card comes (from the lever3 tree, arms/main.cu carried
# untracked, .gpu-bundle/flashinfer-decode carried): on an H200 the figures of record with
# main's served kernel (s37b.sh, after putting arms/main.cu in place); on an H100 lever 3's A/B
# (s38a.sh).
set -uo pipefail
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$NAME"
D=benchmarks/results/h200_2026-12-05h_scripts
if [[ $NAME == *H200* ]]; then
  cp $D/arms/main.cu rq_kernels/csrc/rq_decode_tc.cu
  exec bash benchmarks/results/h200_2026-12-05g_scripts/s37b.sh
fi
exec bash $D/s38a.sh
