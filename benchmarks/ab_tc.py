"""Temporary A/B of the tc split kernel's occupancy/pipeline depth (not tracked)."""
import os, sys, json, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch
import benchmarks.bench_decode as bd
from benchmarks.common import DEV, pool, sdpa_time
import rq_kernels.decode as dec
import rq_kernels.decode_tc as tc
from rq_kernels.decode import DecodeLaunch
from sglang_rq.config import RQConfig

cfg, loops, hq, hkv, dim = RQConfig(), 4, 16, 16, 128
points = bd.POINTS
view = pool(cfg, hkv, dim, max(b * c for b, c in points) + 2, loops)
out = []
for ctas, stages in [(2, 3)]:
    tc.CTAS_PER_SM, tc.STAGES = ctas, stages
    dec.SPLITS_PER_SM = tc.WARPS * ctas
    for b, ctx in points:
        q, kc, vc, ind, idx = bd.inputs(view, hq, hkv, dim, b, ctx)
        by = bd.bytes_per_token_loop(cfg, hkv, dim, loops) * ctx * b
        t, avg = bd.time_loops(DecodeLaunch(split_kernel="tc"), view, q, kc, vc, ind, idx, dim, loops)
        row = dict(ctas=ctas, stages=stages, batch=b, ctx=ctx, resid_ms=t[0], anchor_ms=t[loops - 1],
                   avg_ms=avg, tbs=by / avg / 1e9)
        out.append(row)
        print(f"ctas={ctas} stages={stages} b={b:3d} ctx={ctx:6d} tc {avg*1e3:7.1f}us {row['tbs']:.2f}TB/s "
              f"(resid {t[0]*1e3:.1f} anchor {t[loops-1]*1e3:.1f})", flush=True)
os.makedirs(sys.argv[1], exist_ok=True)
json.dump(out, open(os.path.join(sys.argv[1], "ab_tc.json"), "w"), indent=1)
