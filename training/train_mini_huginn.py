#!/usr/bin/env python3
"""Train "mini-Huginn" (Huginn recurrent-depth architecture, head_dim 96, ~2.8M parameters).

Same data as mini-Ouro (``training/prepare_data.py`` -> ``.mini_ouro_data``, the mini-Ouro BPE
tokenizer, vocab 8192). Imports only torch, numpy, safetensors and the repository's
``sglang_rq/models/huginn_config.py`` and ``huginn_reference.py`` (``huginn_config`` pulls in
``transformers.PretrainedConfig`` and the pure-Python ``sglang_rq/layout.py``; the ``sample``
sub-command also needs ``tokenizers``), so it runs unchanged on the GPU machine with
``PYTHONPATH=.``.

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

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
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


def log(msg: str) -> None:
    print(msg, flush=True)


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
def eval_nll(model: HuginnReferenceModel, tokens: np.ndarray, recurrences: int, seq_len: int = 1024,
             batch: int = 16, device: str = "cuda", autocast: bool = False,
             max_tokens: int | None = None) -> float:
    """Mean next-token NLL (nats) over non-overlapping ``seq_len`` windows of ``tokens`` at
    ``recurrences`` recurrences.

    Every window is scored independently (its first token has no context and is not scored);
    the final partial window is included."""
    toks = torch.from_numpy(tokens.astype(np.int64))
    if max_tokens is not None:
        toks = toks[:max_tokens]
    windows = [toks[i:i + seq_len] for i in range(0, len(toks) - 1, seq_len)]
    windows = [w for w in windows if len(w) >= 2]
    full = [w for w in windows if len(w) == seq_len]
    rest = [w for w in windows if len(w) != seq_len]
    groups = [torch.stack(full[i:i + batch]) for i in range(0, len(full), batch)] + [w[None] for w in rest]
    total, count = 0.0, 0
    model.eval()
    for x in groups:
        x = x.to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast and device.startswith("cuda")):
            logits = model(x, num_recurrences=recurrences)
        total += float(F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                       x[:, 1:].reshape(-1), reduction="sum"))
        count += x[:, 1:].numel()
    return total / count


def full_report(model: HuginnReferenceModel, data: Path, device: str,
                recurrences: tuple[int, ...] = EVAL_RECURRENCES, max_tokens: int | None = None,
                seq_len: int = 1024, batch: int = 16) -> dict:
    """fp32 perplexities at each recurrence count on val / Pride and Prejudice / WikiText-2,
    plus bits per byte where ``meta.json`` gives byte counts (and no ``max_tokens`` cap)."""
    meta = json.loads((data / "meta.json").read_text()) if (data / "meta.json").exists() else {}
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
                scored = n_tok - math.ceil((n_tok - 1) / seq_len)
                row["bits_per_byte"] = nll * scored / math.log(2) / info["bytes"]
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


def lr_at(step: int, total: int, warmup: int, peak: float, min_frac: float) -> float:
    """Linear warmup to ``peak`` then cosine decay to ``min_frac * peak`` at ``total``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    prog = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (min_frac + (1 - min_frac) * 0.5 * (1 + math.cos(math.pi * prog)))


def save_checkpoint(model: HuginnReferenceModel, out: Path, keep_freqs_cis: bool,
                    max_shard_bytes: int) -> list[str]:
    """Upstream layout (`HuginnReferenceModel.save_pretrained`, bf16) + generation config +
    copies of the mini-Ouro tokenizer files."""
    files = model.save_pretrained(out, dtype=torch.bfloat16, max_shard_bytes=max_shard_bytes,
                                  keep_freqs_cis=keep_freqs_cis)
    c = model.config
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": c.bos_token_id, "eos_token_id": [c.eos_token_id, c.pad_token_id],
         "pad_token_id": c.pad_token_id, "do_sample": False}, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER_DIR / name, out / name)
    return files


