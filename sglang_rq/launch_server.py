"""Launch SGLang's OpenAI-compatible server with the sglang-rq plugin.

``python -m sglang_rq.launch_server [SGLang flags] [--rq-* flags]`` (or ``sglang-rq serve``).
Every SGLang server flag is accepted unchanged. Without ``--model-path`` the embedded mini-Ouro
is served. On a machine without CUDA the CPU engine is selected (``--device cpu``,
``SGLANG_USE_CPU_ENGINE=1``), SGLang's CUDA-only kernel package is given its CPU stand-in, and
sane sizes are set unless given (``--max-total-tokens 16384``, ``--max-running-requests 32``,
``--chunked-prefill-size 2048``; otherwise SGLang sizes the pool from ~70% of RAM), and
``OMP_NUM_THREADS=1`` unless set. On every device ``SGLANG_REQUEST_STATE_WAIT_TIMEOUT=1``
unless set (a disconnected client is noticed within 1 s instead of 4 s).
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import sys
from pathlib import Path

from sglang_rq import env
from sglang_rq.canary_spec import CanarySpec, load_spec_for
from sglang_rq.cli_values import MAX_WAIT_S, positive_error
from sglang_rq.config import RQConfig, RQConfigError, add_cli_args
from sglang_rq.layout import ModelKVShape, recurrences_error
from sglang_rq.models.embedded import EMBEDDED_MODEL
from sglang_rq.server_process import port_in_use_reason, port_range_reason
CPU_SHIMS = Path(__file__).resolve().parent / "_cpu_shims"
CPU_DEFAULTS = {"--max-total-tokens": "16384", "--max-running-requests": "32",
                "--chunked-prefill-size": "2048"}


def has_cuda() -> bool:
    """True if a CUDA driver and device are present (checked without importing SGLang)."""
    import torch

    return torch.cuda.is_available()


def add_serving_args(parser: argparse.ArgumentParser) -> None:
    """Serving options of sglang-rq that are not part of the KV format."""
    g = parser.add_argument_group("sglang-rq serving")
    g.add_argument("--rq-kv-budget-gb", type=float, default=None,
                   help="Byte budget of the KV cache in GiB (default: SGLang's profiling). "
                        "Capacity = budget // bytes per token.")
    g.add_argument("--rq-staging-tokens", type=int, default=None,
                   help="Tokens per forward held by the BF16 staging buffer (default: derived from "
                        "--chunked-prefill-size and --max-running-requests).")
    g.add_argument("--rq-canary-file", default="", help="Readiness canary spec JSON "
                   "(default <model-path>/canary.json; see sglang_rq/canary.py).")
    g.add_argument("--rq-canary-interval-s", type=float, default=None,
                   help="Seconds between canary runs (default 30).")
    g.add_argument("--rq-no-canary", action="store_true", help="No /rq/ready canary thread.")
    g.add_argument("--rq-recurrences", type=int, default=None,
                   help="Recurrences of a Huginn (recurrent-depth) model's core for every request "
                        "(default: the config's mean_recurrence). Sets SGLang's "
                        "--json-model-override-args mean_recurrence.")
    g.add_argument("--rq-max-request-bytes", type=int, default=None,
                   help="Largest HTTP request body read, in bytes (default 4 MiB); a larger one is "
                        "answered 413 before it is parsed or tokenized.")
    g.add_argument("--rq-max-n", type=int, default=None,
                   help="Largest n (parallel samples of one prompt) a request may ask for "
                        "(default 128, the OpenAI API's); a larger one is answered 400.")


def rq_flags_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser`` with our flags added: the KV format's (`add_cli_args`) and serving's."""
    add_cli_args(parser)
    add_serving_args(parser)
    return parser


def _format_flags() -> frozenset[str]:
    """The KV-format flags (`config.add_cli_args`) other than ``--rq-disable``."""
    p = argparse.ArgumentParser(add_help=False)
    add_cli_args(p)
    return frozenset(o for a in p._actions for o in a.option_strings) - {"--rq-disable"}


# flags that mean nothing with --rq-disable (the budget and the canary still apply)
_IGNORED_WHEN_DISABLED = _format_flags() | {"--rq-staging-tokens"}


