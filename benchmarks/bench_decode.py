"""Decode attention per layer-loop: both split kernels vs BF16 SDPA, side by side in one run.

``python benchmarks/bench_decode.py --out DIR [--deadline S] [--pdl-ab] [--dry-run]``

`rq_kernels.decode_attention` with each split kernel that can serve the shape
(`DecodeLaunch(split_kernel=...)`: ``tc`` (CUDA, head_dim 64/96/128), ``fma`` for MHA, ``mma`` for
every shape) against PyTorch
SDPA (FlashAttention) over contiguous BF16 K/V of ``ctx + 1`` tokens. Mixed-length batches
(`MIXED`, the JSON's ``mixed`` rows) are timed against a uniform batch of as many requests and tokens (``balance`` = uniform
time / mixed time: 1.0 where a long request does not stretch the call). Timing: CUDA-graph replay
under `triton.testing.do_bench` (L2 flushed before each rep, median). RQ time per layer-loop =
(3 x residual loop + 1 x anchor loop) / 4 for 4 loops; TB/s counts compressed bytes
(`sglang_rq.layout.decode_read_bytes_per_token` of one layer / loops x history tokens). Each
family is first checked against the fp32 twin (flash-attn rule). The speed of light of each
point (the JSON's ``read``; ``vs_read`` = its time / the kernel's): the fastest pure read
(`common.read_roofline`: one launch, timed the same way) of the bytes each loop's call reads. ``--pdl-ab``: the tc kernel
also launched without programmatic dependent launch (``tc_nopdl``; the default launches the
rotation, split and merge kernels as dependents on sm_90+), same run. Row placement
(`PLACED`, the JSON's ``placement`` rows): the default kernel over the same requests with their
history on consecutive pool rows (a prefill allocated at once: every other row of this
benchmark), on pages of 16 rows in random order, on rows interleaved with the batch's other
requests (tokens decoded side by side at page size 1) and on scattered rows (page size 1 after
the free list has churned); ``vs_consecutive`` = consecutive time / placed time. Writes
``DIR/bench_decode.json`` after every point; stops starting new points after ``--deadline``
seconds.

Chained (the JSON's ``chain`` per point; the default split kernel, the pure read's fastest arm,
SDPA): the same calls timed as a model runs them, `common.chain_ms`: back to back from one
CUDA graph, each over its own copy of the data (`common.chain_copies`: the copies together at
least 3x the L2), behind a separator kernel, no L2 flush. The flushed single-call timing above
charges a short call with writing back the L2's dirty lines that do_bench's flush leaves (up to
the L2's 50 MB at a few TB/s) and with a graph launch; the chain charges neither, for every arm.

FlashInfer (``--flashinfer DIR``, default ``.gpu-bundle`` where `benchmarks/flashinfer_bundle.py`
wrote its modules; the JSON's ``flashinfer``): FlashInfer's BF16 paged decode
(`benchmarks.flashinfer_decode`, SGLang's FlashInfer decode at page size 1) over the same K/V as
SDPA, timed flushed and chained as SDPA is (``vs_flashinfer`` = its time / the kernel's), its
output checked against SDPA's (``max_abs_diff_vs_sdpa``). Without the bundle the arm is skipped
and the JSON says why.
"""

from __future__ import annotations

import os
import sys
import time

if "--dry-run" in sys.argv:  # CPU smoke test: Triton interpreter, tiny sizes
    os.environ["TRITON_INTERPRET"] = "1"

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import (  # noqa: E402
    DEV, FAMILIES, bench, bench_args, chain_copies, chain_ms, copy_bandwidth, loop_average,
    loop_bytes_per_token, pool, read_arms, read_roofline, sdpa_call, sdpa_time, write_json,
)
from benchmarks.flashinfer_decode import DEFAULT_BUNDLE, load_baseline  # noqa: E402
from rq_kernels import decode_attention  # noqa: E402
from rq_kernels.decode import DecodeLaunch, fma_unsupported_reason  # noqa: E402
from rq_kernels.decode_tc import tc_unsupported_reason  # noqa: E402
from rq_kernels.testing import attention_errors, within_policy  # noqa: E402
from sglang_rq.config import RQConfig  # noqa: E402
from sglang_rq.layout import ModelKVShape, decode_read_bytes_per_token  # noqa: E402
from sglang_rq.reference import decode_attention_reference, dequantize_rows_reference  # noqa: E402

