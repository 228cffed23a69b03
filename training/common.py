"""What ``train_mini_ouro.py`` and ``train_mini_huginn.py`` share: the token files, the
evaluation windows, the learning-rate schedule, the optimiser, the training loop (throughput
probe, periodic validation, best checkpoint), the saved extras and the command line.

The model-specific parts (architecture config, loss, evaluation exits, checkpoint layout) stay
in the two scripts. Imports only torch and numpy, so the scripts still run unchanged on the GPU
machine with ``PYTHONPATH=.``; they import it as ``training.common`` after putting the
repository root on ``sys.path``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = REPO_ROOT / ".mini_ouro_data"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
DEFAULT_PROMPT = "It was a dark and stormy night; the rain fell in torrents, and"
STOP_TOKEN_IDS = (0, 2)  # <|endoftext|>, <|im_end|>


def log(msg: str) -> None:
    """Print one line and flush (the logs are read live through ``tee``)."""
    print(msg, flush=True)


# --------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------


def eval_windows(tokens: np.ndarray, seq_len: int, batch: int,
                 max_tokens: int | None = None) -> list[torch.Tensor]:
    """Non-overlapping ``seq_len`` windows of ``tokens`` (first ``max_tokens`` only) as int64
    CPU batches: full windows stacked ``batch`` at a time (``[<=batch, seq_len]``), then the
    shorter last window alone (``[1, t]``, ``t >= 2``)."""
    toks = torch.from_numpy(tokens.astype(np.int64))
    if max_tokens is not None:
        toks = toks[:max_tokens]
    windows = [toks[i:i + seq_len] for i in range(0, len(toks) - 1, seq_len)]
    windows = [w for w in windows if len(w) >= 2]
    full = [w for w in windows if len(w) == seq_len]
    rest = [w for w in windows if len(w) != seq_len]
    return ([torch.stack(full[i:i + batch]) for i in range(0, len(full), batch)]
            + [w[None] for w in rest])


def eval_autocast(device: str, autocast: bool):
    """bf16 autocast context for evaluation: on only when ``autocast`` and ``device`` is CUDA."""
    return torch.autocast("cuda", dtype=torch.bfloat16,
                          enabled=autocast and device.startswith("cuda"))


def next_token_nll_sum(logits: torch.Tensor, x: torch.Tensor) -> float:
    """Summed next-token NLL (nats) of ``logits`` ``[B, T, V]`` (any float dtype, scored in
    fp32) for ids ``x`` ``[B, T]``: position t predicts ``x[:, t + 1]``; ``B * (T - 1)`` terms."""
    return float(F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                 x[:, 1:].reshape(-1), reduction="sum"))


def bits_per_byte(nll: float, n_tokens: int, n_bytes: int, seq_len: int = 1024) -> float:
    """Bits per UTF-8 byte from a mean NLL (nats/token) over ``n_tokens`` tokens scored in
    ``seq_len`` windows (the first token of each window is unscored, hence the scored fraction)."""
    scored = n_tokens - math.ceil((n_tokens - 1) / seq_len)
    return nll * scored / math.log(2) / n_bytes


def load_meta(data: Path) -> dict:
    """``meta.json`` of a prepared data folder (token and byte counts per split), or ``{}``."""
    return json.loads((data / "meta.json").read_text()) if (data / "meta.json").exists() else {}


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


def lr_at(step: int, total: int, warmup: int, peak: float, min_frac: float) -> float:
    """Linear warmup to ``peak`` then cosine decay to ``min_frac * peak`` at ``total``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    prog = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (min_frac + (1 - min_frac) * 0.5 * (1 + math.cos(math.pi * prog)))


