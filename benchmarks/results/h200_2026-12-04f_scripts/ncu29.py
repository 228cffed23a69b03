# ruff: noqa  (session 29: as run on the H200; sass_stalls.py is in ../h200_2026-12-04e_scripts/)
"""Three decode_attention calls (Ouro, residual loop 0, tc kernel) at one shape and copy arm,
for ncu to profile the third: python ncu27.py 16x16k coop|warp [scattered]."""
import sys
import torch
import benchmarks.bench_decode as bd
from benchmarks.common import FAMILIES, pool
from rq_kernels import decode_attention, decode_tc
from rq_kernels.decode import DecodeLaunch
from sglang_rq.config import RQConfig
n, ctx = sys.argv[1].split("x")
if sys.argv[2] == "warp":
    decode_tc.coop_copies = lambda view, loop: False
lens = [int(ctx[:-1]) * 1024] * int(n)
hq, hkv, dim = FAMILIES["ouro-1.4b"]
view = pool(RQConfig(), hkv, dim, sum(lens) + 2, 4)
q, kc, vc, ind, idx = bd.batch_inputs(view, hq, hkv, dim, lens)
if len(sys.argv) > 3:
    idx = bd.placed_rows(lens, view.codes[0].shape[0], sys.argv[3])
out = torch.empty_like(q)
for _ in range(3):
    decode_attention(q, kc, vc, view, 0, ind, idx, sm_scale=dim ** -0.5, out=out,
                     launch=DecodeLaunch(split_kernel="tc"))
torch.cuda.synchronize()
print("done", sys.argv[1:])