T0 = time.time()
POINTS = [(1, 8192), (4, 8192), (2, 16384), (16, 16384), (4, 32768), (64, 8192)]
# mixed-length batches (name: history lengths), timed against a uniform batch of the same size
# and tokens: how much a long request's splits stretch the call
MIXED = {"16 x 1k..16k": [1024 * (i + 1) for i in range(16)],
         "1 x 16k + 31 x 1k": [16384] + [1024] * 31,
         "4 x 32k + 60 x 2k": [32768] * 4 + [2048] * 60}  # a one-split plan
# row placement of a request's history (batch, ctx): where SGLang's allocator puts the slots
PLACED = [(2, 16384), (16, 16384), (64, 8192)]
PLACEMENTS = ("consecutive", "pages16", "interleaved", "scattered")


def inputs(view, hq, hkv, dim, b, ctx, seed=0):
    """Queries, the in-flight token and a plan of ``b`` requests of ``ctx`` history tokens."""
    return batch_inputs(view, hq, hkv, dim, [ctx] * b, seed)


def batch_inputs(view, hq, hkv, dim, lens, seed=0):
    """Queries, the in-flight token and a plan: request i's ``lens[i]`` history tokens on
    consecutive pool rows (wrapping past the pool's end, row 0 skipped)."""
    rows = view.codes[0].shape[0]
    b = len(lens)
    ind = torch.tensor([0, *lens], device=DEV).cumsum(0).to(torch.int32)
    idx = torch.arange(int(ind[-1]), device=DEV) % (rows - 1) + 1
    gen = torch.Generator(device=DEV).manual_seed(seed)
    q = torch.randn(b, hq, dim, device=DEV, generator=gen).to(torch.bfloat16)
    kc = torch.randn(b, hkv, dim, device=DEV, generator=gen).to(torch.bfloat16)
    vc = torch.randn(b, hkv, dim, device=DEV, generator=gen).to(torch.bfloat16)
    return q, kc, vc, ind, idx


