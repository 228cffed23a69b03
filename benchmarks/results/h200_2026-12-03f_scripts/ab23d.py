# ruff: noqa  (the session script as run on the H200, 2026-12-03f; kept with its results)
"""Session 23 (ab23d): main vs coalesce (code copies lane chunk-fastest: one L2 request per token row), default arms only; ab23.py's header follows. Session 23: main vs qsmem (the query's MMA fragments in shared memory, reloaded per tile:
168 -> 152 registers, loop 606 -> 592 instructions), per call µs (CUDA graph, L2 flushed,
median; bench_decode.time_loops). Arms of the new tree: default (its global carveout), exact
(carveout from the family's own format), q4 (a 4-CTA shape, 128 registers, replaces the 3-CTA
one), q4all (the 4-CTA shape everywhere); q4 arms with the exact carveout. Each arm's loop-0
output is compared with the default arm's (max |diff| / max |out|)."""
import json, os, sys
import rq_kernels
TREE, REP = sys.argv[1], sys.argv[2]
f = rq_kernels.__file__
assert ("main_rq" in f) == (TREE == "main"), f
import torch
import benchmarks.bench_decode as bd
from benchmarks.common import FAMILIES, pool
from rq_kernels import decode as rq_decode, decode_tc, decode_attention
from rq_kernels.decode import DecodeLaunch
from rq_kernels.decode_tc import tc_plan, Occupancy
from sglang_rq.config import RQConfig
OUT = os.environ.get("OUT", "/tmp")
K = 1024
POINTS = {"ouro-1.4b": {"1x8k": [8*K], "4x8k": [8*K]*4, "2x16k": [16*K]*2, "16x16k": [16*K]*16,
                        "64x8k": [8*K]*64, "13x16k": [16*K]*13, "55x16k": [16*K]*55},
          "huginn-d96": {"4x8k": [8*K]*4, "16x16k": [16*K]*16, "64x8k": [8*K]*64},
          "smollm2-gqa": {"4x8k": [8*K]*4, "16x16k": [16*K]*16, "320x4k": [4*K]*320}}
res = dict(tree=TREE, file=f, points=[])
cfg, loops = RQConfig(), 4
sms = torch.cuda.get_device_properties(0).multi_processor_count
per_sm = torch.cuda.get_device_properties(0).shared_memory_per_multiprocessor
OCC0, CV0 = decode_tc.OCCUPANCY, decode_tc.carveout_percent
def exact(dim):
    need = max(o.ctas_per_sm * (decode_tc.WARPS * decode_tc.warp_bytes(4, 2, dim, o.stages) + 1024)
               for o in decode_tc.OCCUPANCY)
    return min(100, -(-100 * need // per_sm))
def setarm(arm, dim):
    decode_tc.OCCUPANCY = OCC0
    cv = CV0
    if arm != "default":
        if arm == "q4":
            decode_tc.OCCUPANCY = (Occupancy(4, 2, 1), OCC0[1])
        elif arm == "q4all":
            decode_tc.OCCUPANCY = (Occupancy(4, 2, 1), Occupancy(4, 2, 1))
        p = exact(dim)
        cv = lambda index: p
    rq_decode.carveout_percent = decode_tc.carveout_percent = cv
for fam, pts in POINTS.items():
    hq, hkv, dim = FAMILIES[fam]
    view = pool(cfg, hkv, dim, max(sum(v) for v in pts.values()) + 2, loops)
    for name, lens in pts.items():
        q, kc, vc, ind, idx = bd.batch_inputs(view, hq, hkv, dim, lens)
        arms = ["default"]
        ref = None
        for arm in arms:
            setarm(arm, dim)
            s = tc_plan(len(lens), hkv, sum(lens), sms)
            out = torch.full_like(q, float("nan"))
            decode_attention(q, kc, vc, view, 0, ind, idx, sm_scale=dim ** -0.5, out=out,
                             launch=DecodeLaunch(split_kernel="tc"))
            torch.cuda.synchronize()
            if ref is None:
                ref = out.float().clone(); err = 0.0
            else:
                err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
            _, avg = bd.time_loops(DecodeLaunch(split_kernel="tc"), view, q, kc, vc, ind, idx, dim, loops)
            cvp = rq_decode.carveout_percent(0)
            res["points"].append(dict(family=fam, name=name, arm=arm, occ=list(s[0]), S=s[1],
                                      carveout=cvp, us=avg * 1e3, rel_err_vs_default=err))
            print(f"AB {TREE}/{arm} {REP} {fam} {name} occ={tuple(s[0])} S={s[1]} cv={cvp}: "
                  f"{avg*1e3:.1f} us err={err:.2e}", flush=True)
        setarm("default", dim)
    json.dump(res, open(f"{OUT}/ab23d_{TREE}_{REP}.json", "w"), indent=1)
    del view
    torch.cuda.empty_cache()
