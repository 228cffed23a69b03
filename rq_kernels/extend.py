"""Extend (prefill) attention over a compressed prefix, through a bounded BF16 workspace.

DESIGN.md section 4 allows it ("a first version may dequantize the prefix into a workspace and
run a stock kernel"); vLLM's MLA chunked-context prefill works the same way. It replaced a fused
Triton kernel (prefix dequantized tile by tile in registers, Ampere-style MMAs) that took
1.94-2.66x the time of FlashAttention on the H200 (its best launch per shape), against
1.19-1.51x for this path (benchmarks/bench_extend.py, docs/kernels.md; the fused kernel is in
git history). Per call, when the batch's prefixes fit `WORKSPACE_TOKENS` rows:

1. ``q' = q R`` (`rq_rotate_rows_kernel`, exact to fp32, then bf16);
2. one launch (`fill_extend_workspace`) writes, request after request, the reconstructed
   prefix (already in the rotated basis: no matmul) and the chunk's own K/V times ``R`` into
   the workspace, the layout of a BF16 variable-length extend;
3. one variable-length FlashAttention call (causal, bottom-right aligned: each chunk row sees
   its whole prefix and the chunk rows up to itself; GQA natively) gives ``o' = o R``;
4. ``o = o' R^T`` (the same rotation kernel) into ``out``.

Without a rotation steps 1 and 4 vanish. So a prefill batch of any size costs three Triton
launches and one FlashAttention call per (layer, loop). (Before 2026-12-02 it was three Triton
launches, two FlashAttention calls per request and an LSE merge; the same-run A/B is in
docs/kernels.md. Rotating back the reconstructed prefix instead, in the reconstruct kernel,
moved the rotation's MMAs from the chunk's rows to the prefix's: 1.1-1.3x slower at Ouro-1.4B
shapes, its A/B in git history.)

Longer batches go slab by slab, in the rotated basis: `reconstruct_rows` writes at most
`WORKSPACE_TOKENS` prefix rows, one variable-length call attends the requests owning them
(non-causal), the chunks attend to themselves in one causal call, the parts merge by
log-sum-exp in fp32 and the merged output is rotated back.

A mixed batch (SGLang's ``--enable-mixed-chunk``: running decodes appended after the prefill
chunks as one-row requests) would reconstruct every decode row's whole history into bf16; the
trailing run of one-row requests goes to `rq_kernels.decode.decode_attention` instead, which
reads the compressed rows once (the H200 whole-card run of 2026-12-01 slowed TPOT 2.1x before
this split).

LSEs are natural-log ``log sum exp(sm_scale q.k)`` (FlashAttention's convention). The host
needs the lengths: one ``.tolist()`` of both indptrs per call (extend is never captured in a
CUDA graph), unless the caller passes them (``host_indptrs``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rq_kernels._host import (
    cdiv, check_extend_args, interpreting, next_pow2, require_kernel, rotation_args,
    unsupported_reason,
)
from rq_kernels.decode import decode_attention
from rq_kernels.reconstruct import fill_extend_workspace, reconstruct_rows
from rq_kernels.triton.reconstruct import rq_reconstruct_kernel
from rq_kernels.triton.rotate import rq_rotate_rows_kernel

if TYPE_CHECKING:
    from rq_kernels.view import CompressedLayerView

# Prefix rows of the workspace (one batch's prefixes, or one slab); the batch's chunk rows come
# on top. WORKSPACE_TOKENS x num_kv_heads x head_dim x 2 (K, V) bf16 is 128 MiB for Ouro-1.4B
# (16 x 128), 24 MiB for SmolLM2 (3 x 64).
# NOTE: tests monkeypatch it to exercise slab boundaries; it is not a launch parameter.
WORKSPACE_TOKENS = 16384


def _attend_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
                     cu_k: torch.Tensor, host_q: list[int], host_k: list[int], *, causal: bool,
                     scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Variable-length attention: sequence ``i`` is the rows ``host_q[i]:host_q[i+1]`` of ``q``
    ``[Lq, Hq, D]`` over the rows ``host_k[i]:host_k[i+1]`` of ``k``/``v`` ``[Lk, Hkv, D]``
    (bf16, ``Hq % Hkv == 0``: query head ``h`` reads KV head ``h // (Hq / Hkv)``; last dim
    contiguous, any row and head strides; ``host_q[-1] == Lq``; causal only where each sequence
    has as many keys as queries). ``cu_q``/``cu_k``: the same offsets as ``int32`` tensors on
    q's device. Returns out ``[Lq, Hq, D]`` bf16 and lse ``[Hq, Lq]`` fp32 (natural log); a
    sequence without keys gets out 0 and lse ``-inf``.

    CUDA: one FlashAttention-2 varlen call (``aten::_flash_attention_forward`` with
    ``cum_seq_q``/``cum_seq_k``) on the sequence-major layout as it lies (GQA natively: no K/V
    expansion, no transposes); FlashAttention writes lse ``+inf`` for a sequence without keys,
    turned into ``-inf`` here. CPU (interpreter tests): the same maths in fp32 per sequence
    (unnormalised ``P`` rounded to q's dtype for ``P V``, as the flash kernel does)."""
    lq, hq, d = q.shape
    lens = [(host_q[i + 1] - host_q[i], host_k[i + 1] - host_k[i]) for i in range(len(host_q) - 1)]
    if q.is_cuda:
        out, lse = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, max(m for m, _ in lens), max(n for _, n in lens), 0.0, causal,
            False, scale=scale)[:2]
        if any(m and not n for m, n in lens):
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
    res = _workspace_extend(q[:r0], k_cur[:r0], v_cur[:r0], view, loop_id, qo_indptr[:b0 + 1],
                            kv_indptr[:b0 + 1], qp[:b0 + 1], kp[:b0 + 1], kv_indices, sm_scale,
                            out[:r0], out_given=given or b0 < B or r0 < q.shape[0])
    return out if res is None else res


