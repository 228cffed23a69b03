# ruff: noqa  (the session script as run on the lent GPU, 2026-12-05, session 34; kept with its results)
"""Three arms of the tc kernel source in one process (main, copies-only, both = this tree), flushed
time per layer-loop, arm order rotated per rep. Points where the H100 A/B disagreed."""
import json, os, sys, time
import torch
sys.path.insert(0, os.getcwd())
from benchmarks.bench_decode import inputs, time_loops
from benchmarks.common import DEV, FAMILIES, pool
from rq_kernels import cuda, decode_tc
from rq_kernels.decode import DecodeLaunch
from sglang_rq.config import RQConfig
T0 = time.time(); DEADLINE = float(os.environ.get("DEADLINE", 200)); OUT = os.environ.get("OUT", ".")
ARMS = {"main": "_ab_main.cu", "copies": "_ab_copies.cu", "both": decode_tc.SOURCE}
for arm, src in (("main", "scratch/main.cu"), ("copies", "scratch/copies.cu")):
    (cuda.CSRC / ARMS[arm]).write_text(open(src).read())
POINTS = [("huginn-d96", 64, 8192), ("huginn-d96", 16, 16384), ("ouro-1.4b", 64, 8192),
          ("ouro-1.4b", 16, 16384), ("ouro-1.4b", 2, 16384), ("ouro-1.4b", 1, 8192)]
cfg, launch = RQConfig(), DecodeLaunch(split_kernel="tc")
res = dict(gpu=torch.cuda.get_device_name(0), rows=[])
names = list(ARMS)
views = {}
for rep in range(4):
    for fam, b, ctx in POINTS:
        if time.time() - T0 > DEADLINE:
            continue
        hq, hkv, dim = FAMILIES[fam]
        if fam not in views:
            views.clear(); torch.cuda.empty_cache()
            views[fam] = pool(cfg, hkv, dim, max(bb * c for f, bb, c in POINTS if f == fam) + 2, 4)
        view = views[fam]
        q, kc, vc, ind, idx = inputs(view, hq, hkv, dim, b, ctx)
        order = names[rep % 3:] + names[:rep % 3]
        us = {}
        for arm in order:
            decode_tc.SOURCE = ARMS[arm]
            us[arm] = time_loops(launch, view, q, kc, vc, ind, idx, dim, 4)[1] * 1e3
        decode_tc.SOURCE = ARMS["both"]
        row = dict(family=fam, batch=b, ctx=ctx, rep=rep, us=us)
        res["rows"].append(row)
        print(f"{fam:11s} {b:3d} x {ctx:6d} rep {rep} " + " ".join(f"{a} {us[a]:8.1f}" for a in names)
              + f" | main/copies {us['main']/us['copies']:.3f} main/both {us['main']/us['both']:.3f}", flush=True)
        json.dump(res, open(os.path.join(OUT, "ab34.json"), "w"), indent=1)
for arm in ("main", "copies"):
    (cuda.CSRC / ARMS[arm]).unlink()
