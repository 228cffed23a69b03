# ruff: noqa  (session 29 script: the tc kernel's time per layer-loop at forced split counts around
# tc_plan's choice (4-CTA wide shape of the integer K side), Ouro-shaped, H200)
import json, os, sys, time
sys.path.insert(0, os.getcwd())
import torch
from benchmarks.bench_decode import batch_inputs, time_loops
from benchmarks.common import FAMILIES, pool
from rq_kernels.decode import DecodeLaunch
from rq_kernels.decode_tc import tc_plan
from sglang_rq.config import RQConfig
OUT = os.environ.get("OUT", "/tmp"); K = 1024
cfg, LOOPS = RQConfig(), 4
sms = torch.cuda.get_device_properties(0).multi_processor_count
res = []
for fam, pts in {"ouro-1.4b": [[8*K], [16*K]*2, [8*K]*4, [32*K]*4, [16*K]*13, [16*K]*16],
                 "huginn-d96": [[16*K]*2, [16*K]*16]}.items():
    hq, hkv, dim = FAMILIES[fam]
    view = pool(cfg, hkv, dim, max(sum(p) for p in pts) + 2, LOOPS)
    for lens in pts:
        q, kc, vc, ind, idx = batch_inputs(view, hq, hkv, dim, lens)
        occ, s0 = tc_plan(len(lens), hkv, sum(lens), sms, True)
        cands = sorted({max(1, int(s0 * f)) for f in (0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0, 1.25, 1.5)})
        row = dict(family=fam, batch=len(lens), ctx=lens[0], plan=s0, occ=list(occ), us={})
        base = time_loops(DecodeLaunch(split_kernel="tc"), view, q, kc, vc, ind, idx, dim, LOOPS)[1] * 1e3
        row["plan_us"] = base
        for s in cands:
            row["us"][s] = time_loops(DecodeLaunch(split_kernel="tc", num_splits=s), view, q, kc, vc, ind, idx, dim, LOOPS)[1] * 1e3
        best = min(row["us"], key=row["us"].get)
        print(f"{fam} {len(lens)}x{lens[0]} plan S={s0} {base:.1f}us | " + " ".join(f"{s}:{u:.1f}" for s, u in row["us"].items()) + f" | best {best} {base/row['us'][best]:.3f}x", flush=True)
        res.append(row)
        json.dump(res, open(f"{OUT}/sweep29.json", "w"), indent=1)
    del view; torch.cuda.empty_cache()
