#!/usr/bin/env bash
# Session 32, second device call: FlashInfer smoke test, then bench_decode with the FlashInfer arm.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s)
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
el smoke
timeout 90 python3 scratch/fi_smoke.py 2>&1 | tee $OUT/fi_smoke.txt | tail -12
el decode
timeout 420 python3 benchmarks/bench_decode.py --out $OUT --deadline 330 > $OUT/decode.txt 2>&1
tail -45 $OUT/decode.txt
el done
