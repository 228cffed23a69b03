"""Extend (prefill) attention over a compressed prefix, through a bounded BF16 workspace.

DESIGN.md section 4 allows it ("a first version may dequantize the prefix into a workspace and
run a stock kernel"); vLLM's MLA chunked-context prefill works the same way. It replaced a fused
Triton kernel (prefix dequantized tile by tile in registers, Ampere-style MMAs) that took
1.94-2.66x the time of FlashAttention on the H200 (its best launch per shape), against
1.19-1.51x for this path
(benchmarks/bench_extend.py, docs/kernels.md; the fused kernel is in git history). Per call:

1. ``q' = q R`` per KV head, once (`rq_rotate_query_kernel`), with the ``GQ`` query heads of a
   KV head laid on the sequence axis (``[num_kv_heads, num_tokens * GQ, D]`` bf16, row
   ``t * GQ + g``): the prefix is attended non-causally, so the rows need no mask and K/V are
   never expanded;
2. the concatenated prefixes (``kv_indices``) in slabs of at most `WORKSPACE_TOKENS` rows:
   `reconstruct_rows` writes a slab's K'/V' (rotated basis) into the workspace in one launch,
   then one variable-length FlashAttention call attends every request's rows to its part of
   the slab and returns the log-sum-exp; slabs merge by LSE (one slab: the call's outputs are
   read where they lie, no fp32 accumulator);
3. every request's chunk attends to itself causally (original basis, GQA natively), all
   chunks in one variable-length call; one launch (`rq_extend_merge_kernel`) un-rotates the
   prefix output (``o' R^T``) and merges the two by LSE into ``out``.

So a prefill batch of B requests costs the same launches as one request: 2 FlashAttention
calls and 3 Triton launches per (layer, loop), plus one reconstruct and one FlashAttention
call per further slab (before 2026-12-02 it was 2 FlashAttention calls per request).

A mixed batch (SGLang's ``--enable-mixed-chunk``: running decodes appended after the prefill
chunks as one-row requests) would reconstruct every decode row's whole history into bf16; the
trailing run of one-row requests goes to `rq_kernels.decode.decode_attention` instead, which
reads the compressed rows once (the H200 whole-card run of 2026-12-01 slowed TPOT 2.1x before
this split).

LSEs are natural-log ``log sum exp(sm_scale q.k)`` (FlashAttention's convention). Rotations run
in fp32. The host needs the lengths: one ``.tolist()`` of both indptrs per call (extend is never
captured in a CUDA graph), unless the caller passes them (``host_indptrs``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rq_kernels._host import (
    cdiv, check_extend_args, interpreting, launch_kernel, next_pow2, require_kernel,
    rotation_args, unsupported_reason,
)
from rq_kernels.decode import decode_attention
from rq_kernels.reconstruct import launch_reconstruct
from rq_kernels.triton.extend import rq_extend_merge_kernel
from rq_kernels.triton.query import rq_rotate_query_kernel
from rq_kernels.triton.reconstruct import rq_reconstruct_kernel

if TYPE_CHECKING:
    from rq_kernels.view import CompressedLayerView

# Prefix tokens reconstructed per slab. The workspace is WORKSPACE_TOKENS x num_kv_heads x
# head_dim x 2 (K, V) bf16: 128 MiB for Ouro-1.4B (16 x 128), 24 MiB for SmolLM2 (3 x 64).
# NOTE: tests monkeypatch it to exercise slab boundaries; it is not a launch parameter.
WORKSPACE_TOKENS = 16384

# FlashAttention-2's variable-length forward, the overload resolved once (not on every call)
_FLASH_VARLEN = torch.ops.aten._flash_attention_forward.default


def _attend_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
                     cu_k: torch.Tensor, host_q: list[int], host_k: list[int], *, causal: bool,
                     scale: float, empty_lse_any_inf: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Variable-length attention: sequence ``i`` is the rows ``host_q[i]:host_q[i+1]`` of ``q``
    ``[Lq, Hq, D]`` over the rows ``host_k[i]:host_k[i+1]`` of ``k``/``v`` ``[Lk, Hkv, D]``
    (bf16, ``Hq % Hkv == 0``: query head ``h`` reads KV head ``h // (Hq / Hkv)``; last dim
    contiguous, any row and head strides; ``host_q[-1] == Lq``; causal only where each sequence
    has as many keys as queries). ``cu_q``/``cu_k``: the same offsets as ``int32`` tensors on
    q's device. Returns out ``[Lq, Hq, D]`` bf16 and lse ``[Hq, Lq]`` fp32 (natural log); a
    sequence without keys gets out 0 and lse ``-inf`` (``empty_lse_any_inf``: ``-inf`` or
    ``+inf``, for a caller that reads both as empty: two launches fewer).

    CUDA: one FlashAttention-2 varlen call (``aten::_flash_attention_forward`` with
    ``cum_seq_q``/``cum_seq_k``) on the sequence-major layout as it lies (GQA natively: no K/V
    expansion, no transposes); FlashAttention writes lse ``+inf`` for a sequence without keys,
    turned into ``-inf`` here. CPU (interpreter tests): the same maths in fp32 per sequence
    (unnormalised ``P`` rounded to q's dtype for ``P V``, as the flash kernel does)."""
    lq, hq, d = q.shape
    lens = [(host_q[i + 1] - host_q[i], host_k[i + 1] - host_k[i]) for i in range(len(host_q) - 1)]
    if q.is_cuda:
        out, lse = _FLASH_VARLEN(
            q, k, v, cu_q, cu_k, max(m for m, _ in lens), max(n for _, n in lens), 0.0, causal,
            False, scale=scale)[:2]
        if not empty_lse_any_inf and any(m and not n for m, n in lens):
            lse.masked_fill_(lse == float("inf"), float("-inf"))
        return out, lse
    group = hq // k.shape[1]
    out = torch.zeros(lq, hq, d, dtype=q.dtype, device=q.device)
    lse = torch.full((hq, lq), float("-inf"), dtype=torch.float32, device=q.device)
    for i, (m, n) in enumerate(lens):
        if not (m and n):
            continue
        qs, ks = slice(host_q[i], host_q[i + 1]), slice(host_k[i], host_k[i + 1])
        kx = k[ks].float().repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, n, D]
        vx = v[ks].float().repeat_interleave(group, dim=1).transpose(0, 1)
        s = torch.matmul(q[qs].float().transpose(0, 1), kx.transpose(-1, -2)) * scale
        if causal:
            keep = torch.ones(m, n, dtype=torch.bool, device=s.device).tril(n - m)
            s = s.masked_fill(~keep, float("-inf"))
        mx = s.amax(dim=-1, keepdim=True)  # finite: every row sees a key
        p = torch.exp(s - mx)
        den = p.sum(dim=-1, keepdim=True)
        out[qs] = (torch.matmul(p.to(q.dtype).float(), vx) / den).transpose(0, 1).to(q.dtype)
        lse[:, qs] = (mx + torch.log(den)).squeeze(-1)
    return out, lse


