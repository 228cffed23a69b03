"""Commit kernel variants vs the layer's BF16 prefill, side by side (one run).

``python benchmarks/bench_commit.py --out DIR [--dry-run]``

For each model's layer (`LAYERS`: Ouro-1.4B, SmolLM2-135M, Huginn-3.5B's core layer): the commit
of ``tokens`` new tokens (all loops, one layer) under each variant of `rq_kernels.commit.commit`
(``VARIANTS``), and BF16 prefill of the same layer: per loop one causal SDPA and the layer's GEMMs
(QKV, O, gate/up, down). The issue's target is commit <= 10 % of prefill:
``commit / (loops x (SDPA + GEMMs))``. (Before 2026-12-03h only the Ouro row had GEMMs and the
Huginn row was a 24-head stand-in: `benchmarks/results/h200_2026-12-03g_so_layout_ab.json`.)
CUDA-graph replay, `do_bench` median. Writes ``DIR/bench_commit.json``.
"""

from __future__ import annotations

import os
import sys
import time

if "--dry-run" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import DEV, bench, pool, sdpa_time  # noqa: E402
from benchmarks.common import bench_args, write_json  # noqa: E402
from rq_kernels.commit import CommitLaunch, commit  # noqa: E402
from sglang_rq.config import RQConfig  # noqa: E402

# name: (query heads, KV heads, head_dim, hidden, MLP intermediate) of one layer, from the models'
# configs (docs/models.md; ../shared/DESIGN.md): QKV [hidden, (Hq + 2 Hkv) D], O [Hq D, hidden],
# gate/up [hidden, 2 I], down [I, hidden]
LAYERS = {
    "ouro-1.4b": (16, 16, 128, 2048, 5632),
    "smollm2-135m": (9, 3, 64, 576, 1536),
    "huginn-3.5b": (55, 55, 96, 5280, 17920),
}

VARIANTS = {  # CommitLaunch sweeps; the closed variants (IEEE division, per-loop rotation
    # loads: 572 / 515 / 469 us against 242 us for Ouro at 4k) are in
    # benchmarks/results/h200_2026-11-29_commit.json and git history
    "default": {},
    "bt128_w8": dict(block_t=128, num_warps=8),
    "bt64_w16": dict(block_t=64, num_warps=16),
    "bt128_w16": dict(block_t=128, num_warps=16),
}

# a decode step's commit (one token per request, Ouro-1.4B shape): whole-group programs against
# one loop per program, by program size
DECODE_VARIANTS = {
    "groups_bt64_w8": dict(block_t=64, num_warps=8, per_loop=False),
    "groups_bt16_w4": dict(block_t=16, num_warps=4, per_loop=False),
    "loop_bt16_w4": dict(block_t=16, num_warps=4, per_loop=True),
    "loop_bt16_w2": dict(block_t=16, num_warps=2, per_loop=True),
    "loop_bt32_w4": dict(block_t=32, num_warps=4, per_loop=True),
    "loop_bt64_w8": dict(block_t=64, num_warps=8, per_loop=True),
}


def decode_sweep(res: dict, sizes: list[int], out) -> None:
    """`DECODE_VARIANTS` and the default launch at each decode batch size (Ouro-1.4B shape)."""
    view = pool(RQConfig(), 16, 128, max(sizes) + 2)
    loops = len(view.segments)
    res["decode_variants"] = DECODE_VARIANTS
    res["decode_rows"] = []
    for n in sizes:
        k = torch.randn(loops, n, 16, 128, device=DEV, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        loc = torch.arange(n, device=DEV) + 1
        row = dict(tokens=n, default_us=bench(lambda: commit(k, v, loc, view)) * 1e3)  # noqa: B023
        for name, kw in DECODE_VARIANTS.items():
            row[name + "_us"] = bench(
                lambda: commit(k, v, loc, view, launch=CommitLaunch(**kw))) * 1e3  # noqa: B023
        res["decode_rows"].append(row)
        print(f"decode commit, {n:4d} tokens: " + " | ".join(
            f"{key[:-3]} {val:6.1f}us" for key, val in row.items() if key.endswith("_us")),
            flush=True)
        write_json(res, out, "bench_commit.json")


def main() -> None:
    def extra(ap):
        ap.add_argument("--tokens", type=int, default=4096)
        ap.add_argument("--decode-tokens", default="1,4,16,64,128",
                        help="decode batch sizes of the few-token sweep (empty: skip it)")

    a = bench_args(extra)
    tokens = 40 if a.dry_run else a.tokens
    res = dict(gpu=torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu",
               date=time.strftime("%Y-%m-%d"), tokens=tokens, variants=VARIANTS, rows=[])
    layers = LAYERS
    if a.dry_run:  # the interpreter: tiny layers of each head_dim and head ratio
        layers = {"tiny": (2, 2, 128, 256, 512), "tiny-gqa": (3, 1, 64, 192, 384),
                  "tiny-d96": (2, 2, 96, 192, 384)}
    for fam, (hq, hkv, dim, hidden, inter) in layers.items():
        view = pool(RQConfig(), hkv, dim, tokens + 2)
        loops = len(view.segments)
        k = torch.randn(loops, tokens, hkv, dim, device=DEV, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        loc = torch.arange(tokens, device=DEV) + 1
        q = torch.randn(1, hq, tokens, dim, device=DEV, dtype=torch.bfloat16)
        kk = torch.randn(1, hkv, tokens, dim, device=DEV, dtype=torch.bfloat16)
        row = dict(family=fam, layer=dict(zip(("hq", "hkv", "dim", "hidden", "inter"),
                                              layers[fam])),
                   sdpa_causal_ms=sdpa_time(q, kk, kk, causal=True)[0])
        x = torch.randn(tokens, hidden, device=DEV, dtype=torch.bfloat16)
        ws = [torch.randn(hidden, n, device=DEV, dtype=torch.bfloat16)
              for n in ((hq + 2 * hkv) * dim, 2 * inter)]
        wo = torch.randn(hq * dim, hidden, device=DEV, dtype=torch.bfloat16)
        o = torch.randn(tokens, hq * dim, device=DEV, dtype=torch.bfloat16)
        wd = torch.randn(inter, hidden, device=DEV, dtype=torch.bfloat16)
        h = torch.randn(tokens, inter, device=DEV, dtype=torch.bfloat16)
        row["gemms_ms"] = bench(lambda: [x @ w for w in ws] + [o @ wo, h @ wd])  # noqa: B023
        prefill = loops * (row["sdpa_causal_ms"] + row["gemms_ms"])
        row["prefill_ms"] = prefill
        for name, kw in VARIANTS.items():
            ms = bench(lambda: commit(k, v, loc, view, launch=CommitLaunch(**kw)))  # noqa: B023
            row[name] = dict(commit_ms=ms, over_prefill=ms / prefill)
        res["rows"].append(row)
        print(f"{fam:12s} prefill {prefill * 1e3:8.1f}us | " + " | ".join(
            f"{n} {row[n]['commit_ms'] * 1e3:7.1f}us ({row[n]['over_prefill'] * 100:.1f}%)"
            for n in VARIANTS), flush=True)
        write_json(res, a.out, "bench_commit.json")
        view = None  # free the pool (not `del`: the lambda above closes over it)
        if DEV == "cuda":
            torch.cuda.empty_cache()
    if a.decode_tokens:
        decode_sweep(res, [1, 3] if a.dry_run else [int(x) for x in a.decode_tokens.split(",")],
                     a.out)


if __name__ == "__main__":
    main()
