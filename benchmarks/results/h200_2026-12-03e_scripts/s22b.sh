#!/usr/bin/env bash
# Session 22 device call 2: figures of record on the balanced-merge build, the GPU server tests.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; SITE=/tmp/rq-site; T0=$(date +%s)
[ -d $SITE/sglang ] || { mkdir -p $SITE && tar -xJf .gpu-bundle/sglang-rq-bundle.tar.xz -C $SITE; }
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$SITE
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
el "tree $(git rev-parse --short HEAD 2>/dev/null)"
el bench_decode
timeout 150 python3 benchmarks/bench_decode.py --out $OUT 2>&1 | tail -40
el bench_decode_step
timeout 90 python3 benchmarks/bench_decode_step.py --out $OUT 2>&1 | tail -14
el gpuserver
timeout 260 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_gpu_server.py 2>&1 | tail -6 | tee $OUT/gpuserver.txt
if [ $(( $(date +%s) - T0 )) -lt 420 ]; then
  el huginn
  timeout $(( 585 - ($(date +%s) - T0) )) python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_gpu_huginn.py 2>&1 | tail -6 | tee $OUT/gpuhuginn.txt
fi
el done