def _merge_into(acc: torch.Tensor, acc_lse: torch.Tensor, o: torch.Tensor, lse: torch.Tensor
                ) -> None:
    """``(acc, acc_lse) <- LSE merge of (acc, acc_lse) and (o, lse)``, in place: acc
    ``[..., D]`` fp32, acc_lse ``[...]`` fp32; ``-inf`` marks an empty side (its output 0)."""
    new = torch.logaddexp(acc_lse, lse)
    acc.mul_(torch.exp(acc_lse - new).nan_to_num_(0.0).unsqueeze(-1))  # nan: both empty
    acc.add_(o.float() * torch.exp(lse - new).nan_to_num_(0.0).unsqueeze(-1))
    acc_lse.copy_(new)


def extend_attention(q: torch.Tensor, k_cur: torch.Tensor, v_cur: torch.Tensor,
                     view: CompressedLayerView, loop_id: int, qo_indptr: torch.Tensor,
                     kv_indptr: torch.Tensor, kv_indices: torch.Tensor, *, sm_scale: float,
                     out: torch.Tensor | None = None,
                     host_indptrs: tuple[list[int], list[int]] | None = None) -> torch.Tensor:
    """Extend attention of loop ``loop_id``: each request's compressed prefix, then its chunk
    (the module docstring says how).

    Parameters
    ----------
    q:
        ``[num_tokens, num_qo_heads, head_dim]``, ``torch.bfloat16``, ``cuda``: the chunk's
        queries, requests concatenated (``qo_indptr``).
    k_cur, v_cur:
        ``[num_tokens, num_kv_heads, head_dim]``, ``torch.bfloat16``, ``cuda``: the chunk's own
        K/V (full precision, original basis), attended causally.
    view:
        The layer's `CompressedLayerView` (read only).
    loop_id:
        Loop whose K/V are attended (its anchor plus its residual).
    qo_indptr:
        ``[batch_size + 1]``, ``torch.int32``, ``cuda``: request b's chunk rows.
    kv_indptr:
        ``[batch_size + 1]``, ``torch.int32``, ``cuda``: request b's prefix is
        ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` (may be empty); the chunk follows it.
    kv_indices:
        ``[nnz]``, ``torch.int64``, ``cuda``: pool rows of the compressed prefixes.
    sm_scale:
        Softmax scale.
    out:
        Optional ``[num_tokens, num_qo_heads, head_dim]`` output (q's dtype).
    host_indptrs:
        Optional ``(qo_indptr, kv_indptr)`` as host lists, equal to the tensors (the serving
        backend has them from SGLang's host lengths). Without them the lengths are read with
        one host sync per call; with them the call never syncs (CUDA-graph capturable).

    Returns
    -------
    ``[num_tokens, num_qo_heads, head_dim]``, original basis, q's dtype.

    Raises
    ------
    ValueError
        For a format outside `rq_kernels._host.unsupported_reason` or CPU tensors outside
        ``TRITON_INTERPRET=1`` (the caller runs the twin,
        `sglang_rq.reference.extend_attention_reference`).
    AssertionError
        For malformed arguments (shapes, dtypes, devices, indptr values), as the decode
        launcher.

    Note
    ----
    Memory beside the workspace: the rotated queries (bf16), the chunk's output and, unless one
    request's prefix fits one slab, a prefix accumulator (fp32 ``[num_tokens, num_qo_heads,
    head_dim]`` plus its LSE).
    """
    require_kernel("extend_attention", unsupported_reason(view), rq_reconstruct_kernel, q)
    given = out is not None
    out = check_extend_args(q, k_cur, v_cur, view, loop_id, qo_indptr, kv_indptr, kv_indices,
                            out)
    if host_indptrs is None:
        qp, kp = torch.stack([qo_indptr, kv_indptr]).tolist()  # the one host sync
    else:
        qp, kp = (list(x) for x in host_indptrs)
        assert len(qp) == len(kp) == qo_indptr.shape[0], "host_indptrs vs qo_indptr length"
    # the values, on the host already: a bad plan would read out of bounds on the GPU (rows
    # past qo_indptr[-1], e.g. padding, are left unwritten)
    assert qp[0] == 0 and qp[-1] <= q.shape[0] and all(a <= b for a, b in zip(qp, qp[1:])), (
        f"qo_indptr must rise from 0 to at most num_tokens={q.shape[0]}, got "
        f"{qp[:4]}...{qp[-2:]}")
    assert 0 <= kp[0] and kp[-1] <= kv_indices.shape[0] and all(
        a <= b for a, b in zip(kp, kp[1:])), (
        f"kv_indptr must rise within kv_indices' {kv_indices.shape[0]} rows, got "
        f"{kp[:4]}...{kp[-2:]}")
    B = len(qp) - 1
    b0 = B  # the trailing one-row requests [b0, B): decode rows of a mixed batch
    while b0 > 0 and qp[b0] - qp[b0 - 1] == 1:
        b0 -= 1
    r0 = qp[b0]
    if b0 < B:
        decode_attention(q[r0:], k_cur[r0:], v_cur[r0:], view, loop_id,
                         kv_indptr[b0:] - kp[b0], kv_indices[kp[b0]:kp[B]], sm_scale=sm_scale,
                         out=out[r0:])
    # the chunk requests [0, b0) (none when b0 == 0: it returns at once)
    if b0 == B and r0 == q.shape[0]:  # no decode rows, no padding: nothing to slice
        res = _workspace_extend(q, k_cur, v_cur, view, loop_id, qo_indptr, kv_indptr, qp, kp,
                                kv_indices, sm_scale, out, out_given=given)
    else:
        res = _workspace_extend(q[:r0], k_cur[:r0], v_cur[:r0], view, loop_id,
                                qo_indptr[:b0 + 1], kv_indptr[:b0 + 1], qp[:b0 + 1],
                                kp[:b0 + 1], kv_indices, sm_scale, out[:r0], out_given=True)
    return out if res is None else res


