#!/usr/bin/env bash
# Session 39, one call for whichever card comes (from main with ../h200_2026-12-05h_scripts/
# lever3.diff applied and its arms/main.cu = main's kernel; carry .gpu-bundle/flashinfer-decode).
# H200: the figures of record with main's served kernel (../h200_2026-12-05g_scripts/s37b.sh,
# shortened), then lever 3's chained A/B on four points. Else: ../h200_2026-12-05h_scripts/s38a.sh
# (the tc GPU tests on the lever-3 kernel, then the A/B on seven points).
set -uo pipefail
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$NAME"
D=benchmarks/results/h200_2026-12-05h_scripts; OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s)
if [[ $NAME != *H200* ]]; then exec bash $D/s38a.sh; fi
cp rq_kernels/csrc/rq_decode_tc.cu /tmp/lever3.cu
cp $D/arms/main.cu rq_kernels/csrc/rq_decode_tc.cu
LIMIT=360 bash benchmarks/results/h200_2026-12-05g_scripts/s37b.sh
cp /tmp/lever3.cu rq_kernels/csrc/rq_decode_tc.cu
LEFT=$(( 575 - ($(date +%s) - T0) )); echo "[t+$(( $(date +%s) - T0 ))s] lever 3 A/B, ${LEFT}s left"
if (( LEFT > 90 )); then
  export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XDG_CACHE_HOME=/tmp/xdg
  timeout $(( LEFT - 5 )) python3 benchmarks/bench_tc_ab.py --base $D/arms/main.cu --chained --no-step \
    --points ouro-1.4b:2x16384,ouro-1.4b:64x8192,huginn-d96:64x8192,smollm2-gqa:64x8192 --reps 2 \
    --out $OUT --deadline $(( LEFT - 40 )) > $OUT/ab.txt 2>&1
  grep -vE "^\s*$" $OUT/ab.txt | grep -vE "check .*ok=True" | tail -16
fi
echo "[t+$(( $(date +%s) - T0 ))s] done"
