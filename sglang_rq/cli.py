"""The ``sglang-rq`` command: ``serve`` (SGLang server + plugin), ``kv-size`` (byte accounting),
``eval`` (quality of KV formats through the server, `sglang_rq.quality.harness`), ``bundle``
(offline bundle for a CUDA host, `sglang_rq.bundle`), ``doctor`` (can this host serve?,
`sglang_rq.doctor`) and ``score`` (log-probabilities with decode's numerics, `sglang_rq.scoring`)."""

from __future__ import annotations

import argparse
import json
import sys

from sglang_rq.cli_values import positive_error
from sglang_rq.config import RQConfig, RQConfigError, add_cli_args


def kv_size(argv: list[str]) -> int:
    """``sglang-rq kv-size``: print bytes per token, effective bits, staging, tokens in budget.

    The staging size comes from the SGLang flags that decide it at serve time
    (`layout.staging_tokens`); with ``--tp-size`` every figure is per rank.
    """
    from sglang_rq import layout
    from sglang_rq.rotation import check_rotation_file

    p = argparse.ArgumentParser(prog="sglang-rq kv-size",
                                description="KV-cache bytes per token for a model and KV format.")
    p.add_argument("--model-config", required=True,
                   help="The model's config.json (or the directory holding it).")
    p.add_argument("--memory-gb", type=float, default=None, help="KV budget in GiB to fill (per rank).")
    p.add_argument("--tp-size", type=int, default=1,
                   help="Tensor-parallel ranks the KV heads are split over (figures per rank).")
    p.add_argument("--chunked-prefill-size", type=int, default=8192,
                   help="SGLang's flag (default 8192: what SGLang picks on 60-160 GB GPUs; <= 0 "
                        "means chunks of --max-prefill-tokens).")
    p.add_argument("--max-prefill-tokens", type=int, default=16384, help="SGLang's flag.")
    p.add_argument("--max-running-requests", type=int, default=None,
                   help=f"SGLang's flag (unset: {layout.DEFAULT_MAX_RUNNING_REQUESTS}, as at serve "
                        "time).")
    p.add_argument("--enable-mixed-chunk", action="store_true", help="SGLang's flag.")
    p.add_argument("--staging-tokens", type=int, default=None,
                   help="Tokens per forward held in BF16 staging (fixed overhead); overrides the "
                        "value derived from the SGLang flags above, as --rq-staging-tokens does.")
    p.add_argument("--rq-recurrences", type=int, default=None,
                   help="A Huginn model's recurrences per token, as `serve --rq-recurrences` "
                        "(default: the config's mean_recurrence).")
    p.add_argument("--json", action="store_true", help="Print one JSON object.")
    add_cli_args(p)
    args = p.parse_args(argv)
    for flag, value in (("--memory-gb", args.memory_gb), ("--staging-tokens", args.staging_tokens),
                        ("--max-running-requests", args.max_running_requests)):
        if (err := positive_error(flag, value)) is not None:
            p.error(err)
    if args.memory_gb is not None and args.memory_gb > 2**33:  # 8 EiB: past int64 bytes
        p.error(f"--memory-gb={args.memory_gb} is past what a byte count holds (2^33 GiB)")
    if args.tp_size < 1:
        p.error(f"--tp-size={args.tp_size} must be >= 1")
    config = args.model_config
    if args.rq_recurrences is not None:  # serve sets it as mean_recurrence (with_recurrences)
        hf = layout.ModelKVShape.read_hf_config(config)
        if (err := layout.recurrences_error(hf, args.rq_recurrences, config)) is not None:
            p.error(err)
        config = {**hf, "mean_recurrence": args.rq_recurrences}
    shape = layout.ModelKVShape.from_hf_config(config, tp_size=args.tp_size)
    cfg = RQConfig.from_args(args)
    try:  # a rotation file `serve` would refuse (its bytes come from the shape alone)
        check_rotation_file(cfg, num_layers=shape.num_layers, num_kv_heads=shape.num_kv_heads,
                            head_dim=shape.head_dim, tp_size=args.tp_size)
    except RQConfigError as exc:
        p.error(str(exc))
    staging_tokens = args.staging_tokens or layout.staging_tokens(
        chunked_prefill_size=args.chunked_prefill_size,
        max_prefill_tokens=args.max_prefill_tokens,
        max_running_requests=args.max_running_requests,
        enable_mixed_chunk=args.enable_mixed_chunk)
    per_tok = layout.kv_bytes_per_token(shape, cfg)
    bf16 = layout.bf16_bytes_per_token(shape)
    staging = layout.staging_bytes(shape, cfg, staging_tokens=staging_tokens)
    out = {
        "kv_format": cfg.describe(), "tp_size": args.tp_size,
        "num_layers": shape.num_layers, "num_loops": shape.num_loops,
        "num_kv_heads": shape.num_kv_heads, "head_dim": shape.head_dim,
        "bytes_per_token": per_tok, "bf16_bytes_per_token": bf16,
        "compression_ratio": bf16 / per_tok,
        "effective_bits": layout.effective_bits(shape, cfg),
        "decode_read_bytes_per_token": layout.decode_read_bytes_per_token(shape, cfg),
        "staging_bytes": staging, "staging_tokens": staging_tokens,
        "rotation_bytes": layout.rotation_bytes(shape, cfg),
        "memory_gb": args.memory_gb, "tokens_in_budget": None, "bf16_tokens_in_budget": None,
    }
    if args.memory_gb is not None:
        budget = int(args.memory_gb * (1 << 30))
        out["tokens_in_budget"] = layout.tokens_in_budget(
            shape, cfg, budget_bytes=budget, staging_tokens=staging_tokens)
        out["bf16_tokens_in_budget"] = budget // bf16
    if args.json:
        print(json.dumps(out))
        return 0
    rank = f" per rank of {args.tp_size}" if args.tp_size > 1 else ""
    unlooped = (f" + {shape.unlooped_layers} un-looped (prelude {shape.prelude_layers}, coda "
                f"{shape.coda_layers})" if shape.unlooped_layers else "")
    print(f"model: {shape.num_layers} layers x {shape.num_loops} loops{unlooped}, "
          f"{shape.num_kv_heads} KV heads{rank}, head_dim {shape.head_dim}")
    if cfg.enabled:
        looped = layout.looped_format(shape, cfg)
        print(f"loop groups: {shape.num_loops // looped.group_len(shape.num_loops)} of "
              f"{looped.group_len(shape.num_loops)} loops (one anchor each)"
              + (f"; un-looped layers {cfg.unlooped_bits}-bit" if shape.unlooped_layers else ""))
    print(f"format: {out['kv_format']}")
    print(f"bytes/token{rank}: {per_tok:,} (BF16 {bf16:,}, {out['compression_ratio']:.2f}x smaller)")
    print(f"effective bits/element: {out['effective_bits']:.3f}")
    print(f"decode bytes read/token: {out['decode_read_bytes_per_token']:,}")
    print(f"fixed: staging {staging:,} B for {staging_tokens} tokens, "
          f"rotation {out['rotation_bytes']:,} B")
    if args.memory_gb is not None:
        print(f"tokens in {args.memory_gb} GiB: {out['tokens_in_budget']:,} "
              f"(BF16: {out['bf16_tokens_in_budget']:,})")
        if out["tokens_in_budget"] == 0 and cfg.enabled:
            gib = 1 << 30
            shrink = (" (fewer --staging-tokens, a smaller --chunked-prefill-size or "
                      "--max-running-requests shrink the staging)" if staging else "")
            print(f"note: the fixed bytes, staging {staging / gib:.2f} GiB and rotation "
                  f"{out['rotation_bytes'] / gib:.3f} GiB, leave no room for a token, and "
                  f"`serve` refuses this budget{shrink}")
    return 0


