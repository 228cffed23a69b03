"""Decode v2 launch variants side by side (one run, same inputs), plus BF16 SDPA.

``python benchmarks/bench_v2_variants.py --out DIR [--dry-run]``

Variants are keyword sets of `rq_kernels.decode_v2.decode_attention_v2` (``VARIANTS`` below):
the exact-fp32 FFMA K dots vs the dp4a integer K dots, and launch knobs around the latter.
Ouro-1.4B shape (16 KV heads, head_dim 128, 4 loops); µs per layer-loop is (3 x residual loop +
anchor loop) / 4; TB/s counts compressed bytes (`layout.decode_read_bytes_per_token`).
CUDA-graph replay, `do_bench` median (`benchmarks.common.graph_ms`). Writes
``DIR/bench_v2_variants.json``.
"""

from __future__ import annotations

import os
import sys
import time

if "--dry-run" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.bench_decode_v2 import (  # noqa: E402
    DEV, bytes_per_token_loop, copy_bandwidth, inputs, pool, sdpa_ms, time_rq,
)
from benchmarks.common import bench_args, write_json  # noqa: E402
from sglang_rq.config import RQConfig  # noqa: E402

VARIANTS = {  # the default before integer K dots; the default now; knobs around it
    "ffma_bn32": dict(k_idp=False, block_n=32, maxnreg=128, ctas_per_sm=4),
    "default": {},
    "idp_bn64_nopf": dict(prefetch=False),
    "idp_bn32_cap128": dict(block_n=32, maxnreg=128, ctas_per_sm=4),
}


def main() -> None:
    a = bench_args()
    cfg, loops, h, dim = RQConfig(), 4, 16, 128
    points = [(4, 8192), (16, 16384), (2, 16384), (4, 32768), (64, 8192)]
    if a.dry_run:
        points, h, dim = [(2, 40)], 2, 64
    res = dict(gpu=torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu",
               date=time.strftime("%Y-%m-%d"), copy_tbs=copy_bandwidth(), variants=VARIANTS,
               points=[])
    view = pool(cfg, h, dim, max(b * c for b, c in points) + 2, loops)
    for b, ctx in points:
        q, kc, vc, ind, idx = inputs(view, h, h, dim, b, ctx)
        per = bytes_per_token_loop(cfg, h, dim, loops) * ctx * b
        row = dict(batch=b, ctx=ctx, sdpa_ms=sdpa_ms(b, h, h, dim, ctx)[0])
        for name, kw in VARIANTS.items():
            t, avg = time_rq("v2", view, q, kc, vc, ind, idx, dim, loops, kw)
            row[name] = dict(resid_ms=t[0], anchor_ms=t[loops - 1], avg_ms=avg,
                             tbs=per / avg / 1e9, vs_sdpa=row["sdpa_ms"] / avg)
        res["points"].append(row)
        print(f"ctx={ctx:6d} b={b:3d} sdpa {row['sdpa_ms'] * 1e3:7.1f}us | " + " | ".join(
            f"{n} {row[n]['avg_ms'] * 1e3:7.1f}us ({row[n]['resid_ms'] * 1e3:.1f}/"
            f"{row[n]['anchor_ms'] * 1e3:.1f}) {row[n]['tbs']:.2f}TB/s x{row[n]['vs_sdpa']:.2f}"
            for n in VARIANTS), flush=True)
        write_json(res, a.out, "bench_v2_variants.json")


if __name__ == "__main__":
    main()
