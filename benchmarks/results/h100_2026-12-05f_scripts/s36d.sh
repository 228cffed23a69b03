#!/usr/bin/env bash
# Session 36, fourth device call (carry arms/: make_arms.py's second set and arms/main_f.cu =
# ac73e6a's kernel): why do the codes' evict_first copies (STREAM) help Ouro? Nsight's DRAM
# bytes per arm at Ouro 64 x 8k, 2 x 16k and Huginn 64 x 8k, then bench_tc_ab.py chained:
# new (c267694, STREAM), base (ac73e6a), idxkeep (the pool slots loaded with evict_last),
# idxkeep_ns (the same, STREAM off).
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s); AR=benchmarks/results/h100_2026-12-05f_scripts/arms
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XDG_CACHE_HOME=/tmp/xdg
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
ARMS="--base $AR/main_f.cu --arm idxkeep=$AR/idxkeep.cu --arm idxkeep_ns=$AR/idxkeep_ns.cu"
M=gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum,smsp__inst_executed.sum
prof() {  # arm point
  timeout 80 /usr/local/cuda/bin/ncu --clock-control none -k regex:rq_decode_tc -s 2 -c 1 --metrics $M --csv \
    python3 benchmarks/bench_tc_ab.py $ARMS --profile $2 --profile-arm $1 > /tmp/ncu.csv 2>&1
  echo "$1 $2: $(grep -E '"(gpu__time|dram__bytes_read|lts__t_sector_hit|lts__t_sectors_src|smsp__inst)' /tmp/ncu.csv | awk -F'","' '{printf "%s=%s %s; ", $(NF-2), $NF, $(NF-1)}')" | tee -a $OUT/ncu_summary.txt
}
el ncu
for p in ouro-1.4b:64x8192 huginn-d96:64x8192 ouro-1.4b:2x16384; do
  for a in new base idxkeep idxkeep_ns; do (( $(left) > 260 )) && prof $a $p; done
done
el A/B chained
P=ouro-1.4b:1x8192,ouro-1.4b:2x16384,ouro-1.4b:4x8192,ouro-1.4b:64x8192,huginn-d96:4x8192,huginn-d96:64x8192,smollm2-gqa:4x8192,smollm2-gqa:64x8192
timeout $(( $(left) - 5 )) python3 benchmarks/bench_tc_ab.py $ARMS --chained --no-step --points $P --reps 2 --out $OUT \
  --deadline $(( $(left) - 60 )) > $OUT/ab.txt 2>&1
grep -vE "^\s*$" $OUT/ab.txt | grep -vE "check .*ok=True" | tail -24
el done
