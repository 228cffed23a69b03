"""Session 27: batch-1 (and equal-token batch 2/4) history-length sweep, Ouro-1.4B shape, residual
loop: the tc kernel against the pure read of the same bytes (read_roofline), same run."""
import json
import os
import sys
import time
import torch
sys.path.insert(0, os.getcwd())
from benchmarks.bench_decode import inputs, loop_bytes_per_token
from benchmarks.common import DEV, bench, pool, read_roofline
from rq_kernels import decode_attention
from rq_kernels.decode import DecodeLaunch
from sglang_rq.config import RQConfig

cfg, loops, hq, hkv, dim = RQConfig(), 4, 16, 16, 128
pts = [(1, n) for n in (16, 1024, 2048, 4096, 8192, 16384, 32768, 65536)] + [(2, 4096), (4, 2048), (2, 8192), (4, 4096), (8, 8192), (8, 4096)]
view = pool(cfg, hkv, dim, 65536 + 2, loops)
per = loop_bytes_per_token(cfg, hkv, dim, loops, 0)
buf = torch.empty(65536 * per, dtype=torch.uint8, device=DEV)
rows = []
for b, ctx in pts:
    q, kc, vc, ind, idx = inputs(view, hq, hkv, dim, b, ctx)
    out = torch.empty_like(q)
    tc = bench(lambda: decode_attention(q, kc, vc, view, 0, ind, idx, sm_scale=dim ** -0.5, out=out,
                                        launch=DecodeLaunch(split_kernel="tc")))
    rd, arm = read_roofline(buf, per * b * ctx)
    nb = per * b * ctx
    r = dict(batch=b, ctx=ctx, bytes=nb, tc_us=tc * 1e3, read_us=rd * 1e3, read_arm=arm,
             tc_tbs=nb / tc / 1e9, read_tbs=nb / rd / 1e9, tc_vs_read=rd / tc)
    rows.append(r)
    print(f"SWEEP b={b} ctx={ctx:6d} {nb/1e6:7.2f} MB | tc {r['tc_us']:7.1f}us {r['tc_tbs']:.2f}TB/s | read {r['read_us']:7.1f}us {r['read_tbs']:.2f}TB/s ({arm}) | tc/read {r['tc_vs_read']:.2f}", flush=True)
os.makedirs(sys.argv[1], exist_ok=True)
json.dump(dict(gpu=torch.cuda.get_device_name(0), date=time.strftime("%Y-%m-%d"), rows=rows),
          open(os.path.join(sys.argv[1], "sweep.json"), "w"), indent=1)
