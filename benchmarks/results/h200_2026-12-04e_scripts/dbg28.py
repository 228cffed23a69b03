# ruff: noqa  (the session script as run on the H200, 2026-12-04 session 28; kept with its results)
import faulthandler, sys, os, time
faulthandler.dump_traceback_later(40, repeat=True, file=sys.stderr)
t0 = time.time()
def log(*a): print(f"[{time.time()-t0:6.1f}s]", *a, flush=True)
import torch
sys.path.insert(0, os.getcwd())
from benchmarks.bench_decode import inputs
from benchmarks.common import FAMILIES, pool
from rq_kernels import decode_tc, decode_attention
from rq_kernels.decode import DecodeLaunch
from sglang_rq.config import RQConfig
log("imported")
for fam, b, ctx in (("ouro-1.4b", 2, 1024), ("ouro-1.4b", 1, 16384), ("huginn-d96", 2, 1024)):
  hq, hkv, dim = FAMILIES[fam]
  view = pool(RQConfig(), hkv, dim, b * ctx + 2, 4)
  q, kc, vc, ind, idx = inputs(view, hq, hkv, dim, b, ctx)
  log(fam, b, ctx)
  outs = {}
  for arm, src in (("base", "rq_decode_tc_base.cu"), ("kint", "rq_decode_tc.cu")):
    decode_tc.SOURCE = src
    for loop in (0, 3):
        out = torch.empty_like(q)
        decode_attention(q, kc, vc, view, loop, ind, idx, sm_scale=dim ** -0.5, out=out,
                         launch=DecodeLaunch(split_kernel="tc"))
        torch.cuda.synchronize()
        outs[arm, loop] = out.float()
  for loop in (0, 3):
    d = (outs["kint", loop] - outs["base", loop]).abs()
    log("  loop", loop, "max diff", float(d.max()), "rms diff", float(d.pow(2).mean().sqrt()),
        "out max", float(outs["base", loop].abs().max()), "out rms", float(outs["base", loop].pow(2).mean().sqrt()))
  del view
