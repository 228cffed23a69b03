# ruff: noqa  (the session script as run on the H200, 2026-12-03d; kept with its results)
"""Session 21 A/B: main vs balanced vs kpipe trees, one process per tree
(`python ab21.py TREE REP`, PYTHONPATH puts that tree's rq_kernels first; imported before benchmarks).
Uniform and mixed-length batches, per layer-loop (CUDA graph, L2 flushed); twin check on mixed."""
import json, os, sys
import rq_kernels
TREE, REP = sys.argv[1], sys.argv[2]
want = {"main": "scratch/main_rq", "kpipe": "scratch/kpipe_rq", "balanced": None}[TREE]
f = rq_kernels.__file__
assert (want in f) if want else ("scratch" not in f), f
import torch
import benchmarks.bench_decode as bd
from benchmarks.common import FAMILIES, pool
from rq_kernels.decode import DecodeLaunch, decode_attention
from sglang_rq.config import RQConfig
from sglang_rq.reference import decode_attention_reference
OUT = os.environ.get("OUT", "/tmp")
TC = DecodeLaunch(split_kernel="tc")
K = 1024
POINTS = {
    "ouro-1.4b": {"1x8k": [8*K], "4x8k": [8*K]*4, "2x16k": [16*K]*2, "16x16k": [16*K]*16,
                  "64x8k": [8*K]*64, "4x32k": [32*K]*4,
                  "16x1k..16k": [K*(i+1) for i in range(16)], "1x16k+31x1k": [16*K]+[K]*31,
                  "2x16k+6x2k": [16*K]*2+[2*K]*6, "4x32k+60x2k": [32*K]*4+[2*K]*60},
    "smollm2-gqa": {"4x8k": [8*K]*4, "16x16k": [16*K]*16, "16x1k..16k": [K*(i+1) for i in range(16)]},
    "huginn-d96": {"4x8k": [8*K]*4, "64x8k": [8*K]*64, "1x16k+31x1k": [16*K]+[K]*31},
}
res = dict(tree=TREE, file=f, points=[])
print("rq_kernels from", f, flush=True)
cfg, loops = RQConfig(), 4
for fam, pts in POINTS.items():
    hq, hkv, dim = FAMILIES[fam]
    view = pool(cfg, hkv, dim, max(sum(v) for v in pts.values()) + 2, loops)
    for name, lens in pts.items():
        q, kc, vc, ind, idx = bd.batch_inputs(view, hq, hkv, dim, lens)
        _, avg = bd.time_loops(TC, view, q, kc, vc, ind, idx, dim, loops)
        row = dict(family=fam, name=name, lens=lens, us=avg * 1e6)
        if len(set(lens)) > 1 or name == "1x8k":
            out = torch.full_like(q, float("nan"))
            decode_attention(q, kc, vc, view, loops - 1, ind, idx, sm_scale=dim ** -0.5, out=out, launch=TC)
            ref = decode_attention_reference(q.float(), kc, vc, view, loops - 1, ind, idx, sm_scale=dim ** -0.5)
            row["relerr"] = (out.float() - ref).abs().max().item() / ref.abs().max().item()
        print(f"AB {TREE} {REP} {fam} {name}: {row['us']:.1f} us" + (f" err {row['relerr']:.1e}" if 'relerr' in row else ""), flush=True)
        res["points"].append(row)
        json.dump(res, open(f"{OUT}/ab21_{TREE}_{REP}.json", "w"), indent=1)
    del view
    torch.cuda.empty_cache()
