#!/usr/bin/env bash
# Session 36, first device call (checkout of main at the session's start, arms/ carried: make_arms.py
# and `git show eafb0d5:rq_kernels/csrc/rq_decode_tc.cu > arms/main_e.cu`): the merged kernel's
# GPU tests (session 35 ran none), then bench_tc_ab.py chained: main ("new") against eafb0d5's
# kernel ("base", before lever 5) and the codes with evict_first ("first"), 2 reps, and the step.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s); AR=benchmarks/results/h100_2026-12-05f_scripts/arms
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XDG_CACHE_HOME=/tmp/xdg
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader
el tests
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode.py tests/kernels/test_decode_tc_copies.py -k "tc or coop or copies" > $OUT/gputests.txt 2>&1
tail -3 $OUT/gputests.txt; grep -E "^FAILED|Error" $OUT/gputests.txt | head -5
(( $(left) > 90 )) || { el "no time for the A/B"; exit 0; }
el A/B chained
P=ouro-1.4b:1x8192,ouro-1.4b:2x16384,ouro-1.4b:4x8192,ouro-1.4b:16x16384,ouro-1.4b:64x8192,huginn-d96:4x8192,huginn-d96:64x8192
timeout $(( $(left) - 5 )) python3 benchmarks/bench_tc_ab.py --base $AR/main_e.cu --arm first=$AR/first.cu --chained \
  --points $P --reps 2 --out $OUT --deadline $(( $(left) - 120 )) > $OUT/ab.txt 2>&1
grep -vE "^\s*$" $OUT/ab.txt | grep -vE "check .*ok=True" | tail -40
el done
