#!/usr/bin/env bash
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s)
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
el step
timeout 330 python3 benchmarks/bench_decode_step.py --out $OUT --deadline 240 > $OUT/step.txt 2>&1
tail -32 $OUT/step.txt
el done
