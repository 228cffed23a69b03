#!/usr/bin/env bash
# Session 24 device call 4: (scale, offset) rows head-major against token-major (ae493d5), two reps; ncu tm vs hm at 16 x 16k.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; SITE=/tmp/rq-site; T0=$(date +%s)
[ -d $SITE/sglang ] || { mkdir -p $SITE && tar -xJf .gpu-bundle/sglang-rq-bundle.tar.xz -C $SITE; }
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$SITE
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
for rep in 0 1; do
  el "ab rep $rep"
  timeout 150 python scratch/ab24c.py new $rep 2>&1 | grep -E "AB|Error|error|assert|reasons"
done
for arm in tm hm; do
  [ $(( $(date +%s) - T0 )) -gt 400 ] && { el "time guard: skip ncu $arm"; break; }
  el "ncu $arm"
  timeout 50 /usr/local/cuda/bin/ncu --clock-control none -k regex:rq_decode_tc -s 2 -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --metrics lts__t_requests.sum,lts__t_sectors.sum,l1tex__t_requests.sum,l1tex__t_sectors.sum,l1tex__t_sector_hit_rate.pct python3 scratch/ncu24c.py $arm > $OUT/ncu_so_${arm}_16x16k.txt 2>&1
  grep -E "L2 Cache Throughput|DRAM Throughput|Duration|lts__t|l1tex__t" $OUT/ncu_so_${arm}_16x16k.txt
done
el done
