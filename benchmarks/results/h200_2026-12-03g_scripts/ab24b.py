# ruff: noqa  (the session script as run on the H200, 2026-12-03g; kept with its results)
"""Session 24 (ab24b): L2 prefetch-size hints on the split kernel's cp.async copies. Trees:
main; p128 / p256 (every cp.async with .L2::128B / .L2::256B: the L2 fetches the whole aligned
128- or 256-byte block from DRAM, i.e. the neighbouring KV heads' pieces of the same pool row).
Per call µs (CUDA graph, L2 flushed, median; bench_decode.time_loops); each tree's loop-0
output is compared with a stored main output (max |diff| / max |out|)."""
import json, os, sys
import rq_kernels
TREE, REP = sys.argv[1], sys.argv[2]
f = rq_kernels.__file__
assert f"/{TREE}_rq/" in f, f
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
        out = torch.full_like(q, float("nan"))
        decode_attention(q, kc, vc, view, 0, ind, idx, sm_scale=dim ** -0.5, out=out,
                         launch=DecodeLaunch(split_kernel="tc"))
        torch.cuda.synchronize()
        ref_path = f"{OUT}/ref24b_{fam}_{name}.pt"
        if TREE == "main" and not os.path.exists(ref_path):
            torch.save(out.cpu(), ref_path)
        err = float("nan")
        if os.path.exists(ref_path):
            ref = torch.load(ref_path).to(out.device).float()
            err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        _, avg = bd.time_loops(DecodeLaunch(split_kernel="tc"), view, q, kc, vc, ind, idx, dim, loops)
        s = tc_plan(len(lens), hkv, sum(lens), sms)
        res["points"].append(dict(family=fam, name=name, occ=list(s[0]), S=s[1], us=avg * 1e3,
                                  rel_err_vs_main=err))
        print(f"AB {TREE} {REP} {fam} {name} occ={tuple(s[0])} S={s[1]}: {avg*1e3:.1f} us err={err:.2e}", flush=True)
    json.dump(res, open(f"{OUT}/ab24b_{TREE}_{REP}.json", "w"), separators=(",", ":"))
    del view
    torch.cuda.empty_cache()
