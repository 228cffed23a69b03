#!/usr/bin/env bash
# session 20, call 7: balanced splits vs main (main's rq_kernels imported first), mixed batches
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}
SITE=/tmp/rq-site
[ -d $SITE/sglang ] || { mkdir -p $SITE && tar -xJf .gpu-bundle/sglang-rq-bundle.tar.xz -C $SITE; }
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1
PYTHONPATH=$PWD/scratch/main_rq:$PWD:$SITE timeout 45 python scratch/ab_balance.py main 2 2>&1 | grep -E "BAL|from|Error|error" | head -12
PYTHONPATH=$PWD:$SITE timeout 45 python scratch/ab_balance.py new 2 2>&1 | grep -E "BAL|from|Error|error" | head -12
