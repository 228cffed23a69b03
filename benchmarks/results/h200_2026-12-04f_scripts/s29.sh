#!/usr/bin/env bash
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s)
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
NCU=/usr/local/cuda/bin/ncu
for shp in 16x16k 2x16k; do
  el "ncu $shp"
  timeout 130 $NCU --clock-control none -k regex:rq_decode_tc -s 2 -c 1 --import-source no \
    --section WarpStateStats --section SchedulerStats --section InstructionStats --section ComputeWorkloadAnalysis --section SourceCounters --section SpeedOfLight --section Occupancy \
    -o $OUT/ncu_$shp python3 scratch/ncu29.py $shp coop > $OUT/ncu_run_$shp.txt 2>&1
  $NCU -i $OUT/ncu_$shp.ncu-rep --print-details all > $OUT/ncu_details_$shp.txt 2>&1
  $NCU -i $OUT/ncu_$shp.ncu-rep --page source --print-source sass --csv > $OUT/ncu_sass_$shp.csv 2>&1
  ls -la $OUT; tail -3 $OUT/ncu_run_$shp.txt
  grep -E "Stall|Issue|Warp Cycles|Eligible|Active Warps|Duration|Executed Ipc|Pipe" $OUT/ncu_details_$shp.txt | head -60
done
el done
