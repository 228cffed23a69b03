"""Decode attention v1 (MMA kernel) vs v2 (CUDA-core kernel) vs BF16 SDPA, side by side.

``python benchmarks/bench_decode_v2.py --out DIR [--deadline S] [--dry-run]``

Timing: CUDA-graph replay under `triton.testing.do_bench` (L2 flushed before each rep,
median). RQ time per layer-loop = (3 x residual loop + 1 x anchor loop) / 4 for Ouro's 4 loops.
Bytes per layer-loop: `sglang_rq.layout.decode_read_bytes_per_token` for one layer, divided by
the loop count, times the history tokens. SDPA: FlashAttention over contiguous BF16 K/V of
``ctx + 1`` tokens. Writes ``DIR/bench_decode_v2.json`` after every stage. The script stops
starting new points once ``--deadline`` seconds have passed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

if "--dry-run" in sys.argv:  # CPU smoke test: Triton interpreter, tiny sizes
    os.environ["TRITON_INTERPRET"] = "1"

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import graph_ms, realistic_pool  # noqa: E402
from rq_kernels.decode import decode_attention  # noqa: E402
from rq_kernels.decode_v2 import decode_attention_v2  # noqa: E402
from rq_kernels.testing import attention_errors, within_policy  # noqa: E402
from sglang_rq.config import RQConfig  # noqa: E402
from sglang_rq.layout import ModelKVShape, decode_read_bytes_per_token  # noqa: E402
from sglang_rq.reference import decode_attention_reference, dequantize_rows_reference  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
T0 = time.time()


def bench(fn) -> float:
    """Median ms of ``fn`` replayed from a CUDA graph (`benchmarks.common.graph_ms`)."""
    return graph_ms(fn)


def copy_bandwidth() -> float:
    n = (2 << 30) if DEV == "cuda" else 1 << 20
    a = torch.empty(n, dtype=torch.uint8, device=DEV).random_(0, 256)
    b = torch.empty_like(a)
    ms = (triton.testing.do_bench(lambda: b.copy_(a), warmup=25, rep=100, return_mode="median")
          if DEV == "cuda" else bench(lambda: b.copy_(a)))
    a = b = None  # free the buffers (not `del`: the lambdas above close over them)
    return 2 * n / ms / 1e9


def pool(cfg, hkv, dim, rows, loops=4):
    """A pool with random codes, realistic FP8 scale/offset and coefficients (not zeros)."""
    return realistic_pool(cfg, num_loops=loops, num_kv_heads=hkv, head_dim=dim, rows=rows, device=DEV)


def inputs(view, hq, hkv, dim, b, ctx, seed=0):
    rows = view.codes[0].shape[0]
    starts = torch.arange(b, device=DEV) * ctx + 1  # each request: consecutive rows
    idx = (starts[:, None] + torch.arange(ctx, device=DEV)[None, :]).reshape(-1) % (rows - 1) + 1
    ind = torch.arange(b + 1, device=DEV, dtype=torch.int32) * ctx
    gen = torch.Generator(device=DEV).manual_seed(seed)
    q = torch.randn(b, hq, dim, device=DEV, generator=gen).to(torch.bfloat16)
    kc = torch.randn(b, hkv, dim, device=DEV, generator=gen).to(torch.bfloat16)
    vc = torch.randn(b, hkv, dim, device=DEV, generator=gen).to(torch.bfloat16)
    return q, kc, vc, ind, idx.contiguous()


def sdpa_ms(b, hq, hkv, dim, ctx) -> tuple[float, str]:
    q = torch.randn(b, hq, 1, dim, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(b, hkv, ctx + 1, dim, device=DEV, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    gqa = hq != hkv
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH):
        try:
            with sdpa_kernel([backend]):
                ms = bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, enable_gqa=gqa))
            return ms, backend.name
        except RuntimeError:
            continue
    raise RuntimeError("no SDPA backend ran")


def bytes_per_token_loop(cfg, hkv, dim, loops) -> float:
    shape = ModelKVShape(num_layers=1, num_loops=loops, num_kv_heads=hkv, head_dim=dim)
    return decode_read_bytes_per_token(shape, cfg) / loops


def time_rq(fn_name, view, q, kc, vc, ind, idx, dim, loops, kw):
    fn = decode_attention if fn_name == "v1" else decode_attention_v2
    out = torch.empty_like(q)
    res = {}
    for loop in (0, loops - 1):  # loops 0..L-2 cost the same (anchor + own residual)
        res[loop] = bench(lambda: fn(q, kc, vc, view, loop, ind, idx,  # noqa: B023
                                     sm_scale=dim ** -0.5, out=out, **kw))
        assert torch.isfinite(out).all(), f"{fn_name} loop {loop}: non-finite output"
    return res, ((loops - 1) * res[0] + res[loops - 1]) / loops


def check(results, name, view, hq, hkv, dim, b, ctx, loops):
    """v1 and v2 vs the fp32 reference (flash-attn rule, bf16 SDPA yardstick) at this size."""
    q, kc, vc, ind, idx = inputs(view, hq, hkv, dim, b, ctx, seed=7)
    for loop in (0, loops - 1):
        ref = decode_attention_reference(q.float(), kc, vc, view, loop, ind, idx,
                                         sm_scale=dim ** -0.5)
        ks, vs = [], []
        for i in range(b):
            k, v = dequantize_rows_reference(view, idx[ind[i]:ind[i + 1]], loop)
            ks.append(torch.cat([k, kc[i:i + 1].float()]))
            vs.append(torch.cat([v, vc[i:i + 1].float()]))
        kk = torch.stack(ks).transpose(1, 2).to(torch.bfloat16)  # [b, hkv, n, D]
        vv = torch.stack(vs).transpose(1, 2).to(torch.bfloat16)
        yard = torch.nn.functional.scaled_dot_product_attention(
            q[:, :, None, :], kk, vv, scale=dim ** -0.5, enable_gqa=hq != hkv)[:, :, 0].float()
        for ver, fn in (("v1", decode_attention), ("v2", decode_attention_v2)):
            out = torch.full_like(q, float("nan"))
            fn(q, kc, vc, view, loop, ind, idx, sm_scale=dim ** -0.5, out=out)
            e = attention_errors(out, ref, yard)
            e.update(ok=bool(torch.isfinite(out).all()) and within_policy(e), family=name,
                     version=ver, loop=loop, batch=b, ctx=ctx)
            results["checks"].append(e)
            print(f"check {name} b={b} ctx={ctx} {ver} loop {loop}: ok={e['ok']} "
                  f"max={e['max']:.3g} (sdpa {e['max_sdpa']:.3g}) fro={e['fro']:.3g} "
                  f"(sdpa {e['fro_sdpa']:.3g})", flush=True)


def point(results, fam, cfg, view, hq, hkv, dim, b, ctx, loops, v2kw, copy_tbs):
    q, kc, vc, ind, idx = inputs(view, hq, hkv, dim, b, ctx)
    t1, a1 = time_rq("v1", view, q, kc, vc, ind, idx, dim, loops, {})
    t2, a2 = time_rq("v2", view, q, kc, vc, ind, idx, dim, loops, v2kw)
    ts, backend = sdpa_ms(b, hq, hkv, dim, ctx)
    by = bytes_per_token_loop(cfg, hkv, dim, loops) * ctx * b
    bf16 = 2 * hkv * dim * 2 * (ctx + 1) * b
    rec = dict(family=fam, ctx=ctx, batch=b, v1_ms=t1, v2_ms=t2, v1_avg_ms=a1, v2_avg_ms=a2,
               sdpa_ms=ts, sdpa_backend=backend, v1_speedup=ts / a1, v2_speedup=ts / a2,
               v2_over_v1=a1 / a2, v1_tbs=by / a1 / 1e9, v2_tbs=by / a2 / 1e9,
               sdpa_tbs=bf16 / ts / 1e9, rq_bytes=by, bf16_bytes=bf16,
               roofline_ms=by / copy_tbs / 1e9)
    results["decode"].append(rec)
    print(f"{fam:12s} ctx={ctx:6d} b={b:3d} v1={a1 * 1e3:8.1f}us v2={a2 * 1e3:8.1f}us "
          f"[v2 r {t2[0] * 1e3:.1f} a {t2[loops - 1] * 1e3:.1f}] sdpa={ts * 1e3:8.1f}us "
          f"x{rec['v1_speedup']:.2f} -> x{rec['v2_speedup']:.2f}  TB/s v1 {rec['v1_tbs']:.2f} "
          f"v2 {rec['v2_tbs']:.2f} sdpa {rec['sdpa_tbs']:.2f}", flush=True)


def v1_diag():
    """Localise the v1 GPU failure of tests/kernels/test_decode.py::
    test_decode_more_splits_than_tiles (GQA 2, D 64, lens [1, 0, 17], block_n 16, 5 splits):
    v1 and v2 over variants of that call, max-abs error against the reference."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "tests", "kernels"))
    from attn_cases import build, queries

    for group, lens, loop in ((2, [1, 0, 17], 0), (1, [1, 0, 17], 0), (2, [1, 0, 17], 3),
                              (2, [33, 40], 0)):
        view, ind, idx, _ = build(RQConfig(), loops=4, num_kv_heads=1, group=group, dim=64,
                                  lens=lens, rot="cfg", device=DEV, seed=12)
        q, kc, vc = queries(len(lens), group, 1, 64, device=DEV, seed=12)
        ref = decode_attention_reference(q.float(), kc, vc, view, loop, ind, idx, sm_scale=0.125)
        for name, fn, kw in (
                ("v1 bn16 s5", decode_attention, dict(num_splits=5, block_n=16)),
                ("v1 bn16 s5 slow", decode_attention, dict(num_splits=5, block_n=16,
                                                           fast_convert=False)),
                ("v1 bn16 s1", decode_attention, dict(num_splits=1, block_n=16)),
                ("v1 bn32 s5", decode_attention, dict(num_splits=5, block_n=32)),
                ("v1 default", decode_attention, {}),
                ("v1 bn16 w4", decode_attention, dict(num_splits=5, block_n=16, num_warps=4)),
                ("v2 bn16 s5", decode_attention_v2, dict(num_splits=5, block_n=16))):
            try:
                out = fn(q, kc, vc, view, loop, ind, idx, sm_scale=0.125, **kw)
                err = (out.float() - ref).abs().max().item()
                print(f"v1-diag G={group} lens={lens} loop={loop} {name}: max err {err:.4g} "
                      f"(max|ref| {ref.abs().max().item():.3g})", flush=True)
            except Exception as exc:  # report and continue
                print(f"v1-diag G={group} lens={lens} loop={loop} {name}: "
                      f"{type(exc).__name__}: {str(exc)[:100]}", flush=True)


