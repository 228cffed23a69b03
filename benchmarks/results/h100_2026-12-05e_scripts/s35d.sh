#!/usr/bin/env bash
# Session 35, last device call (little device time left): the GPU tests of the merged tc kernel
# (main at fea245d), then, if time is left, bench_tc_ab.py against arms/main.cu (eafb0d5's
# kernel) at Ouro 2 x 16k and 64 x 8k, one rep, and the step at batch 2 and 13.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s); AR=benchmarks/results/h100_2026-12-05e_scripts/arms
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XDG_CACHE_HOME=/tmp/xdg
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
el tests
timeout $(( $(left) - 5 )) python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_decode.py tests/kernels/test_decode_tc_copies.py -k "tc or coop or copies" > $OUT/gputests.txt 2>&1
tail -2 $OUT/gputests.txt
(( $(left) > 60 )) || { el "no time for the A/B"; exit 0; }
el A/B
timeout $(( $(left) - 5 )) python3 benchmarks/bench_tc_ab.py --base $AR/main.cu --points ouro-1.4b:2x16384,ouro-1.4b:64x8192 --reps 1 --out $OUT --deadline $(( $(left) - 40 )) > $OUT/ab.txt 2>&1
grep -E "rep|step|Error|error|ok=False" $OUT/ab.txt | tail -12
el done
