"""Decode attention per layer-loop: the tensor-core kernel vs decode v2 vs BF16 SDPA, one run.

``python benchmarks/bench_decode.py --out DIR [--deadline S] [--dry-run]``

Timing: CUDA-graph replay under `triton.testing.do_bench` (L2 flushed before each rep,
median; `benchmarks.common.graph_ms`). RQ time per layer-loop = (3 x residual loop + 1 x anchor
loop) / 4 for 4 loops. TB/s counts compressed bytes (`sglang_rq.layout.
decode_read_bytes_per_token` of one layer / loops x history tokens). Baseline: PyTorch SDPA
(FlashAttention) over contiguous BF16 K/V of ``ctx + 1`` tokens. Before timing a family, the
tensor-core kernel is checked against the fp32 twin (flash-attn rule) at that family's first
point. Also written: registers, spills and a SASS opcode histogram of each compiled split
kernel (``DIR/decode_sass.json``). Writes ``DIR/bench_decode.json`` after every point.
"""

from __future__ import annotations

import collections
import os
import re
import sys
import time

if "--dry-run" in sys.argv:  # CPU smoke test: Triton interpreter, tiny sizes
    os.environ["TRITON_INTERPRET"] = "1"

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.bench_decode_v2 import (  # noqa: E402
    DEV, bytes_per_token_loop, copy_bandwidth, inputs, pool, sdpa_ms,
)
from benchmarks.common import bench_args, graph_ms, write_json  # noqa: E402
from rq_kernels.decode_tc import TCLaunch, decode_attention_tc  # noqa: E402
from rq_kernels.decode_v2 import decode_attention_v2  # noqa: E402
from rq_kernels.testing import attention_errors, within_policy  # noqa: E402
from rq_kernels.triton.decode_tc import rq_decode_tc_split_kernel  # noqa: E402
from sglang_rq.config import RQConfig  # noqa: E402
from sglang_rq.reference import decode_attention_reference, dequantize_rows_reference  # noqa: E402

T0 = time.time()
TC_VARIANTS = {  # launch configurations of the tensor-core kernel (the first is the default)
    "tc": TCLaunch(),
    "tc_bn128_w8": TCLaunch(block_n=128, num_warps=8, ctas_per_sm=1),
    "tc_bn32": TCLaunch(block_n=32, ctas_per_sm=3),
    "tc_nopf": TCLaunch(prefetch=False, ctas_per_sm=3),
}
FAMILIES = {  # name: (hq, hkv, head_dim, [(batch, ctx)])
    "ouro-1.4b": (16, 16, 128, [(1, 8192), (4, 8192), (2, 16384), (16, 16384), (1, 32768),
                                (4, 32768), (64, 8192)]),
    "smollm2-gqa3": (9, 3, 64, [(4, 8192), (16, 16384)]),
    "huginn-d96": (24, 24, 96, [(4, 8192), (16, 16384)]),
}


def time_loops(fn, view, q, kc, vc, ind, idx, dim, loops) -> tuple[dict, float]:
    out = torch.empty_like(q)
    res = {}
    for loop in (0, loops - 1):  # loops 0..L-2 cost the same (anchor + own residual)
        res[loop] = graph_ms(lambda: fn(q, kc, vc, view, loop, ind, idx,  # noqa: B023
                                        sm_scale=dim ** -0.5, out=out))
        assert torch.isfinite(out).all(), f"loop {loop}: non-finite output"
    return res, ((loops - 1) * res[0] + res[loops - 1]) / loops


def check(view, hq, hkv, dim, b, ctx, loops) -> list[dict]:
    """The tensor-core kernel vs the fp32 twin (flash-attn rule, bf16 SDPA yardstick)."""
    q, kc, vc, ind, idx = inputs(view, hq, hkv, dim, b, ctx, seed=7)
    rows = []
    for loop in (0, loops - 1):
        ref = decode_attention_reference(q.float(), kc, vc, view, loop, ind, idx,
                                         sm_scale=dim ** -0.5)
        ks, vs = [], []
        for i in range(b):
            k, v = dequantize_rows_reference(view, idx[ind[i]:ind[i + 1]], loop)
            ks.append(torch.cat([k, kc[i:i + 1].float()]))
            vs.append(torch.cat([v, vc[i:i + 1].float()]))
        kk = torch.stack(ks).transpose(1, 2).to(torch.bfloat16)
        vv = torch.stack(vs).transpose(1, 2).to(torch.bfloat16)
        yard = torch.nn.functional.scaled_dot_product_attention(
            q[:, :, None, :], kk, vv, scale=dim ** -0.5, enable_gqa=hq != hkv)[:, :, 0].float()
        out = torch.full_like(q, float("nan"))
        decode_attention_tc(q, kc, vc, view, loop, ind, idx, sm_scale=dim ** -0.5, out=out)
        e = attention_errors(out, ref, yard)
        e.update(ok=bool(torch.isfinite(out).all()) and within_policy(e), loop=loop, batch=b,
                 ctx=ctx)
        rows.append(e)
        print(f"  check b={b} ctx={ctx} loop {loop}: ok={e['ok']} max={e['max']:.3g} "
              f"(sdpa {e['max_sdpa']:.3g}) fro={e['fro']:.3g} (sdpa {e['fro_sdpa']:.3g})",
              flush=True)
    return rows


