"""Launcher of decode attention over the compressed cache: one split kernel per request split,
then the LSE merge.

Three split kernels serve one signature (`decode_attention`); the launcher picks:

* ``tc`` wherever it serves the format (`rq_kernels.decode_tc.tc_unsupported_reason`: CUDA with
  compute capability >= 8.9, head_dim 64/96/128, 2/4-bit anchor, 0/2/4-bit residual, group 32,
  or 64 at head_dim 128):
  `csrc/rq_decode_tc.cu`, CUDA C++ on tensor cores (mma.sync fp16, or u8 x s8 for the K side
  where the query rows fit 4 columns; magic-number unpacking, a cp.async pipeline per warp), after
  a Triton pre-kernel that rotates the query where the kernel does not;
* else ``fma`` for MHA: `rq_kernels/triton/decode_fma.py`, CUDA cores: exact fp32 codes from one
  LOP3 + FFMA, K logits as integer ``dp4a`` dots against a 16-bit fixed-point query;
* else ``mma``: `rq_kernels/triton/decode_mma.py`, Triton on tensor cores: PTX magic-number fp16
  codes times a block-diagonal query holding every head of the group.

All write an unnormalised rotated-basis output per split; `rq_decode_merge_kernel` reduces the
splits by log-sum-exp, un-rotates once and adds the in-flight token at full precision. The
H200 measurements behind the choice and the defaults: docs/kernels.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import torch

from rq_kernels import cuda
from rq_kernels._host import (
    attention_loop_args, cdiv, check_decode_args, interpreting, next_pow2, pdl_capable,
    require_kernel, rotation_args, strides3, unsupported_reason,
)
from rq_kernels.decode_tc import (
    balanced_rows, carveout_percent, integer_k, merge_counters, query_rotation, tc_plan, tc_split,
    tc_unsupported_reason,
)
from rq_kernels.triton.decode_fma import rq_decode_fma_split_kernel
from rq_kernels.triton.decode_mma import rq_decode_merge_kernel, rq_decode_mma_split_kernel
from rq_kernels.triton.query import rq_rotate_query_kernel

if TYPE_CHECKING:
    from rq_kernels.view import CompressedLayerView

LOG2E = 1.4426950408889634
SPLIT_KERNELS = ("tc", "fma", "mma")
MERGE_TILE = 128  # (row, split) pairs the merge kernel loads per iteration at head_dim <= 128
MMA_ROWS = 16  # rows of one tensor-core tile (the merge's un-rotation)


@dataclass(frozen=True)
class DecodeLaunch:
    """Launch overrides of `decode_attention` (None: the H200-sweep default).

    ``split_kernel``: ``"tc"``, ``"fma"`` or ``"mma"`` (default: see the module docstring);
    ``num_splits``: equal splits per request's history (default: tc `decode_tc.tc_plan`'s
    count of whole waves, made token-balanced splits shared by the batch where B > 1,
    `decode_tc.tc_split`; the Triton kernels `choose_num_splits`, one wave);
    ``block_n``: history tokens per tile (fma: 64 on loops with a residual, else 32 or 64 by
    group count; mma: 32, and at least 32 on CUDA; tc: fixed 16, refused if set);
    ``pdl``: launch the query rotation, the tc split kernel and the merge as programmatic
    dependents (default: where the GPU can, `rq_kernels._host.pdl_capable`; measured in
    `benchmarks/results/h200_2026-12-02e_decode_pdl_ab.json`).
    """

    split_kernel: str | None = None
    num_splits: int | None = None
    block_n: int | None = None
    pdl: bool | None = None

    def __post_init__(self) -> None:
        if self.split_kernel not in (None, *SPLIT_KERNELS):
            raise ValueError(f"DecodeLaunch.split_kernel must be one of {SPLIT_KERNELS}, "
                             f"got {self.split_kernel!r}")


def merge_shape(rows: int, padded_dim: int, rotated: bool) -> tuple[int, int, int]:
    """``rq_decode_merge_kernel``'s ``(BLOCK_M, SPLITS_PER_ITER, ROW_REPS)`` for ``rows`` (request,
    query head) rows (B x group) of ``padded_dim`` columns: few rows (small batch) take many
    splits per iteration, so ``[BLOCK_M, splits, padded_dim]`` holds at most MERGE_TILE x 128
    fp32; under a rotation, fewer than 16 rows are repeated to one tensor-core tile."""
    block_m = min(MMA_ROWS, next_pow2(rows))
    per_iter = max(1, MERGE_TILE // block_m * 128 // max(padded_dim, 128))
    return block_m, per_iter, MMA_ROWS // block_m if rotated else 1


@lru_cache(maxsize=8)
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def choose_num_splits(batch_size: int, num_kv_heads: int, nnz: int, device: torch.device, *,
                      block_n: int, programs_per_sm: int) -> int:
    """Splits per request so that ``num_kv_heads * batch_size * splits`` programs fill about one
    wave of ``programs_per_sm * SMs`` (equal-length programs, so a partly filled extra wave
    costs a whole one), each split at least 4 tiles of ``block_n``. Host-only: uses ``nnz``
    (the total history tokens), never a device read, so it is CUDA-graph friendly."""
    avg = max(1, nnz // max(1, batch_size))
    most = max(1, cdiv(avg, 4 * block_n))
    if device.type != "cuda":
        return min(most, 3)
    want = (programs_per_sm * _num_sms(device.index or 0)) // (batch_size * num_kv_heads)
    return max(1, min(want, most))


def fma_unsupported_reason(view: CompressedLayerView, group: int) -> str | None:
    """Why the CUDA-core split kernel cannot serve ``view`` with ``group`` query heads per KV
    head (None if it can): a fused format (`unsupported_reason`), MHA, a quantization group of
    a multiple of 16 elements, and every stored loop's codes as whole, aligned int32 words."""
    why = unsupported_reason(view)
    if why is not None:
        return why
    if group != 1:
        return f"{group} query heads per KV head (the CUDA-core kernel is MHA only)"
    if view.cfg.group_size % 16:
        return f"group_size={view.cfg.group_size} not a multiple of 16"
    for i, seg in enumerate(view.segments):
        c = view.codes[i]
        if seg.bits and (seg.code_bytes % 4 or any(s % 4 for s in c.stride()[:-1])
                         or c.data_ptr() % 4):
            return f"codes[{i}] are not whole aligned int32 words"
    return None