def _eval(argv: list[str]) -> int:
    from sglang_rq.quality.harness import main as run_eval

    return run_eval(argv)


def _calibrate(argv: list[str]) -> int:
    from sglang_rq.quality.calibrate import main as run_calibrate

    return run_calibrate(argv)


def _tasks(argv: list[str]) -> int:
    from sglang_rq.quality.tasks import main as run_tasks

    return run_tasks(argv)


def _bundle(argv: list[str]) -> int:
    from sglang_rq.bundle import main as run_bundle

    return run_bundle(argv)


def _doctor(argv: list[str]) -> int:
    from sglang_rq.doctor import main as run_doctor

    return run_doctor(argv)


def _score(argv: list[str]) -> int:
    from sglang_rq.scoring import main as run_score

    return run_score(argv)


COMMANDS = {  # name: what it does (`sglang-rq --help`)
    "serve": "run an SGLang server with the ResidualQuant KV cache (default: the embedded model)",
    "kv-size": "bytes per token, staging and tokens in a budget for a model and KV format",
    "eval": "quality of KV formats measured through the real server (held-out documents)",
    "calibrate": "learn per-(layer, KV head) rotations that shrink quantization error",
    "tasks": "accuracy on GSM8K, MATH500, HumanEval, MBPP, ARC-Easy against a running server",
    "bundle": "the offline bundle for a CUDA host that has Python, torch and triton",
    "doctor": "can this host serve sglang-rq? one ok/warn/FAIL line per fact",
    "score": "log-probabilities of texts with decode's numerics",
}


def usage() -> str:
    """The top-level help: one line per command."""
    width = max(map(len, COMMANDS))
    return "\n".join(["usage: sglang-rq COMMAND [options]   (sglang-rq COMMAND --help for its "
                      "options)", "", "commands:",
                      *(f"  {name:<{width}}  {what}" for name, what in COMMANDS.items())])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"serve": None, "kv-size": kv_size, "eval": _eval, "calibrate": _calibrate,
                "tasks": _tasks, "bundle": _bundle, "doctor": _doctor, "score": _score}
    assert commands.keys() == COMMANDS.keys()
    if argv and argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if not argv or argv[0] not in commands:
        if argv:
            print(f"error: unknown command {argv[0]!r}", file=sys.stderr)
        print(usage(), file=sys.stderr)
        return 2
    try:
        if argv[0] == "serve":
            from sglang_rq.launch_server import main as serve

            serve(argv[1:])
            return 0
        return commands[argv[0]](argv[1:])
    except RQConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
