"""Extend (chunked-prefill) attention over a compressed prefix vs BF16 SDPA (one run).

``python benchmarks/bench_extend.py --out DIR [--dry-run]``

A chunk of ``chunk`` new tokens attends to a compressed prefix of ``prefix`` tokens plus itself
(causal), for loop 0 (anchor + residual) and the last loop (anchor only), through
`rq_kernels.extend.extend_attention`: ``workspace`` given the host indptrs (as the serving
backends call it: no sync, graph-replayed here like the baseline) and ``workspace_eager``
without them (one host sync per call, eager launches). The baseline is PyTorch SDPA
(FlashAttention) over BF16: the chunk against the whole prefix plus a causal SDPA over the
chunk, the same work as ours split in two. The reconstruct kernel alone is timed too, with its
achieved bandwidth on compressed bytes read plus bf16 bytes written. `do_bench` median.

``mixed`` (Ouro shape): a mixed batch as SGLang's ``--enable-mixed-chunk`` builds it, one
2048-token chunk over a 14,336-token prefix plus 16 decode rows over 16,384 tokens each:
`extend_attention` (decode rows through the decode kernel) against ``_workspace_extend`` over
every request (every decode row's history reconstructed to bf16) and SDPA (the chunk as above
plus a batched decode SDPA). ``batched``: many short prefills in one batch (`batched`).
``--mixed-only`` runs just those two. Writes ``DIR/bench_extend.json``. The fused kernel this
replaced (1.94-2.66x SDPA at its best launch per shape) was last measured in
benchmarks/results/h200_2026-12-01_extend.json.
"""

from __future__ import annotations

import os
import sys
import time

if "--dry-run" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import triton  # noqa: E402

from benchmarks.common import DEV, FAMILIES, bench, loop_average, pool, sdpa_time  # noqa: E402
from benchmarks.common import bench_args, write_json  # noqa: E402
from rq_kernels.extend import WORKSPACE_TOKENS, _workspace_extend, extend_attention  # noqa: E402
from rq_kernels.reconstruct import reconstruct_rows  # noqa: E402
from sglang_rq.config import RQConfig  # noqa: E402

def eager_ms(fn) -> float:
    """Median ms of ``fn`` launched eagerly (host work and syncs included); CPU: one call."""
    if DEV != "cuda":
        return bench(fn)
    fn()
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def reconstruct_bytes(view, loop_id: int, n: int) -> int:
    """Bytes `reconstruct_rows` moves for ``n`` rows: the compressed codes, FP8 scale/offset and
    ``c`` of the loop's anchor and own residual read, bf16 K and V written."""
    seg = view.segments[loop_id]
    hkv = view.codes[0].shape[2]
    per = 0
    for i in {seg.base, loop_id}:
        if view.segments[i].bits:
            per += view.segments[i].code_bytes
            per += view.scale_offset[i].shape[-2] * 2 if view.scale_offset[i] is not None else 0
    if seg.role != "anchor" and view.coef[loop_id] is not None:
        per += 2
    return n * 2 * hkv * (per + 2 * view.head_dim)


def batch_tensors(hq: int, hkv: int, dim: int, qp: list[int], kp: list[int]) -> tuple:
    """A batch's random queries and chunk K (also used as V), indptrs, prefix rows (pool rows
    from 1) and output: ``(q, k_cur, qo_indptr, kv_indptr, kv_indices, out)``."""
    q = torch.randn(qp[-1], hq, dim, device=DEV, dtype=torch.bfloat16)
    kc = torch.randn(qp[-1], hkv, dim, device=DEV, dtype=torch.bfloat16)
    qo = torch.tensor(qp, dtype=torch.int32, device=DEV)
    kvi = torch.tensor(kp, dtype=torch.int32, device=DEV)
    return q, kc, qo, kvi, torch.arange(kp[-1], device=DEV) + 1, torch.empty_like(q)


