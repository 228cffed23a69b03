#!/usr/bin/env bash
# Session 23 device call 4: Nsight Compute of the tc split kernel (main's source) at three shapes.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; SITE=/tmp/rq-site; T0=$(date +%s)
[ -d $SITE/sglang ] || { mkdir -p $SITE && tar -xJf .gpu-bundle/sglang-rq-bundle.tar.xz -C $SITE; }
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$SITE
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
which ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null
NCU=$(which ncu 2>/dev/null || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
python3 scratch/ncu23.py 2x16k   # compile the variants first (outside the profiler)
for s in 16x16k 64x8k 2x16k; do
  el "ncu $s"
  timeout 150 $NCU --clock-control none -k regex:rq_decode_tc -s 2 -c 1 --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section Occupancy --section LaunchStats --metrics l1tex__t_sector_hit_rate.pct,lts__t_sector_hit_rate.pct,sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active python3 scratch/ncu23.py $s > $OUT/ncu_$s.txt 2>&1
  grep -E "DRAM Throughput|Memory Throughput|Issue Slots Busy|Issued Warp|L1/TEX Hit|L2 Hit|Achieved Occupancy|Registers Per|Duration|Warp Cycles Per Issued|issue_active|hit_rate|hmma" $OUT/ncu_$s.txt | head -24
done
el done
