#!/usr/bin/env bash
# Session 23 device call 1: GPU tests of qsmem, A/B against main (arms: default, exact, q4, q4all).
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; SITE=/tmp/rq-site; T0=$(date +%s)
[ -d $SITE/sglang ] || { mkdir -p $SITE && tar -xJf .gpu-bundle/sglang-rq-bundle.tar.xz -C $SITE; }
rm -rf scratch/main_rq; tar -xJf scratch/trees.tar.xz -C scratch
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader
for rep in 0 1; do
  [ $(( $(date +%s) - T0 )) -gt 300 ] && { el "time guard: skip rep $rep"; break; }
  el "ab rep $rep"
  PYTHONPATH=$PWD/scratch/main_rq:$PWD:$SITE timeout 90 python scratch/ab23.py main $rep 2>&1 | grep -E "AB|Error|error|assert"
  PYTHONPATH=$PWD:$SITE timeout 150 python scratch/ab23.py new $rep 2>&1 | grep -E "AB|Error|error|assert"
done
el done
