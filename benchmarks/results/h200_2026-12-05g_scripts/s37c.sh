#!/usr/bin/env bash
# Session 37, one call for whichever card comes (carry .gpu-bundle/flashinfer-decode and
# .gpu-bundle/kern.tar.xz, a trimmed SGLang bundle): on an H200 the figures of record (s37b.sh);
# on an H100 the whole tests/kernels with SGLang importable (session 36's run without it had 11
# failures, 10 unidentified), each test's outcome printed as it finishes.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s)
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$NAME"
if [[ $NAME == *H200* ]]; then exec bash benchmarks/results/h200_2026-12-05g_scripts/s37b.sh; fi
mkdir -p /tmp/rq-site && tar -xJf .gpu-bundle/kern.tar.xz -C /tmp/rq-site
export PYTHONPATH=$PWD:/tmp/rq-site TRITON_CACHE_DIR=/tmp/triton-cache XDG_CACHE_HOME=/tmp/xdg PYTHONUNBUFFERED=1
python3 -c "import sglang, sglang.srt.mem_cache.memory_pool; print('sglang', sglang.__version__)" 2>&1 | tail -2
timeout $(( ${LIMIT:-330} - ($(date +%s) - T0) )) python3 -m pytest -v -rfE -p no:cacheprovider tests/kernels \
  > $OUT/kernels.txt 2>&1; echo "pytest rc=$? after $(( $(date +%s) - T0 )) s"
grep -cE " PASSED" $OUT/kernels.txt; grep -cE " SKIPPED" $OUT/kernels.txt
grep -E " (FAILED|ERROR)|^(FAILED|ERROR)|passed|failed" $OUT/kernels.txt | tail -30
