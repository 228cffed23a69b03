#!/usr/bin/env bash
# Session 42: the fused merge's arms (make_arms.py writes them) against the working tree's kernel,
# chained, then the step. First call: BASE=acqrel ARMS="chunk both" (the defaults); second, on
# main with acqrel merged: BASE=pf ARMS="pf1 one".
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; mkdir -p $OUT; D=benchmarks/results/h200_2026-12-06d_scripts
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XDG_CACHE_HOME=/tmp/xdg
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv,noheader
ARGS=(--base $D/arms/${BASE:-acqrel}.cu)
for a in ${ARMS:-chunk both}; do ARGS+=(--arm $a=$D/arms/$a.cu); done
timeout ${LIMIT:-420} python3 benchmarks/bench_tc_ab.py "${ARGS[@]}" --chained --reps 3 --out $OUT \
  --deadline ${DEADLINE:-330} \
  --points ouro-1.4b:1x8192,ouro-1.4b:2x16384,ouro-1.4b:4x8192,ouro-1.4b:4x32768,huginn-d96:4x8192,smollm2-gqa:4x8192 2>&1 | tail -45