def set_tf32(enabled: bool) -> None:
    """TF32 matmuls and convolutions on CUDA on or off."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


@dataclass
class TrainData:
    """What ``setup_training`` prepares: the device, the folders, the training stream (int64
    ``[N]`` on the device), the validation tokens (uint16 numpy) and ``meta.json``."""

    device: str
    cuda: bool
    data: Path
    out: Path
    train_tok: torch.Tensor
    val_tok: np.ndarray
    meta: dict


def setup_training(args) -> TrainData:
    """Seed torch with ``args.seed``, turn TF32 on (CUDA), create ``args.out`` and load the token
    files of ``args.data``."""
    torch.manual_seed(args.seed)
    device = args.device
    cuda = device.startswith("cuda")
    if cuda:
        set_tf32(True)
        log(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    data = Path(args.data)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train_tok = torch.from_numpy(np.load(data / "train.npy").astype(np.int64)).to(device)
    val_tok = np.load(data / "val.npy")
    meta = json.loads((data / "meta.json").read_text())
    return TrainData(device, cuda, data, out, train_tok, val_tok, meta)


def make_optimizer(model: torch.nn.Module, args, cuda: bool) -> torch.optim.AdamW:
    """AdamW (0.9/0.95, eps 1e-8; fused on CUDA) with ``args.weight_decay`` on matrices only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if cuda else {}))


def make_batcher(train_tok: torch.Tensor, seq: int, bsz: int, device: str,
                 seed: int) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """A function returning random windows of the stream as ``(x, y)``, both int64
    ``[bsz, seq]`` on ``device``, ``y`` shifted by one; the starts come from its own generator
    on ``device`` seeded with ``seed``."""
    gen = torch.Generator(device=device).manual_seed(seed)
    offs = torch.arange(seq + 1, device=device)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, len(train_tok) - seq - 1, (bsz,), device=device, generator=gen)
        w = train_tok[starts[:, None] + offs[None, :]]
        return w[:, :-1], w[:, 1:]

    return batch


@dataclass
class StepOut:
    """One training step as the model-specific step function reports it: the scalar loss to
    backpropagate, the tokens it consumed, its relative cost (for the throughput probe) and the
    text the step log shows before and after the loss."""

    loss: torch.Tensor
    tokens: int
    cost: float = 1.0
    before_loss: str = ""
    after_loss: str = ""


@dataclass
class TrainResult:
    """What ``train_loop`` did: steps, tokens, seconds, ``(best val NLL, its step)``, the
    validation history (``step``, ``val_nll``, ``time``) and the start time."""

    step: int
    tokens_seen: int
    train_time: float
    best: tuple[float, int]
    history: list[dict] = field(default_factory=list)
    t_start: float = 0.0


def _synced_time(cuda: bool) -> float:
    if cuda:
        torch.cuda.synchronize()
    return time.time()


