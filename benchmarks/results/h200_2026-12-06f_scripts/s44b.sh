#!/usr/bin/env bash
# Session 44: why the cluster variant's first launch is "an illegal instruction" (s44a.sh):
# one launch per process with and without PDL, for the anchor loop (3) and a residual loop (0);
# then compute-sanitizer on one, and the SASS of the cluster cubin around the PCs it names.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; mkdir -p $OUT
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XDG_CACHE_HOME=/tmp/xdg
D=benchmarks/results/h200_2026-12-06f_scripts
nvcc --version | tail -2
for a in "0 4 3" "1 4 3" "0 4 0" "1 4 0" "0 8 3"; do timeout 60 python3 $D/diag_cluster.py $a 2>&1 | tail -1; done
CS=/usr/local/cuda/bin/compute-sanitizer
timeout 120 $CS --tool memcheck --print-limit 3 python3 $D/diag_cluster.py 0 4 3 > $OUT/san.txt 2>&1
grep -E "=====" $OUT/san.txt | head -16
CO=/usr/local/cuda/bin/cuobjdump
for f in $(ls -t /tmp/xdg/rq_kernels/*.cubin); do
  if $CO -sass $f | grep -q UCGABAR; then
    echo "cluster cubin $f"; cp $f $OUT/; $CO -sass $f > $OUT/$(basename $f).sass
    for pc in $(grep -oE "rq_decode_tc_split\+0x[0-9a-f]+" $OUT/san.txt | sort -u | cut -d+ -f2 | head -3); do
      p=$(printf "%04x" $pc); echo "== $pc"; grep -B12 -A3 -E "/\*$p\*/" $OUT/$(basename $f).sass | grep -oE "/\*[0-9a-f]{4}\*/ +[^;]*;"
    done
  fi
done
