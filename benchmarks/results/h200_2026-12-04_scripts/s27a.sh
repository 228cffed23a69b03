#!/usr/bin/env bash
# Session 27 device call 1: figures of record with the read yardstick (bench_decode.py, bench_decode_step.py),
# the real-layer commit rows (bench_commit.py), a batch-1 length sweep tc vs read (sweep27.py).
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s)
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
git log --oneline -1
el sweep; timeout 120 python scratch/sweep27.py $OUT/sweep 2>&1 | grep -E "SWEEP|Error|error" 
el step; timeout 100 python benchmarks/bench_decode_step.py --out $OUT/step --deadline 90 2>&1 | grep -E "RQ/BF16|non-attention|Error|error" | tail -12
el commit; timeout 100 python benchmarks/bench_commit.py --out $OUT/commit 2>&1 | tail -8
el decode; timeout 300 python benchmarks/bench_decode.py --out $OUT/decode --deadline 280 2>&1 | grep -vE "^  check" | tail -40
el done
