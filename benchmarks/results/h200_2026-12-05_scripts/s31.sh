#!/usr/bin/env bash
# Session 31+, first device call (prepared in session 31, checkout on main): branch cand31 =
# prologue30 (query prologue 963 -> 521 instructions, signs before the PDL wait) + prefetch31 (L2
# prefetch of the head's next tiles before the PDL wait). Its files are copied in from scratch/
# (cand31.cu, cand31_decode_tc.py, cand31_host.py); GPU tests, then scratch/ab31.py: main vs p30 vs
# cand31 at 0 / 16 / 32 MiB of prefetch, flushed and chained, and the Ouro step at batch 2 and
# 32 GiB (both arm orders back to back per point). carry ["scratch"].
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s)
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
cp scratch/cand31.cu rq_kernels/csrc/rq_decode_tc.cu
cp scratch/cand31_decode_tc.py rq_kernels/decode_tc.py
cp scratch/cand31_host.py rq_kernels/_host.py
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
el tests
timeout 170 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_decode.py -k "tc or coop" > $OUT/gputests_cand31.txt 2>&1
tail -2 $OUT/gputests_cand31.txt
el ab
DEADLINE=240 OUT=$OUT timeout 390 python3 scratch/ab31.py > $OUT/ab31.txt 2>&1
tail -40 $OUT/ab31.txt
el done
