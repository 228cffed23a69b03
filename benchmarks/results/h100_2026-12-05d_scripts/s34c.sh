#!/usr/bin/env bash
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s)
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
DEADLINE=230 OUT=$OUT timeout 330 python3 scratch/ab34.py > $OUT/ab34.txt 2>&1
tail -30 $OUT/ab34.txt
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
echo "[t+$(( $(date +%s) - T0 ))s] done"
