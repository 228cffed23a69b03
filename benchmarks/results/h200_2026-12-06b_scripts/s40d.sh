#!/usr/bin/env bash
# Session 40, after s40c.sh (carry .gpu-bundle/kern4.tar.xz: kern.tar.xz of
# ../h200_2026-12-05g_scripts/README.md plus sglang/srt/{multimodal,hardware_backend,disaggregation},
# xgrammar, openai and gguf from `sglang-rq bundle`, without _soundfile_data; 14.6 MB): the kernel
# tests that need SGLang (test_commit.py, test_portable_ops.py), then the GPU server test.
# The server first (the device budget left was about 300 s).
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
rm -rf /tmp/rq-site && mkdir -p /tmp/rq-site && tar -xJf ${SITE_TAR:-.gpu-bundle/kern4.tar.xz} -C /tmp/rq-site
export PYTHONPATH=$PWD:/tmp/rq-site TRITON_CACHE_DIR=/tmp/triton-cache XDG_CACHE_HOME=/tmp/xdg PYTHONUNBUFFERED=1
export SGLANG_RQ_DATA_DIR=$PWD/.gpu-bundle/data
timeout ${SERVER_S:-180} python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_gpu_server.py > $OUT/gpuserver.txt 2>&1
echo "server pytest rc=$? after $(( $(date +%s) - T0 )) s"; grep -E "^(FAILED|ERROR)|^E .*Error|passed|failed" $OUT/gpuserver.txt | head -12
timeout $(( ${LIMIT:-270} - ($(date +%s) - T0) )) python3 -m pytest -q -rfEs -p no:cacheprovider tests/kernels/test_commit.py \
  tests/kernels/test_portable_ops.py > $OUT/commit_ops.txt 2>&1; echo "pytest rc=$? after $(( $(date +%s) - T0 )) s"
grep -E "^(FAILED|ERROR)|^E .*Error|passed|failed" $OUT/commit_ops.txt | sort | uniq -c | head -12
( cd /tmp && tar -czf "$OUT/server-logs.tgz" pytest-of-*/pytest-current/*/*.log 2>/dev/null )
