#!/usr/bin/env bash
# Session 22 device call 1: GPU tests of the balanced merge, A/B against main, fixed-cost sweep.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; SITE=/tmp/rq-site; T0=$(date +%s)
[ -d $SITE/sglang ] || { mkdir -p $SITE && tar -xJf .gpu-bundle/sglang-rq-bundle.tar.xz -C $SITE; }
rm -rf scratch/main_rq; tar -xJf scratch/trees.tar.xz -C scratch
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
el tests
PYTHONPATH=$PWD:$SITE timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_merge.py tests/kernels/test_decode.py -k "tc or graph or merge" 2>&1 | tail -n 8 > $OUT/tests.txt; cat $OUT/tests.txt
for rep in 0 1; do
  [ $(( $(date +%s) - T0 )) -gt 370 ] && { el "time guard: skip rep $rep"; break; }
  el "ab rep $rep"
  PYTHONPATH=$PWD/scratch/main_rq:$PWD:$SITE timeout 100 python scratch/ab22.py main $rep 2>&1 | grep -E "AB|Error|error|assert"
  PYTHONPATH=$PWD:$SITE timeout 100 python scratch/ab22.py new $rep 2>&1 | grep -E "AB|Error|error|assert"
  if [ $rep = 0 ]; then el fix; PYTHONPATH=$PWD:$SITE timeout 70 python scratch/fix22.py 2>&1 | grep -E "FIX|Error|error"; fi
done
el done
