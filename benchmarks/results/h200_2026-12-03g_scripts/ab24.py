# ruff: noqa  (the session script as run on the H200, 2026-12-03g; kept with its results)
"""Session 24 (ab24): records A/B. Per call µs (CUDA graph, L2 flushed, median;
bench_decode.time_loops). Arms: sep (today's separate code and (scale, offset) tensors) in both
trees; rec (the same bytes as one record per (row, KV head): [K codes | V codes | K so | V so],
views with the same logical shapes) in the new tree, whose kernel copies records whole (RECORD).
Each rec output is compared with the sep output of the same tree (max |diff| / max |out|)."""
import dataclasses, json, os, sys
import rq_kernels
TREE, REP = sys.argv[1], sys.argv[2]
f = rq_kernels.__file__
assert ("main_rq" in f) == (TREE == "main"), f
import torch
import benchmarks.bench_decode as bd
from benchmarks.common import FAMILIES, pool
from rq_kernels import decode_attention, decode_tc
from rq_kernels.decode import DecodeLaunch
from rq_kernels.decode_tc import tc_plan
from sglang_rq.config import RQConfig
OUT = os.environ.get("OUT", "/tmp")
K = 1024
POINTS = {"ouro-1.4b": {"1x8k": [8*K], "4x8k": [8*K]*4, "2x16k": [16*K]*2, "16x16k": [16*K]*16,
                        "64x8k": [8*K]*64, "13x16k": [16*K]*13, "55x16k": [16*K]*55, "4x32k": [32*K]*4}}
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from records24 import to_records
res = dict(tree=TREE, file=f, points=[])
cfg, loops = RQConfig(), 4
sms = torch.cuda.get_device_properties(0).multi_processor_count
for fam, pts in POINTS.items():
    hq, hkv, dim = FAMILIES[fam]
    sep = pool(cfg, hkv, dim, max(sum(v) for v in pts.values()) + 2, loops)
    rec = to_records(sep) if TREE == "new" else None
    if rec is not None:
        print("RECORD define", [decode_tc._variant(rec, l, hq // hkv, decode_tc.OCCUPANCY[0])[0]["RECORD"] for l in range(loops)], flush=True)
    for name, lens in pts.items():
        q, kc, vc, ind, idx = bd.batch_inputs(sep, hq, hkv, dim, lens)
        ref = None
        for arm, view in (("sep", sep), ("rec", rec)):
            if view is None:
                continue
            errs = []
            for loop in range(loops):
                out = torch.full_like(q, float("nan"))
                decode_attention(q, kc, vc, view, loop, ind, idx, sm_scale=dim ** -0.5, out=out,
                                 launch=DecodeLaunch(split_kernel="tc"))
                torch.cuda.synchronize()
                if arm == "sep":
                    ref = (ref or []) + [out.float().clone()]
                else:
                    errs.append(((out.float() - ref[loop]).abs().max() / ref[loop].abs().max()).item())
            err = max(errs) if errs else 0.0
            _, avg = bd.time_loops(DecodeLaunch(split_kernel="tc"), view, q, kc, vc, ind, idx, dim, loops)
            s = tc_plan(len(lens), hkv, sum(lens), sms)
            res["points"].append(dict(family=fam, name=name, arm=arm, occ=list(s[0]), S=s[1],
                                      us=avg * 1e3, rel_err_vs_sep=err))
            print(f"AB {TREE}/{arm} {REP} {fam} {name} occ={tuple(s[0])} S={s[1]}: "
                  f"{avg*1e3:.1f} us err={err:.2e}", flush=True)
    json.dump(res, open(f"{OUT}/ab24_{TREE}_{REP}.json", "w"), separators=(",", ":"))
    del sep, rec
    torch.cuda.empty_cache()
