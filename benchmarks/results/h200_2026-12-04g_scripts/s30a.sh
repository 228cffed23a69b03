#!/usr/bin/env bash
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s)
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
el tests
timeout 220 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_decode.py -k "tc or coop" > $OUT/gputests.txt 2>&1
tail -3 $OUT/gputests.txt
el trace
timeout 200 python3 scratch/trace30.py > $OUT/trace30.txt 2>&1
tail -20 $OUT/trace30.txt
el done
