"""Pool layout A/B for decode v2: token-major rows (the pool today) vs head-major rows.

``python benchmarks/bench_pool_layout.py --out DIR [--dry-run]``

Token-major (`sglang_rq.pool`): codes/meta ``[rows, 2, H, bytes]``, so one (token, head) piece is
64 B of anchor K codes at a 2 KB row stride (Ouro). Head-major: the same logical views over
``[2, H, rows, bytes]`` storage (``make_view(head_major=True)`` of tests/kernels/views.py), so
one head's consecutive tokens are contiguous. Requests occupy consecutive rows, as a fresh
request does in SGLang's allocator. Same kernels, same launch config; CUDA-graph replay,
`do_bench` median.
Writes ``DIR/bench_pool_layout.json``.
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
    DEV, bytes_per_token_loop, copy_bandwidth, inputs, sdpa_ms, time_rq,
)
from benchmarks.common import bench_args, realistic_pool, write_json  # noqa: E402
from sglang_rq.config import RQConfig  # noqa: E402


def main() -> None:
    a = bench_args()
    cfg, loops, h, dim = RQConfig(), 4, 16, 128
    points = [(2, 40)] if a.dry_run else [(4, 8192), (16, 16384), (2, 16384), (4, 32768)]
    if a.dry_run:
        h, dim = 2, 64
    res = dict(gpu=torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu",
               date=time.strftime("%Y-%m-%d"), copy_tbs=copy_bandwidth(), points=[])
    for b, ctx in points:
        per = bytes_per_token_loop(cfg, h, dim, loops) * ctx * b
        row = dict(batch=b, ctx=ctx, sdpa_ms=sdpa_ms(b, h, h, dim, ctx)[0])
        for layout in ("token", "head"):
            view = realistic_pool(cfg, num_loops=loops, num_kv_heads=h, head_dim=dim,
                                  rows=b * ctx + 2, device=DEV, head_major=layout == "head")
            q, kc, vc, ind, idx = inputs(view, h, h, dim, b, ctx)
            t, avg = time_rq("v2", view, q, kc, vc, ind, idx, dim, loops, {})
            row[layout] = dict(resid_ms=t[0], anchor_ms=t[loops - 1], avg_ms=avg,
                               tbs=per / avg / 1e9)
            del view
            if DEV == "cuda":
                torch.cuda.empty_cache()
        row["head_over_token"] = row["token"]["avg_ms"] / row["head"]["avg_ms"]
        res["points"].append(row)
        print(f"ctx={ctx:6d} b={b:3d} token {row['token']['avg_ms'] * 1e3:8.1f}us "
              f"({row['token']['tbs']:.2f} TB/s)  head {row['head']['avg_ms'] * 1e3:8.1f}us "
              f"({row['head']['tbs']:.2f} TB/s)  sdpa {row['sdpa_ms'] * 1e3:8.1f}us  "
              f"head speedup x{row['head_over_token']:.2f}", flush=True)
        write_json(res, a.out, "bench_pool_layout.json")


if __name__ == "__main__":
    main()