def train_loop(model: torch.nn.Module, opt: torch.optim.Optimizer, args, cuda: bool,
               n_train_tokens: int, step_fn: Callable[[], StepOut],
               validate: Callable[[], float], *, probe_end: int = 2,
               expected_cost: float | None = None, val_label: str = "",
               validate_on_stop: bool = False,
               done_note: Callable[[], str] = lambda: "") -> TrainResult:
    """Warmup + cosine AdamW loop with grad-norm clipping (``args.grad_clip``).

    ``args.steps > 0`` fixes the step count; otherwise the cost-weighted time of steps
    ``probe + 1 .. probe_end * probe`` (``probe = args.probe_steps``) times ``expected_cost``
    (mean cost of a step; ``None`` = every step costs 1) sets it to fit ``args.time_budget``
    seconds, and training stops at 1.05 x the budget in any case (``validate_on_stop`` then
    validates the last step if it was not). ``validate()`` (mean val NLL, nats) runs every
    ``args.eval_every`` steps and at the end; the best state is restored afterwards."""
    total = args.steps if args.steps > 0 else None
    probe = args.probe_steps
    exp_cost = 1.0 if expected_cost is None else expected_cost
    t_start = time.time()
    t_probe, probe_cost = None, 0.0
    best = (float("inf"), -1)
    best_state = None
    step = 0
    history: list[dict] = []
    tokens_seen = 0

    def record(v: float) -> bool:
        nonlocal best, best_state
        history.append({"step": step, "val_nll": v, "time": time.time() - t_start})
        if v < best[0]:
            best = (v, step)
            best_state = {n: t.detach().clone() for n, t in model.state_dict().items()}
            return True
        return False

    while True:
        if total is not None and step >= total:
            break
        lr = lr_at(step, total or 10**9, args.warmup, args.lr, args.min_lr_frac)
        for g in opt.param_groups:
            g["lr"] = lr
        model.train()
        out = step_fn()
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        step += 1
        tokens_seen += out.tokens
        if total is None and t_probe is not None:
            probe_cost += out.cost
        if total is None and step == probe:
            t_probe = _synced_time(cuda)
        if total is None and t_probe is not None and step == probe_end * probe:
            per_unit = (_synced_time(cuda) - t_probe) / probe_cost
            per_step = per_unit * exp_cost
            # leave room for the periodic evaluations
            total = int((args.time_budget - (time.time() - t_start)) / (per_step * 1.03)) + step
            cost_note = ("" if expected_cost is None else
                         f" expected (E[cost] {exp_cost:.1f} units, {per_unit * 1e3:.2f} ms/unit)")
            log(f"[schedule] {per_step * 1e3:.1f} ms/step{cost_note}, "
                f"{out.tokens / per_step:,.0f} tok/s -> --steps {total} "
                f"({total * out.tokens / n_train_tokens:.1f} epochs)")
        if step % args.log_every == 0 or step == 1:
            log(f"step {step}/{total or '?'} lr {lr:.2e}{out.before_loss} "
                f"loss {float(out.loss.detach()):.4f}{out.after_loss} gnorm {float(gnorm):.2f} "
                f"t {time.time() - t_start:.0f}s")
        if step % args.eval_every == 0 or (total is not None and step == total):
            v = validate()
            tag = " *" if record(v) else ""
            log(f"[val] step {step}{val_label} nll {v:.4f} ppl {math.exp(v):.2f}{tag}")
        if time.time() - t_start > args.time_budget * 1.05:
            log(f"[schedule] time budget exceeded at step {step}; stopping")
            if validate_on_stop and (not history or history[-1]["step"] != step):
                record(validate())
            break
    train_time = time.time() - t_start
    log(f"training done: {step} steps, {tokens_seen:,} tokens, {train_time:.0f}s{done_note()}; "
        f"best val step {best[1]}")
    if best_state is not None and best[1] != step:
        model.load_state_dict(best_state)
        log(f"restored best checkpoint from step {best[1]}")
    return TrainResult(step, tokens_seen, train_time, best, history, t_start)


@torch.no_grad()
def round_to_bf16_(model: torch.nn.Module) -> None:
    """Round every parameter to bf16 in place (kept fp32), so evaluation sees the saved weights."""
    for p in model.parameters():
        p.copy_(p.to(torch.bfloat16).float())


def write_generation_config(out: Path, bos: int, eos: int, pad: int) -> None:
    """``generation_config.json``: greedy, stop on ``eos`` and ``pad``."""
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": bos, "eos_token_id": [eos, pad], "pad_token_id": pad,
         "do_sample": False}, indent=2) + "\n")


def write_json(path: Path, obj) -> None:
    """``obj`` as JSON (indent 1) plus a newline."""
    path.write_text(json.dumps(obj, indent=1) + "\n")


def train_summary(args, result: TrainResult, n_params: int, **extra) -> dict:
    """The common fields of ``train_summary.json``, then ``extra`` in the given order."""
    return {"args": vars(args), "steps": result.step, "tokens_seen": result.tokens_seen,
            "train_seconds": result.train_time, "best_step": result.best[1],
            "params": n_params, "history": result.history, **extra}


# --------------------------------------------------------------------------------------------
# Sampling and command line
# --------------------------------------------------------------------------------------------


