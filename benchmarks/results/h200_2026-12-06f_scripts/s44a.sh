#!/usr/bin/env bash
# Session 44: the cluster merge with the cluster dimension set at launch (cuLaunchKernelEx
# CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION; session 43's compile-time __cluster_dims__ failed its
# first launch with "an illegal instruction" on an H100). GPU tests first; on a failure the
# first failing test again under compute-sanitizer; the A/B (s43a.sh's) only if they pass.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; mkdir -p $OUT
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XDG_CACHE_HOME=/tmp/xdg
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout ${TEST_S:-200} python3 -m pytest -q -x -p no:warnings -rsf tests/kernels/test_decode.py \
  -k "fused_merge or balanced or cuda_graph_tc or pdl" > $OUT/tests.txt 2>&1
RC=$?; grep -E "passed|failed|^FAILED|^E " $OUT/tests.txt | head -20; echo "TESTS_RC=$RC"
if [[ $RC != 0 ]]; then
  T=$(grep -m1 -oE "^FAILED [^ ]+" $OUT/tests.txt | cut -d' ' -f2)
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  echo "sanitizer: ${CS:-none} on $T"
  [[ -n "$CS" && -n "$T" ]] && timeout 240 $CS --tool memcheck --show-backtrace device \
    --print-limit 5 python3 -m pytest -q -x -p no:warnings "$T" > $OUT/sanitizer.txt 2>&1
  grep -E "=========|Invalid|Illegal|at 0x|by thread|Address" $OUT/sanitizer.txt | head -40
  exit 0
fi
[[ ${AB:-1} == 1 ]] || exit 0
timeout ${LIMIT:-300} python3 benchmarks/bench_tc_ab.py --base ab_arms/main.cu --arm chunk=ab_arms/new.cu \
  --host-attr base:CLUSTER=0 --host-attr chunk:CLUSTER=0 --chained --reps 3 --out $OUT \
  --deadline ${DEADLINE:-250} ${NOSTEP:+--no-step} \
  --points ${POINTS:-ouro-1.4b:1x8192,ouro-1.4b:2x16384,ouro-1.4b:4x8192,ouro-1.4b:4x32768,ouro-1.4b:16x16384,huginn-d96:4x8192} 2>&1 | tail -45
