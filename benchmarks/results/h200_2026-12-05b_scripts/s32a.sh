#!/usr/bin/env bash
# Session 32, first device call: GPU tests of main, then the split sweep.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s)
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
el gputests
timeout 300 python3 -m pytest -q -x -p no:warnings tests/kernels/test_decode.py -k "tc or coop" > $OUT/gputests.txt 2>&1
tail -5 $OUT/gputests.txt
el sweep
timeout 260 python3 scratch/sweep32.py > $OUT/sweep.txt 2>&1
cat $OUT/sweep.txt | tail -30
el done
