#!/usr/bin/env bash
# Session 24 device call 9: the head-major (scale, offset) tree with int64 head/K-V offsets in the Triton kernels and
# positional constexprs keyed by value (launch_key): bench_extend, bench_decode_step (the two faults of call 8), GPU kernel tests.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; SITE=/tmp/rq-site; T0=$(date +%s)
[ -d $SITE/sglang ] || { mkdir -p $SITE && tar -xJf .gpu-bundle/sglang-rq-bundle.tar.xz -C $SITE; }
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$SITE
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
el step; mkdir -p $OUT/step; timeout 50 python benchmarks/bench_decode_step.py --out $OUT/step --deadline 45 > $OUT/step.txt 2>&1; grep -E "Error|error|RQ/BF16|non-attention" $OUT/step.txt | tail -12
el extend; mkdir -p $OUT/extend; timeout 45 python benchmarks/bench_extend.py --out $OUT/extend > $OUT/extend.txt 2>&1; grep -E "Error|error|x[0-9]" $OUT/extend.txt | tail -12
el tests
timeout $(( 175 - ($(date +%s) - T0) )) python3 -m pytest -q -p no:cacheprovider tests/kernels/test_extend.py tests/kernels/test_commit.py tests/kernels/test_decode.py tests/kernels/test_launch.py -k "tc or graph or commit or extend or launch or reconstruct" 2>&1 | tail -n 4 > $OUT/tests.txt; cat $OUT/tests.txt
el done
