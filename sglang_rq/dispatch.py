"""One owner of the kernel-or-twin decision: which implementation serves each path.

`resolve` runs once, when the pool is built, for the pool's KV format, device and attention
backend (`KernelRequest`), and hands each path (commit, decode, extend) a ready callable with the
name of what serves it and why:

=======  ========================================  ==============================================
path     ``rq_native`` (CPU)                       ``rq_triton`` (CUDA; CPU under TRITON_INTERPRET)
=======  ========================================  ==============================================
commit   ``c``: `cpu_attention.commit_cpu`         ``triton``: `rq_kernels.commit`
decode   ``c``: `cpu_attention.extend_attention_   `rq_kernels.decode_attention`: ``cuda_tc``
         cpu`, one query row per request           (CUDA tensor-core split kernel: head_dim
                                                   128, 2/4-bit anchor, 0/2/4-bit residual),
                                                   else ``triton_fma`` (MHA, CUDA-core split
                                                   kernel), else ``triton`` (Triton tensor-core
                                                   split kernel)
extend   ``c``: `cpu_attention.extend_attention_   ``triton``: `rq_kernels.extend_attention`
         cpu`
=======  ========================================  ==============================================

Anything else runs the PyTorch twin of `sglang_rq.reference` (``impl = "twin"``), with the reason:
the format (`rq_kernels.unsupported_reason`, `cpu_attention.fallback_reason` /
`commit_fallback_reason`), the device, the C library's build error, or
``SGLANG_RQ_USE_KERNELS=false`` (twins for every path). The launchers never fall back themselves:
given what they cannot serve they raise. The pool logs the decision once (`KernelPaths.log`) and
publishes it as ``sglang_rq_kernel_path_info{path,impl,reason}``; the backends count every
forward a twin serves in ``sglang_rq_fallbacks_total{path}`` (`KernelPaths.count_forward`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rq_kernels import (
    commit, commit_layers, cpu_attention, decode_attention, extend_attention,
    kernel_device_reason, unsupported_reason,
)
from rq_kernels.decode import fma_unsupported_reason
from rq_kernels.decode_tc import tc_unsupported_reason
from sglang_rq import metrics
from sglang_rq.reference import (
    commit_layers_reference, commit_reference, decode_attention_reference,
    extend_attention_reference,
)

if TYPE_CHECKING:
    from rq_kernels.view import CompressedLayerView
    from sglang_rq.config import RQConfig
    from sglang_rq.layout import ModelKVShape

logger = logging.getLogger(__name__)

PATHS = ("commit", "decode", "extend")
BACKENDS = ("rq_native", "rq_triton")
TWIN = "twin"


@dataclass(frozen=True)
class KernelRequest:
    """What the pool asks the dispatcher for.

    Attributes: ``backend`` the attention backend (``rq_native`` or ``rq_triton``; None: by
    device, ``rq_triton`` on CUDA, else ``rq_native``); ``use_kernels`` (``SGLANG_RQ_USE_KERNELS``;
    False: the twins serve every path); ``qo_heads_per_kv`` query heads per KV head (1 = MHA,
    which the CUDA-core decode split kernel serves).
    """

    backend: str | None = None
    use_kernels: bool = True
    qo_heads_per_kv: int = 1

    def __post_init__(self) -> None:
        if self.backend is not None and self.backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {self.backend!r}; expected one of "
                             f"{BACKENDS}")
        if self.qo_heads_per_kv < 1:
            raise ValueError(f"qo_heads_per_kv must be >= 1, got {self.qo_heads_per_kv}")


@dataclass(frozen=True)
class KernelPath:
    """What serves one path: ``impl`` (``c``, ``cuda_tc``, ``triton``, ``triton_fma`` or ``twin``),
    ``reason`` (why the preferred implementation does not serve it; "" when it does) and ``fn``.

    ``fn`` has the path's signature: commit ``(k_loops, v_loops, loc, view)``
    (`rq_kernels.commit`); decode ``(q, k_cur, v_cur, view, loop_id, kv_indptr, kv_indices, *,
    sm_scale, out=None)`` (`rq_kernels.decode_attention`); extend ``(q, k_cur, v_cur, view,
    loop_id, qo_indptr, kv_indptr, kv_indices, *, sm_scale, out=None, host_indptrs=None)``
    (`rq_kernels.extend_attention`).
    """

    path: str
    impl: str
    reason: str
    fn: Callable[..., Any]
    fn_layers: Callable[..., Any] | None = None
    """commit only: ``(k_loops, v_loops, loc, views)``, several layers of one pool at once
    (`rq_kernels.commit_layers`; the C library and the twin commit layer by layer)."""

    @property
    def is_twin(self) -> bool:
        return self.impl == TWIN


@dataclass(frozen=True)
class KernelPaths:
    """The resolved implementation of every path (`resolve`)."""

    commit: KernelPath
    decode: KernelPath
    extend: KernelPath

    def __iter__(self) -> Iterator[KernelPath]:
        return iter((self.commit, self.decode, self.extend))

    def log(self, prefix: str = "") -> None:
        """Log the decision once (start-up): one info line, and a warning per twin; ``prefix``
        names the pool stack in path labels (``unlooped_`` for Huginn's prelude/coda)."""
        logger.info("sglang-rq kernel paths: %s", ", ".join(
            f"{prefix}{p.path}={p.impl}" + (f" ({p.reason})" if p.reason else "") for p in self))
        for p in self:
            if p.is_twin:
                logger.warning("sglang-rq %s%s: running the PyTorch twin (slow): %s", prefix,
                               p.path, p.reason)

    def rows(self, prefix: str = "") -> list[tuple[str, str, str]]:
        """``(path, impl, reason)`` per path, the labels of ``sglang_rq_kernel_path_info``."""
        return [(prefix + p.path, p.impl, p.reason) for p in self]

    def count_forward(self, *, decode: bool, prefix: str = "") -> None:
        """Count one forward in ``sglang_rq_fallbacks_total{path}`` for each of its paths that
        a twin serves: commit, and decode (``decode``) or extend. Host only: call once per
        forward that carries tokens, eager and CUDA-graph replay alike."""
        for p in (self.commit, self.decode if decode else self.extend):
            if p.is_twin:
                metrics.count_fallback(prefix + p.path)


def resolve(view: CompressedLayerView, *, device: torch.device | str,
            request: KernelRequest = KernelRequest()) -> KernelPaths:
    """Decide which implementation serves commit, decode and extend.

    Parameters
    ----------
    view:
        One layer's view of the pool (every layer and loop group has the same format); only its
        format and strides are read.
    device:
        The pool's device (``"cuda"``, ``"cpu"``, a `torch.device`); no tensor is needed.
    request:
        Backend, ``SGLANG_RQ_USE_KERNELS`` and GQA ratio (`KernelRequest`).

    Returns
    -------
    `KernelPaths`, a ready callable per path with its ``impl`` and ``reason``.
    """
    dev = torch.device(device)
    if not request.use_kernels:
        why = "SGLANG_RQ_USE_KERNELS=false"
        return KernelPaths(*(_twin(p, why) for p in PATHS))
    backend = request.backend or ("rq_triton" if dev.type == "cuda" else "rq_native")
    if backend == "rq_native":
        return _resolve_c(view, dev)
    return _resolve_triton(view, dev, request.qo_heads_per_kv)


# ----------------------------------------------------------------------------- per family
def _resolve_c(view: CompressedLayerView, dev: torch.device) -> KernelPaths:
    if dev.type != "cpu":
        why = (f"the C library serves CPU tensors, the pool is on {dev.type} (use "
               "--attention-backend rq_triton)")
        attn_why = commit_why = why
    else:
        attn_why = cpu_attention.fallback_reason(view)
        commit_why = cpu_attention.commit_fallback_reason(view)
    return KernelPaths(
        commit=_pick("commit", "c", cpu_attention.commit_cpu, commit_why),
        decode=_pick("decode", "c", _decode_c, attn_why),
        extend=_pick("extend", "c", _extend_c, attn_why))


def _resolve_triton(view: CompressedLayerView, dev: torch.device,
                    qo_heads_per_kv: int) -> KernelPaths:
    why = unsupported_reason(view) or kernel_device_reason(dev)
    if why is not None:
        return KernelPaths(*(_twin(p, why) for p in PATHS))
    # `decode_attention` picks its split kernel by the same rule (docs/kernels.md): the CUDA
    # tensor-core kernel where it serves the format (checked on loop 0, a residual loop), else
    # the Triton CUDA-core kernel for MHA, else the Triton tensor-core kernel; this only names
    # which one serves, and why not the preferred one
    tc_why = tc_unsupported_reason(view, 0, qo_heads_per_kv, dev)
    fma_why = fma_unsupported_reason(view, qo_heads_per_kv)
    if tc_why is None:
        decode = KernelPath("decode", "cuda_tc", "", decode_attention)
    elif fma_why is None:
        decode = KernelPath("decode", "triton_fma", f"decode tc: {tc_why}", decode_attention)
    else:
        decode = KernelPath("decode", "triton", f"decode tc: {tc_why}; fma: {fma_why}",
                            decode_attention)
    return KernelPaths(commit=KernelPath("commit", "triton", "", commit, commit_layers),
                       decode=decode,
                       extend=KernelPath("extend", "triton", "", extend_attention))


def _pick(path: str, impl: str, fn: Callable[..., Any], why: str | None) -> KernelPath:
    if why is not None:
        return _twin(path, why)
    layers = functools.partial(commit_layers_reference, commit_fn=fn) if path == "commit" else None
    return KernelPath(path, impl, "", fn, layers)


def _twin(path: str, why: str) -> KernelPath:
    fn = {"commit": commit_reference, "decode": decode_attention_reference,
          "extend": extend_attention_reference}[path]
    return KernelPath(path, TWIN, why, fn, commit_layers_reference if path == "commit" else None)



# ----------------------------------------------------------------------------- adapters
# Each path gets one signature whatever serves it (KernelPath): the C library's decode is its
# extend with one query row per request; its CPU index tensors are their own host lengths.
def _decode_c(q, k_cur, v_cur, view, loop_id, kv_indptr, kv_indices, *, sm_scale, out=None):
    qo_indptr = torch.arange(q.shape[0] + 1, dtype=torch.int64)  # [B + 1]: one row each
    return cpu_attention.extend_attention_cpu(q, k_cur, v_cur, view, loop_id, qo_indptr,
                                              kv_indptr, kv_indices, sm_scale=sm_scale, out=out)


def _extend_c(q, k_cur, v_cur, view, loop_id, qo_indptr, kv_indptr, kv_indices, *, sm_scale,
              out=None, host_indptrs=None):
    return cpu_attention.extend_attention_cpu(q, k_cur, v_cur, view, loop_id, qo_indptr,
                                              kv_indptr, kv_indices, sm_scale=sm_scale, out=out)


def graph_blocker(shape: ModelKVShape, cfg: RQConfig) -> str | None:
    """Why decode CUDA graphs cannot be captured for ``shape`` under ``cfg`` on CUDA, or None.

    A stack whose format the fused kernels do not serve decodes through the PyTorch twin, which
    reads its index plan on the host (a sync a CUDA graph cannot record): Huginn's BF16 prelude
    and coda (``--rq-unlooped-bits 16``, the default) are the case in practice. Read from the
    format alone (`rq_kernels.unsupported_reason` on a view without buffers), so the launcher
    can ask before SGLang starts.
    """
    if not cfg.enabled:
        return None
    from rq_kernels.view import CompressedLayerView
    from sglang_rq.layout import kv_stacks

    for st in kv_stacks(shape, cfg):
        segs = st.segments[:st.cfg.group_len(st.shape.num_loops)]
        view = CompressedLayerView(codes=[], scale_offset=[], coef=[], segments=segs, cfg=st.cfg,
                                   head_dim=st.shape.head_dim,
                                   rotation=None if st.cfg.rotation == "none" else torch.empty(0))
        why = unsupported_reason(view)
        if why is not None:
            return f"the {st.name} layers' format runs the PyTorch twin ({why})"
    return None
