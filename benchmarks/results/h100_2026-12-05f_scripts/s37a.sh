#!/usr/bin/env bash
# Prepared in session 36 for the next session's first device call (not run): the per-lane L2
# policies of the codes (make_arms.py, third set: lane_fn, lane_fl, lane_nl), from a checkout of
# main with arms/ carried (`python benchmarks/results/h100_2026-12-05f_scripts/make_arms.py` on
# that checkout, and arms/main_f.cu = `git show ac73e6a:rq_kernels/csrc/rq_decode_tc.cu`).
# Nsight's DRAM bytes per arm at Huginn 64 x 8k (the call needs 2.17 GB; main moved 2.43 on an
# H100), then bench_tc_ab.py chained, 3 reps: new = main (STREAM for Ouro), base = ac73e6a.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s); AR=benchmarks/results/h100_2026-12-05f_scripts/arms
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XDG_CACHE_HOME=/tmp/xdg
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
ARMS="--base $AR/main_f.cu --arm lane_fn=$AR/lane_fn.cu --arm lane_fl=$AR/lane_fl.cu --arm lane_nl=$AR/lane_nl.cu"
M=gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,smsp__inst_executed.sum
prof() {  # arm point
  timeout 80 /usr/local/cuda/bin/ncu --clock-control none -k regex:rq_decode_tc -s 2 -c 1 --metrics $M --csv \
    python3 benchmarks/bench_tc_ab.py $ARMS --profile $2 --profile-arm $1 > /tmp/ncu.csv 2>&1
  echo "$1 $2: $(grep -E '"(gpu__time|dram__bytes_read|lts__t_sector_hit|smsp__inst)' /tmp/ncu.csv | awk -F'","' '{printf "%s=%s %s; ", $(NF-2), $NF, $(NF-1)}')" | tee -a $OUT/ncu_summary.txt
}
el ncu
for a in new base lane_fn lane_fl lane_nl; do (( $(left) > 300 )) && prof $a huginn-d96:64x8192; done
el A/B chained
P=huginn-d96:4x8192,huginn-d96:16x16384,huginn-d96:64x8192,ouro-1.4b:2x16384,ouro-1.4b:64x8192,smollm2-gqa:64x8192
timeout $(( $(left) - 5 )) python3 benchmarks/bench_tc_ab.py $ARMS --chained --no-step --points $P --reps 3 --out $OUT \
  --deadline $(( $(left) - 60 )) > $OUT/ab.txt 2>&1
grep -vE "^\s*$" $OUT/ab.txt | grep -vE "check .*ok=True" | tail -24
el done