def ignored_flags(argv: list[str], cfg: RQConfig,
                  shape: ModelKVShape | None = None) -> list[tuple[str, list[str]]]:
    """The ``--rq-*`` flags in ``argv`` that ``cfg`` makes meaningless, as (why, flags) pairs:
    every format flag under ``--rq-disable``; the anchor and residual bits under
    ``--rq-loop-bits``; the rotation's seed and basis under ``--rq-rotation none``; the seed of
    any rotation but ``signed-hadamard``; ``--rq-unlooped-bits`` for a model ``shape`` (when
    known) without un-looped layers."""
    given = {a.split("=")[0] for a in argv}

    def named(*flags: str) -> list[str]:
        return sorted(given & set(flags))

    if not cfg.enabled:
        out = [("--rq-disable serves SGLang's BF16 pool", named(*_IGNORED_WHEN_DISABLED))]
    else:
        out = [("--rq-loop-bits sets every loop's bits",
                named("--rq-anchor-bits", "--rq-residual-bits") if cfg.loop_bits else []),
               ("--rq-rotation none rotates nothing",
                named("--rq-rotation-seed", "--rq-rotate-anchor", "--no-rq-rotate-anchor")
                if cfg.rotation == "none" else []),
               (f"--rq-rotation {cfg.rotation} has no random signs",
                named("--rq-rotation-seed")
                if cfg.rotation not in ("none", "signed-hadamard") else []),
               ("the model has no un-looped (prelude or coda) layers",
                named("--rq-unlooped-bits")
                if shape is not None and shape.unlooped_layers == 0 else [])]
    return [(why, flags) for why, flags in out if flags]


#: The shortest canary interval: a canary check is a request on the worker it watches.
MIN_CANARY_INTERVAL_S = 1.0


def check_serving_values(ours: argparse.Namespace) -> None:
    """Refuse a serving flag's value that would otherwise be ignored or misread: a KV budget,
    staging size, recurrence count, request-body limit or n limit given as zero or below (or NaN,
    or infinite), a canary interval (flag, else ``SGLANG_RQ_CANARY_INTERVAL_S``) below
    `MIN_CANARY_INTERVAL_S` or not finite, a canary file (flag, else ``SGLANG_RQ_CANARY_FILE``)
    that does not exist (readiness would never pass), or a KV budget
    above this machine's memory (CUDA: device 0's; CPU: physical RAM). The exact room left for
    the KV cache is only known once the weights are loaded (the scheduler's check).

    Raises
    ------
    sglang_rq.config.RQConfigError
        Naming the flag and the value.
    """
    for flag, value in (("--rq-kv-budget-gb", ours.rq_kv_budget_gb),
                        ("--rq-staging-tokens", ours.rq_staging_tokens),
                        ("--rq-recurrences", ours.rq_recurrences),
                        ("--rq-max-request-bytes", ours.rq_max_request_bytes),
                        ("--rq-max-n", ours.rq_max_n)):
        if (err := positive_error(flag, value)) is not None:
            raise RQConfigError(err)
    # the canary's two settings as the server will read them: the flag, else the variable
    # (a review found SGLANG_RQ_CANARY_INTERVAL_S=nan unchecked: the canary looped without sleeping)
    try:
        interval, name = ((ours.rq_canary_interval_s, "--rq-canary-interval-s")
                          if ours.rq_canary_interval_s is not None
                          else (env.RQ_CANARY_INTERVAL_S.get(), env.RQ_CANARY_INTERVAL_S.name))
    except ValueError as exc:
        raise RQConfigError(str(exc)) from exc
    if not MIN_CANARY_INTERVAL_S <= interval <= MAX_WAIT_S:
        raise RQConfigError(f"{name}={interval} must be at least {MIN_CANARY_INTERVAL_S:g} s and "
                            f"at most a year ({MAX_WAIT_S:g} s; each check is a request to this "
                            "worker; leave it out for the default "
                            f"{env.RQ_CANARY_INTERVAL_S.default:g} s)")
    canary_file, name = ((ours.rq_canary_file, "--rq-canary-file") if ours.rq_canary_file
                         else (env.RQ_CANARY_FILE.get(), env.RQ_CANARY_FILE.name))
    if canary_file and not os.path.isfile(canary_file):
        raise RQConfigError(f"{name}={canary_file}: "
                            f"{'not a file' if os.path.exists(canary_file) else 'no such file'} "
                            "(give a recorded canary spec, or leave the flag out for "
                            "<model-path>/canary.json)")
    if canary_file:
        try:
            CanarySpec.load(canary_file)
        except ValueError as exc:
            raise RQConfigError(f"{name}: {exc}") from exc
    if ours.rq_kv_budget_gb is not None:
        total, where = _memory_bytes()
        if ours.rq_kv_budget_gb * 2**30 > total:
            raise RQConfigError(f"--rq-kv-budget-gb={ours.rq_kv_budget_gb} exceeds {where}'s "
                                f"{total / 2**30:.1f} GiB")


