# ruff: noqa  (session 35 script as run on the lent GPU; kept with its results)
"""Three decode_attention calls (residual loop 0, tc kernel) for ncu to profile the third, with the
kernel source arms/ARM.cu: python ncun.py ARM FAMILY BATCH CTX"""
import os, sys
import torch
import benchmarks.bench_decode as bd
from benchmarks.common import FAMILIES, pool
from rq_kernels import cuda, decode_attention, decode_tc
from rq_kernels.decode import DecodeLaunch
from sglang_rq.config import RQConfig
arm, fam, b, ctx = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
src = f"_ab_ncu_{arm}.cu"
(cuda.CSRC / src).write_text(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "arms", arm + ".cu")).read())
decode_tc.SOURCE = src
try:
    lens = [ctx] * b
    hq, hkv, dim = FAMILIES[fam]
    view = pool(RQConfig(), hkv, dim, sum(lens) + 2, 4)
    q, kc, vc, ind, idx = bd.batch_inputs(view, hq, hkv, dim, lens)
    out = torch.empty_like(q)
    for _ in range(3):
        decode_attention(q, kc, vc, view, 0, ind, idx, sm_scale=dim ** -0.5, out=out,
                         launch=DecodeLaunch(split_kernel="tc"))
    torch.cuda.synchronize()
finally:
    (cuda.CSRC / src).unlink(missing_ok=True)
print("done", sys.argv[1:])
