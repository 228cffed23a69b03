"""An Ouro-1.4B-shaped decode step, BF16 KV cache vs ResidualQuant cache, side by side.

``python benchmarks/bench_decode_step.py --out DIR [--deadline S] [--dry-run]``

One decode step of a looped model with random BF16 weights (Ouro-1.4B shapes: hidden 2048,
16 heads x 128, 24 layers run 4 loops, SwiGLU 5632, vocabulary 49152, sandwich RMSNorms; RoPE
omitted, it costs the same on both sides): 96 attention calls per step.

* BF16: per (loop, layer) a contiguous ``[B, 16, C + 1, 128]`` K/V cache, the new token written
  in place, PyTorch SDPA (FlashAttention) decode.
* FlashInfer (where `benchmarks/flashinfer_bundle.py` built its modules, ``--flashinfer DIR``,
  default ``.gpu-bundle``): the BF16 arm with SGLang's page-size-1 layout and FlashInfer's
  decode instead of SDPA (`FlashInferCache`), at the BF16 arm's batches; ``ratio_vs_flashinfer_*``.
* RQ: per layer one compressed view of all 4 loops (the pool's layout, 6,336 B per token and
  layer, the layers' views slices of shared buffers as in the pool); every loop attends with
  `decode_attention` over the compressed history plus the in-flight token; after loop 3's last
  layer `commit_layers` quantizes the token's 4 loops into its row of every layer in one launch
  (as the serving pool does for a decode step).

Each step is captured in a CUDA graph and timed with `triton.testing.do_bench` (median).
Reported: tokens/s = batch / step time at a fixed batch, and at the largest batch whose cache
fits a 32 GiB budget and the whole card (free memory after weights minus a margin), each cache
sized with `sglang_rq.layout` (the one owner of the byte counts). Also the same step without
attention (``none``: ``attend`` returns q) at each of those batches: the part both arms share,
so the attention time of each arm and the ceiling of RQ/BF16 (RQ attention taking no time) are
printed and recorded (``parts_*``). And the same step with each attention call replaced by a
pure read of the bytes RQ's call reads (``read``, `ReadOnly`): ``ratio_read_*`` is the ratio an
RQ attention at the memory roofline would reach. Writes DIR/bench_decode_step.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
import time

if "--dry-run" in sys.argv:  # CPU smoke test: Triton interpreter, tiny sizes
    os.environ["TRITON_INTERPRET"] = "1"

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import (  # noqa: E402
    graph_ms, loop_bytes_per_token, read_arms, read_roofline, realistic_pool,
)
from benchmarks.flashinfer_decode import DEFAULT_BUNDLE, load_baseline  # noqa: E402
from rq_kernels import commit_layers, decode_attention, prepare_layers, stage_kv  # noqa: E402
from sglang_rq.config import RQConfig  # noqa: E402
from sglang_rq.layout import ModelKVShape, bf16_bytes_per_token, kv_bytes_per_token  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
T0 = time.time()
GiB = 1 << 30


class Shape:
    def __init__(self, dry: bool) -> None:
        if dry:
            self.hidden, self.heads, self.dim, self.layers, self.loops = 64, 2, 32, 2, 4
            self.inter, self.vocab = 96, 256
        else:
            self.hidden, self.heads, self.dim, self.layers, self.loops = 2048, 16, 128, 24, 4
            self.inter, self.vocab = 5632, 49152

    @property
    def kv(self) -> ModelKVShape:
        return ModelKVShape(self.layers, self.loops, self.heads, self.dim)


def make_weights(s: Shape) -> dict:
    """Random BF16 weights (std 0.02), one set of layers shared by all loops."""
    g = torch.Generator(device=DEV).manual_seed(0)

    def w(*shape):
        return (torch.randn(*shape, device=DEV, generator=g) * 0.02).to(torch.bfloat16)

    return dict(
        qkv=[w(s.hidden, 3 * s.heads * s.dim) for _ in range(s.layers)],
        o=[w(s.heads * s.dim, s.hidden) for _ in range(s.layers)],
        gu=[w(s.hidden, 2 * s.inter) for _ in range(s.layers)],
        down=[w(s.inter, s.hidden) for _ in range(s.layers)],
        norms=[torch.ones(4, s.hidden, device=DEV, dtype=torch.bfloat16) for _ in range(s.layers)],
        final=torch.ones(s.hidden, device=DEV, dtype=torch.bfloat16),
        lm_head=w(s.hidden, s.vocab))


def rms(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, 1e-6)


def step(s: Shape, W: dict, x: torch.Tensor, attend) -> torch.Tensor:
    """One decode step for ``x`` ``[B, hidden]`` bf16; ``attend(loop, layer, q, k, v)`` -> ``[B, H, D]``."""
    b = x.shape[0]
    for u in range(s.loops):
        for li in range(s.layers):
            n = W["norms"][li]
            qkv = rms(x, n[0]) @ W["qkv"][li]
            q, k, v = qkv.view(b, 3, s.heads, s.dim).unbind(1)
            a = attend(u, li, q, k, v).reshape(b, s.heads * s.dim)
            x = x + rms(a @ W["o"][li], n[1])
            gate, up = (rms(x, n[2]) @ W["gu"][li]).chunk(2, dim=-1)
            x = x + rms((F.silu(gate) * up) @ W["down"][li], n[3])
        x = rms(x, W["final"])
    return x @ W["lm_head"]


class BF16Cache:
    """``[B, H, C + 1, D]`` K/V per (loop, layer); the new token goes to position C."""

    def __init__(self, s: Shape, b: int, ctx: int) -> None:
        n = s.loops * s.layers
        self.k = torch.randn(n, b, s.heads, ctx + 1, s.dim, device=DEV, dtype=torch.bfloat16)
        self.v = torch.randn_like(self.k)
        self.s, self.ctx = s, ctx

    def __call__(self, u, li, q, k, v):
        i = u * self.s.layers + li
        self.k[i, :, :, self.ctx].copy_(k)
        self.v[i, :, :, self.ctx].copy_(v)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION] if DEV == "cuda" else [SDPBackend.MATH]):
            o = F.scaled_dot_product_attention(q[:, :, None], self.k[i], self.v[i])
        return o[:, :, 0]


class FlashInferCache:
    """BF16 K/V per (loop, layer) in SGLang's layout at page size 1, ``[B (C + 1), 1, H, D]``
    (request i's tokens consecutive), the new token written at each request's position C as in
    `BF16Cache`, FlashInfer's decode (`benchmarks.flashinfer_decode`, one plan for every call)."""

    def __init__(self, s: Shape, b: int, ctx: int, fi) -> None:
        n = s.loops * s.layers
        self.k = torch.randn(n, b * (ctx + 1), 1, s.heads, s.dim, device=DEV, dtype=torch.bfloat16)
        self.v = torch.randn_like(self.k)
        self.calls = [fi.call(self.k[i], self.v[i], [ctx + 1] * b, s.heads,
                              sm_scale=s.dim ** -0.5) for i in range(n)]
        self.s, self.b, self.ctx = s, b, ctx

    def __call__(self, u, li, q, k, v):
        i = u * self.s.layers + li
        shape = (self.b, self.ctx + 1, self.s.heads, self.s.dim)
        self.k[i].view(shape)[:, self.ctx].copy_(k)
        self.v[i].view(shape)[:, self.ctx].copy_(v)
        return self.calls[i](q)  # q strided (a view of the QKV projection), as SDPA gets it


class RQCache:
    """One compressed view per layer (all loops), random codes and realistic FP8 metadata."""

    def __init__(self, s: Shape, b: int, ctx: int, cfg: RQConfig) -> None:
        rows = b * ctx + b + 1
        whole = realistic_pool(cfg, num_loops=s.loops, num_kv_heads=s.heads, head_dim=s.dim,
                               rows=rows * s.layers, device=DEV)
        self.views = [layer_rows(whole, slice(li * rows, (li + 1) * rows))
                      for li in range(s.layers)]
        prepare_layers(self.views)
        self.ind = torch.arange(b + 1, device=DEV, dtype=torch.int32) * ctx
        self.idx = torch.arange(1, b * ctx + 1, device=DEV, dtype=torch.int64)
        self.loc = torch.arange(b * ctx + 1, b * ctx + 1 + b, device=DEV, dtype=torch.int64)
        self.staging = torch.empty(s.loops, s.layers, b, 2, s.heads, s.dim, device=DEV,
                                   dtype=torch.bfloat16)
        self.out = torch.empty(b, s.heads, s.dim, device=DEV, dtype=torch.bfloat16)
        self.s = s

    def __call__(self, u, li, q, k, v):
        stage_kv(k, v, self.staging[u, li])  # as `RQTokenToKVPool.save` does
        if u == self.s.loops - 1 and li == self.s.layers - 1:
            commit_layers(self.staging[:, :, :, 0], self.staging[:, :, :, 1], self.loc, self.views)
        return decode_attention(q, k, v, self.views[li], u, self.ind, self.idx,
                                sm_scale=self.s.dim ** -0.5, out=torch.empty_like(self.out))


def layer_rows(view, rows: slice):
    """``view`` restricted to pool rows ``rows`` (a layer of `RQCache`'s shared buffers)."""
    return dataclasses.replace(view, codes=[c[rows] for c in view.codes],
                               scale_offset=[m if m is None else m[rows] for m in view.scale_offset],
                               coef=[f if f is None else f[rows] for f in view.coef])


class ReadOnly:
    """Each attention call replaced by the fastest pure read (`common.read_roofline`, picked once
    on layer 0's residual loop) of the bytes RQ's decode of that loop reads
    (`common.loop_bytes_per_token` x history tokens), from one buffer per
    layer; no commit. The step of an RQ attention at the memory roofline."""

    def __init__(self, s: Shape, b: int, ctx: int, cfg: RQConfig) -> None:
        per = [loop_bytes_per_token(cfg, s.heads, s.dim, s.loops, u) * b * ctx
               for u in range(s.loops)]
        bufs = [torch.empty(max(per), dtype=torch.uint8, device=DEV) for _ in range(s.layers)]
        _, self.arm = read_roofline(bufs[0], max(per))
        self.reads = {(u, li): read_arms(bufs[li], per[u])[self.arm]
                      for u in range(s.loops) for li in range(s.layers)}
        self.bufs = bufs

    def __call__(self, u, li, q, k, v):
        self.reads[u, li]()
        return q


class NoAttention:
    """The step without attention (``attend`` returns q): the part both arms share, whose time
    bounds what a faster attention can gain."""

    def __call__(self, u, li, q, k, v):
        return q


def time_step(s, W, cache, b) -> float:
    """Median ms of one step replayed from a CUDA graph (eager timing on CPU)."""
    x = torch.randn(b, s.hidden, device=DEV, dtype=torch.bfloat16)
    return graph_ms(lambda: step(s, W, x, cache), warmup=5, rep=40)


def max_batch(per_token: int, ctx: int, budget: int) -> int:
    return budget // (per_token * (ctx + 1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--deadline", type=float, default=500.0)
    ap.add_argument("--margin-gb", type=float, default=8.0, help="GiB kept free on the full card")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--flashinfer", default=str(DEFAULT_BUNDLE),
                    help="FlashInfer's decode modules (benchmarks/flashinfer_bundle.py); a BF16 "
                         "arm with FlashInfer's decode instead of SDPA where present")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    s = Shape(a.dry_run)
    cfg = RQConfig()
    W = make_weights(s)
    bf16_tok, rq_tok = bf16_bytes_per_token(s.kv), kv_bytes_per_token(s.kv, cfg)
    props = torch.cuda.get_device_properties(0) if DEV == "cuda" else None
    res = dict(gpu=props.name if props else "cpu-interpreter", torch=torch.__version__,
               triton=triton.__version__, date=time.strftime("%Y-%m-%d"),
               bf16_bytes_per_token=bf16_tok, rq_bytes_per_token=rq_tok,
               runs=[], skipped=[])
    path = os.path.join(a.out, "bench_decode_step.json")

    fi, res["flashinfer"] = load_baseline(a.flashinfer)

    def run(kind, b, ctx, label):
        if time.time() - T0 > a.deadline:
            res["skipped"].append(f"{kind} b={b} ctx={ctx} {label}")
            return None
        if DEV == "cuda":
            gc.collect()  # a previous point's buffers, should anything still hold them
            torch.cuda.empty_cache()
        cache = (BF16Cache(s, b, ctx) if kind == "bf16" else
                 FlashInferCache(s, b, ctx, fi) if kind == "flashinfer" else
                 NoAttention() if kind == "none" else
                 ReadOnly(s, b, ctx, cfg) if kind == "read" else RQCache(s, b, ctx, cfg))
        arm = getattr(cache, "arm", None)
        try:
            ms = time_step(s, W, cache, b)
        finally:
            del cache
        per = dict(bf16=bf16_tok, flashinfer=bf16_tok, rq=rq_tok, read=rq_tok, none=0)[kind]
        rec = dict(kind=kind, batch=b, ctx=ctx, label=label, step_ms=ms, tokens_per_s=b / ms * 1e3,
                   kv_gib=per * b * (ctx + 1) / GiB, **({"read_arm": arm} if arm else {}))
        res["runs"].append(rec)
        print(f"{label:10s} {kind:10s} ctx={ctx:6d} b={b:3d}: step {ms:8.2f} ms, "
              f"{rec['tokens_per_s']:9.1f} tok/s, KV {rec['kv_gib']:.1f} GiB", flush=True)
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
        return rec

    ctxs = [40] if a.dry_run else [4096, 16384]
    bf16_kinds = ("bf16", "flashinfer") if fi is not None else ("bf16",)
    for ctx in ctxs:  # fixed batch 2
        for kind in (*bf16_kinds, "rq", "read"):
            run(kind, 2, ctx, "fixed")
    ctx = ctxs[-1]
    budgets = {"32GiB": 32 * GiB}
    if DEV == "cuda":
        torch.cuda.empty_cache()
        free = torch.cuda.mem_get_info()[0]
        budgets["card"] = int(free - a.margin_gb * GiB)
    else:
        budgets = {"32GiB": 2 * (1 << 20), "card": 4 * (1 << 20)}
    for label, budget in budgets.items():
        for kind, per in [(k, bf16_tok) for k in bf16_kinds] + [("rq", rq_tok)]:
            b = max_batch(per, ctx, budget)
            res[f"max_batch_{label}_{kind}"] = b
            if b >= 1:
                run(kind, b, ctx, label)
                if kind == "rq":
                    run("read", b, ctx, label)
    # the step without attention, once per batch size measured (it does not depend on ctx)
    for b in sorted({r["batch"] for r in res["runs"]}):
        run("none", b, 0, "none")
    rows = {(r["kind"], r["label"], r["ctx"]): r for r in res["runs"]}
    none = {r["batch"]: r for r in res["runs"] if r["kind"] == "none"}
    for key in [("fixed", c) for c in ctxs] + [(lab, ctx) for lab in budgets]:
        bf, rq = rows.get(("bf16", *key)), rows.get(("rq", *key))
        if bf and rq:
            ratio = rq["tokens_per_s"] / bf["tokens_per_s"]
            res[f"ratio_{key[0]}_{key[1]}"] = ratio
            rd = rows.get(("read", *key))
            if rd:  # the ratio an RQ attention at the memory roofline would reach
                res[f"ratio_read_{key[0]}_{key[1]}"] = rd["tokens_per_s"] / bf["tokens_per_s"]
            fb = rows.get(("flashinfer", *key))
            if fb:
                res[f"ratio_vs_flashinfer_{key[0]}_{key[1]}"] = rq["tokens_per_s"] / fb["tokens_per_s"]
            print(f"{key[0]:6s} ctx={key[1]}: RQ/BF16 tokens/s = {ratio:.2f}x "
                  f"(batch {rq['batch']} vs {bf['batch']})" + (
                      f"; attention as a pure read of RQ's bytes: "
                      f"{res[f'ratio_read_{key[0]}_{key[1]}']:.2f}x" if rd else "") + (
                      f"; RQ/BF16 with FlashInfer's decode: "
                      f"{res[f'ratio_vs_flashinfer_{key[0]}_{key[1]}']:.2f}x" if fb else ""),
                  flush=True)
            nb, nr = none.get(bf["batch"]), none.get(rq["batch"])
            if nb and nr:  # the ceiling: RQ's attention taking no time at all
                part = dict(non_attention_ms_bf16_batch=nb["step_ms"],
                            non_attention_ms_rq_batch=nr["step_ms"],
                            attention_ms_bf16=bf["step_ms"] - nb["step_ms"],
                            attention_ms_rq=rq["step_ms"] - nr["step_ms"],
                            ceiling=(rq["batch"] / nr["step_ms"]) / bf["tokens_per_s"] * 1e3)
                res[f"parts_{key[0]}_{key[1]}"] = part
                print(f"{'':6s} non-attention {nb['step_ms']:.2f} / {nr['step_ms']:.2f} ms, "
                      f"attention BF16 {part['attention_ms_bf16']:.2f} ms, RQ "
                      f"{part['attention_ms_rq']:.2f} ms; ceiling with free RQ attention "
                      f"{part['ceiling']:.2f}x", flush=True)
    res["elapsed_s"] = time.time() - T0
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
