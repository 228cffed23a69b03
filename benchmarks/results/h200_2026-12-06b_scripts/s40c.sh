#!/usr/bin/env bash
# Session 40 (carry .gpu-bundle/kern2.tar.xz: kern.tar.xz of ../h200_2026-12-05g_scripts/README.md
# plus sglang/srt/multimodal and xgrammar from `sglang-rq bundle`, 14.9 MB): the kernel tests that
# failed with kern.tar.xz for want of sglang.srt.multimodal (test_commit.py, test_portable_ops.py),
# then the real server on the GPU (benchmarks/gpu_session.sh gpuserver) with that site.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
rm -rf /tmp/rq-site && mkdir -p /tmp/rq-site && tar -xJf .gpu-bundle/kern2.tar.xz -C /tmp/rq-site
export PYTHONPATH=$PWD:/tmp/rq-site TRITON_CACHE_DIR=/tmp/triton-cache XDG_CACHE_HOME=/tmp/xdg PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -rfEs -p no:cacheprovider tests/kernels/test_commit.py tests/kernels/test_portable_ops.py \
  > $OUT/commit_ops.txt 2>&1; echo "pytest rc=$? after $(( $(date +%s) - T0 )) s"
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/commit_ops.txt | tail -12
SITE=/tmp/rq-site MAX_S=$(( ${LIMIT:-560} - 330 - ($(date +%s) - T0) )) bash benchmarks/gpu_session.sh gpuserver 2>&1 | tail -25
