#!/usr/bin/env bash
# Session 38 (main with lever3.diff applied, arms/main.cu = main's kernel; README.md): lever 3, the
# anchor-only loop without the fp16 remainder (docs/kernels.md "What would close the rest").
# The tc GPU tests on the new kernel (anchor-only cases with outlier groups), then the chained
# A/B against main's kernel, 3 reps, the anchor loop's ratio printed per row.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s); AR=benchmarks/results/h200_2026-12-05h_scripts/arms
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XDG_CACHE_HOME=/tmp/xdg
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
el tests
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode.py tests/kernels/test_decode_tc_copies.py -k "tc or coop or copies or stream" > $OUT/tests.txt 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|^FAILED|^ERROR" $OUT/tests.txt | tail -12
el A/B chained
P=ouro-1.4b:1x8192,ouro-1.4b:2x16384,ouro-1.4b:64x8192,huginn-d96:4x8192,huginn-d96:64x8192,smollm2-gqa:4x8192,smollm2-gqa:64x8192
timeout $(( $(left) - 5 )) python3 benchmarks/bench_tc_ab.py --base $AR/main.cu --chained --no-step --points $P --reps 3 --out $OUT \
  --deadline $(( $(left) - 50 )) > $OUT/ab.txt 2>&1
grep -vE "^\s*$" $OUT/ab.txt | grep -vE "check .*ok=True" | tail -24
el done
