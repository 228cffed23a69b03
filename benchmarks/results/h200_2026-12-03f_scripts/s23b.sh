#!/usr/bin/env bash
# Session 23 device call 2: carveout sweep on main's source (two reps, arm order rotated).
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; SITE=/tmp/rq-site; T0=$(date +%s)
[ -d $SITE/sglang ] || { mkdir -p $SITE && tar -xJf .gpu-bundle/sglang-rq-bundle.tar.xz -C $SITE; }
rm -rf scratch/main_rq; tar -xJf scratch/trees.tar.xz -C scratch
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader
el "rep 0"; ARMS=66,43,57,80 PYTHONPATH=$PWD/scratch/main_rq:$PWD:$SITE timeout 200 python scratch/ab23b.py main 0 2>&1 | grep -E "CV|Error|error|assert"
el "rep 1"; ARMS=80,57,43,66 PYTHONPATH=$PWD/scratch/main_rq:$PWD:$SITE timeout 200 python scratch/ab23b.py main 1 2>&1 | grep -E "CV|Error|error|assert"
el done
