#!/usr/bin/env bash
# Session 27 device call 2: COOP (CTA-shared small copies) GPU tests, per-call A/B, decode step with and without.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; SITE=/tmp/rq-site; T0=$(date +%s)
[ -f .gpu-bundle/sglang-rq-bundle.tar.xz ] && [ ! -d $SITE/sglang ] && { mkdir -p $SITE && tar -xJf .gpu-bundle/sglang-rq-bundle.tar.xz -C $SITE; }
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$SITE
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
git log --oneline -1
el tests
timeout 200 python3 -m pytest -q -p no:cacheprovider -x tests/kernels/test_decode.py -k "tc or coop or graph" 2>&1 | tail -n 6 > $OUT/tests.txt; cat $OUT/tests.txt
el ab; timeout 200 python scratch/ab27.py $OUT 2>&1 | grep -E "AB|Error|error|assert"
for arm in warp coop; do
  el "step $arm"; mkdir -p $OUT/step_$arm
  timeout 70 python -c "
import sys, runpy; sys.path.insert(0, '.')
import rq_kernels.decode_tc as d
if '$arm' == 'warp': d.coop_copies = lambda v, l: False
sys.argv = ['bench_decode_step.py', '--out', '$OUT/step_$arm', '--deadline', '60']
runpy.run_path('benchmarks/bench_decode_step.py', run_name='__main__')" 2>&1 | grep -E "RQ/BF16|Error|error" | tail -6
done
el done
