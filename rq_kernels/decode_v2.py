"""Launcher of decode attention v2: a CUDA-core split kernel plus v1's merge kernel.

Same signature and semantics as `rq_kernels.decode.decode_attention`. The design and the
measurements are in docs/kernels_history.md, section "Decode v2".
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import torch

from rq_kernels._host import (
    cdiv, check_decode_args, interpreting, next_pow2, require_kernel, rotation_terms,
    unsupported_reason,
)
from rq_kernels.triton.decode import rq_decode_merge_kernel
from rq_kernels.triton.decode_v2 import rq_decode_v2_split_kernel

if TYPE_CHECKING:
    from rq_kernels.view import CompressedLayerView

LOG2E = 1.4426950408889634
V2_BITS = (2, 4, 8)
MAX_GROUP = 8  # query heads per KV head handled in one program (GQP <= 8)


@lru_cache(maxsize=8)
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def v2_unsupported_reason(view: CompressedLayerView, group: int = 1) -> str | None:
    """Why v2 cannot handle ``view`` / a GQA group of ``group`` (None if it can).

    Fused: everything v1 fuses (see `rq_kernels._host.unsupported_reason`). It also needs
    whole int32 code words (``head_dim * bits / 8`` a multiple of 4), frames of 16 elements
    (group size a multiple of 16), at most 8 query heads per KV head, and 4-byte aligned code
    strides. Anything else runs the reference twin.
    """
    why = unsupported_reason(view)
    if why is not None:
        return why
    g = view.cfg.group_size
    if g % 16:
        return f"group_size={g} not a multiple of 16"
    if group > MAX_GROUP:
        return f"{group} query heads per KV head > {MAX_GROUP}"
    for i, seg in enumerate(view.segments):
        c = view.codes[i]
        if seg.bits == 0:
            continue
        if seg.bits not in V2_BITS:
            return f"loop {i} has {seg.bits} bits"
        if seg.code_bytes % 4 or any(s % 4 for s in c.stride()[:-1]) or c.data_ptr() % 4:
            return f"codes[{i}] are not whole aligned int32 words"
    return None


def choose_num_splits_v2(batch_size: int, num_kv_heads: int, nnz: int, device: torch.device,
                         *, block_n: int, ctas_per_sm: int = 4, min_tiles: int = 4) -> int:
    """Splits per request so that the grid fills one wave of ``ctas_per_sm * SMs`` resident
    programs (equal-length programs, so a partly filled extra wave costs a whole one). Each split
    gets at least ``min_tiles`` tiles of ``block_n``. Host-only: uses ``nnz`` (the total history
    tokens), never a device read, so it is CUDA-graph friendly."""
    avg = max(1, nnz // max(1, batch_size))
    most = max(1, cdiv(avg, min_tiles * block_n))
    if device.type != "cuda":
        return min(most, 3)
    want = (ctas_per_sm * _num_sms(device.index or 0)) // (batch_size * num_kv_heads)
    return max(1, min(want, most))


def _words(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Reinterpret a pool tensor's contiguous last dim as ``dtype`` (same storage)."""
    return t.view(dtype) if t.shape[-1] else t


