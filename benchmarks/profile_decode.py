"""Where one decode-attention call spends its time: per-launch GPU time of `decode_attention`
(query rotation, split kernel, merge) under the PyTorch profiler, next to the whole call replayed
from a CUDA graph and BF16 SDPA over the same history, Ouro-1.4B shape, one run.

``python benchmarks/profile_decode.py --out DIR [--dry-run]``

Each profiled call follows an L2 flush (256 MiB memset), as in `benchmarks.common.graph_ms`.
The graph time minus the sum of the kernels is the launch gaps inside the graph. With
programmatic dependent launch (the default) a dependent kernel starts while its primary runs and
waits inside, so its profiled time includes that wait; the tc rows therefore also give each
kernel's time launched without it (``kernels_nopdl_us``: isolated, serialised). A split-count
sweep at small batch shows what the tc kernel's split plan (`decode_tc.tc_plan`) leaves on the
table. Writes ``DIR/profile_decode.json``.
"""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict

if "--dry-run" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.bench_decode import inputs  # noqa: E402
from benchmarks.common import (  # noqa: E402
    DEV, FAMILIES, bench, bench_args, pool, sdpa_time, write_json,
)
from rq_kernels import decode_attention  # noqa: E402
from rq_kernels.decode import DecodeLaunch  # noqa: E402
from sglang_rq.config import RQConfig  # noqa: E402

POINTS = [(1, 2048), (1, 8192), (2, 16384), (4, 8192), (16, 16384), (64, 8192)]
SWEEP = [(1, 2048), (1, 8192), (2, 16384), (4, 8192)]
SPLITS = (4, 8, 16, 32, 64, 128, 256)


def kernel_us(call, reps: int = 10) -> dict[str, float]:
    """Mean GPU microseconds per call of each kernel ``call`` launches (flush kernels excluded)."""
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=DEV)
    call()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(reps):
            flush.zero_()
            call()
        torch.cuda.synchronize()
    per = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and "rq_" in e.name:
            per[e.name] += e.device_time / reps
    return dict(per)


def main() -> None:
    a = bench_args()
    cfg, loops = RQConfig(), 4
    hq, hkv, dim = FAMILIES["ouro-1.4b"]
    points, sweep, splits = (POINTS, SWEEP, SPLITS) if not a.dry_run else ([(2, 40)], [], ())
    res = dict(gpu=torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu",
               date=time.strftime("%Y-%m-%d"), points=[], sweep=[])
    view = pool(cfg, hkv, dim, max(b * c for b, c in points) + 2, loops)
    for b, ctx in points:
        q, kc, vc, ind, idx = inputs(view, hq, hkv, dim, b, ctx)
        out = torch.empty_like(q)
        qs = torch.randn(b, hq, 1, dim, device=DEV, dtype=torch.bfloat16)
        ks = torch.randn(b, hkv, ctx + 1, dim, device=DEV, dtype=torch.bfloat16)
        row = dict(batch=b, ctx=ctx, sdpa_us=sdpa_time(qs, ks, ks)[0] * 1e3)
        del qs, ks
        for kernel in ("tc", "fma") if DEV == "cuda" else ("fma",):
            for loop in (0, loops - 1):
                def call(launch=DecodeLaunch(split_kernel=kernel), loop=loop):
                    decode_attention(q, kc, vc, view, loop, ind, idx, sm_scale=dim ** -0.5,
                                     out=out, launch=launch)
                ks_us = kernel_us(call) if DEV == "cuda" else {}
                graph_us = bench(call) * 1e3
                row[f"{kernel}_loop{loop}"] = dict(graph_us=graph_us, kernels_us=ks_us,
                                                   gaps_us=graph_us - sum(ks_us.values()))
                if kernel == "tc" and DEV == "cuda":
                    row[f"{kernel}_loop{loop}"]["kernels_nopdl_us"] = kernel_us(
                        lambda loop=loop: call(DecodeLaunch(split_kernel="tc", pdl=False), loop))
                nopdl = row[f"{kernel}_loop{loop}"].get("kernels_nopdl_us", {})
                print(f"b={b:3d} ctx={ctx:6d} {kernel} loop {loop}: graph {graph_us:7.1f}us "
                      f"(sdpa {row['sdpa_us']:6.1f}) " +
                      " ".join(f"{k.split('_kernel')[0]}={v:.1f}" for k, v in ks_us.items()) +
                      ("" if not nopdl else " | without PDL " + " ".join(
                          f"{k.split('_kernel')[0]}={v:.1f}" for k, v in nopdl.items())),
                      flush=True)
        res["points"].append(row)
        write_json(res, a.out, "profile_decode.json")
    for b, ctx in sweep:
        q, kc, vc, ind, idx = inputs(view, hq, hkv, dim, b, ctx)
        out = torch.empty_like(q)
        for s in splits:
            t = {}
            for loop in (0, loops - 1):
                t[loop] = bench(lambda s=s, loop=loop: decode_attention(
                    q, kc, vc, view, loop, ind, idx, sm_scale=dim ** -0.5, out=out,
                    launch=DecodeLaunch(split_kernel="tc", num_splits=s))) * 1e3
            res["sweep"].append(dict(batch=b, ctx=ctx, splits=s, resid_us=t[0],
                                     anchor_us=t[loops - 1]))
            print(f"sweep b={b} ctx={ctx} splits={s}: resid {t[0]:.1f}us anchor "
                  f"{t[loops - 1]:.1f}us", flush=True)
        write_json(res, a.out, "profile_decode.json")


if __name__ == "__main__":
    main()
