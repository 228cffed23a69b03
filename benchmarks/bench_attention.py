"""Decode / extend attention and commit over the ResidualQuant cache vs BF16 PyTorch SDPA.

Runs on any CUDA GPU: ``python benchmarks/bench_attention.py --out DIR [--quick]``. Prints
tables, writes ``DIR/bench_attention.json`` (every measurement) and ``DIR/bench_attention.png``.
Timing: CUDA-graph replay under `triton.testing.do_bench` (L2 flushed before each rep, median).
Bytes: per (token, KV head, K-or-V), loop i reads its own segment plus its anchor's, as
`sglang_rq.layout.decode_read_bytes_per_token` counts them (Ouro default: 114 B for loops 0..2,
72 B for loop 3) versus ``2 * head_dim`` bytes in BF16.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

if "--dry-run" in sys.argv:  # CPU smoke test of this script: Triton interpreter, tiny sizes
    os.environ["TRITON_INTERPRET"] = "1"

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import graph_ms, realistic_pool  # noqa: E402
from rq_kernels import commit, decode_attention, extend_attention  # noqa: E402
from sglang_rq.config import RQConfig  # noqa: E402

FAMILIES = {  # name: (num_qo_heads, num_kv_heads, head_dim)
    "ouro-1.4b": (16, 16, 128),
    "smollm2-gqa": (9, 3, 64),
    "huginn-d96": (24, 24, 96),
}
# (block_n, num_warps, num_stages, fast int->fp16 conversion); the last is the control without
# the PTX conversion. SASS per 64-token tile (Triton 3.6, sm_90) for (64, 4, 2): 2779 -> 1463.
CONFIGS = [(64, 4, 2, True), (128, 8, 2, True), (32, 1, 3, True), (32, 2, 3, True),
           (64, 4, 2, False)]
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def bench(fn) -> float:
    """Median ms of ``fn`` captured in a CUDA graph (`benchmarks.common.graph_ms`)."""
    return graph_ms(fn)


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second (TB/s)."""
    a = torch.empty((2 << 30) if DEV == "cuda" else 1 << 20, dtype=torch.uint8,
                    device=DEV).random_(0, 256)
    b = torch.empty_like(a)
    ms = (triton.testing.do_bench(lambda: b.copy_(a), warmup=25, rep=100, return_mode="median")
          if DEV == "cuda" else bench(lambda: b.copy_(a)))
    return 2 * a.numel() / ms / 1e9


def pool(cfg, hkv, dim, rows, loops=4, head_major=False):
    """A GPU pool with random (finite, realistic) codes, FP8 scale/offset and coefficients."""
    return realistic_pool(cfg, num_loops=loops, num_kv_heads=hkv, head_dim=dim, rows=rows,
                          device=DEV, head_major=head_major)


def loop_bytes(view, loop_id) -> int:
    """Compressed bytes read per (token, KV head, K-or-V) by attention over ``loop_id``."""
    seg = view.segments[loop_id]
    return seg.nbytes + (0 if seg.base == loop_id else view.segments[seg.base].nbytes)


def sdpa_time(q, k, v, *, causal=False) -> tuple[float, str]:
    """Fastest fused PyTorch SDPA backend for ``q [B, Hq, n, D]``, ``k/v [B, Hkv, m, D]`` bf16
    (GQA natively if the backend takes it, else K/V expanded to Hq heads, noted in the name)."""
    gqa = q.shape[1] != k.shape[1]
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel([backend]):
                return bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=causal, enable_gqa=gqa)), backend.name
        except RuntimeError:
            continue
    g = q.shape[1] // k.shape[1]
    ke, ve = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return bench(lambda: torch.nn.functional.scaled_dot_product_attention(
            q, ke, ve, is_causal=causal)), "FLASH_ATTENTION(expanded kv)"