def _rotate(x: torch.Tensor, view: CompressedLayerView, *, inverse: bool = False,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """``x R`` (``inverse``: ``x R^T``) per KV head, ``x [N, H, D]`` bf16 or fp32 with ``H`` a
    multiple of the view's KV heads (head ``h`` uses KV head ``h // (H / Hkv)``'s rotation), last
    dim contiguous; into ``out`` (``[N, H, D]`` bf16, allocated if None); ``x`` itself when the
    view has no rotation, ``x`` is bf16 and ``out`` is None."""
    if view.rotation is None and out is None and x.dtype == torch.bfloat16:
        return x
    N, H, D = x.shape
    hkv = view.codes[0].shape[2]
    gq = H // hkv
    dp = next_pow2(D)
    rot, nterms = rotation_args(view, dp, x.device)
    if out is None:
        out = torch.empty(N, H, D, dtype=torch.bfloat16, device=x.device)
    assert x.stride(-1) == out.stride(-1) == 1
    rq_rotate_rows_kernel[(hkv, cdiv(N * gq, 64))](
        x, x.stride(0), x.stride(1), *rot, out, out.stride(0), gq * out.stride(1),
        out.stride(1), N * gq, GQ=gq, D=D, DP=dp, HAS_ROT=view.rotation is not None,
        TERMS=nterms, INVERSE=inverse, SPLIT_X=x.dtype == torch.float32, BLOCK_M=64,
        INTERP=interpreting(rq_rotate_rows_kernel), num_warps=4)
    return out


def _workspace_extend(q: torch.Tensor, k_cur: torch.Tensor, v_cur: torch.Tensor,
                      view: CompressedLayerView, loop_id: int, qo_indptr: torch.Tensor,
                      kv_indptr: torch.Tensor, qp: list[int], kp: list[int],
                      kv_indices: torch.Tensor, sm_scale: float, out: torch.Tensor, *,
                      out_given: bool = True) -> torch.Tensor | None:
    """`extend_attention` through the workspace (module docstring) into ``out``;
    ``qo_indptr``/``kv_indptr``: ``[B + 1]`` int32 on q's device, ``qp``/``kp`` the same as host
    lists. Returns None, or (``out_given`` False: ``out`` is a fresh buffer covering every row)
    the output itself when it was written elsewhere (no copy)."""
    T, HQ, D = q.shape
    HKV = k_cur.shape[1]
    if T == 0:
        return None
    assert qp[-1] == T, "the chunk rows are q's rows"
    B, npre = len(qp) - 1, kp[-1] - kp[0]
    if not any(kp[b] < kp[b + 1] and qp[b] < qp[b + 1] for b in range(B)):
        # no request with rows has a prefix: every chunk over itself, causal, original basis
        o, _ = _attend_with_lse(q, k_cur, v_cur, qo_indptr, qo_indptr, qp, qp, causal=True,
                                scale=sm_scale)
        if not out_given:
            return o
        out.copy_(o)
        return None
    if npre > WORKSPACE_TOKENS:
        _rotate(_slab_extend(q, k_cur, v_cur, view, loop_id, qo_indptr, kv_indptr, qp, kp,
                             kv_indices, sm_scale), view, inverse=True, out=out)
        return None
    ws_k = torch.empty(npre + T, HKV, D, dtype=torch.bfloat16, device=q.device)
    ws_v = torch.empty_like(ws_k)
    cu_k = torch.empty_like(qo_indptr)
    fill_extend_workspace(view, loop_id, kv_indices[kp[0]:kp[-1]], kv_indptr, qo_indptr,
                          k_cur, v_cur, ws_k, ws_v, cu_k)
    o, _ = _attend_with_lse(_rotate(q, view), ws_k, ws_v, qo_indptr, cu_k, qp,
                            [a + b - kp[0] for a, b in zip(qp, kp)], causal=True, scale=sm_scale)
    if view.rotation is None and not out_given:
        return o
    _rotate(o, view, inverse=True, out=out)
    return None


def _slab_extend(q: torch.Tensor, k_cur: torch.Tensor, v_cur: torch.Tensor,
                 view: CompressedLayerView, loop_id: int, qo_indptr: torch.Tensor,
                 kv_indptr: torch.Tensor, qp: list[int], kp: list[int], kv_indices: torch.Tensor,
                 sm_scale: float) -> torch.Tensor:
    """The batch past one workspace, in the rotated basis: each slab of at most
    `WORKSPACE_TOKENS` prefix rows attended by the requests owning it (one variable-length
    call), the chunks over themselves (one causal call), merged by LSE; returns ``o' [T, Hq,
    D]`` fp32 (rotated basis)."""
    T, HQ, D = q.shape
    HKV = k_cur.shape[1]
    B = len(qp) - 1
    qr = _rotate(q, view)
    o, lse = _attend_with_lse(qr, _rotate(k_cur, view), _rotate(v_cur, view), qo_indptr,
                              qo_indptr, qp, qp, causal=True, scale=sm_scale)
    acc, acc_lse = o.float(), lse.transpose(0, 1)  # [T, Hq, D], [T, Hq]
    slab = WORKSPACE_TOKENS
    ws_k = torch.empty(slab, HKV, D, dtype=torch.bfloat16, device=q.device)
    ws_v = torch.empty_like(ws_k)
    for lo in range(kp[0], kp[-1], slab):
        hi = min(lo + slab, kp[-1])
        # the requests [b0, b1) own the slab's rows (those between the ends own whole
        # prefixes); a slab owned only by requests without chunk rows is skipped
        own = [b for b in range(B) if kp[b] < hi and kp[b + 1] > lo and qp[b] < qp[b + 1]]
        if not own:
            continue
        b0, b1 = own[0], own[-1] + 1
        reconstruct_rows(view, loop_id, kv_indices[lo:hi], ws_k[:hi - lo], ws_v[:hi - lo])
        s, e = qp[b0], qp[b1]
        o, lse = _attend_with_lse(
            qr[s:e], ws_k[:hi - lo], ws_v[:hi - lo], qo_indptr[b0:b1 + 1] - s,
            (kv_indptr[b0:b1 + 1] - lo).clamp_(0, hi - lo), [x - s for x in qp[b0:b1 + 1]],
            [min(max(x - lo, 0), hi - lo) for x in kp[b0:b1 + 1]], causal=False, scale=sm_scale)
        _merge_into(acc[s:e], acc_lse[s:e], o, lse.transpose(0, 1))
    return acc
