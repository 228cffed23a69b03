"""``sglang-rq calibrate``: learn per-(layer, KV head) rotations that shrink quantization error.

1. Capture post-RoPE K/V of every (loop, layer) on calibration text from the *training* mix
   (Moby-Dick and GSM8K train; never the evaluation sets), with the plain PyTorch Ouro reference.
2. Per (layer, head), form what the codec quantizes (DESIGN.md section 1): the anchor loop
   ``x_a`` (``--rq-anchor-bits``) and the residuals ``x_i - c_i x_a`` with the least-squares
   ``c_i = <x_i, x_a> / <x_a, x_a>`` (``--rq-residual-bits``), for K and V.
3. Learn ``R = R_0 · cayley(A)`` (``R_0`` = normalised Hadamard; ``cayley(A) = (I - A)^-1 (I + A)``
   with ``A`` skew-symmetric is orthogonal for any ``A``, as in SpinQuant, Liu et al. 2024,
   section 3.2) minimising the bit-weighted mean squared group-quantization error of ``y R``,
   with straight-through rounding so the gradient reaches ``R`` through each group's min/max.
4. Report, on held-out calibration windows and through the real reference codec
   (`sglang_rq.reference.encode/decode`), the reconstruction error of every loop for Hadamard,
   signed Hadamard and the learned rotation; save ``{"rotation": [L, H, D, D] fp32}`` to
   ``--out`` (load it with ``--rq-rotation PATH``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from sglang_rq.cli_values import out_file_error, positive_error, seed_error
from sglang_rq.config import RQConfig, RQConfigError, add_cli_args
from sglang_rq.layout import ModelKVShape, kv_slot
from sglang_rq.models.ouro_config import OURO_MODEL_TYPE


def parse_args(argv: list[str]) -> argparse.Namespace:
    from sglang_rq.models.embedded import EMBEDDED_MODEL
    from sglang_rq.quality.data import resolve_data_dir

    p = argparse.ArgumentParser(prog="sglang-rq calibrate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", default=str(EMBEDDED_MODEL), help="Ouro checkpoint directory.")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="Calibration data (default: $SGLANG_RQ_DATA_DIR, else shared/data next to "
                        "the source checkout).")
    p.add_argument("--windows", type=int, default=4, help="Calibration windows (half prose, half GSM8K).")
    p.add_argument("--window-tokens", type=int, default=256)
    p.add_argument("--steps", type=int, default=150, help="Optimizer steps.")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="Output .safetensors path.")
    add_cli_args(p)
    a = p.parse_args(argv)
    if a.out.suffix != ".safetensors":
        p.error(f"--out={a.out} must end in .safetensors (the server's --rq-rotation loads it)")
    if a.windows < 2 or a.window_tokens < 8 or a.steps < 0:
        p.error("--windows >= 2, --window-tokens >= 8 and --steps >= 0 are required")
    # what failed only after the capture and the learning (a review): the output path, the
    # optimizer's and torch's seeds, a format that has no rotation to learn or bad loop bits
    if (err := out_file_error("--out", a.out) or positive_error("--lr", a.lr)) is not None:
        p.error(err)
    if (err := seed_error("--seed", a.seed)) is not None:
        p.error(err)
    if a.rq_disable:
        p.error("--rq-disable: calibrate learns the rotations of the RQ cache; leave it out")
    cfg_path = Path(a.model_path) / "config.json"
    try:
        model_type = json.loads(cfg_path.read_text()).get("model_type")
    except (OSError, ValueError) as exc:
        p.error(f"--model-path={a.model_path}: cannot read {cfg_path} ({exc})")
    if model_type != OURO_MODEL_TYPE:  # the capture runs the PyTorch Ouro reference
        p.error(f"--model-path={a.model_path}: model_type {model_type!r}; calibrate captures K/V "
                f"with the Ouro reference and supports only {OURO_MODEL_TYPE!r} checkpoints")
    try:
        bits = RQConfig.from_args(a).bits_for_loops(ModelKVShape.from_hf_config(cfg_path).num_loops)
    except RQConfigError as exc:
        p.error(str(exc))
    if all(b in (0, 16) for b in bits):  # `quantized_targets` would be empty (a review: a
        # "does not require grad" traceback after the capture)
        p.error(f"the format rounds no loop (widths {','.join(map(str, bits))}: 16 is BF16, 0 "
                "shares the anchor), so there is no rotation to learn; give --rq-anchor-bits, "
                "--rq-residual-bits or --rq-loop-bits below 16")
    try:
        a.data_dir = resolve_data_dir(a.data_dir)
    except FileNotFoundError as exc:
        p.error(str(exc))
    for name in CALIBRATION_FILES:  # (the fix's review: found only after the model loaded)
        if not (a.data_dir / name).is_file():
            p.error(f"--data-dir={a.data_dir}: {a.data_dir / name} not found")
    return a


CALIBRATION_FILES = ("literature/herman.melville.moby.dick.or.the.whale.txt", "gsm8k/train.jsonl")
"""The training mix's texts under a data directory (`calibration_windows`)."""