def _memory_bytes() -> tuple[int, str]:
    """This machine's memory for the KV cache's device: (bytes, name)."""
    if has_cuda():
        import torch

        return torch.cuda.get_device_properties(0).total_memory, "CUDA device 0"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this host's RAM"


def _has_flag(argv: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def _without_prefill_graphs(argv: list[str]) -> list[str]:
    """``argv`` plus ``--cuda-graph-backend-prefill disabled`` unless the user chose a prefill
    graph backend or turned graphs off."""
    if _has_flag(argv, "--cuda-graph-backend-prefill") or _has_flag(argv, "--disable-cuda-graph"):
        return argv
    return argv + ["--cuda-graph-backend-prefill", "disabled"]


def _local_model_config(model_path: str | None, overrides: dict | None = None) -> dict | None:
    """A local model's ``config.json`` with SGLang's ``--json-model-override-args`` applied, or
    None when ``model_path`` is not a local directory holding one (a hub id is checked later).

    Raises
    ------
    sglang_rq.config.RQConfigError
        When the file is not valid JSON.
    """
    config = Path(model_path or "") / "config.json"
    if not config.is_file():
        return None
    try:
        return {**json.loads(config.read_text()), **(overrides or {})}
    except json.JSONDecodeError as exc:
        raise RQConfigError(f"{config}: cannot read a JSON config ({exc})") from exc


def _argv_overrides(argv: list[str]) -> dict:
    """The ``--json-model-override-args`` object SGLang will apply (its last occurrence, as
    argparse keeps), or {}.

    Raises
    ------
    sglang_rq.config.RQConfigError
        For a value that is not a JSON object.
    """
    raw = _flag_value(argv, "--json-model-override-args")
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise RQConfigError(f"--json-model-override-args={raw}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise RQConfigError(f"--json-model-override-args={raw}: must be a JSON object")
    return value


def _without_uncapturable_graphs(argv: list[str], cfg: RQConfig) -> list[str]:
    """``argv`` plus ``--disable-cuda-graph`` when a local model's format decodes some layers
    through the PyTorch twin (`dispatch.graph_blocker`: Huginn's BF16 prelude/coda), unless
    the user set graph flags themselves (the backend then refuses to capture, naming the flags)."""
    if _has_flag(argv, "--disable-cuda-graph"):
        return argv
    shape = _local_shape(argv)
    if shape is None:
        return argv
    from sglang_rq.dispatch import graph_blocker

    why = graph_blocker(shape, cfg)
    if why is None:
        return argv
    print(f"sglang-rq: CUDA graphs off: {why}; decode runs eager (pass --rq-unlooped-bits 8 to "
          "serve every layer with the fused kernels and keep graphs)", file=sys.stderr)
    return argv + ["--disable-cuda-graph"]


def _local_model_shape(model_path: str | None, overrides: dict | None,
                       tp_size: int) -> ModelKVShape | None:
    """The KV shape on one of ``tp_size`` ranks of a local model (`_local_model_config`, the
    overrides applied), else None (a hub id: read by SGLang)."""
    hf = _local_model_config(model_path, overrides)
    return None if hf is None else ModelKVShape.from_hf_config(hf, tp_size=tp_size)


def _local_shape(argv: list[str]) -> ModelKVShape | None:
    """`_local_model_shape` of the model, overrides and ``--tp-size`` that ``argv`` gives."""
    return _local_model_shape(_flag_value(argv, "--model-path", "--model"), _argv_overrides(argv),
                              _tp_size(argv))


def _tp_size(argv: list[str]) -> int:
    """The tensor-parallel size ``argv`` gives (``--tp-size``, ``--tensor-parallel-size`` or
    ``--tp``; 1 where none).

    Raises
    ------
    sglang_rq.config.RQConfigError
        For a value that is not an integer >= 1 (a review's ``--tp-size abc`` and ``2.5`` were
        ValueError tracebacks from a bare ``int()``, before SGLang's own parser named the flag).
    """
    return _size_flag(argv, "--tp-size", "--tensor-parallel-size", "--tp")


def _size_flag(argv: list[str], *flags: str) -> int:
    """The integer >= 1 that ``argv`` gives ``flags`` (spellings of one parallel size; 1 where
    none is given).

    Raises
    ------
    sglang_rq.config.RQConfigError
        For a value that is not an integer >= 1, naming ``flags[0]``.
    """
    value = _flag_value(argv, *flags)
    try:
        size = int(value or 1)
    except ValueError:
        size = 0
    if size < 1:
        raise RQConfigError(f"{flags[0]}={value} must be an integer >= 1")
    return size


def _flag_value(argv: list[str], *flags: str) -> str | None:
    """The value ``argv`` gives ``flags`` (spellings of one flag, ``--f v`` or ``--f=v``): the
    last one given, as argparse keeps it; None if none is."""
    value = None
    for i, a in enumerate(argv):
        for f in flags:
            if a == f and i + 1 < len(argv):
                value = argv[i + 1]
            elif a.startswith(f + "="):
                value = a.split("=", 1)[1]
    return value


def check_local_model_path(model_path: str | None) -> None:
    """Refuse a ``--model-path`` that names a local directory which does not exist, or an
    existing directory without ``config.json`` (SGLang would take the first for a hub repo id
    and fail inside transformers with a chained traceback, and fail on the second with a
    traceback too).

    A value is local when it is an existing directory, is absolute, starts with ``.`` or ``~``,
    or has more than the one ``/`` of a hub id ``org/name``.

    Raises
    ------
    sglang_rq.config.RQConfigError
        Naming the flag and the path.
    """
    if not model_path:
        return
    path = Path(model_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise RQConfigError(f"--model-path={model_path}: the directory has no config.json "
                                "(give a Hugging Face checkpoint directory: config.json, the "
                                "tokenizer and the weights)")
        return
    if os.path.isabs(model_path) or model_path.startswith((".", "~")) or model_path.count("/") > 1:
        raise RQConfigError(f"--model-path={model_path}: no such directory (give a checkpoint "
                            "directory holding config.json, or a hub repo id 'org/name')")


class _RefusingParser(argparse.ArgumentParser):
    """An argparse parser whose errors raise `RQConfigError` instead of printing the usage."""

    def error(self, message: str):
        raise RQConfigError(message)


def check_sglang_flags(argv: list[str]) -> None:
    """Parse the SGLang argv with SGLang 0.5.23's own flags first (after
    `sglang_rq.plugin.register_backends`, which adds ours to ``--attention-backend``'s
    choices), so that a mistyped or malformed
    flag is one line naming it (with the closest flags) instead of SGLang's ~500-line usage. A
    ``--config`` file is left to SGLang, which merges it first.

    Raises
    ------
    sglang_rq.config.RQConfigError
        Naming the flag argparse refused, and for an unknown flag the closest known ones; or a
        ``--max-total-tokens``, ``--page-size``, ``--context-length`` or
        ``--max-running-requests`` at or below zero (`positive_error`), or a
        ``--max-total-tokens`` below `MIN_POOL_TOKENS`.
    """
    if _has_flag(argv, "--config"):
        return
    from sglang.srt.server_args import ServerArgs

    # no abbreviations: the launcher reads some SGLang flags by their full names
    # (--model-path, --json-model-override-args, --attention-backend, ...)
    parser = _RefusingParser(prog="sglang-rq serve", add_help=False, allow_abbrev=False)
    ServerArgs.add_cli_args(parser)
    try:
        parsed = parser.parse_args(argv)
    except RQConfigError as exc:
        known = [*parser._option_string_actions,
                 *rq_flags_parser(argparse.ArgumentParser(add_help=False))._option_string_actions]
        unknown = [a.split("=", 1)[0] for a in argv
                   if a.startswith("--") and a.split("=", 1)[0] not in known]
        hints = sorted({m for a in unknown for m in difflib.get_close_matches(a, known, n=2)})
        hint = f"; did you mean {' or '.join(hints)}?" if hints else ""
        raise RQConfigError(f"{exc}{hint} (`sglang-rq serve --help` lists the --rq-* flags, "
                            "`python -m sglang.launch_server --help` SGLang's)") from None
    # SGLang 0.5.23 does not check these: --max-total-tokens 0 loads the model, then ends with
    # "Not enough memory. Please try to increase --mem-fraction-static" and a SIGKILL;
    # --page-size 0 and --context-length 0 divide by zero (a traceback, or rc 137 from the
    # scheduler); --max-running-requests 0 served one request at a time (new-user reviews, 12-06)
    for flag, value in (("--max-total-tokens", parsed.max_total_tokens),
                        ("--page-size", parsed.page_size),
                        ("--context-length", parsed.context_length),
                        ("--max-running-requests", parsed.max_running_requests)):
        if (err := positive_error(flag, value)) is not None:
            raise RQConfigError(err)
    # the port's range here, before the model loads (the bind is checked after the import)
    if (why := port_range_reason(parsed.port)) is not None:
        raise RQConfigError(why)
    # a pool under MIN_POOL_TOKENS failed SGLang's warm-up after the model loaded (rc 137; a
    # new-user review, 12-06), as a --rq-kv-budget-gb that small did (check_kv_budget)
    if parsed.max_total_tokens is not None and parsed.max_total_tokens < MIN_POOL_TOKENS:
        raise RQConfigError(
            f"--max-total-tokens {parsed.max_total_tokens} is below {MIN_POOL_TOKENS}: SGLang "
            "0.5.23's warm-up request needs a pool of at least that many token slots")


def refuse_cpu_parallelism(argv: list[str]) -> None:
    """Refuse more than one rank (``--tp-size``, ``--dp-size`` or ``--pp-size`` above 1) on the
    CPU engine before anything loads.

    SGLang 0.5.23's CPU engine binds one NUMA node per rank (``dp_size * tp_size * pp_size``; an
    AssertionError after ~30 s on a one-node machine, after which the launcher stayed up with no
    server: a new-user review, 12-06, for ``--dp-size 2``) and, with
    ``SGLANG_CPU_OMP_THREADS_BIND`` set, its CPU communicator still asks for a CUDA device
    (``ValueError: Expected a cuda device, but got: cpu``), with the BF16 pool as with ours;
    parallel ranks are a GPU feature here.

    Raises
    ------
    sglang_rq.config.RQConfigError
        Naming the flags above 1.
    """
    sizes = {"--tp-size": _tp_size(argv),
             "--dp-size": _size_flag(argv, "--dp-size", "--data-parallel-size"),
             "--pp-size": _size_flag(argv, "--pp-size", "--pipeline-parallel-size")}
    over = [f"{flag} {n}" for flag, n in sizes.items() if n > 1]
    if over:
        raise RQConfigError(
            f"{', '.join(over)} is not supported on the CPU engine (no CUDA device found): SGLang "
            "0.5.23's CPU engine needs one NUMA node per rank (dp x tp x pp) and a CUDA "
            "communicator; serve with one rank on CPU, or on CUDA GPUs")


PORTABLE_ATTENTION_BACKENDS = ("rq_triton", "rq_native", "triton", "torch_native",
                               "flex_attention")


def prepare_portable_cuda(argv: list[str]) -> list[str]:
    """Portable CUDA mode (`sglang_rq.portable`): without a working compiled ``sgl_kernel``,
    put the Triton stand-in first on ``PYTHONPATH`` (all SGLang processes), set its environment,
    default ``--sampling-backend pytorch``, and log once which ops are substituted and why.
    Returns ``argv`` (extended); with a working ``sgl_kernel`` nothing changes.

    Raises
    ------
    sglang_rq.config.RQConfigError
        For a flag whose path needs a compiled kernel package (an attention backend other than
        `PORTABLE_ATTENTION_BACKENDS`, FlashInfer sampling, speculative decoding, HiCache).
    """
    from sglang_rq import portable

    reason = portable.standin_reason()
    if reason is None:
        return argv
    why = f"needs the compiled sglang-kernel/FlashInfer kernels, and {reason} (portable CUDA mode)"
    for flag in ("--attention-backend", "--prefill-attention-backend",
                 "--decode-attention-backend"):
        value = _flag_value(argv, flag)
        if value is not None and value not in PORTABLE_ATTENTION_BACKENDS:
            raise RQConfigError(f"{flag} {value} {why}; use one of "
                                f"{', '.join(PORTABLE_ATTENTION_BACKENDS)}")
    sampling = _flag_value(argv, "--sampling-backend")
    if sampling not in (None, "pytorch"):
        raise RQConfigError(f"--sampling-backend {sampling} {why}; use --sampling-backend pytorch")
    for flag in ("--speculative-algorithm", "--enable-hierarchical-cache"):
        if _has_flag(argv, flag):
            raise RQConfigError(f"{flag} {why}; serve without it")
    os.environ.update(portable.portable_environment())
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(portable.STANDIN_DIR), os.environ.get("PYTHONPATH", "")) if p)
    sys.path.insert(0, str(portable.STANDIN_DIR))
    if sampling is None:
        argv = argv + ["--sampling-backend", "pytorch"]
    if not _has_flag(argv, "--attention-backend"):
        # --rq-disable: SGLang would pick FlashInfer/FA3 on Hopper; its Triton backend runs here
        argv = argv + ["--attention-backend", "triton"]
    # NOTE: SGLang's (breakable) prefill CUDA graphs call sgl_kernel.weak_ref_tensor, a compiled
    # op; decode graphs do not (measured on the H200, BF16 arm)
    argv = _without_prefill_graphs(argv)
    if _tp_size(argv) > 1 and not _has_flag(argv, "--disable-custom-all-reduce"):
        argv = argv + ["--disable-custom-all-reduce"]  # custom all-reduce is a compiled kernel
    import sgl_kernel  # the stand-in now

    ops = ", ".join(f"{op}={impl}" for op, impl in sorted(sgl_kernel.SUBSTITUTES.items()))
    print(f"sglang-rq: portable CUDA mode ({reason}): sgl_kernel ops substituted: {ops}; "
          "SGLang's JIT rope/activation/KV-store kernels routed to them", file=sys.stderr)
    if os.environ.get("SGLANG_FORCE_FUSED_OP_BACKEND"):
        print("sglang-rq: SGLANG_FORCE_FUSED_OP_BACKEND is set: fused ops bypass the "
              "substitutes (unset it for speed)", file=sys.stderr)
    return argv


def prepare_environment(argv: list[str]) -> list[str]:
    """Parse the ``--rq-*`` flags into the environment; return the SGLang argv.

    Raises
    ------
    sglang_rq.config.RQConfigError
        On an invalid KV-format flag (before any model is loaded).
    """
    parser = rq_flags_parser(_RefusingParser(prog="sglang-rq serve", add_help=False))
    ours, rest = parser.parse_known_args(argv)
    check_serving_values(ours)
    cfg = RQConfig.from_args(ours)
    env.RQ_CONFIG.set(cfg.to_json())
    env.RQ_KV_BUDGET_GB.set(ours.rq_kv_budget_gb)  # None or > 0 (check_serving_values)
    env.RQ_STAGING_TOKENS.set(ours.rq_staging_tokens)
    env.RQ_MAX_REQUEST_BYTES.set(ours.rq_max_request_bytes)
    env.RQ_MAX_N.set(ours.rq_max_n)
    for var, value in ((env.RQ_CANARY_FILE, ours.rq_canary_file),
                       (env.RQ_CANARY_INTERVAL_S, ours.rq_canary_interval_s),
                       (env.RQ_CANARY, "0" if ours.rq_no_canary else "")):
        if value:
            var.set(value)
    if not _has_flag(rest, "--model-path") and not _has_flag(rest, "--model"):
        rest += ["--model-path", str(EMBEDDED_MODEL)]
    check_local_model_path(_flag_value(rest, "--model-path", "--model"))
    if ours.rq_recurrences is not None:
        rest = with_recurrences(rest, ours.rq_recurrences)
    # from config.json alone, before SGLang's import (13-38 s on a loaded 2-core host); no
    # shape under --rq-disable (a model the RQ format cannot shape, e.g. a config nested under
    # text_config, must still serve) or for a hub id
    shape = validate_against_model(cfg, _flag_value(rest, "--model-path", "--model"),
                                   tp_size=_tp_size(rest), overrides=_argv_overrides(rest))
    if shape is not None and ours.rq_staging_tokens:
        check_fixed_bytes(shape, cfg, ours.rq_staging_tokens)  # the flag's; SGLang's later
    for why, ignored in ignored_flags(argv, cfg, shape):
        print(f"sglang-rq: warning: {why}; ignoring {', '.join(ignored)}", file=sys.stderr)
    # NOTE: SGLang 0.5.23 notices a vanished HTTP client only when its per-request wait times
    # out (this variable, default 4 s), then drops a chunked prefill at the next chunk boundary;
    # 1 s cuts a disconnected prefill from 3-4 chunks to 1 (docs/robustness.md section 5).
    os.environ.setdefault("SGLANG_REQUEST_STATE_WAIT_TIMEOUT", "1")
    cuda = has_cuda()
    if cfg.enabled and not _has_flag(rest, "--attention-backend"):
        rest += ["--attention-backend", "rq_triton" if cuda else "rq_native"]
    if cuda and cfg.enabled:
        rest = _without_uncapturable_graphs(rest, cfg)
    if "rq_triton" in rest:
        # Decode CUDA graphs are SGLang's default and rq_triton captures them (run in SGLang's
        # runner on the H200; graph-vs-eager tokens: tests/gpu/test_gpu_server.py, passed there
        # on 2026-12-01); prefill graphs it does not support.
        rest = _without_prefill_graphs(rest)
    if not cuda:
        refuse_cpu_parallelism(rest)
        os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
        # NOTE: the reference codec is many small ops; with >1 intra-op thread on a busy machine
        # torch's thread pool thrashes (measured 0.33 s vs 13.5 s per decode step, 2 cores).
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(CPU_SHIMS), os.environ.get("PYTHONPATH", "")) if p)
        sys.path.insert(0, str(CPU_SHIMS))
        if not _has_flag(rest, "--device"):
            rest += ["--device", "cpu"]
        for flag, value in CPU_DEFAULTS.items():
            if flag == "--max-total-tokens" and ours.rq_kv_budget_gb:
                continue
            if not _has_flag(rest, flag):
                rest += [flag, value]
    else:
        rest = prepare_portable_cuda(rest)
    return rest


