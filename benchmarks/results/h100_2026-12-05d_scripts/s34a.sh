#!/usr/bin/env bash
# Session 34, device call (checkout on branch cand/issue-cut): GPU tests of the tc kernel with the
# copies restructured (copy_setup) and the KINT one-token epilogue (k_whole), then
# bench_tc_ab.py twice: this tree against the copies-only source (scratch/copies.cu: judges
# k_whole), then against main's (scratch/main.cu: judges both), flushed, and the Ouro step at
# batch 2 and 13. carry ["scratch"].
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s)
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
el tests
timeout 170 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_decode.py tests/kernels/test_decode_tc_copies.py -k "tc or coop or copies" > $OUT/gputests.txt 2>&1
tail -3 $OUT/gputests.txt
el ab_kwhole
mkdir -p $OUT/kwhole $OUT/both
timeout 170 python3 benchmarks/bench_tc_ab.py --base scratch/copies.cu --out $OUT/kwhole --reps 1 --no-step --deadline 140 > $OUT/kwhole/ab.txt 2>&1
grep -E "base/new|Error|error" $OUT/kwhole/ab.txt | tail -14
el ab_both
timeout 230 python3 benchmarks/bench_tc_ab.py --base scratch/main.cu --out $OUT/both --reps 2 --deadline 200 > $OUT/both/ab.txt 2>&1
grep -E "base/new|Error|error" $OUT/both/ab.txt | tail -30
el done
