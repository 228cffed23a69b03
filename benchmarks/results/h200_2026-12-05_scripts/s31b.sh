#!/usr/bin/env bash
# Session 31+, second device call: the figures of record (after s31.sh decided prologue30):
# bench_decode (flushed and chained rows) and the decode step. Carry nothing extra.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s)
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
el decode
timeout 400 python3 benchmarks/bench_decode.py --out $OUT --deadline 340 > $OUT/decode.txt 2>&1
tail -40 $OUT/decode.txt
el step
timeout 180 python3 benchmarks/bench_decode_step.py --out $OUT --deadline 150 > $OUT/step.txt 2>&1
tail -25 $OUT/step.txt
el done
