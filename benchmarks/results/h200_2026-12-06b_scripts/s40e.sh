#!/usr/bin/env bash
# Session 40, prepared for the next call (carry .gpu-bundle/site.tar.xz, written by
# `python benchmarks/device_site.py .gpu-bundle/sglang-rq-bundle.tar.xz .gpu-bundle/site.tar.xz`,
# 15.2 MB: kern4's modules plus soundfile's data): the GPU server test (real SGLang, the embedded
# model, RQ and BF16, graphs and eager), then the kernel tests that need SGLang.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
rm -rf /tmp/rq-site && mkdir -p /tmp/rq-site && tar -xJf .gpu-bundle/site.tar.xz -C /tmp/rq-site
export PYTHONPATH=$PWD:/tmp/rq-site TRITON_CACHE_DIR=/tmp/triton-cache XDG_CACHE_HOME=/tmp/xdg PYTHONUNBUFFERED=1
export SGLANG_RQ_DATA_DIR=$PWD/.gpu-bundle/data
timeout ${SERVER_S:-330} python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_gpu_server.py > $OUT/gpuserver.txt 2>&1
echo "server pytest rc=$? after $(( $(date +%s) - T0 )) s"; grep -E "^(FAILED|ERROR)|^E .*Error|passed|failed" $OUT/gpuserver.txt | head -12
timeout $(( ${LIMIT:-540} - ($(date +%s) - T0) )) python3 -m pytest -q -rfEs -p no:cacheprovider tests/kernels/test_commit.py \
  tests/kernels/test_portable_ops.py > $OUT/commit_ops.txt 2>&1; echo "pytest rc=$? after $(( $(date +%s) - T0 )) s"
grep -E "^(FAILED|ERROR)|^E .*Error|passed|failed" $OUT/commit_ops.txt | sort | uniq -c | head -12
( cd /tmp && tar -czf "$OUT/server-logs.tgz" pytest-of-*/pytest-current/*/*.log 2>/dev/null )