def calibration_windows(data_dir: Path, tokenizer, *, count: int, tokens: int, offset: int) -> list[list[int]]:
    """``count`` windows of ``tokens`` ids from the training mix: half from Moby-Dick, half from
    GSM8K *train* conversations; ``offset`` selects disjoint windows (fit vs held-out)."""
    prose_path, gsm_path = (data_dir / f for f in CALIBRATION_FILES)
    prose = tokenizer.encode(prose_path.read_text(encoding="utf-8", errors="replace"),
                             add_special_tokens=False)
    convs = [json.loads(line) for line in gsm_path.read_text().splitlines()[:2000]]
    chat = "".join(f"<|im_start|>user\n{c['question']}<|im_end|>\n<|im_start|>assistant\n"
                   f"{c['answer']}<|im_end|>\n" for c in convs)
    gsm = tokenizer.encode(chat, add_special_tokens=False)
    out = []
    for i in range(count):
        src = prose if i % 2 == 0 else gsm
        start = 5000 + (offset + i // 2) * tokens * 3
        if start + tokens > len(src):
            raise ValueError("calibration text too short for --windows x --window-tokens")
        out.append(src[start:start + tokens])
    return out


@torch.no_grad()
def capture_kv(model, windows: list[list[int]]) -> torch.Tensor:
    """Post-RoPE K/V of every loop and layer: ``[L, U, 2, N, H, D]`` fp32, ``N`` = all window
    tokens, from `OuroReferenceModel.loop_states(collect_kv=True)`."""
    cfg = model.config
    L, U = cfg.num_hidden_layers, cfg.total_ut_steps
    ids = torch.tensor(windows, dtype=torch.long)
    _, kv = model.loop_states(ids, collect_kv=True)
    rows = []
    for layer in range(L):
        loops = []
        for u in range(U):
            k, v = kv[kv_slot(u, layer, L)]  # [B, H, T, D]
            loops.append(torch.stack([t.permute(0, 2, 1, 3).reshape(-1, t.shape[1], t.shape[3])
                                      for t in (k, v)]))
        rows.append(torch.stack(loops))
    return torch.stack(rows).float()


def quantized_targets(kv: torch.Tensor, cfg: RQConfig) -> list[tuple[torch.Tensor, int]]:
    """What the codec quantizes, per (layer, head): ``[(Y [L*H, n, D], bits)]`` for the anchors
    and the LSQ residuals against the exact anchor (K and V together)."""
    L, U, _, N, H, D = kv.shape
    bits = cfg.bits_for_loops(U)
    out = []
    x = kv.permute(0, 4, 1, 2, 3, 5).reshape(L * H, U, 2 * N, D)  # [LH, U, 2N, D]
    for u in range(U):
        a = cfg.anchor_of(u, U)
        b = bits[u]
        if b in (0, 16):
            continue  # nothing rounded
        if a == u:
            out.append((x[:, u], b))
            continue
        base = x[:, a]
        c = (x[:, u] * base).sum(-1, keepdim=True) / (base * base).sum(-1, keepdim=True).clamp_min(1e-12)
        out.append((x[:, u] - (c if cfg.lsq else 1.0) * base, b))
    return out


def fake_quant(y: torch.Tensor, bits: int, group_size: int) -> torch.Tensor:
    """Asymmetric min/max group quantization with straight-through rounding; same shape as ``y``."""
    g = y.unflatten(-1, (y.shape[-1] // group_size, group_size))
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    s = (hi - lo).clamp_min(1e-8) / (2**bits - 1)
    q = (g - lo) / s
    q = q + (q.round() - q).detach()
    return (q * s + lo).flatten(-2)


def objective(targets, rot: torch.Tensor, group_size: int) -> torch.Tensor:
    """Sum over quantized objects of the mean squared quantization error of ``Y R`` (scalar)."""
    total = rot.new_zeros(())
    for y, bits in targets:
        yr = torch.bmm(y, rot)
        total = total + (fake_quant(yr, bits, group_size) - yr).pow(2).mean()
    return total


def cayley(w: torch.Tensor) -> torch.Tensor:
    """Orthogonal ``(I - A)^-1 (I + A)`` with ``A = W - W^T``; ``w`` ``[N, D, D]``."""
    a = w - w.transpose(-1, -2)
    eye = torch.eye(w.shape[-1], dtype=w.dtype).expand_as(w)
    return torch.linalg.solve(eye - a, eye + a)


def learn_rotation(targets, r0: torch.Tensor, *, group_size: int, steps: int, lr: float,
                   log=print) -> torch.Tensor:
    """Minimise `objective` over ``R = R_0 cayley(W)``; returns the best ``R`` seen ``[N, D, D]``."""
    w = torch.zeros_like(r0, requires_grad=True)
    opt = torch.optim.Adam([w], lr=lr)
    best_loss, best = float("inf"), r0.clone()
    for step in range(steps + 1):
        rot = r0 @ cayley(w)
        loss = objective(targets, rot, group_size)
        if loss.item() < best_loss:
            best_loss, best = loss.item(), rot.detach().clone()
        if step % 25 == 0:
            log(f"[calibrate] step {step}: objective {loss.item():.5f}")
        if step == steps:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    return best


def codec_error(kv: torch.Tensor, cfg: RQConfig, rotation: torch.Tensor | None) -> list[float]:
    """Relative reconstruction error ``||x̂ - x||² / ||x||²`` of every loop through the real
    reference codec, K and V of all layers together; one value per loop."""
    from sglang_rq import layout, reference

    L, U, _, N, H, D = kv.shape
    segs = layout.loop_segments(layout.ModelKVShape(L, U, H, D), cfg)
    err = torch.zeros(U, dtype=torch.float64)
    norm = torch.zeros(U, dtype=torch.float64)
    for layer in range(L):
        rot = None if rotation is None else rotation[layer]
        for kvi in range(2):
            x = kv[layer, :, kvi]  # [U, N, H, D]
            stored = reference.encode(x, segments=segs, cfg=cfg, rotation=rot)
            for u in range(U):
                xh = reference.decode(stored, u, segments=segs, cfg=cfg, rotation=rot, head_dim=D)
                err[u] += (xh - x[u]).double().pow(2).sum()
                norm[u] += x[u].double().pow(2).sum()
    return (err / norm).tolist()


def main(argv: list[str]) -> int:
    """Entry point of ``sglang-rq calibrate``."""
    import dataclasses

    from safetensors.torch import save_file
    from sglang_rq.models.ouro_reference import OuroReferenceModel
    from sglang_rq.quality import data
    from sglang_rq.rotation import build_rotation

    args = parse_args(argv)
    cfg = RQConfig.from_args(args)
    torch.manual_seed(args.seed)
    tok = data.load_tokenizer(args.model_path)
    try:  # before the model loads (the fix's review: --windows past the texts was a traceback)
        windows = [calibration_windows(args.data_dir, tok, count=args.windows,
                                       tokens=args.window_tokens, offset=offset)
                   for offset in (0, args.windows)]
    except ValueError as exc:
        print(f"sglang-rq calibrate: error: {exc}", file=sys.stderr)
        return 2
    model = OuroReferenceModel.from_pretrained(args.model_path).eval()
    fit, held = (capture_kv(model, w) for w in windows)
    L, U, _, N, H, D = fit.shape
    shape = dict(num_layers=L, num_kv_heads=H, head_dim=D)
    r0 = build_rotation(dataclasses.replace(cfg, rotation="hadamard"), **shape).reshape(L * H, D, D)
    targets = quantized_targets(fit, cfg)
    learned = learn_rotation(targets, r0, group_size=cfg.group_size,
                             steps=args.steps, lr=args.lr,
                             log=lambda m: print(m, file=sys.stderr, flush=True))
    learned = learned.reshape(L, H, D, D)
    report = {}
    for name, rot in (("none", None),
                      ("hadamard", r0.reshape(L, H, D, D)),
                      ("signed-hadamard", build_rotation(
                          dataclasses.replace(cfg, rotation="signed-hadamard"), **shape)),
                      ("calibrated", learned)):
        c = dataclasses.replace(cfg, rotation="none" if rot is None else "hadamard")
        report[name] = codec_error(held, c, rot)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_file({"rotation": learned.contiguous()}, str(args.out),
              metadata={"kv_format": cfg.describe(), "model_path": str(args.model_path),
                        "held_out_relative_error": json.dumps(report)})
    print(f"held-out relative reconstruction error ||x̂-x||²/||x||² per loop ({cfg.describe()}):")
    for name, errs in report.items():
        print(f"  {name:16s} " + "  ".join(f"loop{u} {e:.5f}" for u, e in enumerate(errs))
              + f"  mean {sum(errs) / len(errs):.5f}")
    print(f"wrote {args.out} (serve with --rq-rotation {args.out})")
    return 0
