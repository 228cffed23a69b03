"""Plots of the recorded H200 results (no GPU needed): ``python benchmarks/plot_results.py``.

Reads ``benchmarks/results/h200_2026-11-29_{v2,v2_variants,decode_step,decode_step_idp,
commit}.json`` and writes ``docs/results/kernels/{decode_attention,decode_step,commit}.png``.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RES = ROOT / "benchmarks" / "results"
OUT = ROOT / "docs" / "results" / "kernels"


def load(name: str) -> dict:
    return json.loads((RES / f"h200_2026-11-29_{name}.json").read_text())


def decode_attention() -> None:
    """µs per layer-loop vs batch x context: BF16 SDPA, v1, v2 (FFMA), v2 (dp4a K dots)."""
    v2 = [r for r in load("v2")["decode"] if r["family"].startswith("ouro")]
    var = load("v2_variants")["points"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    labels = [f"{r['batch']}x{r['ctx'] // 1024}k" for r in v2]
    x = range(len(v2))
    ax.plot(x, [r["sdpa_ms"] * 1e3 for r in v2], "k-o", label="BF16 SDPA (FlashAttention)")
    ax.plot(x, [r["v1_avg_ms"] * 1e3 for r in v2], "C3--s", label="RQ decode v1 (MMA)")
    ax.plot(x, [r["v2_avg_ms"] * 1e3 for r in v2], "C0-^", label="RQ decode v2 (FFMA K dots)")
    idx = {f"{r['batch']}x{r['ctx'] // 1024}k": i for i, r in enumerate(v2)}
    pts = [(idx[f"{p['batch']}x{p['ctx'] // 1024}k"], p["default"]["avg_ms"] * 1e3)
           for p in var if f"{p['batch']}x{p['ctx'] // 1024}k" in idx]
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "C2*", ms=12,
            label="RQ decode v2 (dp4a K dots, default)")
    ax.set_xticks(list(x), labels, rotation=45)
    ax.set_yscale("log")
    ax.set_ylabel("µs per layer-loop")
    ax.set_title("Ouro-1.4B decode attention, H200 (lower is better)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "decode_attention.png", dpi=120)


def decode_step() -> None:
    """Tokens/s of the Ouro-shaped decode step, BF16 vs RQ, before and after dp4a K dots."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    before, after = load("decode_step")["runs"], load("decode_step_idp")["runs"]
    points = [("fixed", 16384, "batch 2, 16k"), ("32GiB", 16384, "32 GiB budget, 16k"),
              ("card", 16384, "whole card, 16k")]
    w = 0.25
    for i, (label, ctx, name) in enumerate(points):
        def tok(runs, kind):
            return next(r for r in runs if r["label"] == label and r["kind"] == kind
                        and r["ctx"] == ctx)
        b = tok(after, "bf16")
        r0, r1 = tok(before, "rq"), tok(after, "rq")
        ax.bar(i - w, b["tokens_per_s"], w, color="0.4", label="BF16" if i == 0 else None)
        ax.bar(i, r0["tokens_per_s"], w, color="C0", label="RQ, v2 FFMA" if i == 0 else None)
        ax.bar(i + w, r1["tokens_per_s"], w, color="C2", label="RQ, v2 dp4a" if i == 0 else None)
        ax.text(i + w, r1["tokens_per_s"], f"{r1['tokens_per_s'] / b['tokens_per_s']:.2f}x\n"
                f"b={r1['batch']} vs {b['batch']}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(points)), [p[2] for p in points])
    ax.set_ylabel("tokens/s")
    ax.set_title("Ouro-1.4B-shaped decode step, H200 (CUDA graphs)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "decode_step.png", dpi=120)


def commit() -> None:
    """Commit time as a share of the layer's BF16 prefill, per variant."""
    d = load("commit")
    names = list(d["variants"])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    w = 0.8 / len(d["rows"])
    for j, row in enumerate(d["rows"]):
        ax.bar([i + j * w for i in range(len(names))],
               [row[n]["over_prefill"] * 100 for n in names], w,
               label=row["family"] + ("" if "gemms_ms" in row else " (attention only)"))
    ax.axhline(10, color="k", ls="--", lw=1, label="target 10 %")
    ax.set_xticks([i + w for i in range(len(names))], names, rotation=30, fontsize=8)
    ax.set_ylabel("commit / layer prefill (%)")
    ax.set_title("Commit kernel, 4096 tokens x 4 loops, H200")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "commit.png", dpi=120)


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    decode_attention()
    decode_step()
    commit()
    print(f"wrote {OUT}")
