#!/usr/bin/env bash
# Session 27 device call 4: COOP 2 (CTA-wide code copies too): GPU tests, per-call A/B against COOP 1 and
# per-warp copies, decode step per arm, ncu at 16 x 16k.
set -uo pipefail
OUT=${OUT:-/tmp/rq-out}; T0=$(date +%s)
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
el tests
timeout 150 python3 -m pytest -q -p no:cacheprovider -x tests/kernels/test_decode.py -k "tc or coop or graph" 2>&1 | tail -n 4 > $OUT/tests.txt; cat $OUT/tests.txt
el ab; timeout 150 python scratch/ab27b.py $OUT 2>&1 | grep -E "AB|Error|error|assert" | python3 -c "
import sys, json
for l in sys.stdin:
    if not l.startswith('AB '): print(l.rstrip()); continue
    r = json.loads(l[3:]); print('AB', r['rep'], r['batch'], r['ctx'], ' '.join(f'{k}={v:.1f}' if k.endswith('us') else f'{k}={v:.3f}' for k, v in r.items() if k.endswith('us') or k.startswith('ratio')))"
for arm in warp coop coop2; do
  el "step $arm"; mkdir -p $OUT/step_$arm
  timeout 70 python -c "
import sys, runpy; sys.path.insert(0, '.')
import rq_kernels.decode_tc as d
if '$arm' == 'warp': d.coop_copies = lambda v, l: False
d.COOP_CODES = '$arm' == 'coop2'
sys.argv = ['bench_decode_step.py', '--out', '$OUT/step_$arm', '--deadline', '60']
runpy.run_path('benchmarks/bench_decode_step.py', run_name='__main__')" 2>&1 | grep -E "RQ/BF16|Error|error" | tail -6
done
el ncu
timeout 60 /usr/local/cuda/bin/ncu --clock-control none -k regex:rq_decode_tc -s 2 -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --metrics lts__t_requests.sum,lts__t_sectors.sum,l1tex__t_requests.sum,l1tex__t_sectors.sum python3 scratch/ncu27.py 16x16k coop > $OUT/ncu_coop2_consecutive_16x16k.txt 2>&1
grep -E "L2 Cache Throughput|DRAM Throughput|Duration|lts__t|l1tex__t|L1/TEX Hit" $OUT/ncu_coop2_consecutive_16x16k.txt
el done
