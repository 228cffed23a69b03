#!/usr/bin/env bash
# Session 42, first call (carry .gpu-bundle/flashinfer-decode): on an H200 the figures of record
# with main's kernel (levers 5, 6, 3, 7 merged; s39b.sh -> s37b.sh); on any other card the GPU
# kernel tests (the magic-drain test's host-independent form was not yet run on a GPU host).
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; mkdir -p $OUT
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XDG_CACHE_HOME=/tmp/xdg
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$NAME"
if [[ $NAME == *H200* ]]; then
  OUT=$OUT LIMIT=${LIMIT:-540} exec bash benchmarks/results/h200_2026-12-05g_scripts/s37b.sh
fi
pip list 2>/dev/null | grep -iE "^(torch|triton|pytest) " || true
timeout ${TESTS_S:-420} python3 -m pytest -q -rs -p no:warnings -p no:cacheprovider tests/kernels 2>&1 | tail -40
