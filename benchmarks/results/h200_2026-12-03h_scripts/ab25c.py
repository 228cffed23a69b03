# ruff: noqa  (the session script as run on the H200, 2026-12-03 session 25; kept with its results)
"""Session 25 (ab25c; call 3 ran it without the views assert and both trees allocated token-major
rows: an A/A; call 4 with it): the (scale, offset) rows head-major (tree ``hm``: main d36f459's
`scale_offset_storage`) against token-major (tree ``tm``: the revert), per call µs (CUDA graph, L2
flushed, median; bench_decode.time_loops, loop average) over the four row placements of
`benchmarks.bench_decode.placed_rows`. One process per tree."""
import json, os, sys
TREE = sys.argv[1]
import rq_kernels.view as rv
import tests.kernels.views as tv  # before benchmarks, which put the checkout first on sys.path
assert hasattr(rv, "scale_offset_storage") == (TREE == "hm"), rv.__file__
assert ("/hm_rq/" in tv.__file__) == (TREE == "hm"), tv.__file__
import torch
import benchmarks.bench_decode as bd
from benchmarks.common import FAMILIES, pool
from rq_kernels.decode import DecodeLaunch
from sglang_rq.config import RQConfig
OUT = os.environ.get("OUT", "/tmp")
K = 1024
res = dict(tree=TREE, file=rv.__file__, points=[])
cfg, loops = RQConfig(), 4
hq, hkv, dim = FAMILIES["ouro-1.4b"]
view = pool(cfg, hkv, dim, 256 * K + 2, loops)
print("so strides", tuple(view.scale_offset[0].stride()))
assert (view.scale_offset[0].stride(0) == 8) == (TREE == "hm")  # head-major: a head's rows adjacent
for b, ctx in ((2, 16 * K), (16, 16 * K), (64, 4 * K)):
    q, kc, vc, ind, _ = bd.inputs(view, hq, hkv, dim, b, ctx)
    for how in bd.PLACEMENTS:
        idx = bd.placed_rows([ctx] * b, view.codes[0].shape[0], how)
        d, avg = bd.time_loops(DecodeLaunch(split_kernel="tc"), view, q, kc, vc, ind, idx, dim, loops)
        res["points"].append(dict(batch=b, ctx=ctx, rows=how, us=avg * 1e3))
        print(f"PLACE {TREE} ouro {b}x{ctx} {how}: {avg*1e3:.1f} us", flush=True)
json.dump(res, open(f"{OUT}/ab25c_{TREE}.json", "w"), separators=(",", ":"))