SASS_CLASSES = ("IMMA", "HMMA", "LOP3", "PRMT", "HADD2", "HFMA2", "SHF", "IADD3", "FFMA", "FMUL",
                "FADD", "MUFU", "LDG", "LDS", "LDSM", "STS", "F2F", "I2F", "BAR", "SHFL")


def sass_report() -> list[dict]:
    """Registers, spills and an opcode histogram of every compiled tensor-core split kernel."""
    out = []
    for cache in getattr(rq_decode_tc_split_kernel, "device_caches", {}).values():
        for key, k in cache[0].items():
            rec = dict(key=str(key)[:300], n_regs=getattr(k, "n_regs", None),
                       n_spills=getattr(k, "n_spills", None))
            try:
                sass = k.asm["sass"]
                ops = collections.Counter(
                    m.group(1).split(".")[0] for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass))
                rec.update(total=sum(ops.values()), ops={c: ops.get(c, 0) for c in SASS_CLASSES})
            except Exception as e:  # noqa: BLE001 - nvdisasm may be missing; report, go on
                rec["sass_error"] = repr(e)[:200]
            out.append(rec)
    return out


def main() -> None:
    def extra(ap):
        ap.add_argument("--deadline", type=float, default=420.0)
        ap.add_argument("--quick", action="store_true",
                        help="three Ouro points, one GQA and one D96 point; default and no-prefetch")

    a = bench_args(extra)
    cfg, loops = RQConfig(), 4
    fams, variants = FAMILIES, TC_VARIANTS
    if a.quick:
        fams = {"ouro-1.4b": (16, 16, 128, [(4, 8192), (2, 16384), (16, 16384)]),
                "smollm2-gqa3": (9, 3, 64, [(16, 16384)]),
                "huginn-d96": (24, 24, 96, [(4, 8192)])}
        variants = {k: TC_VARIANTS[k] for k in ("tc", "tc_nopf")}
    if a.dry_run:
        fams = {"tiny": (2, 2, 64, [(2, 40)]), "tiny-gqa": (4, 2, 64, [(1, 33)])}
    res = dict(gpu=torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu",
               triton=triton.__version__, date=time.strftime("%Y-%m-%d"),
               copy_tbs=copy_bandwidth(), variants={k: vars(v) for k, v in variants.items()},
               checks={}, points=[], skipped=[])
    print(f"device copy {res['copy_tbs']:.2f} TB/s", flush=True)
    for fam, (hq, hkv, dim, points) in fams.items():
        view = pool(cfg, hkv, dim, max(b * c for b, c in points) + 2, loops)
        res["checks"][fam] = check(view, hq, hkv, dim, *points[0], loops)
        for b, ctx in points:
            if time.time() - T0 > a.deadline:
                res["skipped"].append(f"{fam} b={b} ctx={ctx}")
                continue
            q, kc, vc, ind, idx = inputs(view, hq, hkv, dim, b, ctx)
            by = bytes_per_token_loop(cfg, hkv, dim, loops) * ctx * b
            row = dict(family=fam, batch=b, ctx=ctx, sdpa_ms=sdpa_ms(b, hq, hkv, dim, ctx)[0])
            arms = {"v2": decode_attention_v2}
            for name, lc in variants.items():
                arms[name] = (lambda lc: lambda *x, **k: decode_attention_tc(*x, launch=lc, **k)
                              )(lc)
            for name, fn in arms.items():
                t, avg = time_loops(fn, view, q, kc, vc, ind, idx, dim, loops)
                row[name] = dict(resid_ms=t[0], anchor_ms=t[loops - 1], avg_ms=avg,
                                 tbs=by / avg / 1e9, vs_sdpa=row["sdpa_ms"] / avg)
            res["points"].append(row)
            print(f"{fam:13s} ctx={ctx:6d} b={b:3d} sdpa {row['sdpa_ms'] * 1e3:7.1f}us | " +
                  " | ".join(f"{n} {row[n]['avg_ms'] * 1e3:7.1f}us {row[n]['tbs']:.2f}TB/s "
                             f"x{row[n]['vs_sdpa']:.2f}" for n in arms), flush=True)
            write_json(res, a.out, "bench_decode.json")
        del view
        if DEV == "cuda":
            torch.cuda.empty_cache()
    if DEV == "cuda":
        write_json(dict(kernels=sass_report()), a.out, "decode_sass.json")
    res["elapsed_s"] = time.time() - T0
    write_json(res, a.out, "bench_decode.json")


if __name__ == "__main__":
    main()
