"""Reference codec of ResidualQuant in plain PyTorch: the specification the kernels follow.

DESIGN.md section 1 ("ResidualQuant: KV Cache Quantization for Looped Transformers with 2-Bit
Residuals", arXiv 2610.10381, reconstruction). All arithmetic is float32, in this order:

1. group quantization (asymmetric, ``b`` bits, groups of ``g`` along head_dim): offset
   ``m = fp8_down(min)``, scale ``s = fp8_up((max - m) / (2^b - 1))``, codes
   ``q = clamp(floor((x - m) / s + 0.5), 0, 2^b - 1)`` (``q = 0`` where ``s == 0``), value
   ``m + s * q``. Rounding the offset down and the scale up onto the FP8 (e4m3fn) grid *before*
   computing codes keeps every code in range, so the error is at most ``s / 2`` per element and a
   constant group whose value is representable in FP8 (0 included) is reconstructed exactly.
   Both bounds hold while a group's values lie in FP8's range, ``[-448, 448]`` (rotated basis):
   offset and scale saturate there, so larger values are clipped, with errors far above
   ``s / 2``. The server counts such groups (docs/robustness.md section 2, `sglang_rq.clipping`).
2. anchor ``â`` = dequantized anchor loop (in the rotated basis when ``rotate_anchor``).
3. ``c_i = bf16(<x_i, â> / max(<â, â>, 1e-12))`` (c = 1 without LSQ), residual ``r_i = x_i - c_i â``.
4. rotation ``r'_i = r_i @ R`` (when the anchor is not already in the rotated basis).
5. residual quantized like step 1; reconstruction ``x̂_i = c_i â + deq(r'_i) @ R^T``.

Storage per (token, K-or-V, head) and loop, as `layout.loop_segments` sizes it: packed codes
``uint8 [code_bytes]`` (element j in byte ``j // (8/b)`` at bit ``(j % (8/b)) * b``), FP8
``(scale, offset)`` bytes ``uint8 [D/g, 2]``, BF16 ``c``. A 16-bit loop stores BF16 values
(the anchor itself, or the rotated residual) as bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rq_kernels.view import CompressedLayerView  # the kernels' argument type (also named here)
from sglang_rq.config import RQConfig
from sglang_rq.layout import LoopSegment

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
LSQ_EPS = 1e-12


# ----------------------------------------------------------------------------- FP8 rounding
def fp8_round(x: torch.Tensor, *, direction: str) -> torch.Tensor:
    """Round float32 ``x`` onto the FP8 e4m3fn grid, ``direction`` = ``down`` or ``up``.

    Values are first clamped to ``[-448, 448]``. Returns float32 values that are exactly
    representable in FP8, ``<= x`` (down) or ``>= x`` (up) for in-range ``x``.
    """
    x = x.float().clamp(-FP8_MAX, FP8_MAX)
    y = x.to(FP8)
    bits = y.view(torch.uint8).to(torch.int16)
    yf = y.float()
    if direction == "down":
        fix = yf > x
        step = torch.where(yf > 0, bits - 1, torch.where(yf == 0, torch.full_like(bits, 0x81), bits + 1))
    elif direction == "up":
        fix = yf < x
        step = torch.where(yf < 0, bits - 1, torch.where(yf == 0, torch.full_like(bits, 0x01), bits + 1))
        step = torch.where((yf < 0) & (bits == 0x81), torch.zeros_like(bits), step)
    else:
        raise ValueError(f"direction must be 'down' or 'up', got {direction!r}")
    bits = torch.where(fix, step, bits)
    return bits.to(torch.uint8).view(FP8).float()


# ----------------------------------------------------------------------------- group quantization
def quantize_groups(x: torch.Tensor, *, bits: int, group_size: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric integer quantization in groups along the last dimension.

    Parameters
    ----------
    x: ``[..., D]`` float (any float dtype; computed in float32). ``D % group_size == 0``.
    bits: 1, 2, 4 or 8.

    Returns
    -------
    codes ``[..., D]`` uint8 in ``[0, 2^bits - 1]``; scale and offset ``[..., D/group_size]``
    float32, both exactly representable in FP8 e4m3fn (the ``s / 2`` error bound holds for
    values in ``[-448, 448]``; module docstring, step 1).

    Raises
    ------
    ValueError
        ``bits`` not 1, 2, 4 or 8, or ``D`` not a multiple of ``group_size``.
    """
    _check_bits(bits)
    if group_size <= 0 or x.shape[-1] % group_size:
        raise ValueError(f"head_dim {x.shape[-1]} is not a multiple of group_size {group_size}")
    levels = (1 << bits) - 1
    xg = x.float().reshape(*x.shape[:-1], x.shape[-1] // group_size, group_size)  # [..., G, g]
    offset = fp8_round(xg.amin(-1), direction="down")
    scale = fp8_round((xg.amax(-1) - offset) / levels, direction="up")
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.floor((xg - offset.unsqueeze(-1)) / safe.unsqueeze(-1) + 0.5).clamp(0, levels)
    q = torch.where(scale.unsqueeze(-1) > 0, q, torch.zeros_like(q))
    return q.to(torch.uint8).reshape(x.shape), scale, offset


def dequantize_groups(codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, *,
                      group_size: int) -> torch.Tensor:
    """Inverse of `quantize_groups`: ``offset + scale * code``, ``[..., D]`` float32."""
    cg = codes.float().reshape(*codes.shape[:-1], codes.shape[-1] // group_size, group_size)
    return (offset.unsqueeze(-1) + scale.unsqueeze(-1) * cg).reshape(codes.shape)


def _check_bits(bits: int) -> None:
    if bits not in (1, 2, 4, 8):
        raise ValueError(f"bits must be 1, 2, 4 or 8 (codes packed whole into bytes), got {bits}")


def pack_codes(codes: torch.Tensor, *, bits: int) -> torch.Tensor:
    """Pack ``[..., D]`` uint8 codes of ``bits`` (1/2/4/8) into ``[..., D*bits/8]`` uint8.

    Raises ValueError for other ``bits``, codes that are not uint8, a ``D`` that does not fill
    whole bytes, or (outside CUDA graph capture, where reading the codes back is not allowed) a
    code above ``2^bits - 1``, which would spill into its neighbour's bits.
    """
    _check_bits(bits)
    if codes.dtype != torch.uint8:
        raise ValueError(f"codes must be uint8 (as quantize_groups returns), got {codes.dtype}")
    per = 8 // bits
    if codes.shape[-1] % per:
        raise ValueError(f"{codes.shape[-1]} codes of {bits} bits do not fill whole bytes")
    capturing = codes.is_cuda and torch.cuda.is_current_stream_capturing()
    if not capturing and codes.numel() and int(codes.max()) >= 1 << bits:
        raise ValueError(f"a code is {int(codes.max())}, above the {(1 << bits) - 1} that "
                         f"{bits} bits hold")
    c = codes.reshape(*codes.shape[:-1], codes.shape[-1] // per, per).to(torch.int32)
    shifts = torch.arange(per, dtype=torch.int32, device=codes.device) * bits
    return (c << shifts).sum(-1).to(torch.uint8)


def unpack_codes(packed: torch.Tensor, *, bits: int) -> torch.Tensor:
    """Inverse of `pack_codes`: ``[..., nbytes]`` uint8 -> ``[..., nbytes*8/bits]`` uint8."""
    _check_bits(bits)
    per = 8 // bits
    shifts = torch.arange(per, dtype=torch.int32, device=packed.device) * bits
    c = (packed.to(torch.int32).unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return c.reshape(*packed.shape[:-1], packed.shape[-1] * per).to(torch.uint8)


def _scale_offset_bytes(scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """``[..., G]`` x2 float32 (FP8-exact) -> ``[..., G, 2]`` uint8 (scale, offset)."""
    return torch.stack([scale.to(FP8).view(torch.uint8), offset.to(FP8).view(torch.uint8)], -1)


def _scale_offset_values(scale_offset: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    m = scale_offset.view(FP8).float()
    return m[..., 0], m[..., 1]


# ----------------------------------------------------------------------------- one stored loop
@dataclass
class StoredLoop:
    """One loop of one K-or-V tensor as stored: ``codes [..., code_bytes]`` uint8,
    ``scale_offset [..., D/g, 2]`` uint8 or None, ``coef [...]`` bf16 or None (``...`` = token,
    head)."""

    codes: torch.Tensor
    scale_offset: torch.Tensor | None
    coef: torch.Tensor | None


def _store_values(v: torch.Tensor, seg: LoopSegment, group_size: int
                  ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Quantize ``v [..., D]`` fp32 per ``seg``; returns (codes, scale_offset, dequantized fp32)."""
    if seg.bits == 16:
        b = v.to(torch.bfloat16)
        return b.view(torch.uint8).reshape(*v.shape[:-1], 2 * v.shape[-1]), None, b.float()
    if seg.bits == 0:
        return v.new_zeros(*v.shape[:-1], 0, dtype=torch.uint8), None, torch.zeros_like(v)
    q, s, m = quantize_groups(v, bits=seg.bits, group_size=group_size)
    return (pack_codes(q, bits=seg.bits), _scale_offset_bytes(s, m),
            dequantize_groups(q, s, m, group_size=group_size))


def _load_values(st: StoredLoop, seg: LoopSegment, head_dim: int, group_size: int) -> torch.Tensor:
    """Dequantize a stored loop's codes (anchor or rotated residual) to fp32 ``[..., D]``."""
    lead = st.codes.shape[:-1]
    if seg.bits == 16:
        return st.codes.contiguous().view(torch.bfloat16).reshape(*lead, head_dim).float()
    if seg.bits == 0:
        return torch.zeros(*lead, head_dim, dtype=torch.float32, device=st.codes.device)
    s, m = _scale_offset_values(st.scale_offset)
    return dequantize_groups(unpack_codes(st.codes, bits=seg.bits), s, m, group_size=group_size)


def _rotate(x: torch.Tensor, rot: torch.Tensor | None, *, inverse: bool = False) -> torch.Tensor:
    """``x [..., H, D] @ R[h]`` per head (``R^T`` when inverse); identity when ``rot`` is None."""
    if rot is None:
        return x
    r = rot.transpose(-1, -2) if inverse else rot
    return torch.einsum("...hd,hde->...he", x, r.float())


# ----------------------------------------------------------------------------- encode / decode
def encode(x_loops: torch.Tensor, *, segments: tuple[LoopSegment, ...], cfg: RQConfig,
           rotation: torch.Tensor | None) -> list[StoredLoop]:
    """Compress every loop of K and/or V (reference commit).

    Parameters
    ----------
    x_loops: ``[num_loops, ..., num_kv_heads, head_dim]`` float (bf16/fp32); ``...`` is any
        leading shape, e.g. ``[num_tokens]`` or ``[num_tokens, 2]`` (K and V together).
    segments: `layout.loop_segments` for the model and ``cfg``.
    rotation: ``[num_kv_heads, head_dim, head_dim]`` float32 (this layer's), or None.

    Returns
    -------
    One `StoredLoop` per loop with ``codes [..., num_kv_heads, code_bytes]`` uint8,
    ``scale_offset [..., num_kv_heads, D/g, 2]`` uint8, ``coef [..., num_kv_heads]`` bf16.

    Note
    ----
    Loops of one dependency level with the same role and bits are quantized in one batch
    (the arithmetic is elementwise or along head_dim, so batching changes no value).

    Raises
    ------
    ValueError
        ``x_loops`` holds another number of loops than ``segments`` describes.
    """
    if x_loops.shape[0] != len(segments):
        raise ValueError(f"x_loops holds {x_loops.shape[0]} loops, segments describe "
                         f"{len(segments)}")
    x = x_loops.float()
    g = cfg.group_size
    work = _rotate(x, rotation) if cfg.rotate_anchor else x  # basis of anchors and â
    recon: dict[int, torch.Tensor] = {}
    out: dict[int, StoredLoop] = {}
    for batch in _dependency_batches(segments):
        ids = [s.loop_id for s in batch]
        seg = batch[0]
        xi = work[ids]  # [m, ..., H, D]
        if seg.role == "anchor":
            codes, scale_offset, deq = _store_values(xi, seg, g)
            for j, i in enumerate(ids):
                out[i] = StoredLoop(codes[j], None if scale_offset is None else scale_offset[j],
                                    None)
                recon[i] = deq[j]
            continue
        base = torch.stack([recon[s.base] for s in batch])
        if cfg.lsq:
            c = ((xi * base).sum(-1) / (base * base).sum(-1).clamp_min(LSQ_EPS)).to(torch.bfloat16)
        else:
            c = torch.ones(xi.shape[:-1], dtype=torch.bfloat16, device=xi.device)
        res = xi - c.float().unsqueeze(-1) * base
        if not cfg.rotate_anchor:
            res = _rotate(res, rotation)
        codes, scale_offset, deq = _store_values(res, seg, g)
        if not cfg.rotate_anchor:
            deq = _rotate(deq, rotation, inverse=True)
        rec = c.float().unsqueeze(-1) * base + deq
        for j, i in enumerate(ids):
            recon[i] = rec[j]
            out[i] = StoredLoop(codes[j], None if scale_offset is None else scale_offset[j],
                                c[j] if cfg.lsq else None)
    return [out[i] for i in range(len(segments))]


def decode(stored: list[StoredLoop], loop_id: int, *, segments: tuple[LoopSegment, ...],
           cfg: RQConfig, rotation: torch.Tensor | None, head_dim: int) -> torch.Tensor:
    """Reconstruct loop ``loop_id``: ``[num_tokens, num_kv_heads, head_dim]`` float32.

    ``stored`` is what `encode` returned (or the same tensors gathered from pool rows).
    """
    x = _decode_work(stored, loop_id, segments, cfg, rotation, head_dim)
    return _rotate(x, rotation, inverse=True) if cfg.rotate_anchor else x


def _decode_work(stored, loop_id, segments, cfg, rotation, head_dim) -> torch.Tensor:
    seg = segments[loop_id]
    vals = _load_values(stored[loop_id], seg, head_dim, cfg.group_size)
    if seg.role == "anchor":
        return vals
    base = _decode_work(stored, seg.base, segments, cfg, rotation, head_dim)
    c = stored[loop_id].coef
    cf = c.float().unsqueeze(-1) if c is not None else 1.0
    if not cfg.rotate_anchor:
        vals = _rotate(vals, rotation, inverse=True)
    return cf * base + vals


def _dependency_batches(segments: tuple[LoopSegment, ...]) -> list[list[LoopSegment]]:
    """Segments in batches: every base is in an earlier batch than the loops stored against it,
    and a batch shares one role and one bit width."""
    done: set[int] = set()
    batches: list[list[LoopSegment]] = []
    while len(done) < len(segments):
        ready = [s for s in segments if s.loop_id not in done and (s.base == s.loop_id or s.base in done)]
        by_kind: dict[tuple[str, int], list[LoopSegment]] = {}
        for s in ready:
            by_kind.setdefault((s.role == "anchor", s.bits), []).append(s)
        batches.extend(by_kind.values())
        done.update(s.loop_id for s in ready)
    return batches


# ----------------------------------------------------------------------------- attention
def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
                        causal_offset: int | None) -> torch.Tensor:
    """Plain fp32 attention of one sequence (the spec for the fused kernels).

    q ``[num_q, num_qo_heads, D]``, k/v ``[num_kv, num_kv_heads, D]`` (GQA: ``num_qo_heads`` a
    multiple of ``num_kv_heads``). With ``causal_offset = p``, query i sees keys ``0..p+i``.
    Returns ``[num_q, num_qo_heads, D]`` float32.
    """
    group = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    logits = torch.einsum("qhd,khd->hqk", q.float(), kf) * scale
    if causal_offset is not None:
        qi = torch.arange(q.shape[0], device=q.device).unsqueeze(1)
        kj = torch.arange(k.shape[0], device=q.device).unsqueeze(0)
        logits = logits.masked_fill(kj > qi + causal_offset, float("-inf"))
    p = torch.softmax(logits, dim=-1)
    return torch.einsum("hqk,khd->qhd", p, vf)


# ----------------------------------------------------------------------------- pool rows
def commit_reference(k_loops: Sequence[torch.Tensor], v_loops: Sequence[torch.Tensor],
                     loc: torch.Tensor, view: CompressedLayerView) -> None:
    """Compress all loops of ``num_tokens`` tokens and write them to pool rows ``loc``.

    Parameters
    ----------
    k_loops, v_loops: ``num_loops`` tensors ``[num_tokens, num_kv_heads, head_dim]`` bf16/fp32
        (a sequence, or one ``[num_loops, num_tokens, num_kv_heads, head_dim]`` tensor).
    loc: ``[num_tokens]`` int64, destination rows (slots) of the layer's buffers.
    view: the layer's compressed buffers (`CompressedLayerView`); written in place.
    """
    x = torch.stack([torch.stack(tuple(k_loops)), torch.stack(tuple(v_loops))],
                    dim=2)  # [L, n, 2, H, D]: the pool rows' order
    stored = encode(x, segments=view.segments, cfg=view.cfg, rotation=view.rotation_cpu(x))
    for i, st in enumerate(stored):
        view.codes[i][loc] = st.codes.to(view.codes[i].device)
        if view.scale_offset[i] is not None:
            view.scale_offset[i][loc] = st.scale_offset.to(view.scale_offset[i].device)
        if view.coef[i] is not None:
            view.coef[i][loc] = st.coef.to(view.coef[i].device)


def commit_layers_reference(k_loops: Sequence[torch.Tensor], v_loops: Sequence[torch.Tensor],
                            loc: torch.Tensor, views: Sequence[CompressedLayerView], *,
                            commit_fn: Callable[..., None] | None = None) -> None:
    """Twin of `rq_kernels.commit.commit_layers`: ``commit_fn`` (default `commit_reference`) of
    layer ``l``'s K/V (``k_loops[i][l]``, each ``[num_layers, num_tokens, num_kv_heads,
    head_dim]``) into ``views[l]``, for every layer."""
    commit_fn = commit_fn or commit_reference
    for layer, view in enumerate(views):
        commit_fn([k[layer] for k in k_loops], [v[layer] for v in v_loops], loc, view)


def gather_rows(view: CompressedLayerView, slots: torch.Tensor, kv: int) -> list[StoredLoop]:
    """The stored loops of rows ``slots`` (``[n]`` int64) for K (``kv=0``) or V (``kv=1``)."""
    return [
        StoredLoop(view.codes[i][slots, kv],
                   None if view.scale_offset[i] is None else view.scale_offset[i][slots, kv],
                   None if view.coef[i] is None else view.coef[i][slots, kv])
        for i in range(len(view.segments))
    ]


def dequantize_rows_reference(view: CompressedLayerView, slots: torch.Tensor, loop_id: int
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Reconstructed K and V of loop ``loop_id`` at rows ``slots``: 2x ``[n, num_kv_heads, D]`` fp32."""
    out = []
    for kv in (0, 1):
        stored = gather_rows(view, slots, kv)
        out.append(decode(stored, loop_id, segments=view.segments, cfg=view.cfg,
                          rotation=view.rotation, head_dim=view.head_dim))
    return out[0], out[1]


def reconstruct_rows_reference(view: CompressedLayerView, loop_id: int, rows: torch.Tensor,
                               out_k: torch.Tensor, out_v: torch.Tensor
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Twin of `rq_kernels.reconstruct.reconstruct_rows`: loop ``loop_id`` at rows ``rows``
    (``[n]`` int64) in the rotated basis, ``x̂ R`` (`decode` before its un-rotation), written
    as bf16 into ``out_k``/``out_v`` ``[n, num_kv_heads, D]``; returns them."""
    for kv, o in ((0, out_k), (1, out_v)):
        x = _decode_work(gather_rows(view, rows, kv), loop_id, view.segments, view.cfg,
                         view.rotation, view.head_dim)
        if view.rotation is not None and not view.cfg.rotate_anchor:
            x = _rotate(x, view.rotation)
        o.copy_(x.to(torch.bfloat16))
    return out_k, out_v


# ----------------------------------------------------------------------------- attention twins
def decode_attention_reference(q: torch.Tensor, k_cur: torch.Tensor, v_cur: torch.Tensor,
                               view: CompressedLayerView, loop_id: int, kv_indptr: torch.Tensor,
                               kv_indices: torch.Tensor, *, sm_scale: float,
                               out: torch.Tensor | None = None) -> torch.Tensor:
    """Twin of `rq_kernels.decode_attention`: dequantize the history, append the in-flight token,
    fp32 attention. q ``[B, Hq, D]``, k_cur/v_cur ``[B, Hkv, D]``, kv_indptr ``[B+1]``, kv_indices
    ``[nnz]`` (history rows, in-flight token excluded). Returns ``[B, Hq, D]`` in q's dtype."""
    res = out if out is not None else torch.empty_like(q)
    ptr = kv_indptr.tolist()
    for b in range(q.shape[0]):
        k, v = dequantize_rows_reference(view, kv_indices[ptr[b]:ptr[b + 1]].long(), loop_id)
        k = torch.cat([k.to(q.device), k_cur[b:b + 1].float()])
        v = torch.cat([v.to(q.device), v_cur[b:b + 1].float()])
        res[b] = attention_reference(q[b:b + 1], k, v, scale=sm_scale, causal_offset=None)[0]
    return res


def extend_attention_reference(q: torch.Tensor, k_cur: torch.Tensor, v_cur: torch.Tensor,
                               view: CompressedLayerView, loop_id: int, qo_indptr: torch.Tensor,
                               kv_indptr: torch.Tensor, kv_indices: torch.Tensor, *,
                               sm_scale: float, out: torch.Tensor | None = None,
                               host_indptrs: tuple[list[int], list[int]] | None = None
                               ) -> torch.Tensor:
    """Twin of `rq_kernels.extend_attention`: per request, the dequantized prefix (rows
    ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``) then its own chunk (``q/k_cur/v_cur`` rows
    ``qo_indptr[b]:qo_indptr[b+1]``), causal, fp32. Returns ``[T, Hq, D]`` in q's dtype."""
    res = out if out is not None else torch.empty_like(q)
    qp, kp = host_indptrs or (qo_indptr.tolist(), kv_indptr.tolist())
    for b in range(len(qp) - 1):
        k, v = dequantize_rows_reference(view, kv_indices[kp[b]:kp[b + 1]].long(), loop_id)
        s, e = qp[b], qp[b + 1]
        k = torch.cat([k.to(q.device), k_cur[s:e].float()])
        v = torch.cat([v.to(q.device), v_cur[s:e].float()])
        res[s:e] = attention_reference(q[s:e], k, v, scale=sm_scale,
                                       causal_offset=kp[b + 1] - kp[b])
    return res