def mixed(dry_run: bool) -> dict:
    """The mixed-batch row (module docstring), loop 0 (anchor + residual)."""
    hq, hkv, dim = FAMILIES["ouro-1.4b"]
    prefix, chunk, ndec, ctx = (14336, 2048, 16, 16384) if not dry_run else (40, 24, 3, 33)
    view = pool(RQConfig(), hkv, dim, prefix + ndec * ctx + 2)
    qp = [0, chunk] + [chunk + i + 1 for i in range(ndec)]
    kp = [0, prefix] + [prefix + (i + 1) * ctx for i in range(ndec)]
    q, kc, qo, kvi, idx, out = batch_tensors(hq, hkv, dim, qp, kp)
    scale = dim ** -0.5
    ours = bench(lambda: extend_attention(q, kc, kc, view, 0, qo, kvi, idx, sm_scale=scale,
                                          out=out, host_indptrs=(qp, kp)))
    ws_only = bench(lambda: _workspace_extend(q, kc, kc, view, 0, qo, kvi, qp, kp, idx, scale,
                                               out))
    view = None
    qc = torch.randn(1, hq, chunk, dim, device=DEV, dtype=torch.bfloat16)
    kb = torch.randn(1, hkv, prefix + chunk, dim, device=DEV, dtype=torch.bfloat16)
    sd = sdpa_time(qc, kb[:, :, :prefix], kb[:, :, :prefix])[0] + sdpa_time(
        qc, kb[:, :, prefix:], kb[:, :, prefix:], causal=True)[0]
    kb = None
    kd = torch.randn(ndec, hkv, ctx, dim, device=DEV, dtype=torch.bfloat16)
    sd += sdpa_time(torch.randn(ndec, hq, 1, dim, device=DEV, dtype=torch.bfloat16), kd, kd)[0]
    row = dict(prefix=prefix, chunk=chunk, decode_rows=ndec, decode_ctx=ctx, sdpa_ms=sd,
               extend_attention_ms=ours, workspace_only_ms=ws_only,
               over_sdpa=ours / sd, workspace_only_over_sdpa=ws_only / sd)
    print(f"mixed batch: sdpa {sd * 1e3:.1f}us | extend_attention {ours * 1e3:.1f}us "
          f"(x{ours / sd:.2f}) | workspace for every row {ws_only * 1e3:.1f}us "
          f"(x{ws_only / sd:.2f})", flush=True)
    return row


def batched(dry_run: bool) -> list[dict]:
    """The batched-prefill rows (Ouro shape): 16 requests of 256-token chunks, without a prefix
    (fresh prompts) and each over a 1024-token compressed prefix (radix-cache hits), timed
    eagerly (host work included, as a server's prefill runs): `extend_attention` given the host
    indptrs, averaged over loop 0 and the last loop as the single-request rows, against BF16
    FlashAttention over the same K/V in one variable-length call (SGLang's BF16 extend is one
    kernel over the batch); both also replayed from a CUDA graph (GPU time without the host's)."""
    hq, hkv, dim = FAMILIES["ouro-1.4b"]
    nreq, chunk = (16, 256) if not dry_run else (3, 5)
    rows = []
    for prefix in (0, 1024) if not dry_run else (0, 7):
        view = pool(RQConfig(), hkv, dim, nreq * prefix + 2)
        loops = len(view.segments)
        qp = [i * chunk for i in range(nreq + 1)]
        kp = [i * prefix for i in range(nreq + 1)]
        q, kc, qo, kvi, idx, out = batch_tensors(hq, hkv, dim, qp, kp)
        scale = dim ** -0.5
        row = dict(requests=nreq, chunk=chunk, prefix=prefix)
        for name, timer in (("eager", eager_ms), ("graph", bench)):
            t = {i: timer(lambda: extend_attention(  # noqa: B023
                q, kc, kc, view, i, qo, kvi, idx, sm_scale=scale, out=out,  # noqa: B023
                host_indptrs=(qp, kp))) for i in (0, loops - 1)}  # noqa: B023
            row[name] = dict(resid_ms=t[0], anchor_ms=t[loops - 1], avg_ms=loop_average(t, loops))
        view = None
        kb = torch.randn(nreq * (prefix + chunk), hkv, dim, device=DEV, dtype=torch.bfloat16)
        ck = torch.tensor([i * (prefix + chunk) for i in range(nreq + 1)], dtype=torch.int32,
                          device=DEV)
        for name, timer in (("eager", eager_ms), ("graph", bench)):
            fa = timer(lambda: torch.ops.aten._flash_attention_forward(  # noqa: B023
                q, kb, kb, qo, ck, chunk, prefix + chunk, 0.0, True, False,  # noqa: B023
                scale=scale)) if DEV == "cuda" else float("nan")
            row[name].update(flash_varlen_ms=fa, over_flash=row[name]["avg_ms"] / fa)
        kb = None
        rows.append(row)
        print(f"batched {nreq} x {chunk} over prefix {prefix}: " + " | ".join(
            f"{n}: flash varlen {row[n]['flash_varlen_ms'] * 1e3:.1f}us, extend_attention "
            f"{row[n]['avg_ms'] * 1e3:.1f}us (x{row[n]['over_flash']:.2f})"
            for n in ("eager", "graph")), flush=True)
    return rows


