# ruff: noqa  (the session script as run on the H200, 2026-12-03 session 25; kept with its results)
"""Session 25 (ab25a): the LSQ coefficients head-major (`rq_kernels.view.coef_storage`, the
new tree: [layers, H, rows, 2]) against main (d36f459: [layers, rows, 2, H]), per call µs (CUDA
graph, L2 flushed, median; bench_decode.time_loops, loop average and per loop kind). One
process per tree and rep; the main tree (rq_kernels, sglang_rq, benchmarks, tests/kernels with
main's view.py, pool.py, views.py) is first on the path; the script asserts which it imported."""
import json, os, sys
import rq_kernels
TREE, REP = sys.argv[1], sys.argv[2]
f = rq_kernels.__file__
import tests.kernels.views as tv
assert ("/main_rq/" in f) == (TREE == "main") and ("/main_rq/" in tv.__file__) == (TREE == "main"), (f, tv.__file__)
import torch
import benchmarks.bench_decode as bd
from benchmarks.common import FAMILIES, pool
from rq_kernels import decode_attention
from rq_kernels.decode import DecodeLaunch
from rq_kernels.decode_tc import tc_plan
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
for fam, pts in POINTS.items():
    hq, hkv, dim = FAMILIES[fam]
    view = pool(cfg, hkv, dim, max(sum(v) for v in pts.values()) + 2, loops)
    for name, lens in pts.items():
        q, kc, vc, ind, idx = bd.batch_inputs(view, hq, hkv, dim, lens)
        d, avg = bd.time_loops(DecodeLaunch(split_kernel="tc"), view, q, kc, vc, ind, idx, dim, loops)
        cs = next((list(c.stride()) for c in view.coef if c is not None), None)
        s = tc_plan(len(lens), hkv, sum(lens), sms)
        res["points"].append(dict(family=fam, name=name, occ=list(s[0]), S=s[1], us=avg * 1e3,
                                  residual_us=d[0] * 1e3, anchor_us=d[loops - 1] * 1e3,
                                  so_strides=list(view.scale_offset[0].stride()), coef_strides=cs))
        print(f"AB {TREE} {REP} {fam} {name} occ={tuple(s[0])} S={s[1]}: {avg*1e3:.1f} us (residual {d[0]*1e3:.1f}, anchor {d[loops-1]*1e3:.1f}) coef strides {cs}", flush=True)
    json.dump(res, open(f"{OUT}/ab25a_{TREE}_{REP}.json", "w"), separators=(",", ":"))
    del view
    torch.cuda.empty_cache()
