#!/usr/bin/env bash
# Session 35, one device call from a checkout of main (no carry): main's kernel source saved as
# the base, issue_cut.diff (session 34) applied to the call's copy, then
#  - bench_tc_ab.py --l2-rows 4096: the arms with L2-resident reads (the loop's issue-bound
#    speed-up, which the H100's HBM hides);
#  - bench_tc_ab.py flushed over HBM (an H200: two reps and the step; an H100: one rep, no step);
#  - Nsight Compute of Huginn 64 x 8k (the 2-CTA shape the H100 lost), main then the diff.
# Stages are skipped once the call's time runs short.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s)
PREV=benchmarks/results/h100_2026-12-05d_scripts
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( 570 - ($(date +%s) - T0) )); }
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
mkdir -p scratch $OUT/l2 $OUT/hbm && cp rq_kernels/csrc/rq_decode_tc.cu scratch/main.cu
git apply $PREV/issue_cut.diff || patch -p1 < $PREV/issue_cut.diff || exit 1
hbm() {
  if [[ $GPU == *H200* ]]; then args="--reps 2"; t=250; else args="--reps 1 --no-step"; t=130; fi
  (( $(left) > t + 20 )) || { el "skip hbm"; return; }
  el "hbm A/B $args"
  timeout $((t + 30)) python3 benchmarks/bench_tc_ab.py --base scratch/main.cu --out $OUT/hbm $args --deadline $t > $OUT/hbm/ab.txt 2>&1
  grep -E "base/new|Error|error" $OUT/hbm/ab.txt | tail -28
}
l2() {
  el "L2-resident A/B"
  timeout 190 python3 benchmarks/bench_tc_ab.py --base scratch/main.cu --out $OUT/l2 --reps 3 --l2-rows 4096 --deadline 160 > $OUT/l2/ab.txt 2>&1
  grep -E "base/new|Error|error|fail" $OUT/l2/ab.txt | tail -40
}
ncu() {
  for arm in main both; do
    (( $(left) > 90 )) || { el "skip ncu $arm"; continue; }
    el "ncu $arm"
    timeout 90 /usr/local/cuda/bin/ncu --clock-control none -k regex:rq_decode_tc -s 2 -c 1 --import-source no \
      --section WarpStateStats --section SchedulerStats --section InstructionStats --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
      -o $OUT/ncu_$arm python3 $PREV/ncu34.py $arm > $OUT/ncu_run_$arm.txt 2>&1
    /usr/local/cuda/bin/ncu -i $OUT/ncu_$arm.ncu-rep --print-details all > $OUT/ncu_details_$arm.txt 2>&1
    rm -f $OUT/ncu_$arm.ncu-rep
    grep -E "Duration|Issue Slots|Warp Cycles Per Issued|DRAM Throughput|Achieved Occupancy|Registers Per" $OUT/ncu_details_$arm.txt | head -12
  done
}
if [[ $GPU == *H200* ]]; then hbm; l2; ncu; else l2; ncu; hbm; fi
el done
