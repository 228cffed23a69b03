# ruff: noqa  (session 29 script: the integer K side's 4-CTA wide shape with 2 stages (carveout
# 67 %) against 3 stages (two tiles in flight; carveout 79 %, what 4/2-bit rows need), same
# source, arms alternating per rep)
import json, os, sys, time
sys.path.insert(0, os.getcwd())
import torch
from benchmarks import bench_decode_step as step
from benchmarks.bench_decode import check, inputs, batch_inputs, time_loops
from benchmarks.common import FAMILIES, pool
from rq_kernels import decode_tc, decode as rq_decode, decode_attention
from rq_kernels.decode import DecodeLaunch
from rq_kernels.decode_tc import Occupancy, tc_plan
from sglang_rq.config import RQConfig
from sglang_rq.layout import kv_bytes_per_token
OUT = os.environ.get("OUT", "/tmp"); T0 = time.time(); DEADLINE = float(os.environ.get("DEADLINE", 300))
K = 1024
OCC0 = dict(decode_tc.OCCUPANCY)
CV0 = decode_tc.carveout_percent
ARMS = {"2st": (OCC0, CV0), "3st": ({True: (Occupancy(4, 3, 1), OCC0[True][1]), False: OCC0[False]}, lambda index: 79)}
POINTS = {"ouro-1.4b": [[8*K], [16*K]*2, [8*K]*4, [32*K]*4, [16*K]*13, [16*K]*16, [8*K]*64],
          "huginn-d96": [[8*K]*4, [16*K]*16]}
sms = torch.cuda.get_device_properties(0).multi_processor_count
def setarm(a):
    decode_tc.OCCUPANCY = ARMS[a][0]
    rq_decode.carveout_percent = decode_tc.carveout_percent = ARMS[a][1]
res = dict(rows=[], step=[], checks=[], skipped=[])
cfg, launch, LOOPS = RQConfig(), DecodeLaunch(split_kernel="tc"), 4
for fam, pts in POINTS.items():
    hq, hkv, dim = FAMILIES[fam]
    view = pool(cfg, hkv, dim, max(sum(p) for p in pts) + 2, LOOPS)
    setarm("3st")
    res["checks"] += [dict(r, family=fam) for r in check(view, hq, hkv, dim, 2, 1024, LOOPS, ["tc"])]
    for rep in range(2):
        for lens in pts:
            if time.time() - T0 > DEADLINE: res["skipped"].append(f"{fam} {len(lens)}x{lens[0]}"); continue
            q, kc, vc, ind, idx = batch_inputs(view, hq, hkv, dim, lens)
            us, outs, plan = {}, {}, {}
            for a in (("2st", "3st") if rep % 2 == 0 else ("3st", "2st")):
                setarm(a)
                plan[a] = [list(tc_plan(len(lens), hkv, sum(lens), sms, True)[0]), tc_plan(len(lens), hkv, sum(lens), sms, True)[1], decode_tc.carveout_percent(0)]
                out = torch.full_like(q, float("nan"))
                decode_attention(q, kc, vc, view, 0, ind, idx, sm_scale=dim ** -0.5, out=out, launch=launch)
                torch.cuda.synchronize(); outs[a] = out.float()
                us[a] = time_loops(launch, view, q, kc, vc, ind, idx, dim, LOOPS)[1] * 1e3
            err = ((outs["3st"] - outs["2st"]).abs().max() / outs["2st"].abs().max()).item()
            row = dict(family=fam, batch=len(lens), ctx=lens[0], rep=rep, us=us, plan=plan, ratio=us["2st"] / us["3st"], rel_diff=err)
            res["rows"].append(row)
            print(f"{fam:12s} {len(lens):3d} x {lens[0]:6d} rep {rep}: 2st {us['2st']:8.1f} 3st {us['3st']:8.1f} 2st/3st {row['ratio']:.3f} plan {plan} diff {err:.1e}", flush=True)
            json.dump(res, open(f"{OUT}/ab29_stages.json", "w"), indent=1)
    del view; torch.cuda.empty_cache()
s = step.Shape(False); weights = step.make_weights(s)
b32 = step.max_batch(kv_bytes_per_token(s.kv, cfg), 16384, 32 << 30)
for rep in range(2):
    for b in (2, b32):
        if time.time() - T0 > DEADLINE + 60: res["skipped"].append(f"step {b}"); continue
        ms = {}
        for a in (("2st", "3st") if rep % 2 == 0 else ("3st", "2st")):
            setarm(a)
            cache = step.RQCache(s, b, 16384, cfg)
            ms[a] = step.time_step(s, weights, cache, b)
            del cache; torch.cuda.empty_cache()
        res["step"].append(dict(batch=b, rep=rep, ms=ms, ratio=ms["2st"] / ms["3st"]))
        print(f"step b={b} rep {rep}: 2st {ms['2st']:.2f} 3st {ms['3st']:.2f} 2st/3st {ms['2st']/ms['3st']:.3f}", flush=True)
        json.dump(res, open(f"{OUT}/ab29_stages.json", "w"), indent=1)
res["elapsed_s"] = time.time() - T0
json.dump(res, open(f"{OUT}/ab29_stages.json", "w"), indent=1)
