#!/usr/bin/env bash
# Session 22 device call 3: the whole-card step's spread: clocks and power sampled during two
# runs of bench_decode_step, and the card batch per call in isolation.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; SITE=/tmp/rq-site; T0=$(date +%s)
[ -d $SITE/sglang ] || { mkdir -p $SITE && tar -xJf .gpu-bundle/sglang-rq-bundle.tar.xz -C $SITE; }
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$SITE
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,temperature.memory,clocks_throttle_reasons.active --format=csv -lms 250 > $OUT/smi.csv 2>&1 &
SMI=$!
el card22; timeout 100 python3 scratch/card22.py 2>&1 | grep -E "CARD|Error|error"
for r in 1 2; do
  el "step run $r"; mkdir -p $OUT/step$r
  timeout 110 python3 benchmarks/bench_decode_step.py --out $OUT/step$r 2>&1 | grep -E "RQ/BF16|card|step" | tail -8
done
kill $SMI; el done