def _workspace_extend(q: torch.Tensor, k_cur: torch.Tensor, v_cur: torch.Tensor,
                      view: CompressedLayerView, loop_id: int, qo_indptr: torch.Tensor,
                      kv_indptr: torch.Tensor, qp: list[int], kp: list[int],
                      kv_indices: torch.Tensor, sm_scale: float, out: torch.Tensor, *,
                      out_given: bool = True) -> torch.Tensor | None:
    """`extend_attention` through the workspace (module docstring, steps 1-3) into ``out``;
    ``qo_indptr``/``kv_indptr``: ``[B + 1]`` int32 on q's device, ``qp``/``kp`` the same as host
    lists. Returns None, or (``out_given`` False: ``out`` is a fresh buffer covering every row)
    the chunk attention's own output instead of a copy into ``out`` when no prefix is read."""
    T, HQ, D = q.shape
    HKV = k_cur.shape[1]
    GQ = HQ // HKV
    if T == 0:
        return None
    assert qp[-1] == T, "the chunk rows are q's rows"
    # every chunk over itself, causal, original basis, in one call: [T, Hq, D] and [Hq, T]
    o_c, lse = _attend_with_lse(q, k_cur, v_cur, qo_indptr, qo_indptr, qp, qp, causal=True,
                                scale=sm_scale)
    lse_c = lse.transpose(0, 1)
    if not any(kp[b] < kp[b + 1] and qp[b] < qp[b + 1] for b in range(len(qp) - 1)):
        if not out_given:
            return o_c
        out.copy_(o_c)  # no request with rows has a prefix
        return None
    rot, nterms = rotation_args(view, next_pow2(D), q.device)
    o_p, lse_p = _prefix_attention(q, view, loop_id, qo_indptr, kv_indptr, qp, kp, kv_indices,
                                   sm_scale, rot, nterms)
    assert o_p.stride(-1) == o_c.stride(-1) == out.stride(-1) == 1, "rows must be contiguous"
    block_m = 64
    launch_kernel(rq_extend_merge_kernel, (HKV, cdiv(T * GQ, block_m)), (
        o_p, o_p.stride(0), o_p.stride(1), lse_p, lse_p.stride(0), lse_p.stride(1),
        o_c, o_c.stride(0), o_c.stride(1), lse_c, lse_c.stride(0), lse_c.stride(1),
        *rot, out, out.stride(0), out.stride(1), T * GQ), dict(
        GQ=GQ, D=D, DP=next_pow2(D), HAS_ROT=view.rotation is not None, TERMS=nterms,
        BLOCK_M=block_m, INTERP=interpreting(rq_extend_merge_kernel)), num_warps=4)
    return None


