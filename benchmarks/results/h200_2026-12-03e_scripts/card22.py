# ruff: noqa  (the session script as run on the H200, 2026-12-03e; kept with its results)
"""Session 22: the whole-card batch (Ouro 55 x 16k) per call in isolation (bench_decode.time_loops:
CUDA graph, L2 flushed, median, (3 x residual + 1 x anchor loop) / 4), to compare with the
decode step's attention per layer-loop (bench_decode_step: RQ attention / 96)."""
import json, os
import torch
import benchmarks.bench_decode as bd
from benchmarks.common import FAMILIES, pool
from rq_kernels.decode import DecodeLaunch
from sglang_rq.config import RQConfig
OUT = os.environ.get("OUT", "/tmp")
K = 1024
hq, hkv, dim = FAMILIES["ouro-1.4b"]
res = []
for b, ctx in ((55, 16 * K), (13, 16 * K), (10, 16 * K)):
    view = pool(RQConfig(), hkv, dim, b * ctx + 2, 4)
    q, kc, vc, ind, idx = bd.batch_inputs(view, hq, hkv, dim, [ctx] * b)
    per, avg = bd.time_loops(DecodeLaunch(split_kernel="tc"), view, q, kc, vc, ind, idx, dim, 4)
    res.append(dict(batch=b, ctx=ctx, per_loop_ms={str(k): v for k, v in per.items()}, avg_us=avg * 1e3,
                    step_attention_ms_estimate=96 * avg))
    print(f"CARD {b}x{ctx}: {avg*1e3:.1f} us per call, x96 = {96*avg:.2f} ms", flush=True)
    del view, q, kc, vc, ind, idx
    torch.cuda.empty_cache()
json.dump(res, open(f"{OUT}/card22.json", "w"), indent=1)
