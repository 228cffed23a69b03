#!/usr/bin/env bash
# Session 37 (carry .gpu-bundle/flashinfer-decode): the figures of record with the served kernel
# (main e89ce8e: lever 5 and STREAM), on whichever card comes: bench_decode_step.py, then
# bench_decode.py, each against SDPA and FlashInfer.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s)
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XDG_CACHE_HOME=/tmp/xdg
left() { echo $(( ${LIMIT:-390} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader
timeout 150 python3 benchmarks/bench_decode_step.py --out $OUT --deadline 110 > $OUT/step.txt 2>&1
grep -E "^fixed |^32GiB|^card |^ +non-attention" $OUT/step.txt | tail -12
echo "[t+$(( $(date +%s) - T0 ))s] bench_decode"
timeout $(( $(left) - 5 )) python3 benchmarks/bench_decode.py --out $OUT --deadline $(( $(left) - 40 )) > $OUT/decode.txt 2>&1
grep -vE "^\s*$" $OUT/decode.txt | tail -40
