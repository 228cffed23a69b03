# ruff: noqa  (the session script as run on the H200, 2026-12-03g; kept with its results)
"""Three decode_attention calls (Ouro, residual loop 0, tc kernel) at 16 x 16k with the
(scale, offset) rows token-major (tm) or head-major (hm), for ncu: python ncu24c.py tm|hm 16x16k."""
import dataclasses, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import benchmarks.bench_decode as bd
from benchmarks.common import FAMILIES, pool
from rq_kernels import decode_attention
from rq_kernels.decode import DecodeLaunch
from sglang_rq.config import RQConfig
src = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ab24c.py")).read()
exec(src[src.index("def head_major_so"):src.index("res = dict")])
n, ctx = sys.argv[2].split("x")
lens = [int(ctx[:-1]) * 1024] * int(n)
hq, hkv, dim = FAMILIES["ouro-1.4b"]
view = pool(RQConfig(), hkv, dim, sum(lens) + 2, 4)
if sys.argv[1] == "hm":
    view = head_major_so(view)
q, kc, vc, ind, idx = bd.batch_inputs(view, hq, hkv, dim, lens)
out = torch.empty_like(q)
for _ in range(3):
    decode_attention(q, kc, vc, view, 0, ind, idx, sm_scale=dim ** -0.5, out=out,
                     launch=DecodeLaunch(split_kernel="tc"))
torch.cuda.synchronize()
print("done", sys.argv[1:])