def main():
    if "--v1-diag" in sys.argv:
        v1_diag()
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--deadline", type=float, default=420.0, help="seconds; then stop")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    jpath = os.path.join(args.out, "bench_decode_v2.json")
    dry = args.dry_run
    props = torch.cuda.get_device_properties(0) if DEV == "cuda" else None
    results = dict(gpu=props.name if props else "cpu-interpreter",
                   sms=props.multi_processor_count if props else 0, torch=torch.__version__,
                   triton=triton.__version__, date=time.strftime("%Y-%m-%d"), decode=[],
                   sweep=[], checks=[], skipped=[])

    def save():
        results["elapsed_s"] = time.time() - T0
        with open(jpath, "w") as f:
            json.dump(results, f, indent=1)

    def late(what):
        if time.time() - T0 > args.deadline:
            results["skipped"].append(what)
            print(f"deadline: skipped {what}", flush=True)
            return True
        return False

    results["copy_tbs"] = copy_bandwidth()
    print(f"{results['gpu']}: device copy {results['copy_tbs']:.2f} TB/s", flush=True)
    cfg = RQConfig()
    loops = 4
    ctxs = [40, 70] if dry else [4096, 8192, 16384, 32768]
    batches = [1, 2] if dry else [1, 4, 16, 64]
    hq, hkv, dim = (2, 2, 128) if dry else (16, 16, 128)
    view = pool(cfg, hkv, dim, max(ctxs) * max(batches) + 2)
    # 1. correctness at real size (random pool: any codes/scales are valid inputs)
    check(results, "ouro-1.4b", view, hq, hkv, dim, 2 if not dry else 1, ctxs[1], loops)
    save()
    # 2. v2 config sweep at 16k x 16 (the brief's point) and 8k x 4 (the target's corner):
    # (block_n, num_warps, frame_split, prefetch, ctas_per_sm, maxnreg); the first is the default
    confs = [(32, 4, False, False, None, -1), (32, 4, False, True, None, -1),
             (32, 4, False, False, 3, None), (32, 4, False, True, 3, None),
             (64, 4, False, False, 2, None), (64, 8, False, False, 1, None),
             (128, 8, False, False, 1, None), (32, 4, False, False, 8, -1),
             (32, 4, False, False, 2, -1)]
    pts = [(ctxs[1], batches[1])] if dry else [(16384, 16), (8192, 4)]
    if dry:
        confs = confs[:2]
    score = {}
    for sctx, sb in pts:
        q, kc, vc, ind, idx = inputs(view, hq, hkv, dim, sb, sctx)
        base = None
        for bn, nw, fs, pf, cps, mr in confs:
            kw = dict(block_n=bn, num_warps=nw, frame_split=fs, prefetch=pf, ctas_per_sm=cps,
                      maxnreg=mr)
            if late(f"sweep {kw} {sctx}x{sb}"):
                break
            try:
                t, avg = time_rq("v2", view, q, kc, vc, ind, idx, dim, loops, kw)
            except Exception as exc:  # a config that does not compile/fit: reported, skipped
                print(f"sweep {kw}: failed {type(exc).__name__}: {str(exc)[:120]}", flush=True)
                continue
            base = base or avg
            key = (bn, nw, fs, pf, cps, mr)
            score[key] = score.get(key, 0.0) + avg / base
            results["sweep"].append(dict(kw, ctx=sctx, batch=sb, ms_residual=t[0],
                                         ms_anchor=t[loops - 1], ms_avg=avg))
            print(f"sweep {sctx}x{sb} {kw}: residual {t[0] * 1e3:.1f}us anchor "
                  f"{t[loops - 1] * 1e3:.1f}us avg {avg * 1e3:.1f}us", flush=True)
        save()
    names = ("block_n", "num_warps", "frame_split", "prefetch", "ctas_per_sm", "maxnreg")
    full = [k for k in score if all(
        any(all(r[n] == v for n, v in zip(names, k)) and r["ctx"] == c and r["batch"] == bb
            for r in results["sweep"]) for c, bb in pts)]
    bestk = min(full, key=lambda k: score[k]) if full else None
    v2kw = {} if bestk is None else dict(zip(names, bestk))
    results["v2_config"] = v2kw
    print(f"v2 config for the table (best mean relative time over the sweep points): {v2kw}",
          flush=True)
    # 3. the main table
    for ctx in ctxs:
        for b in batches:
            if late(f"ouro ctx={ctx} b={b}"):
                continue
            point(results, "ouro-1.4b", cfg, view, hq, hkv, dim, b, ctx, loops, v2kw,
                  results["copy_tbs"])
            save()
    del view
    if DEV == "cuda":
        torch.cuda.empty_cache()
    # 4. GQA 9/3, D = 64 (SmolLM2-shaped)
    ghq, ghkv, gdim = (3, 1, 64) if dry else (9, 3, 64)
    gctx, gbs = (40, [2]) if dry else (8192, [4, 16])
    gview = pool(cfg, ghkv, gdim, gctx * max(gbs) + 2)
    if not late("gqa check"):
        check(results, "smollm2-gqa", gview, ghq, ghkv, gdim, 2, gctx, loops)
    for b in gbs:
        if late(f"gqa b={b}"):
            continue
        point(results, "smollm2-gqa", cfg, gview, ghq, ghkv, gdim, b, gctx, loops, {},
              results["copy_tbs"])
        save()
    save()
    print("\n| family | ctx | batch | v1 us | v2 us | SDPA us | v1 x | v2 x | v2/v1 | v1 TB/s "
          "| v2 TB/s | SDPA TB/s |")
    for r in results["decode"]:
        print(f"| {r['family']} | {r['ctx']} | {r['batch']} | {r['v1_avg_ms'] * 1e3:.1f} | "
              f"{r['v2_avg_ms'] * 1e3:.1f} | {r['sdpa_ms'] * 1e3:.1f} | {r['v1_speedup']:.2f} | "
              f"{r['v2_speedup']:.2f} | {r['v2_over_v1']:.2f} | {r['v1_tbs']:.2f} | "
              f"{r['v2_tbs']:.2f} | {r['sdpa_tbs']:.2f} |")
    try:  # registers / spills of every compiled v2 split kernel (Triton's device cache)
        from rq_kernels.triton.decode_v2 import rq_decode_v2_split_kernel as kern

        regs = []
        for cache in kern.device_caches.values():
            for key, ck in cache[0].items():
                regs.append(dict(n_regs=getattr(ck, "n_regs", None),
                                 n_spills=getattr(ck, "n_spills", None), key=str(key)[-300:]))
        results["v2_kernels"] = regs
        for r in regs:
            print(f"v2 kernel regs={r['n_regs']} spills={r['n_spills']} {r['key'][-160:]}")
    except Exception as exc:  # best effort only
        print(f"no register report: {exc}")
    save()
    print(f"checks ok: {all(c['ok'] for c in results['checks'])} "
          f"({len(results['checks'])} checks); elapsed {time.time() - T0:.0f}s")


if __name__ == "__main__":
    main()
