#!/usr/bin/env bash
# Session 35, second device call (checkout of main, carry the arms/ folder that make_arms.py
# writes): why issue_cut.diff loses at Huginn 64 x 8k on the H100 (Nsight, first call: 16 % more
# DRAM bytes than main). Arms: new (main, the checkout), base = both (the diff), both_keep (its
# small copies with an L2 evict_last policy), both_nohint (no .L2::128B prefetch), both_first
# (its codes with evict_first). ncu's DRAM bytes per arm at Huginn 64 x 8k, then
# bench_tc_ab.py's flushed A/B of all arms at 9 points, then ncu at Ouro 64 x 8k if time is left.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s); AR=benchmarks/results/h100_2026-12-05e_scripts/arms
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XDG_CACHE_HOME=/tmp/xdg
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
ARMS="--base $AR/both.cu --arm both_keep=$AR/both_keep.cu --arm both_nohint=$AR/both_nohint.cu --arm both_first=$AR/both_first.cu"
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum,smsp__inst_executed.sum
prof() {  # arm point
  timeout 80 /usr/local/cuda/bin/ncu --clock-control none -k regex:rq_decode_tc -s 2 -c 1 --metrics $M --csv \
    python3 benchmarks/bench_tc_ab.py $ARMS --profile $2 --profile-arm $1 > $OUT/ncu_$1_${2/:/_}.csv 2>&1
  echo "$1 $2: $(grep -E '"(gpu__time|dram__bytes_read|lts__t_sector_hit|lts__t_sectors_src)' $OUT/ncu_$1_${2/:/_}.csv | awk -F'","' '{printf "%s=%s %s; ", $(NF-2), $NF, $(NF-1)}')"
}
el ncu huginn
for a in new base both_keep both_nohint both_first; do prof $a huginn-d96:64x8192; done
el A/B
P=huginn-d96:64x8192,huginn-d96:16x16384,huginn-d96:4x8192,ouro-1.4b:64x8192,ouro-1.4b:16x16384,ouro-1.4b:2x16384,ouro-1.4b:1x8192,ouro-1.4b:4x8192,smollm2-gqa:64x8192
timeout $(( $(left) - 40 )) python3 benchmarks/bench_tc_ab.py $ARMS --points $P --reps 3 --no-step --out $OUT/ab --deadline $(( $(left) - 100 )) > $OUT/ab.txt 2>&1
grep -E "rep|Error|error" $OUT/ab.txt | tail -30
el ncu ouro
for a in new base both_keep; do (( $(left) > 30 )) && prof $a ouro-1.4b:64x8192; done
el done
