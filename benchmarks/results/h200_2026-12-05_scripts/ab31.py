# ruff: noqa  (session 31+ script: the tc split kernel's candidates against main, one process,
# arms swapped through decode_tc.SOURCE / decode_tc.L2_PREFETCH_BYTES, alternating per rep;
# flushed (time_loops) and chained (common.chain_ms) per point, and the Ouro decode step.
# Run on the cand31 working tree (host side: Args.prefetch, which main's and p30's sources ignore).
import concurrent.futures as cf, json, os, shutil, sys, time
sys.path.insert(0, os.getcwd())
import torch
from benchmarks import bench_decode_step as step
from benchmarks.bench_decode import batch_inputs, check, time_loops
from benchmarks.common import FAMILIES, chain_copies, chain_ms, loop_average, loop_bytes_per_token, pool
from rq_kernels import cuda, decode_attention, decode_tc
from rq_kernels.decode import DecodeLaunch
from sglang_rq.config import RQConfig
from sglang_rq.layout import kv_bytes_per_token
OUT = os.environ.get("OUT", "/tmp"); T0 = time.time(); DEADLINE = float(os.environ.get("DEADLINE", 330))
K = 1024
for name, src in (("ab_main.cu", "scratch/base_main.cu"), ("ab_p30.cu", "scratch/p30.cu")):
    shutil.copy(src, cuda.CSRC / name)
ARMS = {"main": ("ab_main.cu", 0), "p30": ("ab_p30.cu", 0), "cand0": ("rq_decode_tc.cu", 0),
        "cand16": ("rq_decode_tc.cu", 16 << 20), "cand32": ("rq_decode_tc.cu", 32 << 20)}
ORDER = list(ARMS)
POINTS = {"ouro-1.4b": [[8*K], [16*K]*2, [8*K]*4, [16*K]*16, [8*K]*64],
          "huginn-d96": [[8*K]*4, [16*K]*16],
          "smollm2-gqa": [[8*K]*4, [8*K]*64]}
def setarm(a):
    decode_tc.SOURCE, decode_tc.L2_PREFETCH_BYTES = ARMS[a]
cfg, launch, LOOPS = RQConfig(), DecodeLaunch(split_kernel="tc"), 4
res = dict(what="ab31: main vs prologue30 vs cand31 (prologue30 + L2 prefetch) at 0 / 16 / 32 MiB",
           arms={a: list(v) for a, v in ARMS.items()}, rows=[], step=[], checks=[], skipped=[])
def dump():
    res["elapsed_s"] = time.time() - T0
    json.dump(res, open(f"{OUT}/ab31.json", "w"), indent=1)

# every arm's variants compiled in parallel first (a fresh machine has no cubin cache)
views, copies_of = {}, {}
jobs = []
dev = torch.device("cuda", 0)
for fam, pts in POINTS.items():  # chained: copies that exceed 3x the L2 even for the anchor loop
    hq, hkv, dim = FAMILIES[fam]
    least = min(loop_bytes_per_token(cfg, hkv, dim, LOOPS, u) for u in range(LOOPS))
    for p in pts:
        copies_of[(fam, len(p), p[0])] = chain_copies(least * sum(p))
    views[fam] = max(sum(p) * copies_of[(fam, len(p), p[0])] for p in pts) + 2
