#!/usr/bin/env bash
# Session 39: the H200 figures of record with main's kernel (lever 3 merged), or nothing on any
# other card (its figures were taken this session). Carry .gpu-bundle/flashinfer-decode.
set -uo pipefail
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$NAME"
[[ $NAME == *H200* ]] || { echo "not an H200: nothing to run"; exit 0; }
LIMIT=${LIMIT:-360} exec bash benchmarks/results/h200_2026-12-05g_scripts/s37b.sh
