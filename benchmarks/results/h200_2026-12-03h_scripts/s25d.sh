#!/usr/bin/env bash
# Session 25 device call 4: head-major vs token-major (scale, offset) rows over the four row
# placements (ab25c.py, trees asserted), two reps in rotated order.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; SITE=/tmp/rq-site; T0=$(date +%s)
[ -d $SITE/sglang ] || { mkdir -p $SITE && tar -xJf .gpu-bundle/sglang-rq-bundle.tar.xz -C $SITE; }
rm -rf scratch/hm_rq scratch/hm_files && tar -xJf scratch/hm.tar.xz -C scratch && mkdir -p scratch/hm_rq/tests
cp -r rq_kernels scratch/hm_rq/ && cp tests/__init__.py scratch/hm_rq/tests/ && cp -r tests/kernels scratch/hm_rq/tests/
cp -r scratch/hm_files/* scratch/hm_rq/
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
for rep in 0 1; do
  if [ $rep = 0 ]; then order="hm tm"; else order="tm hm"; fi
  for tree in $order; do
    el "placement $tree rep $rep"
    if [ $tree = hm ]; then P=$PWD/scratch/hm_rq:$PWD:$SITE; else P=$PWD:$SITE; fi
    mkdir -p $OUT/$rep; OUT=$OUT/$rep PYTHONPATH=$P timeout 60 python scratch/ab25c.py $tree 2>&1 | grep -E "PLACE|strides|Error|error|assert"
  done
done
el done
