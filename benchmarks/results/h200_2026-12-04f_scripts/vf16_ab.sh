# The device call that measured the VF16 V side (run from the checkout root on the H200, branch vf16;
# scratch/base_main.cu = `git show main:rq_kernels/csrc/rq_decode_tc.cu`, carried).
export PYTHONPATH=$PWD; mkdir -p $OUT
(timeout 170 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_decode.py -k "tc or coop" > $OUT/t.txt 2>&1; echo rc=$? >> $OUT/t.txt)
BASE_REV=scratch/base_main.cu BENCH_ARGS="--deadline 300" OUT=$OUT timeout 400 benchmarks/gpu_session.sh tc-ab > $OUT/s.txt 2>&1