def sdpa_decode(b, hq, hkv, dim, ctx):
    q = torch.randn(b, hq, 1, dim, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(b, hkv, ctx + 1, dim, device=DEV, dtype=torch.bfloat16)
    return sdpa_time(q, k, torch.randn_like(k))


def decode_point(view, hq, hkv, dim, b, ctx, loops, cfg_kernel=None):
    rows = view.codes[0].shape[0]
    starts = torch.arange(b, device=DEV) * ctx + 1  # each request: consecutive rows
    idx = (starts[:, None] + torch.arange(ctx, device=DEV)[None, :]).reshape(-1) % (rows - 1) + 1
    ind = torch.arange(b + 1, device=DEV, dtype=torch.int32) * ctx
    q = torch.randn(b, hq, dim, device=DEV, dtype=torch.bfloat16)
    kc = torch.randn(b, hkv, dim, device=DEV, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    out = torch.empty_like(q)
    kw = {} if cfg_kernel is None else dict(block_n=cfg_kernel[0], num_warps=cfg_kernel[1],
                                           num_stages=cfg_kernel[2], fast_convert=cfg_kernel[3])
    res = {}
    for loop in loops:  # loops 0..L-2 cost the same (anchor + own residual)
        fn = lambda: decode_attention(q, kc, vc, view, loop, ind, idx,  # noqa: E731
                                      sm_scale=dim ** -0.5, out=out, **kw)
        res[loop] = bench(fn)
        assert torch.isfinite(out).all()
    return res


def run_decode(results, fam, ctxs, batches, copy_tbs, cfg_kernel, head_major=False):
    hq, hkv, dim = FAMILIES[fam]
    cfg = RQConfig()
    view = pool(cfg, hkv, dim, max(ctxs) * max(batches) + 2, head_major=head_major)
    fam = fam + ("/head-major" if head_major else "")
    nloops = len(view.segments)
    for ctx in ctxs:
        for b in batches:
            t = decode_point(view, hq, hkv, dim, b, ctx, (0, nloops - 1), cfg_kernel)
            t_sdpa, backend = sdpa_decode(b, hq, hkv, dim, ctx)
            avg = ((nloops - 1) * t[0] + t[nloops - 1]) / nloops  # per layer-loop
            by = {i: loop_bytes(view, i) * 2 * hkv * ctx * b for i in t}
            by_avg = ((nloops - 1) * by[0] + by[nloops - 1]) / nloops
            bf16_bytes = 2 * hkv * dim * 2 * (ctx + 1) * b
            rec = dict(family=fam, ctx=ctx, batch=b, ms_loop=t, ms_avg=avg, ms_sdpa=t_sdpa,
                       sdpa_backend=backend, speedup=t_sdpa / avg,
                       tbs_loop={i: by[i] / t[i] / 1e9 for i in t},
                       tbs_avg=by_avg / avg / 1e9,
                       tbs_sdpa=bf16_bytes / t_sdpa / 1e9,
                       roofline_ms_avg=by_avg / copy_tbs / 1e9,
                       roofline_ms_sdpa=bf16_bytes / copy_tbs / 1e9)
            results["decode"].append(rec)
            print(f"{fam:12s} ctx={ctx:6d} b={b:3d} ours(avg/loop)={avg * 1e3:8.1f}us "
                  f"[r {t[0] * 1e3:7.1f} a {t[nloops - 1] * 1e3:7.1f}] sdpa={t_sdpa * 1e3:8.1f}us "
                  f"x{rec['speedup']:.2f} eff={rec['tbs_avg']:.2f}TB/s "
                  f"sdpa={rec['tbs_sdpa']:.2f}TB/s",
                  flush=True)
    del view
    torch.cuda.empty_cache()


def pick_config(results, ctx, b):
    hq, hkv, dim = FAMILIES["ouro-1.4b"]
    view = pool(RQConfig(), hkv, dim, ctx * b + 2)
    best = None
    for c in CONFIGS:
        try:
            t = decode_point(view, hq, hkv, dim, b, ctx, (0, 3), c)
        except Exception as exc:  # a config that does not compile/fit is skipped
            print(f"config {c}: failed ({type(exc).__name__}: {str(exc)[:80]})", flush=True)
            continue
        tot = 3 * t[0] + t[3]
        results["configs"].append(dict(block_n=c[0], num_warps=c[1], num_stages=c[2],
                                       fast_convert=c[3], ctx=ctx, batch=b, ms_residual=t[0],
                                       ms_anchor=t[3]))
        print(f"config {c}: residual {t[0] * 1e3:.1f}us anchor {t[3] * 1e3:.1f}us", flush=True)
        if c[3] and (best is None or tot < best[0]):
            best = (tot, c)
    del view
    return best[1]


def run_prefill(results, fam, tokens):
    """Commit of ``tokens`` new tokens (all loops, one layer) vs BF16 prefill attention of the
    same layer (num_loops causal SDPA calls); extend over a compressed prefix of ``tokens``."""
    hq, hkv, dim = FAMILIES[fam]
    cfg = RQConfig()
    view = pool(cfg, hkv, dim, 2 * tokens + 2)
    loops = len(view.segments)
    k = torch.randn(loops, tokens, hkv, dim, device=DEV, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    loc = torch.arange(tokens, device=DEV) + 1
    t_commit = bench(lambda: commit(k, v, loc, view))
    q = torch.randn(1, hq, tokens, dim, device=DEV, dtype=torch.bfloat16)
    kk = torch.randn(1, hkv, tokens, dim, device=DEV, dtype=torch.bfloat16)
    t_causal, _ = sdpa_time(q, kk, kk, causal=True)
    t_full, _ = sdpa_time(q, kk, kk)
    qo = torch.tensor([0, tokens], dtype=torch.int32, device=DEV)
    qx = q[0].transpose(0, 1).contiguous()
    kx = kk[0].transpose(0, 1).contiguous()
    kvi = torch.tensor([0, tokens], dtype=torch.int32, device=DEV)
    idx = torch.arange(tokens, device=DEV) + tokens + 1
    out = torch.empty_like(qx)
    t_ext = {i: bench(lambda: extend_attention(qx, kx, kx, view, i, qo, kvi, idx,  # noqa: B023
                                                sm_scale=dim ** -0.5, out=out,
                                                max_qo_len=tokens)) for i in (0, loops - 1)}
    rec = dict(family=fam, tokens=tokens, ms_commit=t_commit, ms_sdpa_causal=t_causal,
               ms_sdpa_full=t_full, commit_over_attention=t_commit / (loops * t_causal),
               ms_extend=t_ext, ms_sdpa_prefix_plus_chunk=t_full + t_causal,
               extend_ratio={i: t_ext[i] / (t_full + t_causal) for i in t_ext})
    if fam == "ouro-1.4b":  # the layer's GEMMs at 4k tokens, to put the commit in context
        x = torch.randn(tokens, 2048, device=DEV, dtype=torch.bfloat16)
        ws = [torch.randn(2048, n, device=DEV, dtype=torch.bfloat16) for n in (6144, 2048, 11264)]
        wd = torch.randn(5632, 2048, device=DEV, dtype=torch.bfloat16)
        h = torch.randn(tokens, 5632, device=DEV, dtype=torch.bfloat16)
        t_gemm = bench(lambda: [x @ w for w in ws] + [h @ wd])
        rec["ms_layer_gemms"] = t_gemm
        rec["commit_over_layer_prefill"] = t_commit / (loops * (t_causal + t_gemm))
    results["prefill"].append(rec)
    print(f"{fam:12s} commit({tokens} tok, {loops} loops)={t_commit * 1e3:.1f}us "
          f"sdpa causal={t_causal * 1e3:.1f}us/loop -> commit/attention="
          f"{rec['commit_over_attention'] * 100:.1f}%"
          + (f" commit/(attention+gemm)={rec['commit_over_layer_prefill'] * 100:.1f}%"
             if "ms_layer_gemms" in rec else "")
          + f" | extend prefix {tokens}+chunk {tokens}: ours "
          + " ".join(f"L{i}={t * 1e3:.0f}us" for i, t in t_ext.items())
          + f" vs sdpa(prefix+chunk)={(t_full + t_causal) * 1e3:.0f}us", flush=True)
    view = None  # free the pool before the next shape (not `del`: the lambdas above close over it)
    torch.cuda.empty_cache()


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [r for r in results["decode"] if r["family"] == "ouro-1.4b"]
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    for b in sorted({r["batch"] for r in recs}):
        rs = sorted((r for r in recs if r["batch"] == b), key=lambda r: r["ctx"])
        ctx = [r["ctx"] for r in rs]
        ax[0].plot(ctx, [r["speedup"] for r in rs], "o-", label=f"batch {b}")
        ax[1].plot(ctx, [r["tbs_avg"] for r in rs], "o-", label=f"RQ batch {b}")
        ax[1].plot(ctx, [r["tbs_sdpa"] for r in rs], "x--", label=f"SDPA batch {b}")
    ax[0].axhline(2.2, color="k", ls=":", label="target 2.2x")
    ax[0].set(xscale="log", xlabel="context", ylabel="SDPA time / RQ time",
              title="Ouro-1.4B decode attention per layer-loop")
    ax[1].axhline(3.0, color="k", ls=":", label="target 3.0 TB/s")
    ax[1].set(xscale="log", xlabel="context", ylabel="TB/s (compressed / bf16 bytes)",
              title="effective bandwidth")
    for a in ax:
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--quick", action="store_true", help="fewer points")
    ap.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny sizes")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    jpath = os.path.join(args.out, "bench_attention.json")
    dry = args.dry_run
    if dry:
        FAMILIES.update({k: (h // 8 or 1, hk // 8 or 1, d) for k, (h, hk, d) in FAMILIES.items()})
        CONFIGS[:] = CONFIGS[:2]
    props = torch.cuda.get_device_properties(0) if not dry else None
    results = dict(gpu=props.name if props else "cpu-interpreter",
                   sms=props.multi_processor_count if props else 0, torch=torch.__version__,
                   triton=triton.__version__, date=time.strftime("%Y-%m-%d"),
                   decode=[], prefill=[], configs=[])
    results["copy_tbs"] = copy_bandwidth()
    print(f"{results['gpu']}: device copy {results['copy_tbs']:.2f} TB/s", flush=True)
    save = lambda: json.dump(results, open(jpath, "w"), indent=1)  # noqa: E731
    best = pick_config(results, 64 if dry else 8192, 2 if dry else 4)
    results["decode_config"] = best
    print(f"decode config (block_n, num_warps, num_stages, fast) = {best}", flush=True)
    save()
    ctxs = [8192, 32768] if args.quick else [4096, 8192, 16384, 32768]
    batches = [4, 16] if args.quick else [1, 4, 16, 64]
    run_decode(results, "ouro-1.4b", [37, 64] if dry else ctxs, [1, 2] if dry else batches,
               results["copy_tbs"], best)
    save()
    # A/B of the pool layout: [2, H, rows, bytes] (each head's rows contiguous) vs token-major
    run_decode(results, "ouro-1.4b", [40] if dry else [8192, 32768], [2] if dry else [4, 16],
               results["copy_tbs"], best, head_major=True)
    save()
    for fam in ("smollm2-gqa", "huginn-d96"):
        run_decode(results, fam, [40] if dry else [8192, 16384], [2] if dry else [4, 16],
                   results["copy_tbs"], best)
        save()
    for fam in FAMILIES:
        run_prefill(results, fam, 32 if dry else 4096)
        save()
    try:
        plot(results, os.path.join(args.out, "bench_attention.png"))
    except ImportError as exc:
        print(f"no plot: {exc}")
    print("\n| family | ctx | batch | RQ us/layer-loop | SDPA us | speedup | RQ TB/s | SDPA TB/s |")
    for r in results["decode"]:
        print(f"| {r['family']} | {r['ctx']} | {r['batch']} | {r['ms_avg'] * 1e3:.1f} | "
              f"{r['ms_sdpa'] * 1e3:.1f} | {r['speedup']:.2f} | {r['tbs_avg']:.2f} | "
              f"{r['tbs_sdpa']:.2f} |")


if __name__ == "__main__":
    main()