def _strides3(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def decode_attention_v2(q: torch.Tensor, k_cur: torch.Tensor, v_cur: torch.Tensor,
                        view: CompressedLayerView, loop_id: int, kv_indptr: torch.Tensor,
                        kv_indices: torch.Tensor, *, sm_scale: float,
                        out: torch.Tensor | None = None, num_splits: int | None = None,
                        block_n: int | None = None, num_warps: int = 4, num_stages: int = 2,
                        ctas_per_sm: int | None = None, frame_split: bool | None = None,
                        prefetch: bool = True, maxnreg: int | None = -1,
                        k_idp: bool | None = None) -> torch.Tensor:
    """Decode attention of loop ``loop_id`` over the compressed history plus the in-flight
    token (v2 kernel). The arguments, result and fallback rules are those of
    `rq_kernels.decode.decode_attention`.

    Extra knobs:

    - ``k_idp``: K logits by integer ``dp4a`` dots of the codes with a 16-bit fixed-point query
      (two int8 halves per group, error <= 1/(127*512) of the group's largest ``|q'|``). Default
      on for MHA without frame split (the only layout it supports) on loops with a residual;
      off gives the exact-fp32 FFMA dots.
    - ``block_n``: tokens per tile (default 64 with ``k_idp``, two rows per thread; else 32 for
      4+ groups per head, else 64).
    - ``num_warps``, ``num_stages``: the launch config.
    - ``ctas_per_sm``: the split heuristic's target (`choose_num_splits_v2`).
    - ``frame_split``: one thread owns 16 elements of a (token, group) instead of all G. Default
      on for GQA, where it keeps the per-head accumulator copies in registers.
    - ``prefetch``: issue the next tile's loads before the current tile's arithmetic (a
      register double buffer).
    - ``maxnreg``: register cap per thread (-1: 128 for the MHA FFMA path, where Triton 3.6
      would otherwise take 166 and fit 3 programs per SM instead of 4; none otherwise: the
      ``k_idp`` default takes 255 without spills and fits 2).

    Two launches: the split kernel ``(num_kv_heads, batch_size, num_splits)`` and v1's merge
    kernel ``(num_kv_heads, cdiv(batch_size * group, 16))``. A ``[batch_size, num_qo_heads,
    num_splits, head_dim_pow2]`` fp32 workspace is allocated per call. CUDA-graph safe after
    one warm-up call with the same rotation tensor.
    """
    B, HQ, D = q.shape
    HKV = k_cur.shape[1]
    assert HKV > 0 and HQ % HKV == 0, f"num_qo_heads {HQ} not a multiple of num_kv_heads {HKV}"
    gq = HQ // HKV
    require_kernel("decode_attention_v2", v2_unsupported_reason(view, gq),
                   rq_decode_v2_split_kernel, q)
    out = check_decode_args(q, k_cur, v_cur, view, loop_id, kv_indptr, kv_indices, out)
    dev = q.device

    seg = view.segments[loop_id]
    a = seg.base
    a_bits = view.segments[a].bits
    ac, am = _words(view.codes[a], torch.int32), view.meta[a]
    if seg.role == "anchor" or seg.bits == 0:
        r_bits, rc, rm = 0, ac, am
    else:
        r_bits = seg.bits
        rc = _words(view.codes[loop_id], torch.int32)
        rm = view.meta[loop_id]
    has_coef = seg.role != "anchor" and view.coef[loop_id] is not None
    cf = view.coef[loop_id] if has_coef else view.codes[a]
    cf_st = _strides3(view.coef[loop_id]) if has_coef else (0, 0, 0)
    g = view.cfg.group_size
    dp = next_pow2(D)
    gqp = next_pow2(gq)
    ngp = dp // g
    if frame_split is None:
        frame_split = gqp > 1
    if k_idp is None:  # the anchor-only loop is as fast or faster with FFMA dots (H200 sweep)
        k_idp = gqp == 1 and not frame_split and r_bits > 0
    assert not k_idp or (gqp == 1 and not frame_split), "k_idp needs MHA without frame_split"
    # Defaults from the H200 sweeps (docs/kernels_history.md): integer K dots run best with two rows
    # per thread (64-token tiles, uncapped 255 registers, 2 programs/SM); the FFMA path with
    # one row per thread capped at 128 registers (4 programs/SM).
    if block_n is None:
        block_n = 64 if k_idp else (32 if ngp * (g // 16 if frame_split else 1) >= 4 else 64)
    interp = interpreting(rq_decode_v2_split_kernel)
    if maxnreg == -1:
        maxnreg = 128 if gqp == 1 and num_warps == 4 and not k_idp else None
    launch = dict(num_warps=num_warps, num_stages=num_stages)
    if maxnreg and not interp:
        launch["maxnreg"] = maxnreg
    if ctas_per_sm is None:  # resident programs per SM (AOT sm_90: 128 regs MHA FFMA, else 255)
        ctas_per_sm = (4 if gqp == 1 and not k_idp else 2) * 4 // num_warps
    splits = num_splits or choose_num_splits_v2(B, HKV, kv_indices.numel(), dev,
                                                block_n=block_n, ctas_per_sm=ctas_per_sm)
    terms, alpha, nterms = rotation_terms(view.rotation, dp, dev)
    rot = (terms, terms.stride(0) if terms.dim() == 4 else 0,
           terms.stride(1) if terms.dim() == 4 else 0, dp, alpha)
    has_rot = view.rotation is not None
    pool = [t for t in (ac, am, rc, rm, cf) if t.numel()]
    idx64 = max(sum((n - 1) * st for n, st in zip(t.shape, t.stride())) for t in pool) >= 2**31
    mid_o = torch.empty(B, HQ, splits, dp, dtype=torch.float32, device=dev)
    mid_ml = torch.empty(B, HQ, splits, 2, dtype=torch.float32, device=dev)
    qk_scale = sm_scale * LOG2E
    rq_decode_v2_split_kernel[(HKV, B, splits)](
        q, q.stride(0), q.stride(1), kv_indptr, kv_indices,
        ac, *_strides3(ac), am, *_strides3(am), rc, *_strides3(rc), rm, *_strides3(rm),
        cf, *cf_st, *rot, mid_o, mid_ml, qk_scale, splits, HQ, 0x3F800000,
        GQ=gq, GQP=gqp, D=D, DP=dp, G=g, NG=D // g, NGP=ngp, A_BITS=a_bits, R_BITS=r_bits,
        HAS_COEF=has_coef, HAS_ROT=has_rot, TERMS=nterms, BLOCK_N=block_n, FSPLIT=frame_split,
        PREFETCH=prefetch, IDX64=idx64, K_IDP=k_idp,
        INTERP=interp, **launch)
    block_m = 16
    rq_decode_merge_kernel[(HKV, cdiv(B * gq, block_m))](
        q, q.stride(0), q.stride(1), k_cur, k_cur.stride(0), k_cur.stride(1),
        v_cur, v_cur.stride(0), v_cur.stride(1), mid_o, mid_ml, *rot,
        out, out.stride(0), out.stride(1), B * gq, qk_scale, splits,
        GQ=gq, D=D, DP=dp, HAS_ROT=has_rot, TERMS=nterms, BLOCK_M=block_m, INTERP=interp,
        num_warps=4)
    return out
