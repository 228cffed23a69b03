#!/usr/bin/env bash
# Session 24 device call 5: ncu of (scale, offset) rows token-major (tm) and head-major (hm) at 16 x 16k (3-CTA shape) and 64 x 8k (2-CTA shape).
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; SITE=/tmp/rq-site; T0=$(date +%s)
[ -d $SITE/sglang ] || { mkdir -p $SITE && tar -xJf .gpu-bundle/sglang-rq-bundle.tar.xz -C $SITE; }
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$SITE
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
for shape in 16x16k 64x8k; do for arm in tm hm; do
  el "ncu $arm $shape"
  timeout 60 /usr/local/cuda/bin/ncu --clock-control none -k regex:rq_decode_tc -s 2 -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --metrics lts__t_requests.sum,lts__t_sectors.sum,l1tex__t_requests.sum,l1tex__t_sectors.sum,l1tex__t_sector_hit_rate.pct,dram__bytes_read.sum python3 scratch/ncu24c.py $arm $shape > $OUT/ncu_so_${arm}_${shape}.txt 2>&1
  grep -E "L2 Cache Throughput|DRAM Throughput|Duration|lts__t|l1tex__t|dram__bytes|Error" $OUT/ncu_so_${arm}_${shape}.txt
done; done
el done
