#!/usr/bin/env bash
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; SITE=/tmp/rq-site
[ -d $SITE/sglang ] || { mkdir -p $SITE && tar -xJf .gpu-bundle/sglang-rq-bundle.tar.xz -C $SITE; }
rm -rf scratch/main_rq; tar -xJf scratch/trees.tar.xz -C scratch
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1
for rep in 0 1; do
  PYTHONPATH=$PWD/scratch/main_rq:$PWD:$SITE timeout 60 python scratch/ab21b.py main $rep 2>&1 | grep -E "AB|Error|error|assert"
  PYTHONPATH=$PWD:$SITE timeout 60 python scratch/ab21b.py bal2 $rep 2>&1 | grep -E "AB|Error|error|assert"
done
export PYTHONPATH=$PWD:$SITE
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode.py -k "tc or graph" 2>&1 | tail -n 4 > $OUT/tests_bal2.txt; cat $OUT/tests_bal2.txt
timeout 50 python3 benchmarks/bench_decode_step.py --out $OUT 2>&1 | tail -12