for fam in POINTS:
    hq, hkv, dim = FAMILIES[fam]
    v = pool(cfg, hkv, dim, 64, LOOPS)
    for src in {s for s, _ in ARMS.values()}:
        text = (cuda.CSRC / src).read_text()
        for loop in (0, LOOPS - 1):
            for occ in decode_tc.OCCUPANCY[decode_tc.integer_k(hq // hkv, dim, cfg.group_size)]:
                defines, _ = decode_tc._variant(v, loop, hq // hkv, occ)
                jobs.append((text, src, defines))
    del v
arch = "sm_%d%d" % torch.cuda.get_device_capability(0)
with cf.ThreadPoolExecutor(16) as ex:
    list(ex.map(lambda j: cuda._compile(j[0], j[1], j[2], arch), jobs))
print(f"[{time.time()-T0:.0f}s] compiled {len(jobs)} variants", flush=True)

for fam, pts in POINTS.items():
    hq, hkv, dim = FAMILIES[fam]
    view = pool(cfg, hkv, dim, views[fam], LOOPS)
    for a in ORDER:
        setarm(a)
        res["checks"] += [dict(r, family=fam, arm=a) for r in check(view, hq, hkv, dim, 2, 1024, LOOPS, ["tc"])]
    bad = [c for c in res["checks"] if c["family"] == fam and not c["ok"]]
    print(f"[{time.time()-T0:.0f}s] {fam} checks: {len(bad)} not ok", flush=True)
    for lens in pts:
        for rep in range(2):  # both orders back to back, so a deadline never leaves one order
            tag = f"{fam} {len(lens)}x{lens[0]}"
            if time.time() - T0 > DEADLINE:
                res["skipped"].append(f"{tag} rep {rep}"); continue
            q, kc, vc, ind, idx = batch_inputs(view, hq, hkv, dim, lens)
            tokens = idx.numel()
            copies = copies_of[(fam, len(lens), lens[0])]
            idxs = [idx + i * tokens for i in range(copies)]
            outs = [torch.empty_like(q) for _ in range(copies)]
            us, ch, got = {}, {}, {}
            for a in (ORDER if rep % 2 == 0 else ORDER[::-1]):
                setarm(a)
                o = torch.full_like(q, float("nan"))
                decode_attention(q, kc, vc, view, 0, ind, idx, sm_scale=dim ** -0.5, out=o, launch=launch)
                torch.cuda.synchronize()
                got[a] = o.float()
                us[a] = time_loops(launch, view, q, kc, vc, ind, idx, dim, LOOPS)[1] * 1e3
                per = {}
                for loop in (0, LOOPS - 1):
                    per[loop] = chain_ms([lambda i=i, lp=loop: decode_attention(
                        q, kc, vc, view, lp, ind, idxs[i], sm_scale=dim ** -0.5, out=outs[i], launch=launch)
                        for i in range(copies)])
                ch[a] = loop_average(per, LOOPS) * 1e3
            diff = {a: ((got[a] - got["main"]).abs().max() / got["main"].abs().max()).item() for a in ORDER[1:]}
            row = dict(family=fam, batch=len(lens), ctx=lens[0], rep=rep, copies=copies, flushed_us=us,
                       chained_us=ch, max_rel_diff_vs_main=diff)
            res["rows"].append(row)
            print(f"{tag:22s} rep {rep} flushed " + " ".join(f"{a} {us[a]:7.1f}" for a in ORDER)
                  + " | chained " + " ".join(f"{a} {ch[a]:7.1f}" for a in ORDER)
                  + " | main/x chained " + " ".join(f"{a} {ch['main']/ch[a]:.3f}" for a in ORDER[1:])
                  + " | diff " + " ".join(f"{a} {d:.1e}" for a, d in diff.items()), flush=True)
            dump()
    del view; torch.cuda.empty_cache()
s = step.Shape(False); weights = step.make_weights(s)
b32 = step.max_batch(kv_bytes_per_token(s.kv, cfg), 16384, 32 << 30)
for b in (2, b32):  # one cache per batch (the arms differ only in the kernel), both orders
    cache = step.RQCache(s, b, 16384, cfg)
    for rep in range(2):
        if time.time() - T0 > DEADLINE + 100:
            res["skipped"].append(f"step {b} rep {rep}"); continue
        ms = {}
        for a in (ORDER if rep % 2 == 0 else ORDER[::-1]):
            setarm(a)
            ms[a] = step.time_step(s, weights, cache, b)
        res["step"].append(dict(batch=b, rep=rep, ms=ms))
        print(f"step b={b} rep {rep}: " + " ".join(f"{a} {ms[a]:.3f}" for a in ORDER)
              + " | main/x " + " ".join(f"{a} {ms['main']/ms[a]:.3f}" for a in ORDER[1:]), flush=True)
        dump()
    del cache; torch.cuda.empty_cache()
dump()
for name in ("ab_main.cu", "ab_p30.cu"):
    (cuda.CSRC / name).unlink(missing_ok=True)
