# ruff: noqa  (the session script as run on the H200, 2026-12-03g; kept with its results)
"""Session 24 (ab24d): ab24c's arms (tm, hm) per loop kind: residual loop 0 and anchor loop 3,
per call µs (bench_decode.time_loops' dict), arms alternated twice in one process."""
import dataclasses, json, os, sys
import torch
import benchmarks.bench_decode as bd
from benchmarks.common import FAMILIES, pool
from rq_kernels.decode import DecodeLaunch
from sglang_rq.config import RQConfig
src = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ab24c.py")).read()
exec(src[src.index("def head_major_so"):src.index("res = dict")])
OUT = os.environ.get("OUT", "/tmp")
K = 1024
PTS = {"2x16k": [16*K]*2, "16x16k": [16*K]*16, "13x16k": [16*K]*13, "64x8k": [8*K]*64, "55x16k": [16*K]*55}
hq, hkv, dim = FAMILIES["ouro-1.4b"]
tm = pool(RQConfig(), hkv, dim, 55 * 16 * K + 2, 4)
hm = head_major_so(tm)
res = []
for name, lens in PTS.items():
    q, kc, vc, ind, idx = bd.batch_inputs(tm, hq, hkv, dim, lens)
    for rep in range(2):
        for arm, view in (("tm", tm), ("hm", hm)) if rep == 0 else (("hm", hm), ("tm", tm)):
            d, avg = bd.time_loops(DecodeLaunch(split_kernel="tc"), view, q, kc, vc, ind, idx, dim, 4)
            res.append(dict(name=name, arm=arm, rep=rep, residual_us=d[0] * 1e3, anchor_us=d[3] * 1e3, avg_us=avg * 1e3))
            print(f"AB {arm} {rep} {name}: residual {d[0]*1e3:.1f} anchor {d[3]*1e3:.1f} avg {avg*1e3:.1f} us", flush=True)
json.dump(res, open(f"{OUT}/ab24d.json", "w"), separators=(",", ":"))
