#!/usr/bin/env bash
# Session 35, third device call: main with the cut merged (issue_cut.diff + the small copies'
# evict_last policy) against main before it (arms/main.cu = eafb0d5's kernel, carried): the GPU
# tests of the tc kernel, then bench_tc_ab.py (both arms checked against the fp32 twin; flushed,
# 2 reps at 4 points, then the Ouro step at batch 2 and 13).
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s); AR=benchmarks/results/h100_2026-12-05e_scripts/arms
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XDG_CACHE_HOME=/tmp/xdg
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
el tests
timeout 130 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_decode.py tests/kernels/test_decode_tc_copies.py -k "tc or coop or copies" > $OUT/gputests.txt 2>&1
tail -2 $OUT/gputests.txt
el A/B
P=ouro-1.4b:2x16384,ouro-1.4b:64x8192,huginn-d96:64x8192,smollm2-gqa:64x8192
timeout $(( $(left) - 10 )) python3 benchmarks/bench_tc_ab.py --base $AR/main.cu --points $P --reps 2 --out $OUT --deadline $(( $(left) - 60 )) > $OUT/ab.txt 2>&1
grep -E "rep|step|Error|error|ok=False" $OUT/ab.txt | tail -30
el done
