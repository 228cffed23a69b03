#!/usr/bin/env bash
# Session 23 device call 5: coalesced code copies against main (two reps), GPU tests, ncu at 16 x 16k.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; SITE=/tmp/rq-site; T0=$(date +%s)
[ -d $SITE/sglang ] || { mkdir -p $SITE && tar -xJf .gpu-bundle/sglang-rq-bundle.tar.xz -C $SITE; }
rm -rf scratch/main_rq; tar -xJf scratch/trees.tar.xz -C scratch
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
for rep in 0 1; do
  el "ab rep $rep"
  PYTHONPATH=$PWD/scratch/main_rq:$PWD:$SITE timeout 80 python scratch/ab23d.py main $rep 2>&1 | grep -E "AB|Error|error|assert"
  PYTHONPATH=$PWD:$SITE timeout 80 python scratch/ab23d.py new $rep 2>&1 | grep -E "AB|Error|error|assert"
done
el tests
PYTHONPATH=$PWD:$SITE timeout 170 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_merge.py tests/kernels/test_decode.py -k "tc or graph or merge" 2>&1 | tail -n 6 > $OUT/tests.txt; cat $OUT/tests.txt
for tree in main new; do
  el "ncu $tree"
  if [ $tree = main ]; then PP=$PWD/scratch/main_rq:$PWD:$SITE; else PP=$PWD:$SITE; fi
  PYTHONPATH=$PP timeout 100 /usr/local/cuda/bin/ncu --clock-control none -k regex:rq_decode_tc -s 2 -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --metrics lts__t_requests.sum,lts__t_sectors.sum,l1tex__t_requests.sum,l1tex__t_sectors.sum python3 scratch/ncu23.py 16x16k > $OUT/ncu_${tree}_16x16k.txt 2>&1
  grep -E "L2 Cache Throughput|DRAM Throughput|Duration|lts__t|l1tex__t" $OUT/ncu_${tree}_16x16k.txt
done
el done