def with_recurrences(argv: list[str], recurrences: int) -> list[str]:
    """SGLang ``argv`` whose ``--json-model-override-args`` sets Huginn's ``mean_recurrence``
    (the number of KV slots SGLang allocates follows it: `layout.ModelKVShape.num_slots`).

    Raises
    ------
    sglang_rq.config.RQConfigError
        For a count outside 1 .. `layout.MAX_LOOPS`, a local model whose ``config.json`` is not
        a Huginn model, or a ``--json-model-override-args`` that sets another
        ``mean_recurrence``.
    """
    model = _flag_value(argv, "--model-path", "--model")
    if (err := recurrences_error(_local_model_config(model), recurrences, model)) is not None:
        raise RQConfigError(err)
    given = _argv_overrides(argv)
    if given.get("mean_recurrence", recurrences) != recurrences:
        raise RQConfigError(f"--rq-recurrences={recurrences} and --json-model-override-args' "
                            f"mean_recurrence={given['mean_recurrence']!r} disagree; give one")
    overrides = {**given, "mean_recurrence": recurrences}
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--json-model-override-args":
            skip = True
            continue
        if not a.startswith("--json-model-override-args="):
            out.append(a)
    return out + ["--json-model-override-args", json.dumps(overrides)]


def validate_against_model(cfg: RQConfig, model_path: str | None, *, tp_size: int = 1,
                           overrides: dict | None = None) -> ModelKVShape | None:
    """Check the KV format against the model's ``config.json`` before any weights load: loop
    bits vs loop count, group size vs head_dim, loop groups (`layout.loop_segments`), KV heads
    vs ``--tp-size`` (the pool shards heads across ranks) and a rotation file's presence,
    shape and orthogonality (`rotation.check_rotation_file`; a file holds every head, so it is
    refused with ``--tp-size`` > 1). A model that is not a local directory (a hub id) is
    checked later, when the pool is built. ``overrides`` are SGLang's
    ``--json-model-override-args`` (e.g. Huginn's ``mean_recurrence``), applied to the config
    first. Returns the model's KV shape on one rank, or None where nothing was checked
    (``--rq-disable``, a hub id).

    Raises
    ------
    sglang_rq.config.RQConfigError
        Naming the ``--rq-*`` flag, as the pool would, but within a second of start-up.
    """
    shape = _local_model_shape(model_path, overrides, tp_size) if cfg.enabled else None
    if shape is None:
        return None
    from sglang_rq.layout import kv_stacks
    from sglang_rq.rotation import check_rotation_file

    kv_stacks(shape, cfg)
    check_rotation_file(cfg, num_layers=shape.num_layers, num_kv_heads=shape.num_kv_heads,
                        head_dim=shape.head_dim, tp_size=tp_size)
    return shape


