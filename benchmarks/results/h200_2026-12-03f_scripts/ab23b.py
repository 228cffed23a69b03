# ruff: noqa  (the session script as run on the H200, 2026-12-03f; kept with its results)
"""Session 23: the shared-memory carveout of the tc split kernel (and the rotation and merge
kernels launched around it), main's source, per call µs (CUDA graph, L2 flushed, median;
bench_decode.time_loops). Arm cvX forces carveout_percent to X for every launch: the H200 rounds
a percent of 228 KB up to 100 (<= 43 %), 132 (<= 57 %), 164 (<= 71 %) or 196 KB, leaving the rest
of the SM's 256 KB to L1. main's rule: 66 % (the 2-CTA shape at 4-bit anchor and residual)."""
import json, os, sys
import rq_kernels
TREE, REP = sys.argv[1], sys.argv[2]
import torch
import benchmarks.bench_decode as bd
from benchmarks.common import FAMILIES, pool
from rq_kernels import decode as rq_decode, decode_tc
from rq_kernels.decode import DecodeLaunch
from rq_kernels.decode_tc import tc_plan
from sglang_rq.config import RQConfig
OUT = os.environ.get("OUT", "/tmp")
K = 1024
POINTS = {"ouro-1.4b": {"1x8k": [8*K], "4x8k": [8*K]*4, "2x16k": [16*K]*2, "16x16k": [16*K]*16,
                        "64x8k": [8*K]*64, "13x16k": [16*K]*13, "55x16k": [16*K]*55},
          "huginn-d96": {"4x8k": [8*K]*4, "16x16k": [16*K]*16, "64x8k": [8*K]*64},
          "smollm2-gqa": {"4x8k": [8*K]*4, "16x16k": [16*K]*16, "320x4k": [4*K]*320}}
ARMS = [int(a) for a in os.environ.get("ARMS", "66,43,57,80").split(",")]
res = dict(tree=TREE, file=rq_kernels.__file__, points=[])
cfg, loops = RQConfig(), 4
sms = torch.cuda.get_device_properties(0).multi_processor_count
CV0 = decode_tc.carveout_percent
for fam, pts in POINTS.items():
    hq, hkv, dim = FAMILIES[fam]
    view = pool(cfg, hkv, dim, max(sum(v) for v in pts.values()) + 2, loops)
    for name, lens in pts.items():
        q, kc, vc, ind, idx = bd.batch_inputs(view, hq, hkv, dim, lens)
        s = tc_plan(len(lens), hkv, sum(lens), sms)
        for cv in ARMS:
            rq_decode.carveout_percent = decode_tc.carveout_percent = (lambda index, cv=cv: cv)
            _, avg = bd.time_loops(DecodeLaunch(split_kernel="tc"), view, q, kc, vc, ind, idx, dim, loops)
            res["points"].append(dict(family=fam, name=name, arm=f"cv{cv}", occ=list(s[0]), S=s[1],
                                      us=avg * 1e3))
            print(f"CV {TREE} {REP} {fam} {name} occ={tuple(s[0])} S={s[1]} cv={cv}: {avg*1e3:.1f} us", flush=True)
        rq_decode.carveout_percent = decode_tc.carveout_percent = CV0
    json.dump(res, open(f"{OUT}/ab23b_{TREE}_{REP}.json", "w"), indent=1)
    del view
    torch.cuda.empty_cache()
