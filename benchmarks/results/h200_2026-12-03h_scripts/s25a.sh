#!/usr/bin/env bash
# Session 25 device call 1: LSQ coefficients head-major (working tree, branch coef-head-major) against
# main d36f459: per-call A/B (two reps, rotated), decode step and commit per tree; GPU tests on the new tree.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; SITE=/tmp/rq-site; T0=$(date +%s)
[ -d $SITE/sglang ] || { mkdir -p $SITE && tar -xJf .gpu-bundle/sglang-rq-bundle.tar.xz -C $SITE; }
rm -rf scratch/main_rq scratch/main_files; tar -xJf scratch/trees.tar.xz -C scratch
mkdir -p scratch/main_rq/tests scratch/main_rq/benchmarks && cp -r rq_kernels sglang_rq scratch/main_rq/ && rm -rf scratch/main_rq/sglang_rq/assets
cp tests/__init__.py scratch/main_rq/tests/ && cp -r tests/kernels scratch/main_rq/tests/ && cp benchmarks/*.py scratch/main_rq/benchmarks/
cp -r scratch/main_files/* scratch/main_rq/
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
M=$PWD/scratch/main_rq
pp() { if [ $1 = main ]; then echo $M:$PWD:$SITE; else echo $PWD:$SITE; fi; }
bdir() { if [ $1 = main ]; then echo $M/benchmarks; else echo $PWD/benchmarks; fi; }
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
for rep in 0 1; do
  if [ $rep = 0 ]; then order="main new"; else order="new main"; fi
  for tree in $order; do
    el "ab $tree rep $rep"
    PYTHONPATH=$(pp $tree) timeout 100 python scratch/ab25a.py $tree $rep 2>&1 | grep -E "AB|Error|error|assert"
  done
done
for tree in main new; do
  el "step $tree"; mkdir -p $OUT/step_$tree
  PYTHONPATH=$(pp $tree) timeout 60 python $(bdir $tree)/bench_decode_step.py --out $OUT/step_$tree --deadline 55 2>&1 | grep -E "RQ/BF16|non-attention" | tail -8
done
for tree in main new; do
  el "commit $tree"; mkdir -p $OUT/commit_$tree
  PYTHONPATH=$(pp $tree) timeout 70 python $(bdir $tree)/bench_commit.py --out $OUT/commit_$tree 2>&1 | tail -6
done
el tests
PYTHONPATH=$PWD:$SITE timeout $(( 590 - ($(date +%s) - T0) )) python3 -m pytest -q -p no:cacheprovider -x tests/kernels/test_decode_merge.py tests/kernels/test_decode.py tests/kernels/test_commit.py tests/kernels/test_extend.py tests/kernels/test_pool_layout.py -k "tc or graph or merge or commit or extend or layout" 2>&1 | tail -n 6 > $OUT/tests.txt; cat $OUT/tests.txt
el done