def placed_rows(lens: list[int], rows: int, how: str, seed: int = 5) -> torch.Tensor:
    """Pool rows (``int64 [sum(lens)]`` on ``DEV``, row 0 never used) of ``len(lens)`` requests'
    histories, request after request, placed ``how`` (one of `PLACEMENTS`): ``consecutive``
    (request i's tokens on one run of rows after request i-1's), ``pages16`` (16-row pages in a
    random order, a request's tokens filling its pages), ``interleaved`` (token j of request i at
    row ``1 + j * B + i``; equal lengths only) or ``scattered`` (a random sample of rows).
    Raises ValueError if the pool has too few rows or ``how`` is unknown."""
    b, n = len(lens), sum(lens)
    if n > rows - 1:
        raise ValueError(f"{n} tokens do not fit {rows} rows")
    gen = torch.Generator().manual_seed(seed)
    if how == "consecutive":
        out = torch.arange(n) + 1
    elif how == "pages16":
        need = [(x + 15) // 16 for x in lens]
        if sum(need) > (rows - 1) // 16:
            raise ValueError(f"{sum(need)} pages of 16 do not fit {rows - 1} rows")
        pages = torch.randperm((rows - 1) // 16, generator=gen)[:sum(need)]
        parts, at = [], 0
        for x, k in zip(lens, need):
            j = torch.arange(x)
            parts.append(1 + pages[at + j // 16] * 16 + j % 16)
            at += k
        out = torch.cat(parts)
    elif how == "interleaved":
        if len(set(lens)) != 1:
            raise ValueError("interleaved rows need equal lengths")
        j = torch.arange(lens[0])
        out = torch.cat([1 + j * b + i for i in range(b)])
    elif how == "scattered":
        out = torch.randperm(rows - 1, generator=gen)[:n] + 1
    else:
        raise ValueError(f"unknown placement {how!r}; one of {PLACEMENTS}")
    if int(out.max()) >= rows:  # interleaved rows run to B x the longest request
        raise ValueError(f"{n} tokens placed {how} do not fit {rows} rows")
    return out.to(DEV)


def bytes_per_token_loop(cfg, hkv, dim, loops) -> float:
    shape = ModelKVShape(num_layers=1, num_loops=loops, num_kv_heads=hkv, head_dim=dim)
    return decode_read_bytes_per_token(shape, cfg) / loops


def time_reads(buf, cfg, hkv, dim, tokens, loops) -> dict:
    """The speed of light of the decode calls over ``tokens`` history tokens: the fastest pure
    read (`read_roofline`) of the bytes the residual loop and the anchor loop read, averaged
    over the loops as `time_loops` does."""
    t = {}
    for loop in (0, loops - 1):
        t[loop], arm = read_roofline(buf, loop_bytes_per_token(cfg, hkv, dim, loops, loop) * tokens)
    return dict(resid_ms=t[0], anchor_ms=t[loops - 1], avg_ms=loop_average(t, loops), arm=arm)


def time_loops(launch, view, q, kc, vc, ind, idx, dim, loops) -> tuple[dict, float]:
    out = torch.empty_like(q)
    res = {}
    for loop in (0, loops - 1):  # loops 0..L-2 cost the same (anchor + own residual)
        res[loop] = bench(lambda: decode_attention(q, kc, vc, view, loop, ind, idx,  # noqa: B023
                                                   sm_scale=dim ** -0.5, out=out, launch=launch))
        assert torch.isfinite(out).all(), f"loop {loop}: non-finite output"
    return res, loop_average(res, loops)


def chain_points(cfg, hkv, dim, loops, points) -> dict:
    """(batch, ctx) -> the copies `time_chained` cycles the compressed history through, enough
    for the loop that reads least (the anchor loop; the pool must hold copies x batch x ctx
    rows past row 0)."""
    least = min(loop_bytes_per_token(cfg, hkv, dim, loops, u) for u in range(loops))
    return {(b, c): chain_copies(least * b * c) for b, c in points}


def chained_rq(launch, view, q, kc, vc, ind, idx, dim, loops, copies) -> dict:
    """The split kernel ``launch`` timed chained (`common.chain_ms`) over ``copies`` copies of the
    requests' history (request rows ``idx`` shifted by whole batches: the pool holds ``copies x
    len(idx)`` rows past row 0): ms per call of residual loop 0 and of the anchor loop, and
    their `common.loop_average`."""
    tokens = idx.numel()
    idxs = [idx + i * tokens for i in range(copies)]
    outs = [torch.empty_like(q) for _ in range(copies)]
    rq = {}
    for loop in (0, loops - 1):
        rq[loop] = chain_ms([
            lambda i=i, lp=loop: decode_attention(q, kc, vc, view, lp, ind, idxs[i],
                                                  sm_scale=dim ** -0.5, out=outs[i],
                                                  launch=launch)
            for i in range(copies)])
    return dict(resid_ms=rq[0], anchor_ms=rq[loops - 1], avg_ms=loop_average(rq, loops))


def time_chained(launch, view, q, kc, vc, ind, idx, dim, loops, copies, cfg, read_arm,
                 fi=None) -> dict:
    """One point timed chained (`common.chain_ms`): the split kernel ``launch`` over ``copies``
    copies of the requests' history (request rows ``idx`` shifted by whole batches: the pool
    holds ``copies x len(idx)`` rows past row 0), the pure read ``read_arm`` (the arm the flushed
    read picked, `time_reads`'s) of as many bytes per loop (as many copies, one buffer), and
    BF16 SDPA (`common.sdpa_call`) over its own copies of distinct K and V ``[B, Hkv, ctx + 1,
    D]``, and FlashInfer's decode (``fi``, a `flashinfer_decode.FlashInferDecode`, if given) over
    as many copies in its page layout. Times in ms per call; RQ and read averaged over the loops
    (`common.loop_average`)."""
    b, hq, _ = q.shape
    hkv = kc.shape[1]
    tokens = idx.numel()
    ctx = tokens // b
    rq = chained_rq(launch, view, q, kc, vc, ind, idx, dim, loops, copies)
    rd = {}
    for loop in (0, loops - 1):
        nb = loop_bytes_per_token(cfg, hkv, dim, loops, loop) * tokens
        pitch = -(-nb // 256) * 256
        buf = torch.empty(copies * pitch, dtype=torch.uint8, device=DEV)
        rd[loop] = chain_ms([read_arms(buf[i * pitch:], nb)[read_arm] for i in range(copies)])
        del buf
    kv_copies = chain_copies(2 * b * hkv * (ctx + 1) * dim * 2)
    qs = torch.randn(b, hq, 1, dim, device=DEV, dtype=torch.bfloat16)
    sdpas = [sdpa_call(qs, *(torch.randn(b, hkv, ctx + 1, dim, device=DEV, dtype=torch.bfloat16)
                             for _ in range(2)))[0] for _ in range(kv_copies)]
    sdpa_ms = chain_ms(sdpas)
    del sdpas
    fi_ms = None
    if fi is not None:
        q1, o1 = qs[:, :, 0].contiguous(), torch.empty_like(qs[:, :, 0])
        fis = [fi.call(*(torch.randn(b * (ctx + 1), 1, hkv, dim, device=DEV, dtype=torch.bfloat16)
                         for _ in range(2)), [ctx + 1] * b, hq, sm_scale=dim ** -0.5)
               for _ in range(kv_copies)]
        fi_ms = chain_ms([lambda f=f: f(q1, o1) for f in fis])
        del fis
    return dict(copies=copies, sdpa_copies=kv_copies, sdpa_ms=sdpa_ms, flashinfer_ms=fi_ms,
                read=dict(resid_ms=rd[0], anchor_ms=rd[loops - 1], avg_ms=loop_average(rd, loops),
                          arm=read_arm),
                rq=rq)


def time_flashinfer(fi, qs, ks, vs) -> dict:
    """FlashInfer's decode of ``qs [B, Hq, 1, D]`` over ``ks``, ``vs`` ``[B, Hkv, ctx + 1, D]``
    (SDPA's flushed operands, laid out as pages of one token): median ms (`bench`) and its
    largest difference from SDPA's output."""
    b, hkv, n, dim = ks.shape
    k_pages, v_pages = (t.permute(0, 2, 1, 3).reshape(b * n, 1, hkv, dim).contiguous()
                        for t in (ks, vs))
    q1 = qs[:, :, 0].contiguous()
    out = torch.empty_like(q1)
    call = fi.call(k_pages, v_pages, [n] * b, q1.shape[1], sm_scale=dim ** -0.5)
    got = call(q1, out).float()
    want = sdpa_call(qs, ks, vs)[0]()[:, :, 0].float()
    return dict(ms=bench(lambda: call(q1, out)),
                max_abs_diff_vs_sdpa=(got - want).abs().max().item(),
                max_abs_sdpa=want.abs().max().item())


def check(view, hq, hkv, dim, b, ctx, loops, kernels) -> list[dict]:
    """Each split kernel vs the fp32 twin (flash-attn rule, bf16 SDPA yardstick)."""
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
        for kernel in kernels:
            out = torch.full_like(q, float("nan"))
            decode_attention(q, kc, vc, view, loop, ind, idx, sm_scale=dim ** -0.5, out=out,
                             launch=DecodeLaunch(split_kernel=kernel))
            e = attention_errors(out, ref, yard)
            e.update(ok=bool(torch.isfinite(out).all()) and within_policy(e), kernel=kernel,
                     loop=loop, batch=b, ctx=ctx)
            rows.append(e)
            print(f"  check {kernel} b={b} ctx={ctx} loop {loop}: ok={e['ok']} max={e['max']:.3g} "
                  f"(sdpa {e['max_sdpa']:.3g})", flush=True)
    return rows


def main() -> None:
    def extra(ap):
        ap.add_argument("--deadline", type=float, default=420.0)
        ap.add_argument("--pdl-ab", action="store_true",
                        help="also time the tc kernel launched without PDL (tc_nopdl)")
        ap.add_argument("--flashinfer", default=str(DEFAULT_BUNDLE),
                        help="FlashInfer's decode modules (benchmarks/flashinfer_bundle.py)")

    a = bench_args(extra)
    cfg, loops = RQConfig(), 4
    fams = {k: (*v, POINTS) for k, v in FAMILIES.items()}
    mixed = MIXED
    if a.dry_run:
        fams = {"tiny": (2, 2, 64, [(2, 40)]), "tiny-gqa": (4, 2, 64, [(1, 33)])}
        mixed = {"40 + 3 + 17": [40, 3, 17]}
        placed = [(2, 48)]
    else:
        placed = PLACED
    res = dict(gpu=torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu",
               triton=triton.__version__, date=time.strftime("%Y-%m-%d"),
               copy_tbs=copy_bandwidth(), checks={}, points=[], mixed=[], placement=[],
               skipped=[])
    fi, res["flashinfer"] = load_baseline(a.flashinfer)
    for fam, (hq, hkv, dim, points) in fams.items():
        copies = chain_points(cfg, hkv, dim, loops, points)
        # the rows placements spread over: the pool's size before the chained copies
        spread = max([b * c for b, c in points + placed] + [sum(ls) for ls in mixed.values()]) + 2
        view = pool(cfg, hkv, dim, max([spread] + [copies[b, c] * b * c + 2 for b, c in points]),
                    loops)
        kernels = (["tc"] if DEV == "cuda" and tc_unsupported_reason(
            view, 0, hq // hkv, torch.device(DEV)) is None else []) + (
            ["fma"] if fma_unsupported_reason(view, hq // hkv) is None else []) + ["mma"]
        res["checks"][fam] = check(view, hq, hkv, dim, *points[0], loops, kernels)
        read_buf = torch.empty(max(b * c for b, c in points) * max(
            loop_bytes_per_token(cfg, hkv, dim, loops, u) for u in range(loops)),
            dtype=torch.uint8, device=DEV)
        for b, ctx in points:
            if time.time() - T0 > a.deadline:
                res["skipped"].append(f"{fam} b={b} ctx={ctx}")
                continue
            q, kc, vc, ind, idx = inputs(view, hq, hkv, dim, b, ctx)
            by = bytes_per_token_loop(cfg, hkv, dim, loops) * ctx * b
            qs = torch.randn(b, hq, 1, dim, device=DEV, dtype=torch.bfloat16)
            # distinct K and V (until 12-05b one tensor served as both: V's reads could hit
            # the L2 behind K's)
            ks, vs = (torch.randn(b, hkv, ctx + 1, dim, device=DEV, dtype=torch.bfloat16)
                      for _ in range(2))
            row = dict(family=fam, batch=b, ctx=ctx, sdpa_ms=sdpa_time(qs, ks, vs)[0],
                       read=time_reads(read_buf, cfg, hkv, dim, b * ctx, loops))
            fi_here = fi if fi is not None and str(dim) in fi.manifest["modules"] else None
            if fi_here is not None:
                try:
                    row["flashinfer"] = time_flashinfer(fi_here, qs, ks, vs)
                except RuntimeError as exc:  # e.g. a head_dim its merge does not take
                    row["flashinfer_error"] = str(exc)
                    fi_here = None
            del ks, vs  # before the chained copies
            row["read"]["tbs"] = by / row["read"]["avg_ms"] / 1e9
            arms = [(k, DecodeLaunch(split_kernel=k)) for k in kernels]
            if a.pdl_ab and "tc" in kernels:
                arms.append(("tc_nopdl", DecodeLaunch(split_kernel="tc", pdl=False)))
            for name, launch in arms:
                t, avg = time_loops(launch, view, q, kc, vc, ind, idx, dim, loops)
                row[name] = dict(resid_ms=t[0], anchor_ms=t[loops - 1], avg_ms=avg,
                                 tbs=by / avg / 1e9, vs_sdpa=row["sdpa_ms"] / avg,
                                 vs_read=row["read"]["avg_ms"] / avg)
                if "flashinfer" in row:
                    row[name]["vs_flashinfer"] = row["flashinfer"]["ms"] / avg
            try:
                ch = time_chained(arms[0][1], view, q, kc, vc, ind, idx, dim, loops,
                                  copies[b, ctx], cfg, row["read"]["arm"], fi_here)
            except Exception as exc:  # keep the point's flushed figures and go on
                ch = dict(error=f"{type(exc).__name__}: {exc}")
                if DEV == "cuda":
                    torch.cuda.empty_cache()
            if "error" not in ch:
                ch["kernel"] = arms[0][0]
                ch["read"]["tbs"] = by / ch["read"]["avg_ms"] / 1e9
                ch["rq"].update(tbs=by / ch["rq"]["avg_ms"] / 1e9,
                                vs_sdpa=ch["sdpa_ms"] / ch["rq"]["avg_ms"],
                                vs_read=ch["read"]["avg_ms"] / ch["rq"]["avg_ms"])
                if ch["flashinfer_ms"] is not None:
                    ch["rq"]["vs_flashinfer"] = ch["flashinfer_ms"] / ch["rq"]["avg_ms"]
            row["chain"] = ch
            res["points"].append(row)
            print(f"{fam:12s} ctx={ctx:6d} b={b:3d} sdpa {row['sdpa_ms'] * 1e3:7.1f}us | read "
                  f"{row['read']['avg_ms'] * 1e3:7.1f}us {row['read']['tbs']:.2f}TB/s | " +
                  " | ".join(f"{k} {row[k]['avg_ms'] * 1e3:7.1f}us {row[k]['tbs']:.2f}TB/s "
                             f"x{row[k]['vs_sdpa']:.2f} ({row[k]['vs_read']:.2f} of read)"
                             for k, _ in arms) + ("" if "flashinfer" not in row else
                  f" | flashinfer {row['flashinfer']['ms'] * 1e3:7.1f}us x"
                  f"{row[arms[0][0]]['vs_flashinfer']:.2f}") + (
                  f" | flashinfer: {row['flashinfer_error']}" if "flashinfer_error" in row else ""),
                  flush=True)
            print(f"{'':12s} chained: {ch['error']}" if "error" in ch else
                  f"{'':12s} chained ({ch['copies']} copies): sdpa {ch['sdpa_ms'] * 1e3:7.1f}us | "
                  f"read {ch['read']['avg_ms'] * 1e3:7.1f}us {ch['read']['tbs']:.2f}TB/s | "
                  f"{ch['kernel']} {ch['rq']['avg_ms'] * 1e3:7.1f}us {ch['rq']['tbs']:.2f}TB/s "
                  f"x{ch['rq']['vs_sdpa']:.2f} ({ch['rq']['vs_read']:.2f} of read)" +
                  ("" if ch["flashinfer_ms"] is None else
                   f" | flashinfer {ch['flashinfer_ms'] * 1e3:7.1f}us x"
                   f"{ch['rq']['vs_flashinfer']:.2f}"), flush=True)
            write_json(res, a.out, "bench_decode.json")
        for name, lens in mixed.items():
            if time.time() - T0 > a.deadline:
                res["skipped"].append(f"{fam} {name}")
                continue
            b, total = len(lens), sum(lens)
            row = dict(family=fam, mixed=name, batch=b, tokens=total)
            for label, ls in (("mixed", lens), ("uniform", [total // b] * b)):
                q, kc, vc, ind, idx = batch_inputs(view, hq, hkv, dim, ls)
                for k in kernels:
                    _, avg = time_loops(DecodeLaunch(split_kernel=k), view, q, kc, vc, ind, idx,
                                        dim, loops)
                    row.setdefault(k, {})[label + "_ms"] = avg
            for k in kernels:
                row[k]["balance"] = row[k]["uniform_ms"] / row[k]["mixed_ms"]
            res["mixed"].append(row)
            print(f"{fam:12s} {name} (uniform: b={b} x {total // b}) | " + " | ".join(
                f"{k} {row[k]['mixed_ms'] * 1e3:7.1f}us vs {row[k]['uniform_ms'] * 1e3:7.1f}us "
                f"x{row[k]['balance']:.2f}" for k in kernels), flush=True)
            write_json(res, a.out, "bench_decode.json")
        for b, ctx in placed:
            if time.time() - T0 > a.deadline:
                res["skipped"].append(f"{fam} placement b={b} ctx={ctx}")
                continue
            q, kc, vc, ind, _ = inputs(view, hq, hkv, dim, b, ctx)
            row = dict(family=fam, batch=b, ctx=ctx, kernel=kernels[0])
            for how in PLACEMENTS:
                idx = placed_rows([ctx] * b, spread, how)
                _, row[how + "_ms"] = time_loops(DecodeLaunch(split_kernel=kernels[0]), view, q,
                                                 kc, vc, ind, idx, dim, loops)
                row[how + "_vs_consecutive"] = row["consecutive_ms"] / row[how + "_ms"]
            res["placement"].append(row)
            print(f"{fam:12s} ctx={ctx:6d} b={b:3d} {kernels[0]} rows | " + " | ".join(
                f"{how} {row[how + '_ms'] * 1e3:7.1f}us x{row[how + '_vs_consecutive']:.2f}"
                for how in PLACEMENTS), flush=True)
            write_json(res, a.out, "bench_decode.json")
        del view, read_buf
        if DEV == "cuda":
            torch.cuda.empty_cache()
    res["elapsed_s"] = time.time() - T0
    write_json(res, a.out, "bench_decode.json")


if __name__ == "__main__":
    main()
