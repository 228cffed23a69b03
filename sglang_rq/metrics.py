"""Prometheus metrics of sglang-rq, served on SGLang's own ``/metrics`` endpoint.

How they get there (SGLang 0.5.23, ``--enable-metrics``): the engine process calls
``set_prometheus_multiproc_dir()`` before it spawns the scheduler, so every SGLang process
inherits ``PROMETHEUS_MULTIPROC_DIR``; ``prometheus_client`` then writes each process's samples
to mmap files in that folder, and the HTTP server's ``/metrics`` route aggregates them with a
``MultiProcessCollector``. A metric created here, in the scheduler (KV pool, attention backend)
or in the HTTP process (readiness canary), therefore appears next to the ``sglang:*`` families
with no extra port or route.

Rules this module keeps:

* ``prometheus_client`` is imported lazily, and only when ``PROMETHEUS_MULTIPROC_DIR`` is set:
  importing it earlier in a process would bind in-process values that ``/metrics`` never sees.
  Without ``--enable-metrics`` every function here is a no-op.
* Gauges use ``multiprocess_mode="mostrecent"`` (one value, no ``pid`` label), like SGLang's.
* Every number comes from `sglang_rq.layout`; nothing is recomputed here.
* All families exist (with value 0) from the moment the pool is built, so alert rules and
  dashboards never see "no data" in steady state.

Families (``sglang_rq_`` prefix, base units in names, ``_total`` on counters):

==================================================  ===========================================
``sglang_rq_kv_format_info{...}``                   1, labels = the KV format and model shape
``sglang_rq_kv_bytes_per_token``                    compressed bytes per token (layout)
``sglang_rq_kv_bf16_bytes_per_token``               BF16 bytes per token, same model
``sglang_rq_kv_compression_ratio``                  BF16 / compressed bytes per token
``sglang_rq_kv_effective_bits``                     stored bits per K/V element, metadata included
``sglang_rq_kv_decode_read_bytes_per_token``        bytes one decode step reads per history token
``sglang_rq_kv_staging_bytes`` / ``_staging_tokens``  fixed BF16 staging buffer
``sglang_rq_kv_rotation_bytes``                     fixed rotation matrices
``sglang_rq_kv_pool_tokens`` / ``_pool_bytes``      token slots and compressed bytes allocated
``sglang_rq_committed_tokens_total``                tokens quantized into the pool
``sglang_rq_nonfinite_attention_outputs_total``     tokens whose attention output had NaN/Inf
``sglang_rq_kernel_path_info{path,impl,reason}``    1 per path (commit, decode, extend): what
                                                    serves it (``c``, ``cuda_tc``, ``triton``, ``triton_fma``,
                                                    ``twin``) and why (`sglang_rq.dispatch`)
``sglang_rq_fallbacks_total{path}``                 forwards a PyTorch twin served, per path
                                                    (``unlooped_*``: Huginn's prelude/coda)
``sglang_rq_canary_*``                              readiness canary (see `sglang_rq.canary`),
                                                    ``canary_saturated`` 1 while it queues
``sglang_rq_clipped_groups_total{layer}``           K/V groups whose FP8 scale/offset saturated
                                                    at commit (`sglang_rq.clipping`)
``sglang_rq_portable_ops{op,impl}``                 1 per ``sgl_kernel`` op substituted in
                                                    portable CUDA mode (`sglang_rq.portable`)
==================================================  ===========================================
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from sglang_rq import env, layout

if TYPE_CHECKING:
    import torch

    from sglang_rq.config import RQConfig
    from sglang_rq.layout import ModelKVShape

PREFIX = "sglang_rq_"
# the paths of `sglang_rq.dispatch`, for the looped layers and (prefixed) the un-looped ones
FALLBACK_PATHS = tuple(layout.stack_label_prefix(stack) + path for stack in layout.STACK_NAMES
                       for path in ("commit", "decode", "extend"))
CANARY_RESULTS = ("pass", "wrong_answer", "error", "saturated")
INFO_LABELS = ("enabled", "format", "loop_bits", "group_size", "anchor", "lsq", "rotation",
               "num_loops", "num_layers", "num_kv_heads", "head_dim", "page_size")

_lock = threading.Lock()
_families: dict[str, Any] | None = None


def enabled() -> bool:
    """True when SGLang runs with ``--enable-metrics`` (multiprocess folder set)."""
    return bool(env.PROMETHEUS_MULTIPROC_DIR.get())


def _get() -> dict[str, Any] | None:
    """The metric families of this process, created on first use (None if metrics are off)."""
    global _families
    if _families is not None or not enabled():
        return _families
    with _lock:
        if _families is None:
            _families = _create()
    return _families


def _create() -> dict[str, Any]:
    from prometheus_client import Counter, Gauge

    def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
        return Gauge(PREFIX + name, doc, labels, multiprocess_mode="mostrecent")

    fams: dict[str, Any] = {
        "info": gauge("kv_format_info", "KV-cache format of this worker (value 1).", INFO_LABELS),
        "bytes": gauge("kv_bytes_per_token", "KV-cache bytes per token, all layers/loops/heads."),
        "bf16": gauge("kv_bf16_bytes_per_token", "Bytes per token of a BF16 cache, same model."),
        "ratio": gauge("kv_compression_ratio", "BF16 bytes per token / stored bytes per token."),
        "bits": gauge("kv_effective_bits", "Stored bits per K/V element, metadata included."),
        "read": gauge("kv_decode_read_bytes_per_token",
                      "Bytes one decode step reads per history token."),
        "staging": gauge("kv_staging_bytes", "Fixed bytes of the BF16 staging buffer."),
        "staging_tokens": gauge("kv_staging_tokens",
                                "Tokens per forward the staging buffer holds."),
        "rotation": gauge("kv_rotation_bytes", "Fixed bytes of the rotation matrices."),
        "pool_tokens": gauge("kv_pool_tokens", "Token slots of the KV pool."),
        "pool_bytes": gauge("kv_pool_bytes", "Bytes of the KV pool (compressed buffers)."),
        # NOTE: counters get the ``_total`` suffix from prometheus_client.
        "committed": Counter(PREFIX + "committed_tokens", "Tokens quantized into the KV pool."),
        "nonfinite": Counter(PREFIX + "nonfinite_attention_outputs",
                             "Tokens whose attention output held NaN or Inf "
                             "(last layer, last loop)."),
        "fallback": Counter(PREFIX + "fallbacks",
                            "Forwards that ran the PyTorch twin instead of the kernels (Triton "
                            "on CUDA, the C library on CPU), per path: commit, decode, extend.",
                            ("path",)),
        "graphs_stopped": gauge("decode_graphs_stopped",
                                "1 once decode CUDA graphs were turned off because a layer needed "
                                "a K/V prescale after they were captured (sglang_rq.prescale)."),
        "kernel_path": gauge("kernel_path_info",
                             "What serves each path (value 1): impl c, cuda_tc, triton, triton_fma "
                             "or twin, and the reason the preferred kernel does not serve it.",
                             ("path", "impl", "reason")),
    }
    for path in FALLBACK_PATHS:
        fams["fallback"].labels(path=path)
    return fams


def publish_kv_format(*, cfg: RQConfig, shape: ModelKVShape, page_size: int, staging_tokens: int,
                      pool_tokens: int, pool_bytes: int, dtype_bytes: int = 2) -> None:
    """Set the KV-format gauges from `layout` (called once per process when the pool exists).

    With ``cfg.enabled == False`` (``--rq-disable``) the same families describe the BF16 cache
    (ratio 1, no staging or rotation), so dashboards compare A/B workers on one panel.
    """
    publish_portable_ops()
    fams = _get()
    if fams is None:
        return
    per_tok = layout.kv_bytes_per_token(shape, cfg)
    bf16 = layout.bf16_bytes_per_token(shape)
    bits = (layout.looped_format(shape, cfg).bits_for_loops(shape.num_loops) if cfg.enabled
            else (16,) * shape.num_loops)
    fams["info"].labels(
        enabled=str(cfg.enabled).lower(), format=cfg.describe(),
        loop_bits=",".join(map(str, bits)), group_size=str(cfg.group_size if cfg.enabled else 0),
        anchor=cfg.anchor if cfg.enabled else "none", lsq=str(cfg.lsq and cfg.enabled).lower(),
        rotation=cfg.rotation if cfg.enabled else "none", num_loops=str(shape.num_loops),
        num_layers=str(shape.num_layers), num_kv_heads=str(shape.num_kv_heads),
        head_dim=str(shape.head_dim), page_size=str(page_size),
    ).set(1)
    fams["bytes"].set(per_tok)
    fams["bf16"].set(bf16)
    fams["ratio"].set(bf16 / per_tok)
    fams["bits"].set(layout.effective_bits(shape, cfg))
    fams["read"].set(layout.decode_read_bytes_per_token(shape, cfg))
    fams["staging"].set(layout.staging_bytes(shape, cfg, staging_tokens=staging_tokens,
                                             dtype_bytes=dtype_bytes))
    fams["staging_tokens"].set(staging_tokens if cfg.enabled else 0)
    fams["rotation"].set(layout.rotation_bytes(shape, cfg))
    fams["pool_tokens"].set(pool_tokens)
    fams["pool_bytes"].set(pool_bytes)
    fams["graphs_stopped"].set(0)  # a sample from the start (mark_decode_graphs_stopped: 1)


_portable_published = False


def publish_portable_ops() -> dict[str, str]:
    """Set ``sglang_rq_portable_ops{op, impl} = 1`` for every op the ``sgl_kernel`` stand-in
    substitutes in this process (portable CUDA mode), and log the list once per process.

    Returns the ``{op: impl}`` map (empty with the real ``sgl_kernel``). Called by
    `publish_kv_format` (once per process, when the pool exists), metrics on or off.
    """
    import sys

    from sglang_rq.portable import STANDIN_DIR

    global _portable_published
    mod = sys.modules.get("sgl_kernel")
    if mod is None and str(STANDIN_DIR) in sys.path:  # a process that has not imported it yet
        import sgl_kernel as mod
    subs = dict(getattr(mod, "SUBSTITUTES", None) or {})
    if not subs or _portable_published:
        return subs
    _portable_published = True
    import logging

    logging.getLogger(__name__).info(
        "sglang-rq portable CUDA mode: sgl_kernel stand-in ops %s",
        ", ".join(f"{op}={impl}" for op, impl in sorted(subs.items())))
    fams = _get()
    if fams is not None:
        with _lock:
            if "portable" not in fams:
                from prometheus_client import Gauge

                fams["portable"] = Gauge(PREFIX + "portable_ops", "1 per sgl_kernel op run by "
                                         "the sglang-rq stand-in (portable CUDA mode).",
                                         ("op", "impl"), multiprocess_mode="mostrecent")
        for op, impl in subs.items():
            fams["portable"].labels(op=op, impl=impl).set(1)
    return subs


def count_committed(num_tokens: int) -> None:
    """Add ``num_tokens`` (a host int: no device sync) to the committed-tokens counter.

    Note
    ----
    Not CUDA-graph safe: call it from code that runs on every forward on the host, never from
    inside a captured region (it would count the capture only).
    """
    fams = _get()
    if fams is not None and num_tokens:
        fams["committed"].inc(num_tokens)


def count_nonfinite(out: torch.Tensor) -> int:
    """Count the rows of ``out`` (``[num_tokens, ...]``) holding NaN/Inf; return that count.

    One reduction and one host sync: call it once per forward (the last layer of the last loop,
    where any NaN upstream has propagated to), outside CUDA-graph capture.
    """
    fams = _get()
    if fams is None:
        return 0
    import torch

    bad = int((~torch.isfinite(out)).reshape(out.shape[0], -1).any(dim=1).sum())
    if bad:
        fams["nonfinite"].inc(bad)
    return bad


def publish_kernel_paths(rows: list[tuple[str, str, str]]) -> None:
    """Set ``sglang_rq_kernel_path_info{path, impl, reason} = 1`` for each ``(path, impl,
    reason)`` (`sglang_rq.dispatch.KernelPaths.rows`; called once when the pool is built)."""
    fams = _get()
    if fams is None:
        return
    for path, impl, reason in rows:
        fams["kernel_path"].labels(path=path, impl=impl, reason=reason).set(1)


def mark_decode_graphs_stopped() -> None:
    """Set ``sglang_rq_decode_graphs_stopped`` to 1 (decode runs eagerly from now on)."""
    fams = _get()
    if fams is not None:
        fams["graphs_stopped"].set(1)


def count_fallback(path: str) -> None:
    """One forward ran the PyTorch twin for ``path`` (one of `FALLBACK_PATHS`)."""
    if path not in FALLBACK_PATHS:
        raise ValueError(f"unknown fallback path {path!r}; expected one of {FALLBACK_PATHS}")
    fams = _get()
    if fams is not None:
        fams["fallback"].labels(path=path).inc()


# ----------------------------------------------------------------------------- canary
_canary: dict[str, Any] | None = None


def _canary_families() -> dict[str, Any] | None:
    global _canary
    if _canary is not None or not enabled():
        return _canary
    with _lock:
        if _canary is None:
            from prometheus_client import Counter, Gauge

            _canary = {
                "ok": Gauge(PREFIX + "canary_ok", "1 if the last readiness canary passed.",
                            multiprocess_mode="mostrecent"),
                "runs": Counter(PREFIX + "canary_runs", "Readiness canary runs by result.",
                                ("result",)),
                "latency": Gauge(PREFIX + "canary_latency_seconds",
                                 "Wall time of the last canary request.",
                                 multiprocess_mode="mostrecent"),
                "last_pass": Gauge(PREFIX + "canary_last_pass_timestamp_seconds",
                                   "Unix time of the last passing canary.",
                                   multiprocess_mode="mostrecent"),
                "matched": Gauge(PREFIX + "canary_matched_tokens",
                                 "Leading tokens of the last canary answer equal to the expected.",
                                 multiprocess_mode="mostrecent"),
                "saturated": Gauge(PREFIX + "canary_saturated",
                                   "1 while the canary is queued behind other requests "
                                   "(readiness keeps the last completed verdict).",
                                   multiprocess_mode="mostrecent"),
            }
            for result in CANARY_RESULTS:
                _canary["runs"].labels(result=result)
            _canary["ok"].set(0)
            _canary["saturated"].set(0)
    return _canary


def init_canary_metrics() -> None:
    """Create the canary families (``canary_ok`` = 0) before the first run."""
    _canary_families()


def record_canary(*, result: str, latency_s: float, matched_tokens: int, now_s: float) -> None:
    """Record one canary run (``result`` in `CANARY_RESULTS`).

    ``saturated`` (queued behind load, not judged) sets ``canary_saturated`` = 1 and leaves
    ``canary_ok``, the latency and the matched tokens of the last completed canary as they are.
    """
    fams = _canary_families()
    if fams is None:
        return
    fams["runs"].labels(result=result).inc()
    fams["saturated"].set(1 if result == "saturated" else 0)
    if result == "saturated":
        return
    fams["ok"].set(1 if result == "pass" else 0)
    fams["latency"].set(latency_s)
    fams["matched"].set(matched_tokens)
    if result == "pass":
        fams["last_pass"].set(now_s)


# ----------------------------------------------------------------------------- clipping
_clipped: Any = None


def init_clipped_groups(num_layers: int) -> None:
    """Create ``sglang_rq_clipped_groups_total{layer}`` with every layer at 0."""
    global _clipped
    if not enabled():
        return
    with _lock:
        if _clipped is None:
            from prometheus_client import Counter

            _clipped = Counter(PREFIX + "clipped_groups",
                               "K/V groups committed with an FP8 scale or offset at its +-448 "
                               "limit (values clipped), by physical layer.", ("layer",))
    for layer in range(num_layers):
        _clipped.labels(layer=str(layer))


def count_clipped_groups(*, layer: int, num: int) -> None:
    """Add ``num`` saturated groups of physical ``layer`` (host ints, from `ClipCounter`)."""
    if _clipped is not None and num:
        _clipped.labels(layer=str(layer)).inc(num)
