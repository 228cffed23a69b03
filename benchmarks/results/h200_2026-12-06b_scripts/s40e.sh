#!/usr/bin/env bash
# Session 40, prepared for the next call (carry .gpu-bundle/site.tar.xz, written by
# `python benchmarks/device_site.py .gpu-bundle/sglang-rq-bundle.tar.xz .gpu-bundle/site.tar.xz`,
# 15.2 MB: kern4's modules plus soundfile's data): s40d.sh with that site and a whole call's time,
# i.e. the GPU server test (real SGLang, the embedded model, RQ and BF16, graphs and eager), then
# the kernel tests that need SGLang.
SITE_TAR=.gpu-bundle/site.tar.xz SERVER_S=${SERVER_S:-330} LIMIT=${LIMIT:-540} \
  exec bash benchmarks/results/h200_2026-12-06b_scripts/s40d.sh
