# ruff: noqa  (session 35 script as run on the lent GPU; kept with its results)
"""N kernel-source arms (arms/*.cu) in one process: flushed time per layer-loop (bench_decode's
time_loops), arm order rotated per rep. python abn.py OUT_JSON arm1 arm2 ... (env DEADLINE, REPS)"""
import json, os, sys, time
import torch
sys.path.insert(0, os.getcwd())
from benchmarks.bench_decode import inputs, time_loops
from benchmarks.common import FAMILIES, pool
from rq_kernels import cuda, decode_tc
from rq_kernels.decode import DecodeLaunch
from sglang_rq.config import RQConfig
T0 = time.time(); DEADLINE = float(os.environ.get("DEADLINE", 200)); REPS = int(os.environ.get("REPS", 3))
HERE = os.path.dirname(os.path.abspath(__file__))
out, names = sys.argv[1], sys.argv[2:]
ARMS = {a: f"_ab_{a}.cu" for a in names}
for a in names:
    (cuda.CSRC / ARMS[a]).write_text(open(os.path.join(HERE, "arms", a + ".cu")).read())
POINTS = [("huginn-d96", 64, 8192), ("huginn-d96", 16, 16384), ("ouro-1.4b", 64, 8192),
          ("ouro-1.4b", 16, 16384), ("ouro-1.4b", 2, 16384)]
cfg, launch = RQConfig(), DecodeLaunch(split_kernel="tc")
res = dict(gpu=torch.cuda.get_device_name(0), arms=names, rows=[])
views = {}
try:
    for rep in range(REPS):
        for fam, b, ctx in POINTS:
            if time.time() - T0 > DEADLINE:
                continue
            hq, hkv, dim = FAMILIES[fam]
            if fam not in views:
                views.clear(); torch.cuda.empty_cache()
                views[fam] = pool(cfg, hkv, dim, max(bb * c for f, bb, c in POINTS if f == fam) + 2, 4)
            view = views[fam]
            q, kc, vc, ind, idx = inputs(view, hq, hkv, dim, b, ctx)
            k = rep % len(names)
            us = {}
            for arm in names[k:] + names[:k]:
                decode_tc.SOURCE = ARMS[arm]
                us[arm] = time_loops(launch, view, q, kc, vc, ind, idx, dim, 4)[1] * 1e3
            res["rows"].append(dict(family=fam, batch=b, ctx=ctx, rep=rep, us=us))
            print(f"{fam:11s} {b:3d} x {ctx:6d} rep {rep} " + " ".join(f"{a} {us[a]:7.1f}" for a in names)
                  + " | " + " ".join(f"{names[0]}/{a} {us[names[0]]/us[a]:.3f}" for a in names[1:]), flush=True)
            json.dump(res, open(out, "w"), indent=1)
finally:
    for a in names:
        (cuda.CSRC / ARMS[a]).unlink(missing_ok=True)
