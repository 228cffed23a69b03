#!/usr/bin/env bash
# Session 24 device call 2: records (RECORD) against main, two reps; GPU tests; ncu sep vs rec at 16 x 16k.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; SITE=/tmp/rq-site; T0=$(date +%s)
[ -d $SITE/sglang ] || { mkdir -p $SITE && tar -xJf .gpu-bundle/sglang-rq-bundle.tar.xz -C $SITE; }
rm -rf scratch/main_rq; tar -xJf scratch/trees.tar.xz -C scratch
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
for rep in 0 1; do
  el "ab rep $rep"
  PYTHONPATH=$PWD/scratch/main_rq:$PWD:$SITE timeout 100 python scratch/ab24.py main $rep 2>&1 | grep -E "AB|Error|error|assert|RECORD"
  PYTHONPATH=$PWD:$SITE timeout 140 python scratch/ab24.py new $rep 2>&1 | grep -E "AB|Error|error|assert|RECORD"
done
el tests
PYTHONPATH=$PWD:$SITE timeout 170 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_merge.py tests/kernels/test_decode.py -k "tc or graph or merge" 2>&1 | tail -n 6 > $OUT/tests.txt; cat $OUT/tests.txt
for arm in sep rec; do
  [ $(( $(date +%s) - T0 )) -gt 480 ] && { el "time guard: skip ncu $arm"; break; }
  el "ncu $arm"
  PYTHONPATH=$PWD:$SITE timeout 50 /usr/local/cuda/bin/ncu --clock-control none -k regex:rq_decode_tc -s 2 -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --metrics lts__t_requests.sum,lts__t_sectors.sum,l1tex__t_requests.sum,l1tex__t_sectors.sum python3 scratch/ncu24.py 16x16k $arm > $OUT/ncu_${arm}_16x16k.txt 2>&1
  grep -E "L2 Cache Throughput|DRAM Throughput|Duration|lts__t|l1tex__t" $OUT/ncu_${arm}_16x16k.txt
done
el done
