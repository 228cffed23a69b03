#!/usr/bin/env bash
# Session 24 device call 1: figures of record on main f5dd0cf (the coalesced copies landed).
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; SITE=/tmp/rq-site; T0=$(date +%s)
[ -d $SITE/sglang ] || { mkdir -p $SITE && tar -xJf .gpu-bundle/sglang-rq-bundle.tar.xz -C $SITE; }
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$SITE
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader
el bench_decode
timeout 200 python3 benchmarks/bench_decode.py --out $OUT 2>&1 | tail -45
el bench_decode_step
timeout 100 python3 benchmarks/bench_decode_step.py --out $OUT 2>&1 | tail -16
el done
