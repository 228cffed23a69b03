#!/usr/bin/env bash
# Session 36, second device call (arms/main_f.cu = ac73e6a's kernel, `git show`; carry arms/ and
# .gpu-bundle/flashinfer-decode): the codes' evict_first copies where no CTA shares a code line
# (STREAM, `decode_tc.stream_codes`): GPU tests, bench_tc_ab.py chained against ac73e6a's kernel
# and the step, then bench_decode.py (figures of record: SDPA, FlashInfer, the pure read).
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s); AR=benchmarks/results/h100_2026-12-05f_scripts/arms
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XDG_CACHE_HOME=/tmp/xdg
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader
el tests
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode.py tests/kernels/test_decode_tc_copies.py -k "tc or coop or copies or stream" > $OUT/gputests.txt 2>&1
tail -3 $OUT/gputests.txt; grep -E "^FAILED|Error" $OUT/gputests.txt | head -5
el A/B chained
P=ouro-1.4b:1x8192,ouro-1.4b:2x16384,ouro-1.4b:4x8192,ouro-1.4b:4x32768,ouro-1.4b:16x16384,ouro-1.4b:64x8192,smollm2-gqa:64x8192
timeout 150 python3 benchmarks/bench_tc_ab.py --base $AR/main_f.cu --chained --points $P --reps 2 --out $OUT \
  --deadline 100 > $OUT/ab.txt 2>&1
grep -vE "^\s*$" $OUT/ab.txt | grep -vE "check .*ok=True" | tail -24
(( $(left) > 100 )) || { el "no time for bench_decode"; exit 0; }
el bench_decode
timeout $(( $(left) - 5 )) python3 benchmarks/bench_decode.py --out $OUT --deadline $(( $(left) - 40 )) > $OUT/decode.txt 2>&1
grep -E "^ouro|^huginn|^smollm|TB/s|vs" $OUT/decode.txt | grep -v check | head -60
el done
