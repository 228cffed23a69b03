#!/usr/bin/env bash
# Session 35, second device call (checkout of main, no carry): why issue_cut.diff loses at Huginn
# 64 x 8k on the H100 (Nsight, first call: 16-19 % more DRAM bytes than main). Arms (make_arms.py):
# main, both (the diff), both_keep (small copies with an L2 evict_last policy), both_nohint (no
# .L2::128B prefetch), both_first (codes with evict_first). ncu's DRAM bytes per arm at Huginn 64 x 8k, then abn.py's flushed
# A/B of all arms, then ncu at Ouro 64 x 8k if time is left.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s); HERE=benchmarks/results/h100_2026-12-05e_scripts
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XDG_CACHE_HOME=/tmp/xdg
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( 570 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
ARMS="main both both_keep both_nohint both_first"
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum,smsp__inst_executed.sum
prof() {  # arm fam b ctx
  timeout 80 /usr/local/cuda/bin/ncu --clock-control none -k regex:rq_decode_tc -s 2 -c 1 --metrics $M --csv \
    python3 $HERE/ncun.py "$@" > $OUT/ncu_$1_$2_$3x$4.csv 2>&1
  echo "$1 $2 $3x$4: $(grep -E '"(gpu__time|dram__bytes_read|lts__t_sector_hit|lts__t_sectors_src)' $OUT/ncu_$1_$2_$3x$4.csv | awk -F'","' '{printf "%s=%s %s; ", $(NF-2), $NF, $(NF-1)}')"
}
el ncu huginn
for a in $ARMS; do prof $a huginn-d96 64 8192; done
el abn
DEADLINE=$(( $(left) - 120 )) REPS=3 timeout $(( $(left) - 60 )) python3 $HERE/abn.py $OUT/abn.json $ARMS > $OUT/abn.txt 2>&1
tail -16 $OUT/abn.txt
el ncu ouro
for a in main both main_keep; do (( $(left) > 30 )) && prof $a ouro-1.4b 64 8192; done
el done
