# ruff: noqa  (the session script as run on the H200, 2026-12-03d; kept with its results)
"""Session 21b: main vs balanced (default) vs balanced tree forced to equal splits (the plan's S)."""
import json, os, sys
import rq_kernels
TREE, REP = sys.argv[1], sys.argv[2]
f = rq_kernels.__file__
assert ({"main": "main_rq"}.get(TREE, "/work/main/rq_kernels") in f), f
import torch
import benchmarks.bench_decode as bd
from benchmarks.common import FAMILIES, pool
from rq_kernels.decode import DecodeLaunch
from rq_kernels.decode_tc import tc_plan
from sglang_rq.config import RQConfig
OUT = os.environ.get("OUT", "/tmp")
K = 1024
POINTS = {"ouro-1.4b": {"1x8k": [8*K], "4x8k": [8*K]*4, "2x16k": [16*K]*2, "16x16k": [16*K]*16,
                        "64x8k": [8*K]*64, "1x16k+31x1k": [16*K]+[K]*31,
                        "4x32k+60x2k": [32*K]*4+[2*K]*60},
          "smollm2-gqa": {"4x8k": [8*K]*4}}
arms = [TREE]
res = dict(tree=TREE, file=f, points=[])
cfg, loops = RQConfig(), 4
for fam, pts in POINTS.items():
    hq, hkv, dim = FAMILIES[fam]
    view = pool(cfg, hkv, dim, max(sum(v) for v in pts.values()) + 2, loops)
    for name, lens in pts.items():
        q, kc, vc, ind, idx = bd.batch_inputs(view, hq, hkv, dim, lens)
        s = tc_plan(len(lens), hkv, sum(lens), torch.cuda.get_device_properties(0).multi_processor_count)[1]
        for arm in arms:
            launch = DecodeLaunch(split_kernel="tc", num_splits=s if arm == "equal" else None)
            _, avg = bd.time_loops(launch, view, q, kc, vc, ind, idx, dim, loops)
            res["points"].append(dict(family=fam, name=name, arm=arm, S=s, us=avg * 1e3))
            print(f"AB {arm} {REP} {fam} {name} S={s}: {avg*1e3:.1f} us", flush=True)
    json.dump(res, open(f"{OUT}/ab21b_{TREE}_{REP}.json", "w"), indent=1)
    del view
    torch.cuda.empty_cache()
