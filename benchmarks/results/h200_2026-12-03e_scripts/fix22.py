# ruff: noqa  (the session script as run on the H200, 2026-12-03e; kept with its results)
"""Session 22: where batch 1-4's fixed cost goes. Ouro residual loop (loop 0: anchor + its residual), per call µs (CUDA
graph, L2 flushed, median): batch 1 over history lengths (the intercept is the fixed cost), and
at 1 x 8k / 2 x 16k / 4 x 8k the split count forced around the plan's."""
import json, os
import torch
import benchmarks.bench_decode as bd
from benchmarks.common import FAMILIES, pool, bench
from rq_kernels import decode_attention
from rq_kernels.decode import DecodeLaunch
from rq_kernels.decode_tc import tc_plan
from sglang_rq.config import RQConfig
OUT = os.environ.get("OUT", "/tmp")
K = 1024
hq, hkv, dim = FAMILIES["ouro-1.4b"]
view = pool(RQConfig(), hkv, dim, 64 * K + 2, 4)
sms = torch.cuda.get_device_properties(0).multi_processor_count
res = dict(sweep=[], splits=[])
def t(lens, s=None):
    q, kc, vc, ind, idx = bd.batch_inputs(view, hq, hkv, dim, lens)
    out = torch.empty_like(q)
    launch = DecodeLaunch(split_kernel="tc", num_splits=s)
    return bench(lambda: decode_attention(q, kc, vc, view, 0, ind, idx, sm_scale=dim ** -0.5,
                                          out=out, launch=launch)) * 1e3
for n in (16, 256, 1 * K, 2 * K, 4 * K, 8 * K, 16 * K, 32 * K, 64 * K):
    s = tc_plan(1, hkv, n, sms)[1]
    us = t([n])
    res["sweep"].append(dict(batch=1, tokens=n, S=s, us=us))
    print(f"FIX b1 {n} S={s}: {us:.2f} us", flush=True)
for lens, name in (([8 * K], "1x8k"), ([16 * K] * 2, "2x16k"), ([8 * K] * 4, "4x8k")):
    s0 = tc_plan(len(lens), hkv, sum(lens), sms)[1]
    for s in sorted({max(1, s0 // 4), max(1, s0 // 2), max(1, (3 * s0) // 4), s0, (5 * s0) // 4, 2 * s0}):
        us = t(lens, s)
        res["splits"].append(dict(name=name, plan_S=s0, S=s, us=us))
        print(f"FIX {name} S={s} (plan {s0}): {us:.2f} us", flush=True)
json.dump(res, open(f"{OUT}/fix22.json", "w"), indent=1)
