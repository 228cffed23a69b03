#!/usr/bin/env python3
"""Train "mini-Huginn" (Huginn recurrent-depth architecture, head_dim 96, ~2.8M parameters).

Same data as mini-Ouro (``training/prepare_data.py`` -> ``.mini_ouro_data``, the mini-Ouro BPE
tokenizer, vocab 8192). Imports only torch, numpy, safetensors, ``training/common.py`` (shared
with ``train_mini_ouro.py``) and the repository's ``sglang_rq/models/huginn_config.py`` and
``huginn_reference.py`` (``huginn_config`` pulls in ``transformers.PretrainedConfig`` and the
pure-Python ``sglang_rq/layout.py``; the ``sample`` sub-command also needs ``tokenizers``), so it
runs unchanged on the GPU machine with ``PYTHONPATH=.``.

Sub-commands::

    train   (default) train, save in the upstream checkpoint layout, evaluate (eval.json)
    eval    perplexity of a saved checkpoint at several recurrence counts (table + --json)
    sample  generations from a saved checkpoint (CPU is fine)

Training follows upstream Huginn (arXiv 2502.05171, sections 3-4): per step the recurrence
count is drawn from a log-normal Poisson with mean ``mean_recurrence`` (``tau ~ N(log(m) -
sigma^2/2, sigma)``, ``sigma = 0.5``, ``r = Poisson(exp(tau)) + 1``, clamped to ``3 m``), and
backpropagation is truncated to the last ``--backprop-depth`` (8) recurrences (the earlier ones
run under ``no_grad``; the prelude still learns through the adapter's input). The initial state
is zeros, as in serving (upstream draws it at random). Loss: next-token cross-entropy of the
single exit. bf16 autocast, AdamW, linear warmup + cosine decay; ``--steps 0`` picks the step
count from the throughput measured over the first steps so that training fits
``--time-budget`` seconds (the chosen count is printed; pass it back with ``--steps`` to repeat
the run). The best checkpoint by validation loss at ``r = mean_recurrence`` (a split of the
*training* mix) is kept; Pride and Prejudice and WikiText-2 are evaluated once, at the end, and
never influence training.

Example (GPU)::

    PYTHONUNBUFFERED=1 PYTHONPATH=. python3 training/train_mini_huginn.py train \\
        --data .mini_ouro_data --out $OUT --time-budget 420
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from sglang_rq.models.huginn_config import HuginnConfig  # noqa: E402
from sglang_rq.models.huginn_reference import HuginnReferenceModel  # noqa: E402
from training import common  # noqa: E402
from training.common import TOKENIZER_FILES, log  # noqa: E402

TOKENIZER_DIR = REPO_ROOT / "sglang_rq" / "assets" / "mini-ouro"
EVAL_RECURRENCES = (1, 2, 4, 8, 16, 32, 64)
EVAL_SPLITS = ("val", "eval_pride", "eval_wikitext2")


def mini_huginn_config(vocab_size: int = 8192, intermediate_size: int = 224,
                       block_size: int = 2048) -> HuginnConfig:
    """The mini-Huginn architecture: H=192, 2 heads of 96 (Huginn-3.5B's head_dim), 1 prelude +
    2 core + 1 coda blocks, gated MLP 224, R=32 at inference, tied embeddings."""
    return HuginnConfig(
        n_embd=192, n_heads=2, n_layers=4, n_layers_in_prelude=1, n_layers_in_recurrent_block=2,
        n_layers_in_coda=1, mean_recurrence=32, vocab_size=vocab_size, padding_multiple=64,
        intermediate_size=intermediate_size, block_size=block_size, norm_eps=1e-6,
        rope_base=50_000.0, qk_bias=True, tie_embeddings=True, bias=False, state_init="zero",
        bos_token_id=1, eos_token_id=2, pad_token_id=0)


# --------------------------------------------------------------------------------------------
# Recurrence sampling (upstream's log-normal Poisson)
# --------------------------------------------------------------------------------------------


def sample_recurrences(gen: torch.Generator, mean: int, backprop_depth: int, sigma: float = 0.5,
                       r_max: int | None = None) -> tuple[int, int]:
    """``(r, k)``: total recurrences ``r = Poisson(exp(tau)) + 1``, ``tau ~ N(log(mean) -
    sigma^2/2, sigma)`` (so ``E[exp(tau)] = mean``), clamped to ``[1, r_max]`` (default
    ``3 * mean``); ``k = min(backprop_depth, r)`` of them carry gradients."""
    r_max = 3 * mean if r_max is None else r_max
    mu = math.log(mean) - sigma ** 2 / 2
    tau = mu + sigma * float(torch.randn((), generator=gen))
    r = int(torch.poisson(torch.tensor([math.exp(tau)]), generator=gen)) + 1
    r = max(1, min(r, r_max))
    return r, min(backprop_depth, r)


def step_cost(r: int, k: int) -> float:
    """Relative cost of a training step in units of one forward recurrence: a no-grad recurrence
    1, a recurrence with backward 3, plus about 4 for embedding, prelude, coda and the head."""
    return (r - k) + 3 * k + 4


def expected_step_cost(mean: int, backprop_depth: int, n: int = 20000) -> float:
    gen = torch.Generator().manual_seed(12345)
    return sum(step_cost(*sample_recurrences(gen, mean, backprop_depth)) for _ in range(n)) / n


# --------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def eval_nll(model: HuginnReferenceModel, tokens: np.ndarray, recurrences: int,
             seq_len: int = 1024, batch: int = 16, device: str = "cuda", autocast: bool = False,
             max_tokens: int | None = None) -> float:
    """Mean next-token NLL (nats) over non-overlapping ``seq_len`` windows of ``tokens`` at
    ``recurrences`` recurrences.

    Every window is scored independently (its first token has no context and is not scored);
    the final partial window is included."""
    total, count = 0.0, 0
    model.eval()
    for x in common.eval_windows(tokens, seq_len, batch, max_tokens):
        x = x.to(device)
        with common.eval_autocast(device, autocast):
            logits = model(x, num_recurrences=recurrences)
        total += common.next_token_nll_sum(logits, x)
        count += x[:, 1:].numel()
    return total / count


def full_report(model: HuginnReferenceModel, data: Path, device: str,
                recurrences: tuple[int, ...] = EVAL_RECURRENCES, max_tokens: int | None = None,
                seq_len: int = 1024, batch: int = 16) -> dict:
    """fp32 perplexities at each recurrence count on val / Pride and Prejudice / WikiText-2,
    plus bits per byte where ``meta.json`` gives byte counts (and no ``max_tokens`` cap)."""
    meta = common.load_meta(data)
    report: dict = {"recurrences": list(recurrences), "seq_len": seq_len, "sets": {}}
    for split in EVAL_SPLITS:
        f = data / f"{split}.npy"
        if not f.exists():
            continue
        toks = np.load(f)
        n_tok = int(min(len(toks), max_tokens or len(toks)))
        info = meta.get(split, {})
        entry: dict = {"tokens": n_tok, "by_recurrence": {}}
        for r in recurrences:
            t0 = time.time()
            nll = eval_nll(model, toks, r, seq_len=seq_len, batch=batch, device=device,
                           max_tokens=max_tokens)
            row = {"nll": nll, "ppl": math.exp(nll)}
            if info.get("bytes") and max_tokens is None:
                row["bits_per_byte"] = common.bits_per_byte(nll, n_tok, info["bytes"], seq_len)
            entry["by_recurrence"][str(r)] = row
            log(f"[eval] {split} r={r}: ppl {row['ppl']:.2f}"
                + (f", bpb {row['bits_per_byte']:.3f}" if "bits_per_byte" in row else "")
                + f" ({time.time() - t0:.1f}s)")
        report["sets"][split] = entry
    log(format_table(report))
    return report


def format_table(report: dict) -> str:
    """Markdown table: one row per set, one perplexity column per recurrence count."""
    rs = report["recurrences"]
    lines = ["| set | tokens | " + " | ".join(f"r={r}" for r in rs) + " |",
             "| --- | --- | " + " | ".join("---" for _ in rs) + " |"]
    for split, entry in report["sets"].items():
        cells = [f"{entry['by_recurrence'][str(r)]['ppl']:.2f}" for r in rs]
        lines.append(f"| {split} | {entry['tokens']:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


def save_checkpoint(model: HuginnReferenceModel, out: Path, keep_freqs_cis: bool,
                    max_shard_bytes: int) -> list[str]:
    """Upstream layout (`HuginnReferenceModel.save_pretrained`, bf16) + generation config +
    copies of the mini-Ouro tokenizer files."""
    files = model.save_pretrained(out, dtype=torch.bfloat16, max_shard_bytes=max_shard_bytes,
                                  keep_freqs_cis=keep_freqs_cis)
    c = model.config
    common.write_generation_config(out, c.bos_token_id, c.eos_token_id, c.pad_token_id)
    for name in TOKENIZER_FILES:
        # the embedded mini-Huginn's tokenizer.json is a link to mini-Ouro's (the repository's
        # size budget): replace it rather than copy onto its own target
        (out / name).unlink(missing_ok=True)
        shutil.copyfile(TOKENIZER_DIR / name, out / name)
    return files


def train(args) -> None:
    td = common.setup_training(args)
    device, cuda, out = td.device, td.cuda, td.out
    cfg = mini_huginn_config(td.meta.get("vocab_size", 8192), args.intermediate_size,
                             args.block_size)
    model = HuginnReferenceModel(cfg)
    model.init_weights(seed=args.seed)
    model.to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"params {n_params:,} ({n_params * 2 / 1e6:.3f} MB in bf16); head_dim {cfg.head_dim}; "
        f"train tokens {len(td.train_tok):,}, val tokens {len(td.val_tok):,}")

    opt = common.make_optimizer(model, args, cuda)
    batch = common.make_batcher(td.train_tok, args.seq_len, args.batch_size, device, args.seed)
    rgen = torch.Generator().manual_seed(args.seed + 1)  # recurrence counts (CPU, reproducible)
    mean_r = cfg.mean_recurrence
    r_hist: list[int] = []

    def step_fn() -> common.StepOut:
        r, k = sample_recurrences(rgen, mean_r, args.backprop_depth)
        r_hist.append(r)
        x, y = batch()
        with torch.autocast(device_type="cuda" if cuda else "cpu", dtype=torch.bfloat16,
                            enabled=cuda):
            logits = model.forward_train(x, num_recurrences=r, backprop_depth=k)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        del logits
        return common.StepOut(loss, x.numel(), cost=step_cost(r, k), before_loss=f" r {r} k {k}")

    def validate() -> float:
        return eval_nll(model, td.val_tok, mean_r, seq_len=min(args.seq_len, 1024), device=device,
                        autocast=cuda, batch=32, max_tokens=args.report_max_tokens)

    def done_note() -> str:
        return (f"; mean r {sum(r_hist) / max(1, len(r_hist)):.2f} "
                f"(max {max(r_hist, default=0)})")

    res = common.train_loop(
        model, opt, args, cuda, len(td.train_tok), step_fn, validate, probe_end=3,
        expected_cost=expected_step_cost(mean_r, args.backprop_depth), val_label=f" r={mean_r}",
        validate_on_stop=True, done_note=done_note)

    # Save, then evaluate exactly what is saved: bf16 weights, fp32 math, TF32 off.
    common.round_to_bf16_(model)
    files = save_checkpoint(model, out, args.keep_freqs_cis, args.max_shard_bytes)
    sizes = {f: os.path.getsize(out / f) for f in files}
    log(f"saved {files} -> {out}; sizes " + ", ".join(f"{s:,} B" for s in sizes.values())
        + f" (total {sum(sizes.values()):,} B)")
    summary = common.train_summary(args, res, n_params,
                                   recurrence_mean=sum(r_hist) / max(1, len(r_hist)), shards=sizes)
    common.write_json(out / "train_summary.json", summary)
    if cuda:
        common.set_tf32(False)
    report = full_report(model, td.data, device, max_tokens=args.report_max_tokens,
                         recurrences=tuple(args.eval_recurrences))
    common.write_json(out / "eval.json", report)
    summary["eval"] = report
    common.write_json(out / "train_summary.json", summary)
    log(f"wrote {out / 'eval.json'}; total {time.time() - res.t_start:.0f}s")


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def cmd_eval(args) -> None:
    model = HuginnReferenceModel.from_pretrained(args.ckpt, dtype=torch.float32).to(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    report = full_report(model, Path(args.data), args.device, recurrences=tuple(args.recurrences),
                         max_tokens=args.max_tokens, batch=args.batch_size)
    report["checkpoint"] = str(args.ckpt)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        log(f"wrote {args.json}")


def cmd_sample(args) -> None:
    from tokenizers import Tokenizer

    ckpt = Path(args.ckpt)
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    model = HuginnReferenceModel.from_pretrained(ckpt, dtype=torch.float32).to(args.device)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    g = torch.Generator().manual_seed(args.seed)
    for text in common.sample_prompts(args):
        ids = tok.encode(text).ids
        new: list[int] = []
        cache: dict = {}
        step = torch.tensor([ids], device=args.device)
        with torch.no_grad():
            for _ in range(args.max_new_tokens):
                logits = model(step, cache=cache, num_recurrences=args.recurrences)[0, -1]
                if args.temperature <= 0:
                    nxt = int(logits.argmax())
                else:
                    logits = logits / args.temperature
                    if args.top_k > 0:
                        kth = torch.topk(logits, args.top_k).values[-1]
                        logits = logits.masked_fill(logits < kth, float("-inf"))
                    nxt = int(torch.multinomial(torch.softmax(logits.cpu(), -1), 1, generator=g))
                new.append(nxt)
                if nxt in common.STOP_TOKEN_IDS:
                    break
                step = torch.tensor([[nxt]], device=args.device)
        common.print_sample(text, tok.decode(new, skip_special_tokens=False))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    t = sub.add_parser("train")
    common.add_train_io_args(t, "mini-huginn")
    t.add_argument("--intermediate-size", type=int, default=224)
    t.add_argument("--block-size", type=int, default=2048)
    common.add_batch_args(t)
    t.add_argument("--backprop-depth", type=int, default=8, help="recurrences that carry gradients")
    common.add_schedule_args(t, lr=2e-3,
                             probe_help="throughput measured over steps probe..3*probe")
    common.add_checkpoint_args(t, max_shard_bytes=3_000_000)
    t.add_argument("--keep-freqs-cis", action="store_true",
                   help="also store upstream's fp32 RoPE buffer (786 KB at block 2048)")
    t.add_argument("--eval-recurrences", type=int, nargs="+", default=list(EVAL_RECURRENCES))
    common.add_report_arg(t)
    e = sub.add_parser("eval")
    common.add_eval_args(e)
    e.add_argument("--recurrences", type=int, nargs="+", default=list(EVAL_RECURRENCES))
    e.add_argument("--max-tokens", type=int, default=None)
    e.add_argument("--batch-size", type=int, default=16)
    e.add_argument("--threads", type=int, default=0)
    e.add_argument("--json", default=None, help="write the report here")
    s = sub.add_parser("sample")
    common.add_prompt_args(s)
    s.add_argument("--recurrences", type=int, default=None, help="default: mean_recurrence")
    common.add_sampling_args(s)
    common.run_cli(ap, {"train": train, "eval": cmd_eval, "sample": cmd_sample})


if __name__ == "__main__":
    main()
