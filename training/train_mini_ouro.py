#!/usr/bin/env python3
"""Train "mini-Ouro" (Ouro architecture, 4 loops, ~19M parameters) on the prepared token files.

Imports only torch, numpy, safetensors, ``training/common.py`` (shared with
``train_mini_huginn.py``) and the repository's ``sglang_rq/models/ouro_config.py`` and
``ouro_reference.py`` (with the pure-Python ``sglang_rq/layout.py`` and ``config.py``; the
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
from training import common  # noqa: E402
from training.common import log  # noqa: E402


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
    sums = [0.0] * len(exit_kwargs_list)
    count = 0
    model.eval()
    for x in common.eval_windows(tokens, seq_len, batch, max_tokens):
        x = x.to(device)
        with common.eval_autocast(device, autocast):
            states, _ = model.loop_states(x)
            for j, kw in enumerate(exit_kwargs_list):
                sums[j] += common.next_token_nll_sum(_exit_logits(model, states, kw), x)
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


def full_report(model: OuroReferenceModel, data: Path, device: str,
                max_tokens: int | None = None) -> dict:
    """fp32 perplexities (last loop, each loop, weighted exit) on val / Pride and Prejudice /
    WikiText-2, plus bits per byte where ``meta.json`` gives byte counts."""
    meta = common.load_meta(data)
    n_loops = model.config.total_ut_steps
    kws = ([{}] + [{"exit_mode": "step", "exit_step": i} for i in range(n_loops)]
           + [{"exit_mode": "weighted"}])
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
            # bits per byte of the last-loop exit
            entry["bits_per_byte"] = common.bits_per_byte(nlls[0], len(toks), info["bytes"])
        entry["tokens"] = int(min(len(toks), max_tokens or len(toks)))
        report[split] = entry
        log(f"[eval] {split}: "
            + ", ".join(f"{n} ppl {math.exp(v):.2f}" for n, v in zip(names, nlls))
            + (f", bpb {entry['bits_per_byte']:.3f}" if "bits_per_byte" in entry else "")
            + f" ({time.time() - t0:.1f}s)")
    return report


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


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
    td = common.setup_training(args)
    device, cuda, out = td.device, td.cuda, td.out
    cfg = mini_ouro_config(td.meta.get("vocab_size", 8192))
    model = OuroReferenceModel(cfg)
    model.init_weights(seed=args.seed)
    model.set_dropout(args.dropout)
    model.to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"params {n_params:,} ({n_params * 2 / 1e6:.2f} MB in bf16); "
        f"train tokens {len(td.train_tok):,}, val tokens {len(td.val_tok):,}")

    opt = common.make_optimizer(model, args, cuda)
    batch = common.make_batcher(td.train_tok, args.seq_len, args.batch_size, device, args.seed)

    def step_fn() -> common.StepOut:
        x, y = batch()
        with torch.autocast(device_type="cuda" if cuda else "cpu", dtype=torch.bfloat16,
                            enabled=cuda):
            loss, ces, gate_loss = loss_fn(model, x, y, args.aux_weight, args.gate_margin)
        ce_text = " ".join(f"{c:.3f}" for c in ces)
        return common.StepOut(loss, x.numel(), after_loss=f" ce {ce_text} gate {gate_loss:.3f}")

    def validate() -> float:
        return eval_nll(model, td.val_tok, device=device, autocast=cuda, batch=32,
                        max_tokens=args.report_max_tokens)[0]

    res = common.train_loop(model, opt, args, cuda, len(td.train_tok), step_fn, validate)

    # Evaluate exactly what is saved: bf16 weights, fp32 math, TF32 off.
    model.set_dropout(0.0)
    common.round_to_bf16_(model)
    if cuda:
        common.set_tf32(False)
    report = full_report(model, td.data, device, max_tokens=args.report_max_tokens)
    files = model.save_pretrained(out, max_shard_bytes=args.max_shard_bytes, dtype=torch.bfloat16)
    common.write_generation_config(out, bos=1, eos=2, pad=0)
    summary = common.train_summary(args, res, n_params, eval=report,
                                   shards={f: os.path.getsize(out / f) for f in files})
    common.write_json(out / "train_summary.json", summary)
    log(f"saved {files} -> {out}; sizes "
        + ", ".join(f"{os.path.getsize(out / f) / 1e6:.2f} MB" for f in files))


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
    for text in common.sample_prompts(args):
        ids = tok.encode(text).ids
        out = model.generate([ids], args.max_new_tokens, temperature=args.temperature,
                             top_k=args.top_k, seed=args.seed,
                             stop_token_ids=list(common.STOP_TOKEN_IDS))[0]
        common.print_sample(text, tok.decode(out, skip_special_tokens=False))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    t = sub.add_parser("train")
    common.add_train_io_args(t, "mini-ouro")
    common.add_batch_args(t)
    common.add_schedule_args(t, lr=1.5e-3, probe_help=None)
    t.add_argument("--dropout", type=float, default=0.1)
    t.add_argument("--aux-weight", type=float, default=0.1)
    t.add_argument("--gate-margin", type=float, default=0.01)
    common.add_checkpoint_args(t, max_shard_bytes=14_500_000)
    common.add_report_arg(t)
    e = sub.add_parser("eval")
    common.add_eval_args(e)
    e.add_argument("--max-tokens", type=int, default=None)
    s = sub.add_parser("sample")
    common.add_prompt_args(s)
    common.add_sampling_args(s)
    common.run_cli(ap, {"train": train, "eval": cmd_eval, "sample": cmd_sample})


if __name__ == "__main__":
    main()
