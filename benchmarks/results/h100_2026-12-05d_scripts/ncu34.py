# ruff: noqa  (session 34 script, kept with its results: run by rerun_h200.sh)
"""Three decode_attention calls (Huginn, residual loop 0, tc kernel) at 64 x 8k for ncu to profile the
third; arm main (scratch/main.cu) or both (this tree): python ncu34.py main|both"""
import sys
import torch
import benchmarks.bench_decode as bd
from benchmarks.common import FAMILIES, pool
from rq_kernels import cuda, decode_attention, decode_tc
from rq_kernels.decode import DecodeLaunch
from sglang_rq.config import RQConfig
if sys.argv[1] == "main":
    (cuda.CSRC / "_ab_main.cu").write_text(open("scratch/main.cu").read())
    decode_tc.SOURCE = "_ab_main.cu"
lens = [8192] * 64
hq, hkv, dim = FAMILIES["huginn-d96"]
view = pool(RQConfig(), hkv, dim, sum(lens) + 2, 4)
q, kc, vc, ind, idx = bd.batch_inputs(view, hq, hkv, dim, lens)
out = torch.empty_like(q)
for _ in range(3):
    decode_attention(q, kc, vc, view, 0, ind, idx, sm_scale=dim ** -0.5, out=out,
                     launch=DecodeLaunch(split_kernel="tc"))
torch.cuda.synchronize()
print("done", sys.argv[1:])