def decode_attention(q: torch.Tensor, k_cur: torch.Tensor, v_cur: torch.Tensor,
                     view: CompressedLayerView, loop_id: int, kv_indptr: torch.Tensor,
                     kv_indices: torch.Tensor, *, sm_scale: float, out: torch.Tensor | None = None,
                     launch: DecodeLaunch | None = None) -> torch.Tensor:
    """Decode attention of loop ``loop_id`` over the compressed history plus the in-flight token.

    Parameters
    ----------
    q:
        ``[batch_size, num_qo_heads, head_dim]``, ``torch.bfloat16``, ``cuda``.
    k_cur, v_cur:
        ``[batch_size, num_kv_heads, head_dim]``, ``torch.bfloat16``, ``cuda``: this step's
        token (full precision, original basis); ``num_qo_heads % num_kv_heads == 0``.
    view:
        The layer's `CompressedLayerView` (read only).
    loop_id:
        Loop whose K/V are attended: its anchor plus its own residual (anchor loop: anchor only).
    kv_indptr:
        ``[batch_size + 1]``, ``torch.int32``, ``cuda``: request b's history is
        ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` (may be empty).
    kv_indices:
        ``[nnz]``, ``torch.int64``, ``cuda``: pool rows of the history (in-flight token excluded).
    sm_scale:
        Softmax scale (``1/sqrt(head_dim)`` usually).
    out:
        Optional ``[batch_size, num_qo_heads, head_dim]`` output (q's dtype).
    launch:
        `DecodeLaunch` overrides (tests and benchmarks); None for the defaults.

    Returns
    -------
    ``[batch_size, num_qo_heads, head_dim]`` in the original basis, q's dtype.

    Raises
    ------
    ValueError
        For a format the kernels do not fuse (`rq_kernels._host.unsupported_reason`), CPU tensors
        outside ``TRITON_INTERPRET=1``, or a launch the chosen split kernel cannot run; the
        caller runs the twin `sglang_rq.reference.decode_attention_reference` instead.
    AssertionError
        For malformed arguments (shapes, dtypes, devices).

    Note
    ----
    Two launches: the split kernel ``(num_kv_heads, batch_size, num_splits)`` (tc:
    ``cdiv(rows * num_kv_heads, 4)`` CTAs of 4 warps, `decode_tc.tc_split`) and the merge kernel
    ``(num_kv_heads, cdiv(batch_size * group, 16))``. For ``tc``, three under a rotation other
    than a (signed) Sylvester Hadamard (the query rotation first; the tc split kernel applies
    such a Hadamard to the query itself), and one without rotation or under such a Hadamard
    (the split kernel merges its splits itself; `decode_tc.merge_counters`, reserved before
    graph capture by `decode_tc.reserve_merge_counters`). Each launch (sm_90+) is a programmatic
    dependent that starts while the kernel before it runs (the tc split kernel copies its first
    history tiles before waiting for the query; all three prefer one shared-memory carveout,
    `decode_tc.carveout_percent`); a ``[batch_size, num_qo_heads, num_splits, head_dim_pow2]``
    fp32 workspace is allocated per call. CUDA-graph safe once the view is prepared
    (`rq_kernels.prepare_view`) or after one eager call (which also compiles and loads a tc
    variant).
    """
    launch = launch or DecodeLaunch()
    B, HQ, D = q.shape
    HKV = k_cur.shape[1]
    assert HKV > 0 and HQ % HKV == 0, f"num_qo_heads {HQ} not a multiple of num_kv_heads {HKV}"
    gq = HQ // HKV
    kernel = launch.split_kernel
    if kernel is None:
        kernel = ("tc" if tc_unsupported_reason(view, loop_id, gq, q.device) is None else
                  "fma" if fma_unsupported_reason(view, gq) is None else "mma")
    if kernel == "tc":
        if launch.block_n is not None:
            raise ValueError("DecodeLaunch.block_n does not apply to the tc split kernel "
                             "(16-token tiles)")
        require_kernel("decode_attention (tc)", tc_unsupported_reason(view, loop_id, gq, q.device),
                       rq_rotate_query_kernel, q)
    elif kernel == "fma":
        require_kernel("decode_attention (fma)", fma_unsupported_reason(view, gq),
                       rq_decode_fma_split_kernel, q)
    else:
        require_kernel("decode_attention", unsupported_reason(view), rq_decode_mma_split_kernel, q)
    out = check_decode_args(q, k_cur, v_cur, view, loop_id, kv_indptr, kv_indices, out)
    dev = q.device
    args, c = attention_loop_args(view, loop_id)
    dp = c["DP"]
    rot, nterms = rotation_args(view, dp, dev)
    has_rot = view.rotation is not None
    interp = interpreting(rq_decode_mma_split_kernel)
    pdl = not interp and (pdl_capable(dev) if launch.pdl is None else launch.pdl)
    qk_scale = sm_scale * LOG2E
    split_rows = None  # the tc kernel's balanced rows per request, where the merge kernel merges
    if kernel == "tc":
        q_split = q  # the split kernel rotates the query itself, or needs none
        if query_rotation(view, dev)[0] == 0:  # any other rotation: the rotation kernel first
            q_split = torch.empty(B, HQ, D, dtype=torch.float32, device=dev)
            rotate = rq_rotate_query_kernel[(HKV, cdiv(B * gq, 16))](
                q, q.stride(0), q.stride(1), *rot, q_split, HQ * D, gq * D, D, B * gq, GQ=gq,
                D=D, DP=dp, HAS_ROT=has_rot, TERMS=nterms, BLOCK_M=16, INTERP=interp, PDL=pdl,
                num_warps=4, launch_pdl=pdl)
            if not interp:
                cuda.set_carveout(rotate.function, carveout_percent(dev.index))
        occupancy, splits = tc_plan(B, HKV, kv_indices.numel(), _num_sms(dev.index or 0),
                                    integer_k(gq, view.head_dim, view.cfg.group_size),
                                    splits=launch.num_splits)
        # token-balanced splits unless the caller fixed the count (for one request equal splits
        # already are)
        balanced = not launch.num_splits and B > 1
        rows = balanced_rows(B, splits) if balanced else splits  # split rows per pair's merge
        counters = merge_counters(dev, B * HKV, rows, gq) if q_split is q else None
        mid_o, mid_ml, split_rows = tc_split(
            q_split, kv_indptr, kv_indices, view, loop_id, HKV, qk_scale, splits, occupancy,
            balanced=balanced, pdl=pdl,
            merge=None if counters is None else (k_cur, v_cur, out, counters))
        if counters is not None:  # the split kernel merged its splits itself
            return out
        splits = rows
    elif kernel == "fma":
        mid_o, mid_ml, splits = _fma_split(q, kv_indptr, kv_indices, view, loop_id, args, c,
                                           rot, nterms, has_rot, qk_scale, launch, interp)
    else:
        block_n = launch.block_n or 32
        if block_n < 32 and q.is_cuda:
            # NOTE: measured wrong on the H200 (its 16-row tensor-core path); correct under the
            # interpreter. Refused rather than risked; see docs/kernels_history.md "Decode v2".
            raise ValueError(f"decode_attention: block_n={block_n} < 32 is not supported by the "
                             "tensor-core split kernel on CUDA")
        splits = launch.num_splits or choose_num_splits(B, HKV, kv_indices.numel(), dev,
                                                        block_n=block_n, programs_per_sm=4)
        mid_o = torch.empty(B, HQ, splits, dp, dtype=torch.float32, device=dev)
        mid_ml = torch.empty(B, HQ, splits, 2, dtype=torch.float32, device=dev)
        gqv = max(next_pow2(gq), 16 // c["NGP"])
        rq_decode_mma_split_kernel[(HKV, B, splits)](
            q, q.stride(0), q.stride(1), kv_indptr, kv_indices, *args, *rot, mid_o, mid_ml,
            qk_scale, splits, GQ=gq, GQV=gqv, HAS_ROT=has_rot, TERMS=nterms, BLOCK_N=block_n,
            INTERP=interp, FAST=not interp, num_warps=1, num_stages=3, **c)
    block_m, per_iter, reps = merge_shape(B * gq, dp, has_rot)
    merge = rq_decode_merge_kernel[(HKV, cdiv(B * gq, block_m))](
        q, q.stride(0), q.stride(1), k_cur, k_cur.stride(0), k_cur.stride(1),
        v_cur, v_cur.stride(0), v_cur.stride(1), mid_o, mid_ml,
        mid_ml if split_rows is None else split_rows, *rot,
        out, out.stride(0), out.stride(1), B * gq, qk_scale, splits,
        GQ=gq, D=D, DP=dp, HAS_ROT=has_rot, TERMS=nterms, BLOCK_M=block_m,
        SPLITS_PER_ITER=per_iter, ROW_REPS=reps, INTERP=interp, PDL=pdl,
        BALANCED=split_rows is not None, num_warps=8, launch_pdl=pdl)
    if kernel == "tc" and not interp:
        cuda.set_carveout(merge.function, carveout_percent(dev.index))
    return out


def _words(t: torch.Tensor) -> torch.Tensor:
    """A pool tensor's contiguous last dim reinterpreted as int32 words (same storage)."""
    return t.view(torch.int32) if t.shape[-1] else t


def _fma_split(q, kv_indptr, kv_indices, view, loop_id, args, c, rot, nterms, has_rot, qk_scale,
               launch, interp):
    """The CUDA-core split kernel; returns the merge kernel's inputs and the split count.

    Defaults from the H200 sweeps (docs/kernels_history.md, "Decode v2 with integer K dots"):
    on loops with a residual, integer K dots with two rows per thread (64-token tiles, 255
    registers, 2 programs per SM); on the anchor-only loop exact-fp32 FFMA dots with one row
    per thread, capped at 128 registers (4 programs per SM).
    """
    B, HQ, D = q.shape
    dev = q.device
    r_bits = c["R_BITS"]
    k_idp = r_bits > 0
    block_n = launch.block_n or (64 if k_idp else (32 if c["NGP"] >= 4 else 64))
    per_sm = 2 if k_idp else 4
    splits = launch.num_splits or choose_num_splits(B, HQ, kv_indices.numel(), dev,
                                                    block_n=block_n, programs_per_sm=per_sm)
    seg = view.segments[loop_id]
    ac, aso = _words(view.codes[seg.base]), view.scale_offset[seg.base]
    rc, rso = (_words(view.codes[loop_id]), view.scale_offset[loop_id]) if r_bits else (ac, aso)
    cf, cf_st = args[-4], args[-3:]
    pool = [t for t in (ac, aso, rc, rso, cf) if t.numel()]
    idx64 = max(sum((n - 1) * st for n, st in zip(t.shape, t.stride())) for t in pool) >= 2**31
    opts = dict(num_warps=4, num_stages=2)
    if not k_idp and not interp:
        opts["maxnreg"] = 128
    mid_o = torch.empty(B, HQ, splits, c["DP"], dtype=torch.float32, device=dev)
    mid_ml = torch.empty(B, HQ, splits, 2, dtype=torch.float32, device=dev)
    rq_decode_fma_split_kernel[(HQ, B, splits)](
        q, q.stride(0), q.stride(1), kv_indptr, kv_indices,
        ac, *strides3(ac), aso, *strides3(aso), rc, *strides3(rc), rso, *strides3(rso),
        cf, *cf_st, *rot, mid_o, mid_ml, qk_scale, splits, HQ, 0x3F800000,
        D=D, DP=c["DP"], G=c["G"], NG=c["NG"], NGP=c["NGP"], A_BITS=c["A_BITS"], R_BITS=r_bits,
        HAS_COEF=c["HAS_COEF"], HAS_ROT=has_rot, TERMS=nterms, BLOCK_N=block_n, IDX64=idx64,
        K_IDP=k_idp, INTERP=interp, **opts)
    return mid_o, mid_ml, splits


def default_sm_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