def check_fixed_bytes(shape: ModelKVShape, cfg: RQConfig, staging_tokens: int) -> int:
    """The pool's fixed bytes (`layout.fixed_bytes`: staging for ``staging_tokens`` tokens per
    forward, rotations).

    Raises
    ------
    sglang_rq.config.RQConfigError
        When they exceed this machine's memory (a review's ``--rq-staging-tokens`` 10^11:
        SGLang loaded the weights, then stopped, rc 137), naming the flag.
    """
    from sglang_rq import layout

    fixed = layout.fixed_bytes(shape, cfg, staging_tokens=staging_tokens)
    total, where = _memory_bytes()
    if fixed > total:
        raise RQConfigError(f"the pool's fixed bytes ({fixed / 2**30:.1f} GiB: staging for "
                            f"{staging_tokens} tokens per forward, --rq-staging-tokens, and "
                            f"rotations) exceed {where}'s {total / 2**30:.1f} GiB")
    return fixed


# NOTE: SGLang 0.5.23 takes inputs of at most the pool's tokens - 6 (tp_worker: max_req_len =
# tokens - 1, inputs up to max_req_len - 5) and warms up with a short prompt and 8 new tokens;
# a budget under this many tokens failed that warm-up (rc 137) under --rq-disable.
MIN_POOL_TOKENS = 64


