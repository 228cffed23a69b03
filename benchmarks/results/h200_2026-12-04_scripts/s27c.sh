#!/usr/bin/env bash
# Session 27 device call 3: figures of record on main (COOP landed): GPU kernel tests, ncu L2 requests
# COOP vs per-warp at 16 x 16k (consecutive, scattered), bench_decode.py, bench_decode_step.py.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s)
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
git log --oneline -1
el tests
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode.py tests/kernels/test_decode_tc_build.py tests/kernels/test_decode_merge.py 2>&1 | tail -n 6 > $OUT/tests.txt; cat $OUT/tests.txt
for pl in consecutive scattered; do for arm in coop warp; do
  el "ncu $arm $pl"
  timeout 100 /usr/local/cuda/bin/ncu --clock-control none -k regex:rq_decode_tc -s 2 -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --metrics lts__t_requests.sum,lts__t_sectors.sum,l1tex__t_requests.sum,l1tex__t_sectors.sum python3 scratch/ncu27.py 16x16k $arm $pl > $OUT/ncu_${arm}_${pl}_16x16k.txt 2>&1
  grep -E "L2 Cache Throughput|DRAM Throughput|Duration|lts__t|l1tex__t|L1/TEX Hit" $OUT/ncu_${arm}_${pl}_16x16k.txt
done; done
el step; timeout 100 python benchmarks/bench_decode_step.py --out $OUT/step --deadline 90 2>&1 | grep -E "RQ/BF16|non-attention|Error|error" | tail -12
el decode; timeout 300 python benchmarks/bench_decode.py --out $OUT/decode --deadline 280 2>&1 | grep -vE "^  check" | grep -v "rows |" | tail -30
el done