def _prefix_attention(q: torch.Tensor, view: CompressedLayerView, loop_id: int,
                      qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, qp: list[int],
                      kp: list[int], kv_indices: torch.Tensor, sm_scale: float, rot: tuple,
                      nterms: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every request's chunk over its compressed prefix, slab by slab, one FlashAttention call
    per slab: output ``[Hkv, T*GQ, D]`` in the rotated basis and LSE ``[Hkv, T*GQ]`` fp32
    (``-inf`` or, with one slab, ``+inf``; output 0: no prefix). With one slab the call's bf16
    output and LSE are returned as they are; otherwise the slabs merge in fp32. The caller guarantees that some request with
    chunk rows has a prefix; ``rot``, ``nterms``: `rotation_args` at the padded head_dim."""
    T, HQ, D = q.shape
    HKV = view.codes[0].shape[2]
    GQ = HQ // HKV
    dp = next_pow2(D)
    # q' = q R with the GQ query heads of a KV head on the row axis (row t * GQ + g), bf16
    qh = torch.empty(HKV, T * GQ, D, dtype=torch.bfloat16, device=q.device)
    launch_kernel(rq_rotate_query_kernel, (HKV, cdiv(T * GQ, 64)), (
        q, q.stride(0), q.stride(1), *rot, qh, GQ * D, T * GQ * D, D, T * GQ), dict(
        GQ=GQ, D=D, DP=dp, HAS_ROT=view.rotation is not None, TERMS=nterms, BLOCK_M=64,
        INTERP=interpreting(rq_rotate_query_kernel)), num_warps=4)
    qx = qh.transpose(0, 1)  # [T*GQ, Hkv, D]: request b's rows are qp[b]*GQ:qp[b+1]*GQ
    B = len(qp) - 1
    slab = min(WORKSPACE_TOKENS, kp[-1] - kp[0])
    ws_k, ws_v = torch.empty(2, slab, HKV, D, dtype=torch.bfloat16, device=q.device).unbind(0)
    if slab == kp[-1] - kp[0]:  # one slab: every request in one call, its outputs returned
        launch_reconstruct(view, loop_id, kv_indices[kp[0]:kp[-1]], ws_k, ws_v)
        o, lse = _attend_with_lse(qx, ws_k, ws_v, qo_indptr * GQ if GQ > 1 else qo_indptr,
                                  kv_indptr - kp[0] if kp[0] else kv_indptr,
                                  [x * GQ for x in qp], [x - kp[0] for x in kp], causal=False,
                                  scale=sm_scale, empty_lse_any_inf=True)
        return o.transpose(0, 1), lse  # [Hkv, T*GQ, D], [Hkv, T*GQ]
    acc = torch.zeros(HKV, T * GQ, D, dtype=torch.float32, device=q.device)
    acc_lse = torch.full((HKV, T * GQ), float("-inf"), dtype=torch.float32, device=q.device)
    for lo in range(kp[0], kp[-1], slab):
        hi = min(lo + slab, kp[-1])
        # the requests [b0, b1] own the slab's rows (those between them own whole prefixes);
        # a slab owned only by requests without chunk rows is skipped
        own = [b for b in range(B) if kp[b] < hi and kp[b + 1] > lo and qp[b] < qp[b + 1]]
        if not own:
            continue
        b0, b1 = own[0], own[-1] + 1
        launch_reconstruct(view, loop_id, kv_indices[lo:hi], ws_k[:hi - lo], ws_v[:hi - lo])
        s, e = qp[b0] * GQ, qp[b1] * GQ
        cu_q = (qo_indptr[b0:b1 + 1] - qp[b0]) * GQ
        cu_k = (kv_indptr[b0:b1 + 1] - lo).clamp_(0, hi - lo)
        o, lse = _attend_with_lse(
            qx[s:e], ws_k[:hi - lo], ws_v[:hi - lo], cu_q, cu_k,
            [(x - qp[b0]) * GQ for x in qp[b0:b1 + 1]],
            [min(max(x - lo, 0), hi - lo) for x in kp[b0:b1 + 1]], causal=False, scale=sm_scale)
        _merge_into(acc[:, s:e], acc_lse[:, s:e], o.transpose(0, 1), lse)
    return acc, acc_lse
