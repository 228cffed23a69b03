#!/usr/bin/env bash
# Session 40 (branch lever7; arms/main.cu = main c39098f's kernel, untracked: `git show
# c39098f:rq_kernels/csrc/rq_decode_tc.cu`): lever 7, p = exp2(logit - m_p) with m_p = max(m_run,
# -1e30) + VPRE (no select for masked logits, the weights' 2^-VPRE in the exponent). The tc GPU
# tests on the new kernel, then the chained A/B against main's kernel, 3 reps.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s); AR=benchmarks/results/h200_2026-12-06b_scripts/arms
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XDG_CACHE_HOME=/tmp/xdg
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
el tests
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode.py tests/kernels/test_decode_tc_copies.py -k "tc or coop or copies or stream" > $OUT/tests.txt 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|^FAILED|^ERROR" $OUT/tests.txt | tail -12
el A/B chained
P=ouro-1.4b:1x8192,ouro-1.4b:2x16384,ouro-1.4b:16x16384,ouro-1.4b:64x8192,huginn-d96:4x8192,huginn-d96:64x8192,smollm2-gqa:4x8192,smollm2-gqa:64x8192
timeout $(( $(left) - 5 )) python3 benchmarks/bench_tc_ab.py --base $AR/main.cu --chained --no-step --points $P --reps 3 --out $OUT \
  --deadline $(( $(left) - 50 )) > $OUT/ab.txt 2>&1
grep -vE "^\s*$" $OUT/ab.txt | grep -vE "check .*ok=True" | tail -26
el done
