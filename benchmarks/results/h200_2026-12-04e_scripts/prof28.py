# ruff: noqa  (the session script as run on the H200, 2026-12-04 session 28; kept with its results)
"""Per-kernel device time inside the Ouro decode step's CUDA graph (b=2, 16k; 32GiB b=13)."""
import json, os, sys, time
from collections import defaultdict
import torch
sys.path.insert(0, os.getcwd())
from benchmarks import bench_decode_step as S
from rq_kernels import decode_attention, stage_kv, commit_layers
from sglang_rq.config import RQConfig

OUT = os.environ.get("OUT", "/tmp")
s = S.Shape(False); cfg = RQConfig(); W = S.make_weights(s)

class NoStage(S.RQCache):
    def __call__(self, u, li, q, k, v):
        return decode_attention(q, k, v, self.views[li], u, self.ind, self.idx,
                                sm_scale=self.s.dim ** -0.5, out=torch.empty_like(self.out))

def prof(cache, b, reps=5):
    x = torch.randn(b, s.hidden, device="cuda", dtype=torch.bfloat16)
    fn = lambda: S.step(s, W, x, cache)
    fn(); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3): g.replay()
    torch.cuda.synchronize()
    t0 = torch.cuda.Event(enable_timing=True); t1 = torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(10): g.replay()
    t1.record(); torch.cuda.synchronize(); wall = t0.elapsed_time(t1) / 10
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        for _ in range(reps): g.replay()
        torch.cuda.synchronize()
    per = defaultdict(lambda: [0, 0.0])
    evs = []
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name[:90]][0] += 1; per[e.name[:90]][1] += e.device_time
            evs.append((e.time_range.start, e.time_range.end, e.name[:40]))
    tot = sum(v[1] for v in per.values()) / reps
    rows = sorted(((k, v[0] / reps, v[1] / reps) for k, v in per.items()), key=lambda r: -r[2])
    return dict(wall_ms=wall, kernel_ms=tot / 1e3, kernels_per_step=sum(r[1] for r in rows),
                top=[dict(name=k, per_step=c, ms=t / 1e3, us_each=t / max(c, 1)) for k, c, t in rows[:14]])

res = {}
for label, b in (("b2_16k", 2), ("b13_16k", 13)):
    for kind in ("rq", "nostage", "read", "bf16", "none"):
        if kind == "bf16" and b == 13: continue
        torch.cuda.empty_cache()
        cache = (S.BF16Cache(s, b, 16384) if kind == "bf16" else S.NoAttention() if kind == "none"
                 else S.ReadOnly(s, b, 16384, cfg) if kind == "read" else
                 NoStage(s, b, 16384, cfg) if kind == "nostage" else S.RQCache(s, b, 16384, cfg))
        r = prof(cache, b); del cache
        res[f"{label}_{kind}"] = r
        print(label, kind, f"wall {r['wall_ms']:.2f} ms, kernels {r['kernel_ms']:.2f} ms, n={r['kernels_per_step']:.0f}", flush=True)
        for t in r["top"][:8]:
            print(f"   {t['per_step']:6.0f} x {t['us_each']:8.2f} us = {t['ms']:7.3f} ms  {t['name']}")
json.dump(res, open(os.path.join(OUT, "prof28.json"), "w"), indent=1)
