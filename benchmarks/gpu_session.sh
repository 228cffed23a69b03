#!/usr/bin/env bash
# Everything the project checks and times on a CUDA host, in one call (the lent H200 has no
# network and a per-session time budget, so one script does it all and writes under $OUT).
#
#   benchmarks/gpu_session.sh STEP...
#   steps: doctor gpuserver gputests kernels bench-extend bench-decode ops serving-card
#          serving-budget tp2 profile-server tc-ab
#
# Env: BUNDLE (default .gpu-bundle/site.tar.xz where it exists, the device site that
# `benchmarks/device_site.py` writes from the full bundle and that fits the lent machine's carried
# tree beside the checkout; else .gpu-bundle/sglang-rq-bundle.tar.xz, from `sglang-rq bundle`), SITE
# (where it is unpacked, default /tmp/rq-site), OUT (results, default /tmp/rq-out), DATA (held-out
# text, default .gpu-bundle/data; `device_site.py --data` writes the heads the gpuserver step
# reads), TOKENIZER (SmolLM2 tokenizer dir for the Ouro-1.4B-shaped checkpoint, default
# .gpu-bundle/smollm2-tokenizer), MAX_S (skip steps that start after this many seconds), CARD_ARGS
# (extra flags of the card suite, e.g. --offered 0), GPUTESTS (test files of the gputests step),
# TESTS_K (-k filter of the gpuserver step), BENCH_ARGS (extra flags of the bench-* steps, e.g.
# --mixed-only for bench-extend), BASE_REV (the tc-ab step's base: a git revision, or a saved .cu
# file where the checkout travels without .git; default main; the working tree's tc kernel against
# it, `benchmarks/bench_tc_ab.py`).
# FlashInfer's BF16 decode (`benchmarks/flashinfer_bundle.py .gpu-bundle`, carried as
# .gpu-bundle/flashinfer-decode) is timed beside SDPA by bench-decode and bench_decode_step.py
# when present.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/rq-out}; SITE=${SITE:-/tmp/rq-site}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
DEFAULT_BUNDLE=.gpu-bundle/sglang-rq-bundle.tar.xz
[ -f .gpu-bundle/site.tar.xz ] && DEFAULT_BUNDLE=.gpu-bundle/site.tar.xz
BUNDLE=${BUNDLE:-$DEFAULT_BUNDLE}
if [ ! -d "$SITE/sglang" ] && [ -f "$BUNDLE" ]; then
  mkdir -p "$SITE" && tar -xJf "$BUNDLE" -C "$SITE" || exit 3
elif [ ! -d "$SITE/sglang" ]; then  # the kernel steps (kernels, bench-*, tc-ab) need no SGLang
  el "no bundle at $BUNDLE: the steps that serve (doctor, gpuserver, serving-*, tp2) will fail"
fi
export PYTHONPATH=$PWD:$SITE PYTHONUNBUFFERED=1
export SGLANG_RQ_DATA_DIR=${DATA:-$PWD/.gpu-bundle/data} TRITON_CACHE_DIR=/tmp/triton-cache
TOK=${TOKENIZER:-$PWD/.gpu-bundle/smollm2-tokenizer}
el "site $(du -sh "$SITE" | cut -f1); $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -2 | tr '\n' ' ')"
for step in "$@"; do
  if [ $(( $(date +%s) - T0 )) -gt "${MAX_S:-100000}" ]; then el "time guard: skip $step"; continue; fi
  el "step $step"
  case $step in
    doctor)
      python3 -m sglang_rq.doctor 2>&1 | tee "$OUT/doctor.txt" ;;
    gpuserver)  # all four tests take about 460 s on an H100 (12-06c): TESTS_K="not teacher", then teacher
      timeout 330 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_gpu_server.py \
        -k "${TESTS_K:-not nothing}" 2>&1 | tee "$OUT/gpuserver.txt" | tail -30 ;;
    gputests)
      timeout 500 python3 -m pytest -q -rs -s -p no:cacheprovider \
        ${GPUTESTS:-tests/gpu/test_gpu_prescale.py tests/gpu/test_gpu_huginn.py} 2>&1 | tee "$OUT/gputests.txt" | tail -30 ;;
    bench-extend|bench-decode|bench-commit)
      timeout 300 python3 "benchmarks/bench_${step#bench-}.py" --out "$OUT" ${BENCH_ARGS:-} 2>&1 \
        | tee "$OUT/$step.txt" | tail -30 ;;
    tc-ab)
      timeout 540 python3 benchmarks/bench_tc_ab.py --base "${BASE_REV:-main}" --out "$OUT" \
        ${BENCH_ARGS:-} 2>&1 | tee "$OUT/tc-ab.txt" | tail -30 ;;
    kernels)
      timeout 360 python3 -m pytest -q -rs -p no:cacheprovider -x tests/kernels 2>&1 \
        | tee "$OUT/kernels.txt" | tail -20 ;;
    ops)
      timeout 100 python3 benchmarks/bench_portable_ops.py --out "$OUT" 2>&1 | tail -30 ;;
    serving-card|serving-budget)
      timeout 560 python3 benchmarks/bench_serving.py --out "$OUT/serving" --tokenizer "$TOK" \
        --suite "${step#serving-}" $([ $step = serving-card ] && echo "${CARD_ARGS:-}") 2>&1 | tail -40 ;;
    profile-server)
      timeout 540 python3 benchmarks/profile_server.py --out "$OUT/profile_server" --tokenizer "$TOK" \
        ${BENCH_ARGS:-} 2>&1 | tail -30 ;;
    tp2)
      timeout 200 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_gpu_tp.py 2>&1 \
        | tee "$OUT/tp2.txt" | tail -20 ;;
    *) echo "unknown step $step" ;;
  esac
done
( cd /tmp && tar -czf "$OUT/server-logs.tgz" pytest-of-*/pytest-current/*/*.log rq-bench-serving/*.log 2>/dev/null )
el done
