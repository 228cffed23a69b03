# ruff: noqa  (the session script as run on the H200, 2026-12-03g; kept with its results)
"""Three decode_attention calls (Ouro, residual loop 0, tc kernel) at one shape and pool layout,
for ncu to profile the third: python ncu24.py 16x16k sep|rec."""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import benchmarks.bench_decode as bd
from benchmarks.common import FAMILIES, pool
from rq_kernels import decode_attention
from rq_kernels.decode import DecodeLaunch
from sglang_rq.config import RQConfig
from records24 import to_records
n, ctx = sys.argv[1].split("x")
lens = [int(ctx[:-1]) * 1024] * int(n)
hq, hkv, dim = FAMILIES["ouro-1.4b"]
view = pool(RQConfig(), hkv, dim, sum(lens) + 2, 4)
if sys.argv[2] == "rec":
    view = to_records(view)
q, kc, vc, ind, idx = bd.batch_inputs(view, hq, hkv, dim, lens)
out = torch.empty_like(q)
for _ in range(3):
    decode_attention(q, kc, vc, view, 0, ind, idx, sm_scale=dim ** -0.5, out=out,
                     launch=DecodeLaunch(split_kernel="tc"))
torch.cuda.synchronize()
print("done", sys.argv[1:])