def check_kv_budget(cfg: RQConfig, server_args) -> None:
    """Refuse pool fixed bytes (the staging buffer for one forward's tokens and the rotation
    matrices, `layout.fixed_bytes`) past this machine's memory, and a ``--rq-kv-budget-gb`` that
    leaves fewer than `MIN_POOL_TOKENS` token slots (nor one page) once they are taken from it
    (`layout.tokens_in_budget`; BF16 cells under ``--rq-disable``): SGLang would load the
    weights and then stop with its own advice to raise ``--mem-fraction-static``, or fail its
    warm-up. Local models only (a hub id's shape is known only when the pool is built).

    Raises
    ------
    sglang_rq.config.RQConfigError
        Naming the flag, the fixed bytes and the memory, or the least budget.
    """
    budget_gb = env.RQ_KV_BUDGET_GB.get()
    hf = _local_model_config(server_args.model_path,
                             json.loads(server_args.json_model_override_args or "{}"))
    if hf is None:
        return
    from sglang_rq import layout
    from sglang_rq.plugin import staging_tokens_for

    try:
        shape = layout.ModelKVShape.from_hf_config(hf, tp_size=server_args.tp_size)
    except RQConfigError:
        if cfg.enabled:
            raise
        return  # a model the RQ format cannot shape still serves under --rq-disable
    staging = staging_tokens_for(server_args) if cfg.enabled else 0
    fixed = check_fixed_bytes(shape, cfg, staging)
    if not budget_gb or budget_gb <= 0:
        return
    need = max(MIN_POOL_TOKENS, server_args.page_size or 1)
    tokens = layout.tokens_in_budget(shape, cfg, budget_bytes=int(budget_gb * 2**30),
                                     staging_tokens=staging)
    if tokens < need:
        least = fixed + need * layout.kv_bytes_per_token(shape, cfg)
        taken = (f"; the pool's fixed bytes take {fixed / 2**30:.4f} GiB (staging for {staging} "
                 "tokens per forward, rotations)" if fixed else "")
        raise RQConfigError(
            f"--rq-kv-budget-gb={budget_gb} holds {tokens} tokens, fewer than the {need} a "
            f"server needs{taken}; give at least {math.ceil(least / 2**30 * 1e4) / 1e4:.4f} GiB")


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``sglang-rq serve`` and ``python -m sglang_rq.launch_server``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        rq_flags_parser(argparse.ArgumentParser(
            prog="sglang-rq serve", description=__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter)).print_help()
        print("\nAll other flags are SGLang's: see `python -m sglang.launch_server --help`.")
        return
    sglang_argv = prepare_environment(argv)
    from sglang_rq.plugin import register_backends

    register_backends()  # our backends' names are --attention-backend choices
    check_sglang_flags(sglang_argv)  # before load_plugins imports every SGLang model
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.launch_server import run_server
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args(sglang_argv)
    cfg = RQConfig.from_json(env.RQ_CONFIG.get())
    if cfg.enabled:
        from sglang_rq.plugin import validate_server_args

        validate_server_args(server_args)  # before any weights load
    check_kv_budget(cfg, server_args)
    if env.RQ_CANARY.get():  # the spec the canary will read, the model's own canary.json too
        try:  # (the fix's review: a malformed default spec was a traceback from install)
            load_spec_for(server_args.model_path, env.RQ_CANARY_FILE.get())
        except ValueError as exc:
            raise RQConfigError(f"{exc} (record one with `python -m sglang_rq.canary record`, or "
                                "give --rq-canary-file)") from exc
    why = port_in_use_reason(server_args.host, server_args.port)
    if why is not None:
        raise RQConfigError(why)
    from sglang.srt.entrypoints.http_server import app

    from sglang_rq import http_errors
    from sglang_rq.canary import install

    install(app, server_args)  # /rq/ready + canary thread (single-tokenizer HTTP server)
    http_errors.install(app)  # validation errors without the server's file paths
    http_errors.install_body_limit(app, env.RQ_MAX_REQUEST_BYTES.get())
    http_errors.install_object_bodies(app)  # inside the limit: sees a bounded body
    if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":  # set by prepare_environment
        http_errors.install_cpu_refusals(app)
    run_server(server_args)


if __name__ == "__main__":
    from sglang_rq.config import RQConfigError

    try:
        main()
    except RQConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
