#!/usr/bin/env python3
"""Train "mini-Ouro" (Ouro architecture, 4 loops, ~19M parameters) on the prepared token files.

Imports only torch, numpy, safetensors and the repository's ``sglang_rq/models/ouro_config.py``
and ``ouro_reference.py`` (with the pure-Python ``sglang_rq/layout.py`` and ``config.py``; the
``sample`` sub-command also needs ``tokenizers``), so it runs
unchanged on the GPU machine with ``PYTHONPATH=.``.

Sub-commands::

    train   (default) train, evaluate, save with OuroReferenceModel.save_pretrained
    eval    perplexity of a saved checkpoint on the .npy files (any device, fp32)
    sample  generations from a saved checkpoint (CPU is fine)

Objective (Ouro-style, see training/README.md): cross-entropy of the last loop plus
``--aux-weight`` x the cross-entropy of every earlier loop (so every loop's state is a usable
exit), and a separate binary cross-entropy for the early-exit gate on *detached* states: the
target of loop t is 1 ("exit") when loop t+1 lowers that token's loss by less than
``--gate-margin`` nats (Ouro's stage-II idea, simplified).  bf16 autocast, AdamW, linear
warmup + cosine decay; ``--steps 0`` picks the step count from the throughput measured over the
first steps so that training fits ``--time-budget`` seconds (the chosen count is printed; pass
it back with ``--steps`` to repeat the run).  The best checkpoint by validation loss (a split
of the *training* mix) is kept; Pride and Prejudice and WikiText-2 are evaluated once, at the
end, and never influence training.

Example (GPU)::

    PYTHONUNBUFFERED=1 PYTHONPATH=. python3 training/train_mini_ouro.py train \\
        --data .mini_ouro_data --out $OUT --time-budget 420
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from sglang_rq.models.ouro_config import OuroConfig  # noqa: E402
from sglang_rq.models.ouro_reference import OuroReferenceModel  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def mini_ouro_config(vocab_size: int = 8192) -> OuroConfig:
    """The mini-Ouro architecture: H=512, 4 layers x 4 loops, 4 heads (MHA) of 128, SwiGLU 1024."""
    return OuroConfig(
        vocab_size=vocab_size,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=128,
        hidden_act="silu",
        max_position_embeddings=2048,
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        total_ut_steps=4,
        early_exit_threshold=1.0,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def log(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def eval_nll(model: OuroReferenceModel, tokens: np.ndarray, seq_len: int = 1024, batch: int = 16,
             device: str = "cuda", autocast: bool = False, max_tokens: int | None = None,
             exit_kwargs_list: list[dict] | None = None) -> list[float]:
    """Mean next-token NLL (nats) over non-overlapping ``seq_len`` windows of ``tokens``.

    Every window is scored independently (its first token has no context and is not scored);
    the final partial window is included.  Returns one value per entry of
    ``exit_kwargs_list`` (default: ``[{}]`` = last loop)."""
    exit_kwargs_list = exit_kwargs_list or [{}]
    toks = torch.from_numpy(tokens.astype(np.int64))
    if max_tokens is not None:
        toks = toks[:max_tokens]
    windows = [toks[i:i + seq_len] for i in range(0, len(toks) - 1, seq_len)]
    windows = [w for w in windows if len(w) >= 2]
    sums = [0.0] * len(exit_kwargs_list)
    count = 0
    model.eval()
    # full windows in batches, the (shorter) last window alone
    full = [w for w in windows if len(w) == seq_len]
    rest = [w for w in windows if len(w) != seq_len]
    groups = [torch.stack(full[i:i + batch]) for i in range(0, len(full), batch)] + [w[None] for w in rest]
    for x in groups:
        x = x.to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast and device.startswith("cuda")):
            states, _ = model.loop_states(x)
            for j, kw in enumerate(exit_kwargs_list):
                logits = _exit_logits(model, states, kw)
                nll = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                      x[:, 1:].reshape(-1), reduction="sum")
                sums[j] += float(nll)
        count += x[:, 1:].numel()
    return [s / count for s in sums]


def _exit_logits(model: OuroReferenceModel, states, kw: dict) -> torch.Tensor:
    mode = kw.get("exit_mode", "last")
    if mode == "last":
        return model.lm_head(states[-1]).float()
    if mode == "step":
        return model.lm_head(states[kw["exit_step"]]).float()
    if mode == "weighted":
        probs = model.exit_probabilities(states)
        return sum(p[..., None] * model.lm_head(h).float() for p, h in zip(probs, states))
    if mode == "threshold":
        idx = model.exit_loop_index(states, kw.get("exit_threshold", 1.0))
        stacked = torch.stack(states, 0)
        sel = stacked.gather(0, idx[None, :, :, None].expand(1, *stacked.shape[1:])).squeeze(0)
        return model.lm_head(sel).float()
    raise ValueError(mode)


def full_report(model: OuroReferenceModel, data: Path, device: str, max_tokens: int | None = None) -> dict:
    """fp32 perplexities (last loop, each loop, weighted exit) on val / Pride and Prejudice /
    WikiText-2, plus bits per byte where ``meta.json`` gives byte counts."""
    meta = json.loads((data / "meta.json").read_text()) if (data / "meta.json").exists() else {}
    n_loops = model.config.total_ut_steps
    kws = [{}] + [{"exit_mode": "step", "exit_step": i} for i in range(n_loops)] + [{"exit_mode": "weighted"}]
    names = ["last"] + [f"loop{i}" for i in range(n_loops)] + ["weighted"]
    report = {}
    for split in ("val", "eval_pride", "eval_wikitext2"):
        f = data / f"{split}.npy"
        if not f.exists():
            continue
        toks = np.load(f)
        t0 = time.time()
        nlls = eval_nll(model, toks, device=device, exit_kwargs_list=kws, max_tokens=max_tokens)
        entry = {n: {"nll": v, "ppl": math.exp(v)} for n, v in zip(names, nlls)}
        info = meta.get(split, {})
        if info.get("bytes") and info.get("tokens") and max_tokens is None:
            # bits per byte of the last-loop exit; windows leave the first token of each unscored,
            # so scale by the scored fraction
            n_tok = len(toks)
            scored = n_tok - math.ceil((n_tok - 1) / 1024)
            entry["bits_per_byte"] = nlls[0] * scored / math.log(2) / info["bytes"]
        entry["tokens"] = int(min(len(toks), max_tokens or len(toks)))
        report[split] = entry
        log(f"[eval] {split}: " + ", ".join(f"{n} ppl {math.exp(v):.2f}" for n, v in zip(names, nlls))
            + (f", bpb {entry['bits_per_byte']:.3f}" if "bits_per_byte" in entry else "")
            + f" ({time.time() - t0:.1f}s)")
    return report


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


def lr_at(step: int, total: int, warmup: int, peak: float, min_frac: float) -> float:
    """Linear warmup to ``peak`` then cosine decay to ``min_frac * peak`` at ``total``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    prog = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (min_frac + (1 - min_frac) * 0.5 * (1 + math.cos(math.pi * prog)))


