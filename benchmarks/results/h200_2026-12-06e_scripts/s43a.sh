#!/usr/bin/env bash
# Session 43: the cluster merge (CLUSTER=8). First the GPU tests of the fused merge (both paths),
# then, chained, 3 reps, the working tree (new, clusters where decode_tc.merge_cluster says)
# against main's source (base, 2f4a38c, saved as ab_arms/main.cu) and the working tree's source
# with the chunked merge only (chunk: CLUSTER=0), then the step.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; mkdir -p $OUT
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XDG_CACHE_HOME=/tmp/xdg
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv,noheader
timeout ${TEST_S:-200} python3 -m pytest -q -x -p no:warnings -rs ${TESTS:-tests/kernels/test_decode.py} \
  -k "${TEST_K:-fused_merge or balanced or cuda_graph_tc or pdl}" > $OUT/tests.txt 2>&1
RC=$?; tail -40 $OUT/tests.txt; echo "TESTS_RC=$RC"
[[ $RC == 0 && ${AB:-1} == 1 ]] || exit 0
timeout ${LIMIT:-420} python3 benchmarks/bench_tc_ab.py --base ab_arms/main.cu --arm chunk=ab_arms/new.cu \
  --host-attr base:CLUSTER=0 --host-attr chunk:CLUSTER=0 --chained --reps 3 --out $OUT \
  --deadline ${DEADLINE:-300} ${NOSTEP:+--no-step} \
  --points ${POINTS:-ouro-1.4b:1x8192,ouro-1.4b:2x16384,ouro-1.4b:4x8192,ouro-1.4b:4x32768,ouro-1.4b:16x16384,huginn-d96:4x8192,huginn-d96:16x16384} 2>&1 | tail -45
