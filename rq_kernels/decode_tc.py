"""Launcher of decode attention on tensor cores: split kernel plus the LSE merge kernel.

Same signature and semantics as `rq_kernels.decode.decode_attention` (its PyTorch twin is
`sglang_rq.reference.decode_attention_reference`). Design: the module docstring of
`rq_kernels/triton/decode_tc.py`; measurements: docs/kernels.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import torch

from rq_kernels._host import (
    attention_loop_args, cdiv, check_decode_args, interpreting, next_pow2, rotation_terms,
    unsupported_reason,
)
from rq_kernels.triton.decode import rq_decode_merge_kernel
from rq_kernels.triton.decode_tc import rq_decode_tc_split_kernel

if TYPE_CHECKING:
    from sglang_rq.reference import CompressedLayerView

LOG2E = 1.4426950408889634
MAX_GROUP = 8  # query heads per KV head in one program


@dataclass(frozen=True)
class TCLaunch:
    """Launch configuration of the split kernel (defaults from the H200 sweep).

    ``block_n``: history tokens per tile (the MMA's M); ``num_warps``; ``prefetch``: issue the
    next tile's loads before this tile's arithmetic; ``ctas_per_sm``: resident programs per SM
    assumed by the split heuristic; ``num_splits``: fixed splits per request (None: heuristic).
    """

    block_n: int = 64
    num_warps: int = 4
    prefetch: bool = True
    ctas_per_sm: int = 2
    num_splits: int | None = None


@lru_cache(maxsize=8)
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def tc_unsupported_reason(view: CompressedLayerView, group: int = 1) -> str | None:
    """Why the tensor-core decode kernel cannot serve ``view`` for ``group`` query heads per KV
    head (None if it can): the fused formats of `rq_kernels._host.unsupported_reason`, a
    power-of-two quantization group of at least 16 elements, at most 8 query heads per KV head.
    """
    why = unsupported_reason(view)
    if why is not None:
        return why
    g = view.cfg.group_size
    if g < 16 or g & (g - 1):
        return f"group_size={g} is not a power of two >= 16"
    if group > MAX_GROUP:
        return f"{group} query heads per KV head > {MAX_GROUP}"
    return None


def choose_num_splits(batch_size: int, num_kv_heads: int, nnz: int, device: torch.device,
                      *, block_n: int, ctas_per_sm: int, min_tiles: int = 4) -> int:
    """Splits per request so that the grid fills one wave of ``ctas_per_sm * SMs`` programs,
    each split at least ``min_tiles`` tiles long. Host-only (``nnz`` = total history tokens, no
    device read), so CUDA-graph safe."""
    avg = max(1, nnz // max(1, batch_size))
    most = max(1, cdiv(avg, min_tiles * block_n))
    if device.type != "cuda":
        return min(most, 3)
    want = (ctas_per_sm * _num_sms(device.index or 0)) // (batch_size * num_kv_heads)
    return max(1, min(want, most))


def decode_attention_tc(q: torch.Tensor, k_cur: torch.Tensor, v_cur: torch.Tensor,
                        view: CompressedLayerView, loop_id: int, kv_indptr: torch.Tensor,
                        kv_indices: torch.Tensor, *, sm_scale: float,
                        out: torch.Tensor | None = None,
                        launch: TCLaunch | None = None) -> torch.Tensor:
    """Decode attention of loop ``loop_id`` over the compressed history plus the in-flight
    token, on tensor cores.

    Args: ``q [B, Hq, D]`` bf16, ``k_cur``/``v_cur [B, Hkv, D]`` bf16 (the in-flight token at
    full precision), ``view`` (the pool's compressed layer), ``kv_indptr [B+1]`` int32 and
    ``kv_indices [nnz]`` int64 (history slots per request), ``sm_scale``, ``out [B, Hq, D]``
    bf16 or None. Returns ``out``. Raises ValueError for a format the kernel does not serve
    (`tc_unsupported_reason`; the caller picks the twin) and AssertionError for malformed
    arguments. Two launches: the split kernel ``(Hkv, B, splits)`` and the merge kernel; a
    ``[B, Hq, splits, DP]`` fp32 workspace per call. CUDA-graph safe after one warm-up call
    with the same rotation tensor.
    """
    B, HQ, D = q.shape
    HKV = k_cur.shape[1]
    assert HKV > 0 and HQ % HKV == 0, f"num_qo_heads {HQ} not a multiple of num_kv_heads {HKV}"
    gq = HQ // HKV
    why = tc_unsupported_reason(view, gq)
    if why is not None:
        raise ValueError(f"decode_attention_tc cannot serve this format: {why}")
    interp = interpreting(rq_decode_tc_split_kernel)
    assert q.device.type == "cuda" or interp, "CUDA tensors (or CPU under TRITON_INTERPRET=1)"
    out = check_decode_args(q, k_cur, v_cur, view, loop_id, kv_indptr, kv_indices, out)
    launch = launch or TCLaunch()
    dev = q.device
    args, consts = attention_loop_args(view, loop_id)
    dp, gqp = consts["DP"], next_pow2(gq)
    cols = consts["NGP"] * gqp  # MMA columns per (hi/lo part): (group, head); padded to 16
    pk, pv = max(1, 16 // (2 * cols)), max(1, 16 // cols)
    splits = launch.num_splits or choose_num_splits(
        B, HKV, kv_indices.numel(), dev, block_n=launch.block_n, ctas_per_sm=launch.ctas_per_sm)
    terms, alpha, nterms = rotation_terms(view.rotation, dp, dev)
    rot = (terms, terms.stride(0) if terms.dim() == 4 else 0,
           terms.stride(1) if terms.dim() == 4 else 0, dp, alpha)
    has_rot = view.rotation is not None
    pool = [t for t in args if isinstance(t, torch.Tensor) and t.numel()]
    idx64 = max(sum((n - 1) * st for n, st in zip(t.shape, t.stride())) for t in pool) >= 2**31
    mid_o = torch.empty(B, HQ, splits, dp, dtype=torch.float32, device=dev)
    mid_ml = torch.empty(B, HQ, splits, 2, dtype=torch.float32, device=dev)
    qk_scale = sm_scale * LOG2E
    rq_decode_tc_split_kernel[(HKV, B, splits)](
        q, q.stride(0), q.stride(1), kv_indptr, kv_indices, *args, *rot, mid_o, mid_ml,
        qk_scale, splits, HQ, GQ=gq, GQP=gqp, PK=pk, PV=pv, HAS_ROT=has_rot, TERMS=nterms,
        BLOCK_N=launch.block_n, PREFETCH=launch.prefetch, IDX64=idx64, FAST=not interp,
        INTERP=interp, num_warps=launch.num_warps, **consts)
    block_m = 16
    rq_decode_merge_kernel[(HKV, cdiv(B * gq, block_m))](
        q, q.stride(0), q.stride(1), k_cur, k_cur.stride(0), k_cur.stride(1),
        v_cur, v_cur.stride(0), v_cur.stride(1), mid_o, mid_ml, *rot,
        out, out.stride(0), out.stride(1), B * gq, qk_scale, splits,
        GQ=gq, D=D, DP=dp, HAS_ROT=has_rot, TERMS=nterms, BLOCK_M=block_m, INTERP=interp,
        num_warps=4)
    return out