def loss_fn(model: OuroReferenceModel, x: torch.Tensor, y: torch.Tensor, aux_weight: float,
            gate_margin: float) -> tuple[torch.Tensor, list[float], float]:
    """Training loss on ``x, y`` ``[B, T]``; returns (loss, per-loop CE means, gate BCE)."""
    states, _ = model.loop_states(x)
    ces = []
    for h in states:
        logits = model.lm_head(h)
        ces.append(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none"))
    loss = ces[-1].mean() + aux_weight * sum(c.mean() for c in ces[:-1])
    gate_losses = []
    for t in range(len(states) - 1):
        logit = model.model.early_exit_gate(states[t].detach()).float().view(-1)
        target = ((ces[t] - ces[t + 1]).detach() < gate_margin).float()
        gate_losses.append(F.binary_cross_entropy_with_logits(logit, target))
    gate_loss = torch.stack(gate_losses).mean()
    return loss + gate_loss, [float(c.detach().mean()) for c in ces], float(gate_loss.detach())


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
    cfg = mini_ouro_config(meta.get("vocab_size", 8192))
    model = OuroReferenceModel(cfg)
    model.init_weights(seed=args.seed)
    model.set_dropout(args.dropout)
    model.to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"params {n_params:,} ({n_params * 2 / 1e6:.2f} MB in bf16); train tokens {len(train_tok):,}, "
        f"val tokens {len(val_tok):,}")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if cuda else {}))

    gen = torch.Generator(device=device).manual_seed(args.seed)
    seq, bsz = args.seq_len, args.batch_size
    offs = torch.arange(seq + 1, device=device)

    def batch():
        starts = torch.randint(0, len(train_tok) - seq - 1, (bsz,), device=device, generator=gen)
        w = train_tok[starts[:, None] + offs[None, :]]
        return w[:, :-1], w[:, 1:]

    total = args.steps if args.steps > 0 else None
    probe_steps = args.probe_steps
    t_start = time.time()
    t_probe = None
    best = (float("inf"), -1)
    best_state = None
    step = 0
    history = []
    tokens_seen = 0
    while True:
        if total is not None and step >= total:
            break
        lr = lr_at(step, total or 10**9, args.warmup, args.lr, args.min_lr_frac)
        for g in opt.param_groups:
            g["lr"] = lr
        model.train()
        x, y = batch()
        with torch.autocast(device_type="cuda" if cuda else "cpu", dtype=torch.bfloat16, enabled=cuda):
            loss, ces, gate_loss = loss_fn(model, x, y, args.aux_weight, args.gate_margin)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        step += 1
        tokens_seen += x.numel()
        if total is None and step == probe_steps:
            if cuda:
                torch.cuda.synchronize()
            t_probe = time.time()
        if total is None and t_probe is not None and step == 2 * probe_steps:
            if cuda:
                torch.cuda.synchronize()
            per_step = (time.time() - t_probe) / probe_steps
            # leave room for the periodic evaluations (about 2%)
            total = int((args.time_budget - (time.time() - t_start)) / (per_step * 1.03)) + step
            log(f"[schedule] {per_step * 1e3:.1f} ms/step, {x.numel() / per_step:,.0f} tok/s -> "
                f"--steps {total} ({total * x.numel() / len(train_tok):.1f} epochs)")
        if step % args.log_every == 0 or step == 1:
            log(f"step {step}/{total or '?'} lr {lr:.2e} loss {float(loss):.4f} ce "
                + " ".join(f"{c:.3f}" for c in ces) + f" gate {gate_loss:.3f} gnorm {float(gnorm):.2f} "
                f"t {time.time() - t_start:.0f}s")
        if step % args.eval_every == 0 or (total is not None and step == total):
            v = eval_nll(model, val_tok, device=device, autocast=cuda, batch=32,
                         max_tokens=args.report_max_tokens)[0]
            history.append({"step": step, "val_nll": v, "time": time.time() - t_start})
            tag = ""
            if v < best[0]:
                best = (v, step)
                best_state = {k: t.detach().clone() for k, t in model.state_dict().items()}
                tag = " *"
            log(f"[val] step {step} nll {v:.4f} ppl {math.exp(v):.2f}{tag}")
        if time.time() - t_start > args.time_budget * 1.05:
            log(f"[schedule] time budget exceeded at step {step}; stopping")
            break
    train_time = time.time() - t_start
    log(f"training done: {step} steps, {tokens_seen:,} tokens, {train_time:.0f}s; best val step {best[1]}")
    if best_state is not None and best[1] != step:
        model.load_state_dict(best_state)
        log(f"restored best checkpoint from step {best[1]}")

    # Evaluate exactly what is saved: bf16 weights, fp32 math, TF32 off.
    model.set_dropout(0.0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    report = full_report(model, data, device, max_tokens=args.report_max_tokens)
    files = model.save_pretrained(out, max_shard_bytes=args.max_shard_bytes, dtype=torch.bfloat16)
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": [2, 0], "pad_token_id": 0, "do_sample": False}, indent=2) + "\n")
    summary = {
        "args": vars(args), "steps": step, "tokens_seen": tokens_seen, "train_seconds": train_time,
        "best_step": best[1], "params": n_params, "history": history, "eval": report,
        "shards": {f: os.path.getsize(out / f) for f in files},
    }
    (out / "train_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    log(f"saved {files} -> {out}; sizes " + ", ".join(f"{os.path.getsize(out / f) / 1e6:.2f} MB" for f in files))


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def cmd_eval(args) -> None:
    model = OuroReferenceModel.from_pretrained(args.ckpt, dtype=torch.float32, device=args.device)
    report = full_report(model, Path(args.data), args.device, max_tokens=args.max_tokens)
    print(json.dumps(report, indent=1))


def cmd_sample(args) -> None:
    from tokenizers import Tokenizer

    ckpt = Path(args.ckpt)
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    model = OuroReferenceModel.from_pretrained(ckpt, dtype=torch.float32, device=args.device)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    prompts = args.prompt or ["It was a dark and stormy night; the rain fell in torrents, and"]
    for p in prompts:
        text = p.encode().decode("unicode_escape") if args.escapes else p
        ids = tok.encode(text).ids
        out = model.generate([ids], args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                             seed=args.seed, stop_token_ids=[0, 2])[0]
        print("=== PROMPT:\n" + text)
        print("=== COMPLETION:\n" + tok.decode(out, skip_special_tokens=False))
        print(flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    t = sub.add_parser("train")
    t.add_argument("--data", default=str(REPO_ROOT / ".mini_ouro_data"))
    t.add_argument("--out", default=os.environ.get("OUT", str(REPO_ROOT / "runs" / "mini-ouro")))
    t.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    t.add_argument("--seq-len", type=int, default=1024)
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--steps", type=int, default=0, help="0 = fit --time-budget")
    t.add_argument("--time-budget", type=float, default=420.0, help="training seconds (excl. final eval)")
    t.add_argument("--probe-steps", type=int, default=20)
    t.add_argument("--lr", type=float, default=1.5e-3)
    t.add_argument("--min-lr-frac", type=float, default=0.1)
    t.add_argument("--warmup", type=int, default=300)
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--grad-clip", type=float, default=1.0)
    t.add_argument("--dropout", type=float, default=0.1)
    t.add_argument("--aux-weight", type=float, default=0.1)
    t.add_argument("--gate-margin", type=float, default=0.01)
    t.add_argument("--eval-every", type=int, default=500)
    t.add_argument("--log-every", type=int, default=100)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--max-shard-bytes", type=int, default=14_500_000)
    t.add_argument("--report-max-tokens", type=int, default=None, help="cap the validation and final evals (smoke tests)")
    e = sub.add_parser("eval")
    e.add_argument("ckpt")
    e.add_argument("--data", default=str(REPO_ROOT / ".mini_ouro_data"))
    e.add_argument("--device", default="cpu")
    e.add_argument("--max-tokens", type=int, default=None)
    s = sub.add_parser("sample")
    s.add_argument("ckpt")
    s.add_argument("--prompt", action="append")
    s.add_argument("--escapes", action="store_true", help="interpret \\n etc. in --prompt")
    s.add_argument("--max-new-tokens", type=int, default=120)
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
