#!/usr/bin/env bash
# Session 25 device call 2: figures of record on main d36f459 (bench_decode.py); pool-row
# fragmentation with head-major vs token-major (scale, offset) rows (ab25b.py); the GPU server test.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; SITE=/tmp/rq-site; T0=$(date +%s)
[ -d $SITE/sglang ] || { mkdir -p $SITE && tar -xJf .gpu-bundle/sglang-rq-bundle.tar.xz -C $SITE; }
rm -rf scratch/tm_rq scratch/tm_files && tar -xJf scratch/tm.tar.xz -C scratch && mkdir -p scratch/tm_rq
cp -r rq_kernels scratch/tm_rq/ && cp scratch/tm_files/rq_kernels/view.py scratch/tm_rq/rq_kernels/view.py
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader
el bench_decode
PYTHONPATH=$PWD:$SITE timeout 200 python3 benchmarks/bench_decode.py --out $OUT --deadline 170 2>&1 | tail -32
for rep in 0 1; do
  if [ $rep = 0 ]; then order="hm tm"; else order="tm hm"; fi
  for tree in $order; do
    el "frag $tree rep $rep"
    if [ $tree = tm ]; then P=$PWD/scratch/tm_rq:$PWD:$SITE; else P=$PWD:$SITE; fi
    PYTHONPATH=$P timeout 80 python scratch/ab25b.py $tree $rep 2>&1 | grep -E "FRAG|Error|error|assert"
  done
done
el gpu_server_test
PYTHONPATH=$PWD:$SITE timeout $(( 585 - ($(date +%s) - T0) )) python3 -m pytest -q -p no:cacheprovider -x tests/gpu/test_gpu_server.py 2>&1 | tail -n 8 > $OUT/server_test.txt; cat $OUT/server_test.txt
el done
