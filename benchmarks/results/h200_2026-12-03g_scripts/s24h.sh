#!/usr/bin/env bash
# Session 24 device call 8: where the head-major (scale, offset) tree fails: bench_extend and bench_decode_step with CUDA_LAUNCH_BLOCKING=1.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; SITE=/tmp/rq-site; T0=$(date +%s)
[ -d $SITE/sglang ] || { mkdir -p $SITE && tar -xJf .gpu-bundle/sglang-rq-bundle.tar.xz -C $SITE; }
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$SITE CUDA_LAUNCH_BLOCKING=1
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
el extend; mkdir -p $OUT/e; timeout 70 python benchmarks/bench_extend.py --out $OUT/e > $OUT/extend.txt 2>&1; grep -vE "^\s*$" $OUT/extend.txt | grep -E "File|Error|error|us" | tail -24
el step; mkdir -p $OUT/s; timeout 60 python benchmarks/bench_decode_step.py --out $OUT/s --deadline 50 > $OUT/step.txt 2>&1; grep -E "File|Error|error|step|RQ/BF16" $OUT/step.txt | tail -24
el done
