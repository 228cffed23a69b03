#!/usr/bin/env bash
# Session 32: the FlashInfer arms with PDL (as SGLang runs them): decode step, then bench_decode.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s)
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
el step
timeout 200 python3 benchmarks/bench_decode_step.py --out $OUT --deadline 150 > $OUT/step.txt 2>&1
tail -9 $OUT/step.txt
el decode
timeout 420 python3 benchmarks/bench_decode.py --out $OUT --deadline 320 > $OUT/decode.txt 2>&1
grep -A1 "ctx=.*b=.*sdpa" $OUT/decode.txt | cut -c1-360 | tail -36
el done
