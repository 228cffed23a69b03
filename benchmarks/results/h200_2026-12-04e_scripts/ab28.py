# ruff: noqa  (the session script as run on the H200, 2026-12-04 session 28; kept with its results)
"""Session 28 A/B: K side on integer tensor cores (KINT) vs main's fp16 K side, tc kernel, per call
(same process, arms rotated per rep) and the Ouro decode step."""
import json, os, sys, time
import torch
sys.path.insert(0, os.getcwd())
from benchmarks.bench_decode import inputs, time_loops
from benchmarks.common import FAMILIES, pool
from benchmarks import bench_decode_step as S
from rq_kernels import decode_tc
from rq_kernels.decode import DecodeLaunch
from sglang_rq.config import RQConfig

ARMS = {"base": "rq_decode_tc_base.cu", "kint": "rq_decode_tc.cu"}
cfg, loops = RQConfig(), 4
launch = DecodeLaunch(split_kernel="tc")
pts = {"ouro-1.4b": [(1, 8192), (2, 16384), (4, 32768), (16, 16384), (64, 8192)],
       "huginn-d96": [(16, 16384)]}
rows = []
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for fam, ps in pts.items():
    hq, hkv, dim = FAMILIES[fam]
    view = pool(cfg, hkv, dim, max(b * c for b, c in ps) + 2, loops)
    for rep in range(2):
        for b, ctx in ps:
            row = dict(family=fam, rep=rep, batch=b, ctx=ctx)
            q, kc, vc, ind, idx = inputs(view, hq, hkv, dim, b, ctx)
            for arm in (("kint", "base") if rep == 0 else ("base", "kint")):
                decode_tc.SOURCE = ARMS[arm]
                t, avg = time_loops(launch, view, q, kc, vc, ind, idx, dim, loops)
                row[f"{arm}_us"] = avg * 1e3
                row[f"{arm}_res_us"] = t[0] * 1e3
            row["ratio"] = row["base_us"] / row["kint_us"]
            rows.append(row)
            print("AB " + json.dumps(row), flush=True)
    del view
    torch.cuda.empty_cache()
step = []
s = S.Shape(False); W = S.make_weights(s)
for rep, b, label in ((0, 2, "fixed"), (1, 2, "fixed"), (0, 13, "32GiB")):
    if True:
        rec = dict(rep=rep, batch=b, label=label)
        for arm in (("kint", "base") if rep == 0 else ("base", "kint")):
            decode_tc.SOURCE = ARMS[arm]
            torch.cuda.empty_cache()
            cache = S.RQCache(s, b, 16384, cfg)
            rec[f"{arm}_ms"] = S.time_step(s, W, cache, b)
            del cache
        rec["ratio"] = rec["base_ms"] / rec["kint_ms"]
        step.append(rec)
        print("STEP " + json.dumps(rec), flush=True)
json.dump(dict(gpu=torch.cuda.get_device_name(0), date=time.strftime("%Y-%m-%d"), rows=rows, step=step),
          open(os.path.join(out, "kint_ab.json"), "w"), indent=1)
