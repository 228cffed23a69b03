#!/usr/bin/env bash
# Session 24 device call 3: L2 prefetch-size hints (p128, p256) against main, two reps, rotated order; decode step per tree.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; SITE=/tmp/rq-site; T0=$(date +%s)
[ -d $SITE/sglang ] || { mkdir -p $SITE && tar -xJf .gpu-bundle/sglang-rq-bundle.tar.xz -C $SITE; }
rm -rf scratch/*_rq; tar -xJf scratch/trees.tar.xz -C scratch
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader
for rep in 0 1; do
  if [ $rep = 0 ]; then order="main p128 p256"; else order="p256 p128 main"; fi
  for tree in $order; do
    el "ab $tree rep $rep"
    PYTHONPATH=$PWD/scratch/${tree}_rq:$PWD:$SITE timeout 100 python scratch/ab24b.py $tree $rep 2>&1 | grep -E "AB|Error|error|assert"
  done
done
for tree in main p128 p256; do
  [ $(( $(date +%s) - T0 )) -gt 500 ] && { el "time guard: skip step $tree"; break; }
  el "step $tree"; mkdir -p $OUT/step_$tree
  PYTHONPATH=$PWD/scratch/${tree}_rq:$PWD:$SITE timeout 60 python benchmarks/bench_decode_step.py --out $OUT/step_$tree --deadline 55 2>&1 | grep -E "RQ/BF16" | tail -6
done
el done
