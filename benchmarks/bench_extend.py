"""Extend (chunked-prefill) attention variants over a compressed prefix vs BF16 SDPA (one run).

``python benchmarks/bench_extend.py --out DIR [--dry-run]``

A chunk of ``chunk`` new tokens attends to a compressed prefix of ``prefix`` tokens plus itself
(causal), for loop 0 (anchor + residual) and the last loop (anchor only), under each launch
variant of `rq_kernels.extend.extend_attention` (``VARIANTS``). The baseline is PyTorch SDPA
(FlashAttention) over BF16: the chunk against the whole prefix plus a causal SDPA over the chunk,
the same work as ours split in two. CUDA-graph replay, `do_bench` median. Writes
``DIR/bench_extend.json``.
"""

from __future__ import annotations

import os
import sys
import time

if "--dry-run" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import DEV, FAMILIES, bench, pool, sdpa_time  # noqa: E402
from benchmarks.common import bench_args, write_json  # noqa: E402
from rq_kernels.extend import extend_attention  # noqa: E402
from sglang_rq.config import RQConfig  # noqa: E402

VARIANTS = {  # (block_m, block_n, num_warps, num_stages)
    "m64_n64_w4_s2": dict(block_m=64, block_n=64, num_warps=4, num_stages=2),
    "m128_n64_w8_s2": dict(block_m=128, block_n=64, num_warps=8, num_stages=2),
    "m128_n32_w8_s2": dict(block_m=128, block_n=32, num_warps=8, num_stages=2),
    "m128_n64_w4_s2": dict(block_m=128, block_n=64, num_warps=4, num_stages=2),
    "m64_n32_w4_s3": dict(block_m=64, block_n=32, num_warps=4, num_stages=3),
}


def main() -> None:
    a = bench_args()
    shapes = [(4096, 4096), (16384, 2048)] if not a.dry_run else [(40, 24)]
    res = dict(gpu=torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu",
               date=time.strftime("%Y-%m-%d"), variants=VARIANTS, rows=[])
    for fam, (hq, hkv, dim) in FAMILIES.items():
        for prefix, chunk in shapes:
            view = pool(RQConfig(), hkv, dim, prefix + 2)
            loops = len(view.segments)
            q = torch.randn(1, hq, chunk, dim, device=DEV, dtype=torch.bfloat16)
            kp = torch.randn(1, hkv, prefix + chunk, dim, device=DEV, dtype=torch.bfloat16)
            kc = kp[:, :, prefix:]
            sd = sdpa_time(q, kp[:, :, :prefix], kp[:, :, :prefix])[0] + sdpa_time(
                q, kc, kc, causal=True)[0]
            qx = q[0].transpose(0, 1).contiguous()
            kx = kc[0].transpose(0, 1).contiguous()
            qo = torch.tensor([0, chunk], dtype=torch.int32, device=DEV)
            kvi = torch.tensor([0, prefix], dtype=torch.int32, device=DEV)
            idx = torch.arange(prefix, device=DEV) + 1
            out = torch.empty_like(qx)
            row = dict(family=fam, prefix=prefix, chunk=chunk, sdpa_ms=sd)
            for name, kw in VARIANTS.items():
                t = {i: bench(lambda: extend_attention(  # noqa: B023
                    qx, kx, kx, view, i, qo, kvi, idx, sm_scale=dim ** -0.5, out=out,  # noqa: B023
                    max_qo_len=chunk, **kw)) for i in (0, loops - 1)}  # noqa: B023
                avg = ((loops - 1) * t[0] + t[loops - 1]) / loops
                row[name] = dict(resid_ms=t[0], anchor_ms=t[loops - 1], avg_ms=avg,
                                 over_sdpa=avg / sd)
            res["rows"].append(row)
            print(f"{fam:12s} prefix {prefix:6d} chunk {chunk:5d} sdpa {sd * 1e3:7.1f}us | "
                  + " | ".join(f"{n} {row[n]['avg_ms'] * 1e3:7.1f}us (x{row[n]['over_sdpa']:.2f})"
                               for n in VARIANTS), flush=True)
            write_json(res, a.out, "bench_extend.json")
            view = None  # free the pool (not `del`: the lambdas above close over it)
            if DEV == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
