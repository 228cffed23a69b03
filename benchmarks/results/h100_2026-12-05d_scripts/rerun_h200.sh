#!/usr/bin/env bash
# The A/B of issue_cut.diff for an H200 (or any GPU), from a checkout of main as it stood on
# 2026-12-05 (e391771 .. 0090987: the kernel source the diff applies to): one device call, no
# carry. main's kernel source is saved as the base, the diff applied to the call's copy of the
# tree, the GPU tests run, then bench_tc_ab.py (flushed, two reps, the Ouro step at batch 2 and
# 13) and Nsight Compute on Huginn 64 x 8k (ncu34.py: main's source, then the diff's), the point
# the H100 lost.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s)
HERE=benchmarks/results/h100_2026-12-05d_scripts
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
mkdir -p scratch && cp rq_kernels/csrc/rq_decode_tc.cu scratch/main.cu
git apply $HERE/issue_cut.diff || patch -p1 < $HERE/issue_cut.diff || exit 1
el tests
timeout 170 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_decode.py tests/kernels/test_decode_tc_copies.py -k "tc or coop or copies" > $OUT/gputests.txt 2>&1
tail -2 $OUT/gputests.txt
el ab
timeout 260 python3 benchmarks/bench_tc_ab.py --base scratch/main.cu --out $OUT --reps 2 --deadline 220 > $OUT/ab.txt 2>&1
grep -E "base/new|Error" $OUT/ab.txt | tail -28
NCU=/usr/local/cuda/bin/ncu
for arm in main both; do
  el "ncu $arm"
  timeout 100 $NCU --clock-control none -k regex:rq_decode_tc -s 2 -c 1 --import-source no \
    --section WarpStateStats --section SchedulerStats --section InstructionStats --section SpeedOfLight --section MemoryWorkloadAnalysis \
    -o $OUT/ncu_$arm python3 $HERE/ncu34.py $arm > $OUT/ncu_run_$arm.txt 2>&1
  $NCU -i $OUT/ncu_$arm.ncu-rep --print-details all > $OUT/ncu_details_$arm.txt 2>&1
  rm -f $OUT/ncu_$arm.ncu-rep
  grep -E "Duration|Stall|Issue Slots|Warp Cycles Per Issued|DRAM Throughput" $OUT/ncu_details_$arm.txt | head -30
done
el done
