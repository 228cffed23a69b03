#!/usr/bin/env bash
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; SITE=/tmp/rq-site
[ -d $SITE/sglang ] || { mkdir -p $SITE && tar -xJf .gpu-bundle/sglang-rq-bundle.tar.xz -C $SITE; }
[ -d scratch/main_rq ] || tar -xJf scratch/trees.tar.xz -C scratch
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
PYTHONPATH=$PWD:$SITE timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode.py -k "tc or graph" 2>&1 | tail -n 8 | tee $OUT/tests_balanced.txt
for rep in 0 1; do
 for t in main balanced; do
  case $t in main) P=$PWD/scratch/main_rq:;; kpipe) P=$PWD/scratch/kpipe_rq:;; *) P=;; esac
  PYTHONPATH=$P$PWD:$SITE timeout 100 python scratch/ab21.py $t $rep 2>&1 | grep -E "AB|from|Error|error|assert" | head -24
 done
done