def main() -> None:
    mixed_only = "--mixed-only" in sys.argv
    if mixed_only:
        sys.argv.remove("--mixed-only")
    a = bench_args()
    shapes = [(4096, 4096), (16384, 2048)] if not a.dry_run else [(40, 24)]
    res = dict(gpu=torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu",
               date=time.strftime("%Y-%m-%d"),
               workspace_tokens=WORKSPACE_TOKENS, rows=[])
    res["mixed"] = mixed(a.dry_run)
    res["batched"] = batched(a.dry_run)
    write_json(res, a.out, "bench_extend.json")
    for fam, (hq, hkv, dim) in FAMILIES.items() if not mixed_only else ():
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
            arms = {"workspace": (bench, dict(host_indptrs=([0, chunk], [0, prefix]))),
                    "workspace_eager": (eager_ms, {})}
            for name, (timer, kw) in arms.items():
                t = {i: timer(lambda: extend_attention(  # noqa: B023
                    qx, kx, kx, view, i, qo, kvi, idx, sm_scale=dim ** -0.5, out=out,  # noqa: B023
                    **kw)) for i in (0, loops - 1)}  # noqa: B023
                avg = loop_average(t, loops)
                row[name] = dict(resid_ms=t[0], anchor_ms=t[loops - 1], avg_ms=avg,
                                 over_sdpa=avg / sd)
            ws_k = torch.empty(prefix, hkv, dim, device=DEV, dtype=torch.bfloat16)
            ws_v = torch.empty_like(ws_k)
            for i, role in ((0, "resid"), (loops - 1, "anchor")):
                ms = bench(lambda: reconstruct_rows(view, i, idx, ws_k, ws_v))  # noqa: B023
                nbytes = reconstruct_bytes(view, i, prefix)
                row[f"reconstruct_{role}"] = dict(ms=ms, bytes=nbytes, gb_s=nbytes / ms / 1e6)
            res["rows"].append(row)
            print(f"{fam:12s} prefix {prefix:6d} chunk {chunk:5d} sdpa {sd * 1e3:7.1f}us | "
                  + " | ".join(f"{n} {row[n]['avg_ms'] * 1e3:7.1f}us (x{row[n]['over_sdpa']:.2f})"
                               for n in arms)
                  + " | reconstruct " + " ".join(
                      f"{r} {row[f'reconstruct_{r}']['ms'] * 1e3:.1f}us "
                      f"{row[f'reconstruct_{r}']['gb_s']:.0f}GB/s" for r in ("resid", "anchor")),
                  flush=True)
            write_json(res, a.out, "bench_extend.json")
            view = ws_k = ws_v = None  # free them (not `del`: the lambdas above close over them)
            if DEV == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
