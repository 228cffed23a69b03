"""GPU check of the CUDA tensor-core split kernel at head_dim 64, 96 and 128, in one call.

``python benchmarks/check_tc_head_dims.py [--points 4x8192,16x4096]``

For each model shape of the kernel benchmarks (`benchmarks.common.FAMILIES`: Ouro 128 MHA,
SmolLM2 64 GQA 3, Huginn 96 MHA; default format, 4 loops) it prints why ``tc`` would not serve
(a FAIL), then `benchmarks.bench_decode.check`'s comparison of ``decode_attention`` forced to
``split_kernel="tc"`` with the fp32 twin `decode_attention_reference` (flash-attn rule, bf16 SDPA
yardstick; a residual loop and the anchor-only loop; 3 requests of 1,001 tokens, off the
16-token tile) as PASS/FAIL lines with the max errors, then one timing line per point:
CUDA-graph median of tc and of the Triton kernel that served the shape before (``fma`` for MHA,
``mma`` for GQA), per layer-loop ((3 x residual + anchor) / 4), against PyTorch SDPA over BF16
K/V of the same size (`bench_decode.time_loops`, `common.sdpa_time`). Exits 1 on any FAIL.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.bench_decode import check, inputs, time_loops  # noqa: E402
from benchmarks.common import DEV, FAMILIES, pool, sdpa_time  # noqa: E402
from rq_kernels.decode import DecodeLaunch, fma_unsupported_reason  # noqa: E402
from rq_kernels.decode_tc import tc_unsupported_reason  # noqa: E402
from sglang_rq.config import RQConfig  # noqa: E402

LOOPS = 4
CHECK = (3, 1001)  # requests, tokens each


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default="4x8192,16x4096", help="timed BATCHxCTX, comma-separated")
    a = ap.parse_args()
    points = [tuple(int(x) for x in p.split("x")) for p in a.points.split(",") if p]
    assert DEV == "cuda", "needs a GPU"
    print(f"GPU: {torch.cuda.get_device_name(0)}", flush=True)
    cfg, failed = RQConfig(), 0
    for fam, (hq, hkv, dim) in FAMILIES.items():
        rows = max([CHECK[0] * CHECK[1]] + [b * c for b, c in points]) + 2
        view = pool(cfg, hkv, dim, rows, LOOPS)
        why = {loop: tc_unsupported_reason(view, loop, hq // hkv, torch.device(DEV))
               for loop in range(LOOPS)}
        if any(why.values()):
            print(f"FAIL {fam}: tc does not serve it: {why}", flush=True)
            failed += 1
            continue
        for e in check(view, hq, hkv, dim, *CHECK, LOOPS, ["tc"]):
            print(f"{'PASS' if e['ok'] else 'FAIL'} {fam:12s} d={dim:3d} gq={hq // hkv} "
                  f"loop {e['loop']}: max err {e['max']:.3g} (bf16 SDPA {e['max_sdpa']:.3g}), "
                  f"fro {e['fro']:.3g} (SDPA {e['fro_sdpa']:.3g})", flush=True)
            failed += not e["ok"]
        before = "fma" if fma_unsupported_reason(view, hq // hkv) is None else "mma"
        for b, ctx in points:
            q, kc, vc, ind, idx = inputs(view, hq, hkv, dim, b, ctx)
            qs = torch.randn(b, hq, 1, dim, device=DEV, dtype=torch.bfloat16)
            ks = torch.randn(b, hkv, ctx + 1, dim, device=DEV, dtype=torch.bfloat16)
            sdpa_ms, backend = sdpa_time(qs, ks, ks)
            ms = {k: time_loops(DecodeLaunch(split_kernel=k), view, q, kc, vc, ind, idx, dim,
                                LOOPS)[1] for k in ("tc", before)}
            print(f"time {fam:12s} d={dim:3d} gq={hq // hkv} {b:3d} x {ctx:5d}: "
                  f"SDPA({backend}) {sdpa_ms * 1e3:7.1f} us | tc {ms['tc'] * 1e3:7.1f} us "
                  f"x{sdpa_ms / ms['tc']:.2f} SDPA | {before} {ms[before] * 1e3:7.1f} us "
                  f"x{sdpa_ms / ms[before]:.2f} SDPA | tc/{before} "
                  f"{ms[before] / ms['tc']:.2f}x faster", flush=True)
        del view
        torch.cuda.empty_cache()
    print("ALL PASS" if not failed else f"{failed} FAIL", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
