# ruff: noqa  (the session script as run on the H200, 2026-12-03 session 25; kept with its results)
"""Session 25 (ab25b): pool-row fragmentation. The tc decode call's µs (CUDA graph, L2 flushed,
median; bench_decode.time_loops, loop average) when a request's history tokens lie on
- ``consecutive`` rows (the benchmarks' pattern: a prefill allocated at once),
- ``interleaved`` rows (token j of request i at row 1 + j*B + i: tokens decoded side by side at
  page size 1, one new row per request per step),
- ``random`` rows (a random permutation: a long-churned free list),
for the landed head-major (scale, offset) rows (tree ``hm``, main) and token-major ones (tree
``tm``: main with `scale_offset_storage` always token-major). One process per tree and rep."""
import json, os, sys
import rq_kernels
TREE, REP = sys.argv[1], sys.argv[2]
import rq_kernels.view as rv
assert ("/tm_rq/" in rv.__file__) == (TREE == "tm"), rv.__file__
import torch
import benchmarks.bench_decode as bd
from benchmarks.common import FAMILIES, pool
from rq_kernels.decode import DecodeLaunch
from sglang_rq.config import RQConfig
OUT = os.environ.get("OUT", "/tmp")
K = 1024
POINTS = {"ouro-1.4b": {"2x16k": [16*K]*2, "16x16k": [16*K]*16, "64x8k": [8*K]*64},
          "smollm2-gqa": {"16x16k": [16*K]*16}}
res = dict(tree=TREE, file=rv.__file__, points=[])
cfg, loops = RQConfig(), 4
for fam, pts in POINTS.items():
    hq, hkv, dim = FAMILIES[fam]
    rows = max(sum(v) for v in pts.values()) + 2
    view = pool(cfg, hkv, dim, rows, loops)
    for name, lens in pts.items():
        q, kc, vc, ind, idx = bd.batch_inputs(view, hq, hkv, dim, lens)
        b, n = len(lens), sum(lens)
        j = torch.arange(lens[0], device=idx.device)
        inter = torch.cat([1 + j * b + i for i in range(b)])
        gen = torch.Generator(device="cpu").manual_seed(5)
        rand = (torch.randperm(rows - 1, generator=gen)[:n] + 1).to(idx.device)
        for pat, ix in (("consecutive", idx), ("interleaved", inter), ("random", rand)):
            assert ix.shape == idx.shape and int(ix.max()) < rows and int(ix.min()) >= 1
            d, avg = bd.time_loops(DecodeLaunch(split_kernel="tc"), view, q, kc, vc, ind, ix, dim, loops)
            res["points"].append(dict(family=fam, name=name, rows=pat, us=avg * 1e3,
                                      residual_us=d[0] * 1e3, anchor_us=d[loops - 1] * 1e3))
            print(f"FRAG {TREE} {REP} {fam} {name} {pat}: {avg*1e3:.1f} us (residual {d[0]*1e3:.1f}, anchor {d[loops-1]*1e3:.1f})", flush=True)
    json.dump(res, open(f"{OUT}/ab25b_{TREE}_{REP}.json", "w"), separators=(",", ":"))
    del view
    torch.cuda.empty_cache()
