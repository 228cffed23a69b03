#!/usr/bin/env bash
# Session 25 device call 3: the revert to token-major (scale, offset) rows: figures of record with
# row placements (bench_decode.py), head-major vs token-major over placements (ab25c.py), decode
# step, GPU kernel tests.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; SITE=/tmp/rq-site; T0=$(date +%s)
[ -d $SITE/sglang ] || { mkdir -p $SITE && tar -xJf .gpu-bundle/sglang-rq-bundle.tar.xz -C $SITE; }
rm -rf scratch/hm_rq scratch/hm_files && tar -xJf scratch/hm.tar.xz -C scratch && mkdir -p scratch/hm_rq/tests
cp -r rq_kernels scratch/hm_rq/ && cp tests/__init__.py scratch/hm_rq/tests/ && cp -r tests/kernels scratch/hm_rq/tests/
cp -r scratch/hm_files/* scratch/hm_rq/
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader
el bench_decode
PYTHONPATH=$PWD:$SITE timeout 230 python3 benchmarks/bench_decode.py --out $OUT --deadline 200 2>&1 | grep -E "TB/s|rows|uniform" | tail -40
for tree in hm tm; do
  el "placement $tree"
  if [ $tree = hm ]; then P=$PWD/scratch/hm_rq:$PWD:$SITE; else P=$PWD:$SITE; fi
  PYTHONPATH=$P timeout 60 python scratch/ab25c.py $tree 2>&1 | grep -E "PLACE|strides|Error|error|assert"
done
el step; mkdir -p $OUT/step
PYTHONPATH=$PWD:$SITE timeout 70 python3 benchmarks/bench_decode_step.py --out $OUT/step --deadline 60 2>&1 | grep -E "RQ/BF16|non-attention" | tail -8
el tests
PYTHONPATH=$PWD:$SITE timeout $(( 560 - ($(date +%s) - T0) )) python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode.py tests/kernels/test_commit.py -k "tc or graph or commit or real" 2>&1 | tail -n 5 > $OUT/tests.txt; cat $OUT/tests.txt
el done
