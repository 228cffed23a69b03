# ruff: noqa  (session 32 script: the tc split kernel's split count and plan overhead swept on
# main: chained per point for forced split counts around tc_plan's choice, and the Ouro decode
# step at batch 2 with tc_plan's SPLIT_OVERHEAD_TILES changed, both orders)
import json, os, sys, time
sys.path.insert(0, os.getcwd())
import torch
from benchmarks import bench_decode_step as step
from benchmarks.bench_decode import batch_inputs
from benchmarks.common import FAMILIES, chain_copies, chain_ms, loop_average, loop_bytes_per_token, pool
from rq_kernels import decode_attention, decode_tc
from rq_kernels.decode import DecodeLaunch
from sglang_rq.config import RQConfig
OUT = os.environ.get("OUT", "/tmp"); T0 = time.time()
K = 1024; cfg = RQConfig(); LOOPS = 4
res = dict(what="sweep32: forced split counts (equal splits) vs tc_plan's (balanced) at Ouro small batch, chained; step with SPLIT_OVERHEAD_TILES 0/1/2/4/8", rows=[], step=[])
def dump():
    res["elapsed_s"] = time.time() - T0
    json.dump(res, open(f"{OUT}/sweep32.json", "w"), indent=1)
fam = "ouro-1.4b"; hq, hkv, dim = FAMILIES[fam]
least = min(loop_bytes_per_token(cfg, hkv, dim, LOOPS, u) for u in range(LOOPS))
PTS = [[8*K], [16*K], [16*K]*2, [8*K]*4]
cps = {len(p) * 100 + p[0] // K: chain_copies(least * sum(p)) for p in PTS}
rows = max(sum(p) * cps[len(p) * 100 + p[0] // K] for p in PTS) + 2
view = pool(cfg, hkv, dim, rows, LOOPS)
sms = torch.cuda.get_device_properties(0).multi_processor_count
for lens in PTS:
    B = len(lens)
    occ, plan = decode_tc.tc_plan(B, hkv, sum(lens), sms, decode_tc.integer_k(hq // hkv, dim, cfg.group_size))
    cands = sorted({None, *[max(1, round(plan * f)) for f in (0.5, 0.75, 0.9, 1.1, 1.25, 1.5, 2.0)]}, key=lambda s: s or 0)
    q, kc, vc, ind, idx = batch_inputs(view, hq, hkv, dim, lens)
    tokens = idx.numel(); copies = cps[B * 100 + lens[0] // K]
    idxs = [idx + i * tokens for i in range(copies)]
    outs = [torch.empty_like(q) for _ in range(copies)]
    for rep in range(2):
        ch = {}
        for s in (cands if rep == 0 else cands[::-1]):
            launch = DecodeLaunch(split_kernel="tc", num_splits=s)
            per = {}
            for loop in (0, LOOPS - 1):
                per[loop] = chain_ms([lambda i=i, lp=loop: decode_attention(
                    q, kc, vc, view, lp, ind, idxs[i], sm_scale=dim ** -0.5, out=outs[i], launch=launch)
                    for i in range(copies)])
            ch[str(s)] = loop_average(per, LOOPS) * 1e3
        res["rows"].append(dict(batch=B, ctx=lens[0], plan=plan, occupancy=str(occ), rep=rep, chained_us=ch))
        print(f"{B}x{lens[0]} plan {plan} rep {rep}: " + " ".join(f"{s}:{v:.1f}" for s, v in ch.items()), flush=True)
        dump()
del view; torch.cuda.empty_cache()
s = step.Shape(False); weights = step.make_weights(s)
cache = step.RQCache(s, 2, 16384, cfg)
for rep in range(2):
    ms = {}
    for ov in ((0, 1, 2, 4, 8) if rep == 0 else (8, 4, 2, 1, 0)):
        decode_tc.SPLIT_OVERHEAD_TILES = ov
        ms[ov] = step.time_step(s, weights, cache, 2)
    decode_tc.SPLIT_OVERHEAD_TILES = 2
    res["step"].append(dict(batch=2, rep=rep, ms=ms))
    print(f"step b=2 rep {rep}: " + " ".join(f"ov{o} {m:.3f}" for o, m in ms.items()), flush=True)
    dump()
