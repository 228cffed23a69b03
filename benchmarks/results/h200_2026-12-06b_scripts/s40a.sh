#!/usr/bin/env bash
# Session 40, first call on whichever card comes (carry .gpu-bundle/kern.tar.xz, the trimmed SGLang
# bundle of ../h200_2026-12-05g_scripts/README.md): the whole tests/kernels with SGLang importable,
# each test's outcome kept (session 36's bare run had 11 failures, 10 never identified).
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
mkdir -p /tmp/rq-site && tar -xJf .gpu-bundle/kern.tar.xz -C /tmp/rq-site
export PYTHONPATH=$PWD:/tmp/rq-site TRITON_CACHE_DIR=/tmp/triton-cache XDG_CACHE_HOME=/tmp/xdg PYTHONUNBUFFERED=1
python3 -c "import sglang, sglang.srt.mem_cache.memory_pool; print('sglang', sglang.__version__)" 2>&1 | tail -2
timeout $(( ${LIMIT:-540} - ($(date +%s) - T0) )) python3 -m pytest -v -rfEs -p no:cacheprovider tests/kernels \
  > $OUT/kernels.txt 2>&1; echo "pytest rc=$? after $(( $(date +%s) - T0 )) s"
grep -cE " PASSED" $OUT/kernels.txt; grep -cE " SKIPPED" $OUT/kernels.txt
grep -E " (FAILED|ERROR)|^(FAILED|ERROR)|passed|failed" $OUT/kernels.txt | tail -30
