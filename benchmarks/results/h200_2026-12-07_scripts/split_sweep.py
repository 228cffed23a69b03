"""Session 47 probe: the tc split kernel's split count at small batch, as served now (levers 5-8,
the fused two-level merge), swept chained around `decode_tc.tc_plan`'s count; then the Ouro
decode step at batch 2 with the count the sweep liked best, against the plan's, arms alternating.

The count is forced by wrapping `rq_kernels.decode.tc_plan` (not `DecodeLaunch.num_splits`, which
would also turn off the token-balanced splits), so every other choice is the served one.
Run from the repository root: python3 THIS --out DIR (--dry: CPU, tiny)."""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))
import torch  # noqa: E402

import rq_kernels.decode as D  # noqa: E402
from benchmarks import bench_decode_step as BS  # noqa: E402
from benchmarks.bench_decode import chain_points, chained_rq, inputs  # noqa: E402
from benchmarks.common import pool  # noqa: E402
from rq_kernels import decode_attention  # noqa: E402
from rq_kernels.decode import DecodeLaunch  # noqa: E402
from sglang_rq.config import RQConfig  # noqa: E402

FORCE = {"splits": None}
_plan = D.tc_plan


def forced_plan(B, H, nnz, sms, int_k, splits=None):
    occ, s = _plan(B, H, nnz, sms, int_k, splits=splits)
    return occ, (FORCE["splits"] or s)


D.tc_plan = forced_plan

# (batch, ctx): split counts to try besides the plan's
POINTS = {(1, 8192): [43, 64, 86, 96, 110], (1, 16384): [64, 86, 96, 110],
          (2, 16384): [32, 43, 48, 56], (4, 8192): [16, 20, 24, 28],
          (2, 4096): [16, 24, 32, 43]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--grid", action="store_true",
                    help="batch 1-8 x 1k-32k, split counts filling 1-4 CTAs per SM; no step")
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    t0 = time.time()
    hq = hkv = 2 if a.dry else 16
    dim = 32 if a.dry else 128
    loops = 4
    cfg = RQConfig()
    sms = torch.cuda.get_device_properties(0).multi_processor_count if cuda else 132
    if a.grid:  # split counts whose CTAs fill k = 1..4 per SM (4 KV heads per CTA), >= 2 tiles
        grid = {(b, c): sorted({k * sms * 4 // (b * hkv) for k in (1, 2, 3, 4)}
                               | {k * sms * 4 // (b * hkv) * 3 // 4 for k in (2, 4)}
                               | {sms * 2 // (b * hkv)})
                for b in (1, 2, 4, 8) for c in (1024, 2048, 4096, 8192, 16384, 32768)}
        points = {(b, c // 256 if a.dry else c): [s for s in v if 1 <= s <= c // 32]
                  for (b, c), v in grid.items()}
    else:
        points = {(b, c // 256 if a.dry else c): v for (b, c), v in POINTS.items()}
    res = dict(gpu=torch.cuda.get_device_name(0) if cuda else "cpu", sweep=[], step=[])
    copies = chain_points(cfg, hkv, dim, loops, list(points))
    view = pool(cfg, hkv, dim, max(copies[p] * p[0] * p[1] for p in points) + 2, loops)
    best = {}
    for (b, c), extra in points.items():
        _, s0 = _plan(b, hkv, b * c, sms, True)
        counts = [s0] + [s for s in extra if s != s0]
        q, kc, vc, ind, idx = inputs(view, hq, hkv, dim, b, c)
        ref = None
        times = {s: [] for s in counts}
        for r in range(a.rounds):
            for s in counts:
                FORCE["splits"] = s
                out = torch.empty_like(q)
                decode_attention(q, kc, vc, view, 0, ind, idx, sm_scale=dim ** -0.5, out=out)
                if ref is None:
                    ref = out.float()
                err = (out.float() - ref).abs().max().item()
                t = chained_rq(DecodeLaunch(), view, q, kc, vc, ind, idx, dim, loops, copies[b, c])
                times[s].append(t["avg_ms"] * 1e3)
                res["sweep"].append(dict(batch=b, ctx=c, splits=s, plan=s0, round=r,
                                         max_abs_diff_vs_plan=err, **t))
                print(f"{b:3d} x {c:6d} S={s:4d}{'*' if s == s0 else ' '} r{r}: avg "
                      f"{t['avg_ms'] * 1e3:7.2f} us (resid {t['resid_ms'] * 1e3:7.2f}, anchor "
                      f"{t['anchor_ms'] * 1e3:7.2f}); diff vs plan {err:.2e}  [{time.time() - t0:.0f}s]",
                      flush=True)
        FORCE["splits"] = None
        med = {s: sorted(v)[len(v) // 2] for s, v in times.items()}
        bs = min(med, key=med.get)
        best[b, c] = (s0, bs, med[s0] / med[bs])
        print(f"    best S={bs}: {med[s0] / med[bs]:.3f}x the plan's S={s0}", flush=True)
    res["best"] = [dict(batch=b, ctx=c, plan=s0, best=bs, speedup=x)
                   for (b, c), (s0, bs, x) in best.items()]
    # the step at batch 2 (16k and 4k) with the sweep's best count, if it is not the plan's
    s = BS.Shape(a.dry)
    W = BS.make_weights(s)
    for (b, c) in [] if a.grid else [(2, 16384), (2, 4096)]:
        cc = c // 256 if a.dry else c
        s0, bs, x = best[b, cc]
        if bs == s0:
            continue
        cache = BS.RQCache(s, b, cc, cfg)
        for r in range(3):
            for name, f in (("plan", None), ("best", bs)):
                FORCE["splits"] = f
                ms = BS.time_step(s, W, cache, b)
                res["step"].append(dict(batch=b, ctx=cc, arm=name, splits=f or s0, round=r, step_ms=ms))
                print(f"step b={b} ctx={cc} {name} (S={f or s0}) r{r}: {ms:.3f} ms", flush=True)
        FORCE["splits"] = None
        del cache
        if cuda:
            torch.cuda.empty_cache()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "split_sweep.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
