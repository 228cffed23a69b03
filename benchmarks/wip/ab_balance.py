"""A/B (session 20): token-balanced splits in the tc split kernel ("new": where the kernel merges
and the plan gives S >= 2 splits, the batch shares B x S split rows and one split length, the
smallest of 32 candidates whose splits fit, found on the device) against main (each request's
own length / S). Run
once per arm process: `python ab_balance.py main|new` (main: PYTHONPATH with main's rq_kernels
first); mixed-length and uniform batches, per call (CUDA graph, L2 flushed, average per
layer-loop); plus a check against the fp32 twin on each mixed batch. Session script."""
import json
import os
import sys
import torch
import rq_kernels  # first: main's copy where PYTHONPATH puts it first (bench_decode adds the repo)
if sys.argv[1] != "main":
    sys.path.insert(0, os.getcwd())
import benchmarks.bench_decode as bd
from benchmarks.common import FAMILIES, pool
from rq_kernels import decode_tc
from rq_kernels.decode import DecodeLaunch, decode_attention
from sglang_rq.config import RQConfig
from sglang_rq.reference import decode_attention_reference

ARM = sys.argv[1]
REP = sys.argv[2] if len(sys.argv) > 2 else "0"
OUT = os.environ.get("OUT", "/tmp")
TC = DecodeLaunch(split_kernel="tc")
print("rq_kernels from", rq_kernels.__file__, flush=True)

K = 1024
POINTS = {  # name: (family, lengths)
    "ouro 16 x 1k..16k": ("ouro-1.4b", [K * (i + 1) for i in range(16)]),
    "ouro 1 x 16k + 31 x 1k": ("ouro-1.4b", [16 * K] + [K] * 31),
    "ouro 2 x 16k + 6 x 2k": ("ouro-1.4b", [16 * K] * 2 + [2 * K] * 6),
    "ouro 4 x 8k": ("ouro-1.4b", [8 * K] * 4),
    "ouro 16 x 16k": ("ouro-1.4b", [16 * K] * 16),
    "smollm2 16 x 1k..16k": ("smollm2-gqa", [K * (i + 1) for i in range(16)]),
}


def inputs(view, hq, hkv, dim, lens, seed=0):
    rows = view.codes[0].shape[0]
    ind = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
    idx = torch.arange(int(ind[-1]), device="cuda") % (rows - 1) + 1
    gen = torch.Generator(device="cuda").manual_seed(seed)
    b = len(lens)
    q = torch.randn(b, hq, dim, device="cuda", generator=gen).to(torch.bfloat16)
    kc = torch.randn(b, hkv, dim, device="cuda", generator=gen).to(torch.bfloat16)
    vc = torch.randn(b, hkv, dim, device="cuda", generator=gen).to(torch.bfloat16)
    return q, kc, vc, ind, idx


def main():
    cfg, loops = RQConfig(), 4
    spreads = [None, None]
    res = dict(what=__doc__, arm=ARM, points=[])
    views = {}
    for name, (fam, lens) in POINTS.items():
        hq, hkv, dim = FAMILIES[fam]
        if fam not in views:
            views.clear()
            torch.cuda.empty_cache()
            need = max(sum(ls) for f, ls in POINTS.values() if f == fam) + 2
            views[fam] = pool(cfg, hkv, dim, need, loops)
        view = views[fam]
        q, kc, vc, ind, idx = inputs(view, hq, hkv, dim, lens)
        row = dict(name=name, family=fam, lens=lens)
        for sp in spreads:
            if sp:
                decode_tc.SPLIT_SPREAD = sp
            key = ARM if sp is None else f"new{sp}"
            _, avg = bd.time_loops(TC, view, q, kc, vc, ind, idx, dim, loops)
            row.setdefault(key, []).append(avg * 1e3)
            if ("1k" in name or "2k" in name) and key + "_relerr" not in row:  # mixed: the twin check, last loop
                out = torch.full_like(q, float("nan"))
                decode_attention(q, kc, vc, view, loops - 1, ind, idx, sm_scale=dim ** -0.5, out=out,
                                 launch=TC)
                ref = decode_attention_reference(q.float(), kc, vc, view, loops - 1, ind, idx,
                                                 sm_scale=dim ** -0.5)
                err = (out.float() - ref).abs().max().item() / ref.abs().max().item()
                row[key + "_relerr"] = err
        print(f"BAL {ARM} {name}: " + " ".join(
            f"{k} {min(v):.1f}/{max(v):.1f}" if not k.endswith("relerr") else f"{k} {v:.1e}"
            for k, v in row.items() if k.startswith(("main", "new"))), flush=True)
        res["points"].append(row)
        json.dump(res, open(f"{OUT}/ab_balance_{ARM}_{REP}.json", "w"), indent=1)


main()
