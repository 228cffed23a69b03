# ruff: noqa  (the session script as run on the H200, 2026-12-03e; kept with its results)
"""Session 22: main vs balanced-merge (token-balanced splits through the merge kernel, q_mode 0),
per call µs (CUDA graph, L2 flushed, median; bench_decode.time_loops). Arm g15 (new tree only):
balanced_rows monkeypatched to B x S + cdiv(B, 2) for one-split plans (fewer empty rows)."""
import json, os, sys
import rq_kernels
TREE, REP = sys.argv[1], sys.argv[2]
f = rq_kernels.__file__
assert ("main_rq" in f) == (TREE == "main"), f
import torch
import benchmarks.bench_decode as bd
from benchmarks.common import FAMILIES, pool
from rq_kernels import decode as rq_decode, decode_tc
from rq_kernels.decode import DecodeLaunch
from rq_kernels.decode_tc import tc_plan
from sglang_rq.config import RQConfig
OUT = os.environ.get("OUT", "/tmp")
K = 1024
POINTS = {"huginn-d96": {"1x8k": [8*K], "4x8k": [8*K]*4, "16x16k": [16*K]*16, "64x8k": [8*K]*64,
                         "1x16k+31x1k": [16*K]+[K]*31, "16x1k..16k": [K*(i+1) for i in range(16)],
                         "4x32k+60x2k": [32*K]*4+[2*K]*60},
          "ouro-1.4b": {"1x8k": [8*K], "2x16k": [16*K]*2, "64x8k": [8*K]*64,
                        "1x16k+31x1k": [16*K]+[K]*31}}
res = dict(tree=TREE, file=f, points=[])
cfg, loops = RQConfig(), 4
orig = decode_tc.balanced_rows
def g15(b, s):
    return b * s + (b + 1) // 2 if s == 1 else orig(b, s)
for fam, pts in POINTS.items():
    hq, hkv, dim = FAMILIES[fam]
    view = pool(cfg, hkv, dim, max(sum(v) for v in pts.values()) + 2, loops)
    for name, lens in pts.items():
        q, kc, vc, ind, idx = bd.batch_inputs(view, hq, hkv, dim, lens)
        s = tc_plan(len(lens), hkv, sum(lens), torch.cuda.get_device_properties(0).multi_processor_count)[1]
        arms = ["default"] + (["g15"] if TREE != "main" and fam == "ouro-1.4b" and name == "64x8k" else [])
        for arm in arms:
            if arm == "g15":
                rq_decode.balanced_rows = decode_tc.balanced_rows = g15
            _, avg = bd.time_loops(DecodeLaunch(split_kernel="tc"), view, q, kc, vc, ind, idx, dim, loops)
            rq_decode.balanced_rows = decode_tc.balanced_rows = orig
            res["points"].append(dict(family=fam, name=name, arm=arm, S=s, us=avg * 1e3))
            print(f"AB {TREE}/{arm} {REP} {fam} {name} S={s}: {avg*1e3:.1f} us", flush=True)
    json.dump(res, open(f"{OUT}/ab22_{TREE}_{REP}.json", "w"), indent=1)
    del view
    torch.cuda.empty_cache()
