#!/usr/bin/env bash
# Session 36, third device call (carry .gpu-bundle/flashinfer-decode): bench_decode_step.py with
# the STREAM kernel (c267694): the step against SDPA and FlashInfer, its parts and pure reads.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XDG_CACHE_HOME=/tmp/xdg
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader
timeout 420 python3 benchmarks/bench_decode_step.py --out $OUT --deadline 330 > $OUT/step.txt 2>&1
grep -E "^fixed |^32GiB|^card |^ +non-attention" $OUT/step.txt | tail -12