def sample_prompts(args) -> list[str]:
    """The ``--prompt`` texts (``\\n`` etc. decoded with ``--escapes``), or the default prompt."""
    prompts = args.prompt or [DEFAULT_PROMPT]
    return [p.encode().decode("unicode_escape") if args.escapes else p for p in prompts]


def print_sample(text: str, completion: str) -> None:
    """Print one prompt and its completion in the sample sub-command's format."""
    print("=== PROMPT:\n" + text)
    print("=== COMPLETION:\n" + completion)
    print(flush=True)


def add_train_io_args(t: argparse.ArgumentParser, run_name: str) -> None:
    """``--data``, ``--out`` (``$OUT`` or ``runs/<run_name>``), ``--device``."""
    t.add_argument("--data", default=str(DATA_DIR))
    t.add_argument("--out", default=os.environ.get("OUT", str(REPO_ROOT / "runs" / run_name)))
    t.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")


def add_batch_args(t: argparse.ArgumentParser) -> None:
    """``--seq-len``, ``--batch-size``."""
    t.add_argument("--seq-len", type=int, default=1024)
    t.add_argument("--batch-size", type=int, default=32)


def add_schedule_args(t: argparse.ArgumentParser, lr: float, probe_help: str | None) -> None:
    """``--steps`` ... ``--grad-clip`` (step count, time budget, probe, lr schedule, AdamW)."""
    t.add_argument("--steps", type=int, default=0, help="0 = fit --time-budget")
    t.add_argument("--time-budget", type=float, default=420.0,
                   help="training seconds (excl. final eval)")
    t.add_argument("--probe-steps", type=int, default=20, help=probe_help)
    t.add_argument("--lr", type=float, default=lr)
    t.add_argument("--min-lr-frac", type=float, default=0.1)
    t.add_argument("--warmup", type=int, default=300)
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--grad-clip", type=float, default=1.0)


def add_checkpoint_args(t: argparse.ArgumentParser, max_shard_bytes: int) -> None:
    """``--eval-every``, ``--log-every``, ``--seed``, ``--max-shard-bytes``."""
    t.add_argument("--eval-every", type=int, default=500)
    t.add_argument("--log-every", type=int, default=100)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--max-shard-bytes", type=int, default=max_shard_bytes)


def add_report_arg(t: argparse.ArgumentParser) -> None:
    """``--report-max-tokens``."""
    t.add_argument("--report-max-tokens", type=int, default=None,
                   help="cap the validation and final evals (smoke tests)")


def add_eval_args(e: argparse.ArgumentParser) -> None:
    """``ckpt``, ``--data``, ``--device`` (CPU by default) of the eval sub-command."""
    e.add_argument("ckpt")
    e.add_argument("--data", default=str(DATA_DIR))
    e.add_argument("--device", default="cpu")


def add_prompt_args(s: argparse.ArgumentParser) -> None:
    """``ckpt``, ``--prompt``, ``--escapes``, ``--max-new-tokens`` of the sample sub-command."""
    s.add_argument("ckpt")
    s.add_argument("--prompt", action="append")
    s.add_argument("--escapes", action="store_true", help="interpret \\n etc. in --prompt")
    s.add_argument("--max-new-tokens", type=int, default=120)


def add_sampling_args(s: argparse.ArgumentParser) -> None:
    """``--temperature`` (0 = greedy), ``--top-k``, ``--seed``, ``--device`` of sample."""
    s.add_argument("--temperature", type=float, default=0.0)
    s.add_argument("--top-k", type=int, default=0)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--device", default="cpu")


def run_cli(ap: argparse.ArgumentParser, commands: dict[str, Callable]) -> None:
    """Parse ``sys.argv`` (``train`` when no sub-command is named) and run the sub-command."""
    argv = sys.argv[1:]
    if not argv or argv[0] not in (*commands, "-h", "--help"):
        argv = ["train"] + argv
    args = ap.parse_args(argv)
    commands[args.cmd](args)
