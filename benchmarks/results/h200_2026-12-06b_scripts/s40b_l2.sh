#!/usr/bin/env bash
# Session 40, right after s40b.sh on the same H100 lease (issued as one command line): lever 7
# against main's kernel with every history on 4,096 pool rows (reads in the L2), 3 reps.
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XDG_CACHE_HOME=/tmp/xdg
P=ouro-1.4b:2x16384,ouro-1.4b:16x16384,ouro-1.4b:64x8192,huginn-d96:4x8192,huginn-d96:64x8192,smollm2-gqa:4x8192,smollm2-gqa:64x8192
timeout 280 python3 benchmarks/bench_tc_ab.py --base benchmarks/results/h200_2026-12-06b_scripts/arms/main.cu --l2-rows 4096 \
  --no-step --points $P --reps 3 --out $OUT --deadline 230 > $OUT/ab_l2.txt 2>&1
grep -vE "^\s*$" $OUT/ab_l2.txt | grep -vE "check .*ok=True" | tail -24