def train(args) -> None:
    torch.manual_seed(args.seed)
    device = args.device
    cuda = device.startswith("cuda")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        log(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    data = Path(args.data)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train_tok = torch.from_numpy(np.load(data / "train.npy").astype(np.int64)).to(device)
    val_tok = np.load(data / "val.npy")
    meta = json.loads((data / "meta.json").read_text())
    cfg = mini_huginn_config(meta.get("vocab_size", 8192), args.intermediate_size, args.block_size)
    model = HuginnReferenceModel(cfg)
    model.init_weights(seed=args.seed)
    model.to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"params {n_params:,} ({n_params * 2 / 1e6:.3f} MB in bf16); head_dim {cfg.head_dim}; "
        f"train tokens {len(train_tok):,}, val tokens {len(val_tok):,}")

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if cuda else {}))

    gen = torch.Generator(device=device).manual_seed(args.seed)
    rgen = torch.Generator().manual_seed(args.seed + 1)  # recurrence counts (CPU, reproducible)
    seq, bsz = args.seq_len, args.batch_size
    offs = torch.arange(seq + 1, device=device)
    mean_r = cfg.mean_recurrence

    def batch():
        starts = torch.randint(0, len(train_tok) - seq - 1, (bsz,), device=device, generator=gen)
        w = train_tok[starts[:, None] + offs[None, :]]
        return w[:, :-1], w[:, 1:]

    total = args.steps if args.steps > 0 else None
    probe = args.probe_steps
    exp_cost = expected_step_cost(mean_r, args.backprop_depth)
    t_start = time.time()
    t_probe, probe_cost = None, 0.0
    best = (float("inf"), -1)
    best_state = None
    step = 0
    history = []
    tokens_seen = 0
    r_hist: list[int] = []
    while True:
        if total is not None and step >= total:
            break
        lr = lr_at(step, total or 10**9, args.warmup, args.lr, args.min_lr_frac)
        for g in opt.param_groups:
            g["lr"] = lr
        model.train()
        r, k = sample_recurrences(rgen, mean_r, args.backprop_depth)
        r_hist.append(r)
        x, y = batch()
        with torch.autocast(device_type="cuda" if cuda else "cpu", dtype=torch.bfloat16, enabled=cuda):
            logits = model.forward_train(x, num_recurrences=r, backprop_depth=k)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        del logits
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        step += 1
        tokens_seen += x.numel()
        if total is None and t_probe is not None:
            probe_cost += step_cost(r, k)
        if total is None and step == probe:
            if cuda:
                torch.cuda.synchronize()
            t_probe = time.time()
        if total is None and t_probe is not None and step == 3 * probe:
            if cuda:
                torch.cuda.synchronize()
            per_unit = (time.time() - t_probe) / probe_cost
            per_step = per_unit * exp_cost
            # leave room for the periodic evaluations (about 3%)
            total = int((args.time_budget - (time.time() - t_start)) / (per_step * 1.03)) + step
            log(f"[schedule] {per_step * 1e3:.1f} ms/step expected (E[cost] {exp_cost:.1f} units, "
                f"{per_unit * 1e3:.2f} ms/unit), {x.numel() / per_step:,.0f} tok/s -> --steps {total} "
                f"({total * x.numel() / len(train_tok):.1f} epochs)")
        if step % args.log_every == 0 or step == 1:
            log(f"step {step}/{total or '?'} lr {lr:.2e} r {r} k {k} loss {float(loss.detach()):.4f} "
                f"gnorm {float(gnorm):.2f} t {time.time() - t_start:.0f}s")
        if step % args.eval_every == 0 or (total is not None and step == total):
            v = eval_nll(model, val_tok, mean_r, seq_len=min(seq, 1024), device=device, autocast=cuda,
                         batch=32, max_tokens=args.report_max_tokens)
            history.append({"step": step, "val_nll": v, "time": time.time() - t_start})
            tag = ""
            if v < best[0]:
                best = (v, step)
                best_state = {n: t.detach().clone() for n, t in model.state_dict().items()}
                tag = " *"
            log(f"[val] step {step} r={mean_r} nll {v:.4f} ppl {math.exp(v):.2f}{tag}")
        if time.time() - t_start > args.time_budget * 1.05:
            log(f"[schedule] time budget exceeded at step {step}; stopping")
            if not history or history[-1]["step"] != step:
                v = eval_nll(model, val_tok, mean_r, seq_len=min(seq, 1024), device=device,
                             autocast=cuda, batch=32, max_tokens=args.report_max_tokens)
                history.append({"step": step, "val_nll": v, "time": time.time() - t_start})
                if v < best[0]:
                    best = (v, step)
                    best_state = {n: t.detach().clone() for n, t in model.state_dict().items()}
            break
    train_time = time.time() - t_start
    log(f"training done: {step} steps, {tokens_seen:,} tokens, {train_time:.0f}s; mean r "
        f"{sum(r_hist) / max(1, len(r_hist)):.2f} (max {max(r_hist, default=0)}); best val step {best[1]}")
    if best_state is not None and best[1] != step:
        model.load_state_dict(best_state)
        log(f"restored best checkpoint from step {best[1]}")

    # Save, then evaluate exactly what is saved: bf16 weights, fp32 math, TF32 off.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    files = save_checkpoint(model, out, args.keep_freqs_cis, args.max_shard_bytes)
    sizes = {f: os.path.getsize(out / f) for f in files}
    log(f"saved {files} -> {out}; sizes " + ", ".join(f"{s:,} B" for s in sizes.values())
        + f" (total {sum(sizes.values()):,} B)")
    summary = {
        "args": vars(args), "steps": step, "tokens_seen": tokens_seen, "train_seconds": train_time,
        "best_step": best[1], "params": n_params, "history": history,
        "recurrence_mean": sum(r_hist) / max(1, len(r_hist)), "shards": sizes,
    }
    (out / "train_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    report = full_report(model, data, device, max_tokens=args.report_max_tokens,
                         recurrences=tuple(args.eval_recurrences))
    (out / "eval.json").write_text(json.dumps(report, indent=1) + "\n")
    summary["eval"] = report
    (out / "train_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    log(f"wrote {out / 'eval.json'}; total {time.time() - t_start:.0f}s")


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
    prompts = args.prompt or ["It was a dark and stormy night; the rain fell in torrents, and"]
    for p in prompts:
        text = p.encode().decode("unicode_escape") if args.escapes else p
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
                if nxt in (0, 2):
                    break
                step = torch.tensor([[nxt]], device=args.device)
        print("=== PROMPT:\n" + text)
        print("=== COMPLETION:\n" + tok.decode(new, skip_special_tokens=False))
        print(flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    t = sub.add_parser("train")
    t.add_argument("--data", default=str(REPO_ROOT / ".mini_ouro_data"))
    t.add_argument("--out", default=os.environ.get("OUT", str(REPO_ROOT / "runs" / "mini-huginn")))
    t.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    t.add_argument("--intermediate-size", type=int, default=224)
    t.add_argument("--block-size", type=int, default=2048)
    t.add_argument("--seq-len", type=int, default=1024)
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--backprop-depth", type=int, default=8, help="recurrences that carry gradients")
    t.add_argument("--steps", type=int, default=0, help="0 = fit --time-budget")
    t.add_argument("--time-budget", type=float, default=420.0, help="training seconds (excl. final eval)")
    t.add_argument("--probe-steps", type=int, default=20,
                   help="throughput measured over steps probe..3*probe")
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--min-lr-frac", type=float, default=0.1)
    t.add_argument("--warmup", type=int, default=300)
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--grad-clip", type=float, default=1.0)
    t.add_argument("--eval-every", type=int, default=500)
    t.add_argument("--log-every", type=int, default=100)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--max-shard-bytes", type=int, default=3_000_000)
    t.add_argument("--keep-freqs-cis", action="store_true",
                   help="also store upstream's fp32 RoPE buffer (786 KB at block 2048)")
    t.add_argument("--eval-recurrences", type=int, nargs="+", default=list(EVAL_RECURRENCES))
    t.add_argument("--report-max-tokens", type=int, default=None,
                   help="cap the validation and final evals (smoke tests)")
    e = sub.add_parser("eval")
    e.add_argument("ckpt")
    e.add_argument("--data", default=str(REPO_ROOT / ".mini_ouro_data"))
    e.add_argument("--device", default="cpu")
    e.add_argument("--recurrences", type=int, nargs="+", default=list(EVAL_RECURRENCES))
    e.add_argument("--max-tokens", type=int, default=None)
    e.add_argument("--batch-size", type=int, default=16)
    e.add_argument("--threads", type=int, default=0)
    e.add_argument("--json", default=None, help="write the report here")
    s = sub.add_parser("sample")
    s.add_argument("ckpt")
    s.add_argument("--prompt", action="append")
    s.add_argument("--escapes", action="store_true", help="interpret \\n etc. in --prompt")
    s.add_argument("--max-new-tokens", type=int, default=120)
    s.add_argument("--recurrences", type=int, default=None, help="default: mean_recurrence")
    s.add_argument("--temperature", type=float, default=0.0)
    s.add_argument("--top-k", type=int, default=0)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--device", default="cpu")
    argv = sys.argv[1:]
    if not argv or argv[0] not in ("train", "eval", "sample", "-h", "--help"):
        argv = ["train"] + argv
    args = ap.parse_args(argv)
    {"train": train, "eval": cmd_eval, "sample": cmd_sample}[args.cmd](args)


if __name__ == "__main__":
    main()
