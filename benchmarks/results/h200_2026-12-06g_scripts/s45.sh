#!/usr/bin/env bash
# Session 45, one call on whichever card comes (carry .gpu-bundle/flashinfer-decode,
# .gpu-bundle/site.tar.xz, .gpu-bundle/data):
#   WHAT=figures : on an H200 only, the figures of record with main's kernel (s39b.sh);
#   WHAT=server  : the real server on the GPU (tests/gpu/test_gpu_server.py, SGLang from the
#                  offline site bundle);
#   WHAT=step    : on an H200 only, the decode step alone (bench_decode_step.py, ~150 s);
#   WHAT=auto    : figures on an H200, else the server test.
set -uo pipefail
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$NAME"
WHAT=${WHAT:-auto}
[[ $WHAT == auto ]] && { [[ $NAME == *H200* ]] && WHAT=figures || WHAT=server; }
echo "running: $WHAT"
if [[ $WHAT == step ]]; then  # the decode step alone (about 150 s), for a short budget
  [[ $NAME == *H200* ]] || { echo "not an H200: nothing to run"; exit 0; }
  export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XDG_CACHE_HOME=/tmp/xdg
  timeout 150 python3 benchmarks/bench_decode_step.py --out ${OUT:-/tmp/rq-out} --deadline 110 \
    2>&1 | grep -E "^fixed |^32GiB|^card |^ +non-attention|^none "
  exit 0
fi
if [[ $WHAT == figures ]]; then
  exec bash benchmarks/results/h200_2026-12-06_scripts/s39b.sh
fi
export XDG_CACHE_HOME=/tmp/xdg TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1
mkdir -p /tmp/rq-site && [[ -d /tmp/rq-site/sglang ]] || tar -xJf .gpu-bundle/site.tar.xz -C /tmp/rq-site
T0=$(date +%s)
PYTHONPATH=$PWD:/tmp/rq-site SGLANG_RQ_DATA_DIR=$PWD/.gpu-bundle/data timeout ${LIMIT:-500} \
  python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_gpu_server.py 2>&1 | tail -30
echo "[server test: $(( $(date +%s) - T0 )) s]"
