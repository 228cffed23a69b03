"""Launchers of the commit kernel (quantize all loops of new tokens into the compressed pool):
`commit` (one layer), `commit_layers` (several layers of one pool in one launch)."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from rq_kernels._host import (
    cdiv, check_view, interpreting, launch_kernel, next_pow2, on_kernel_device, pdl_capable,
    prepare_layers, require_kernel, rotation_args, rotation_terms, strides3, unsupported_reason,
)
from rq_kernels.triton.commit import rq_commit_kernel, rq_stage_kernel

if TYPE_CHECKING:
    from rq_kernels.view import CompressedLayerView


@dataclass(frozen=True)
class CommitLaunch:
    """Launch parameters of `commit` (None: `default_launch`'s choice for the call):
    ``block_t`` tokens per program, ``num_warps``, and ``per_loop``: one program per (token
    block, head, K-or-V, loop), each re-quantizing its group's anchor, instead of one per
    (token block, head, K-or-V) running the whole group."""

    block_t: int | None = None
    num_warps: int | None = None
    per_loop: bool | None = None


# At most this many tokens (a decode step: one per request) commit one loop per program: the
# grid of whole-group programs would be a fraction of one wave, each program four loops long.
FEW_TOKENS = 64


def default_launch(num_tokens: int) -> CommitLaunch:
    """The launch `commit` uses for ``num_tokens`` new tokens, from the H200 sweeps of
    benchmarks/bench_commit.py (Ouro-1.4B shape, 16 KV heads x 128, 4 loops):

    * prefill chunks: 64-token programs of 8 warps over whole loop groups (128/16 was 10 %
      faster on Ouro and 18 % slower on SmolLM2);
    * at most `FEW_TOKENS`: one loop per program, 16-token programs of 4 warps up to 16 tokens,
      else 64/8. 1, 4, 16, 64 tokens: 12.9, 13.0, 11.4, 13.6 us against 20.6, 20.7, 21.3,
      20.6 us for whole groups (2026-12-01g, benchmarks/results/h200_2026-12-01g_commit.json).
    """
    if num_tokens <= 16:
        return CommitLaunch(block_t=16, num_warps=4, per_loop=True)
    return CommitLaunch(block_t=64, num_warps=8, per_loop=num_tokens <= FEW_TOKENS)


def commit(k_loops: Sequence[torch.Tensor], v_loops: Sequence[torch.Tensor], loc: torch.Tensor,
           view: CompressedLayerView, *, launch: CommitLaunch | None = None) -> None:
    """Compress every loop of ``num_tokens`` tokens and write them to pool rows ``loc``.

    Same signature and semantics as `sglang_rq.reference.commit_reference` (its twin). One
    launch: grid ``(cdiv(num_tokens, block_t), num_kv_heads, 2)``, or ``2 * num_loops`` on the
    last axis for a few tokens (`default_launch`).

    Parameters
    ----------
    k_loops, v_loops:
        ``num_loops`` tensors ``[num_tokens, num_kv_heads, head_dim]`` (a sequence, or one
        ``[num_loops, num_tokens, num_kv_heads, head_dim]`` tensor), ``torch.bfloat16``,
        ``cuda``, last dim contiguous, any token and head strides: the serving pool passes its
        staged earlier loops and the last loop's K/V where they lie, with no concatenation.
    loc:
        ``[num_tokens]``, ``torch.int64``, ``cuda``: destination rows (slots), all distinct.
    view:
        The layer's `CompressedLayerView`; its ``codes/scale_offset/coef[i]`` (``uint8 [rows, 2, H,
        code_bytes]``, ``uint8 [rows, 2, H, head_dim/group_size, 2]``, ``bf16 [rows, 2, H]``)
        are written in place; ``rotation`` ``[num_kv_heads, head_dim, head_dim]`` fp32 or None.
    launch:
        `CommitLaunch` overrides (tests and benchmarks only); None fields take
        `default_launch`'s.

    Raises
    ------
    ValueError
        For a format outside `rq_kernels._host.unsupported_reason` (chained anchors, 1- or
        16-bit loops, ``rotate_anchor=False``) or CPU tensors outside ``TRITON_INTERPRET=1``;
        the caller runs the twin for those.

    Note
    ----
    Codes equal the twin's except where fp32 rounding ties differ (see
    tests/kernels/test_commit.py). CUDA-graph safe once the view is prepared
    (`rq_kernels.prepare_view`) or after one eager call.
    """
    _commit([k[None] for k in k_loops], [v[None] for v in v_loops], loc, [view], launch)


def commit_layers(k_loops: Sequence[torch.Tensor], v_loops: Sequence[torch.Tensor],
                  loc: torch.Tensor, views: Sequence[CompressedLayerView], *,
                  launch: CommitLaunch | None = None) -> None:
    """`commit` of the same tokens into several layers of one pool in one launch (a decode
    step commits every layer at once: one launch instead of one per layer, each a ~12 us
    latency chain on the H200 at a few tokens, docs/kernels.md "Commit in a decode step").

    Same semantics as `sglang_rq.reference.commit_layers_reference` (its twin, `commit` per
    layer). Grid ``(cdiv(num_tokens, block_t), num_layers * num_kv_heads, 2 or 2 * num_loops)``.

    Parameters
    ----------
    k_loops, v_loops:
        ``num_loops`` tensors ``[num_layers, num_tokens, num_kv_heads, head_dim]``,
        ``torch.bfloat16``, last dim contiguous, any layer, token and head strides.
    loc:
        ``[num_tokens]``, ``torch.int64``: destination rows, the same in every layer.
    views:
        ``num_layers`` views of one format whose tensors are layers of shared buffers: each
        tensor of ``views[l]`` lies ``l`` layer strides after ``views[0]``'s, with equal shapes
        and strides (the serving pool's views; `prepare_layers` lays their rotation terms out
        the same way, and is called here, syncing, when they are not).
    launch:
        As for `commit`.

    Raises
    ------
    ValueError
        As for `commit`, and when the views' tensors are not evenly spaced layers of shared
        buffers.
    """
    _commit(k_loops, v_loops, loc, list(views), launch)


def stage_kv(k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
    """Write one loop's in-flight K/V into staging rows: ``out[:, 0] = k``, ``out[:, 1] = v``
    (`torch.stack([k, v], 1, out=out)`, its twin and what runs where the kernel cannot).

    On CUDA (and under ``TRITON_INTERPRET=1``) one Triton launch, which on sm_90+ lets the next
    kernel start at once (a programmatic-dependent-launch trigger): the decode split kernel after
    it in the pool's decode step copies its first history tiles while the copy runs, as it did
    behind the query rotation kernel before the split kernel rotated its query itself.

    Parameters
    ----------
    k, v: ``[num_tokens, num_kv_heads, head_dim]``, last dim contiguous, any token/head strides.
    out: ``[num_tokens, 2, num_kv_heads, head_dim]``, last dim contiguous (written, cast to its
        dtype).
    """
    n, h, d = k.shape
    assert v.shape == k.shape and out.shape == (n, 2, h, d), (
        f"k {tuple(k.shape)}, v {tuple(v.shape)} and out {tuple(out.shape)} do not match")
    if n == 0:
        return
    if not on_kernel_device(rq_stage_kernel, k) or min(t.stride(-1) for t in (k, v, out)) != 1:
        torch.stack([k, v], dim=1, out=out)
        return
    pdl = not interpreting(rq_stage_kernel) and pdl_capable(k.device)
    launch_kernel(rq_stage_kernel, (n,),
                  (k, k.stride(0), k.stride(1), v, v.stride(0), v.stride(1), out, out.stride(0),
                   out.stride(1), out.stride(2), h),
                  dict(D=d, HP=next_pow2(h), DP=next_pow2(d), PDL=pdl), num_warps=4)


def _layer_stride(ts: Sequence[torch.Tensor | None], what: str) -> int:
    """Elements between consecutive layers' tensors ``ts`` (0 for one layer or None)."""
    t0 = ts[0]
    if len(ts) == 1 or t0 is None:
        return 0
    step = ts[1].data_ptr() - t0.data_ptr()
    if step % t0.element_size() or any(
            t is None or t.shape != t0.shape or t.stride() != t0.stride() or t.dtype != t0.dtype
            or t.data_ptr() - t0.data_ptr() != i * step for i, t in enumerate(ts)):
        raise ValueError(f"commit_layers: the views' {what} are not evenly spaced layers of one "
                         "buffer (equal shapes and strides)")
    return step // t0.element_size()


def _pool_layer_strides(views: list[CompressedLayerView], dp: int, dev: torch.device
                        ) -> tuple[list[int], list[int], list[int], int]:
    """Layer strides of the views' codes, scale_offset and coef per loop and of their rotation
    terms; kept in ``views[0].launch_cache`` with the views they were computed for."""
    key = ("layer_strides", len(views), dp, dev)
    hit = views[0].launch_cache.get(key)
    if hit is not None and all(r() is v for r, v in zip(hit[0], views)):
        return hit[1]
    for v in views[1:]:
        if v.segments != views[0].segments or v.cfg != views[0].cfg:
            raise ValueError("commit_layers: the views' formats differ")
        check_view(v, dev)
    n = len(views[0].segments)
    codes = [_layer_stride([v.codes[i] for v in views], f"codes[{i}]") for i in range(n)]
    so = [_layer_stride([v.scale_offset[i] for v in views], f"scale_offset[{i}]")
          for i in range(n)]
    coef = [_layer_stride([v.coef[i] for v in views], f"coef[{i}]") for i in range(n)]
    rot = 0
    if views[0].rotation is not None and len(views) > 1:
        terms = [rotation_terms(v, dp, dev)[0] for v in views]
        try:
            rot = _layer_stride(terms, "rotation terms")
        except ValueError:
            prepare_layers(views)
            rot = _layer_stride([rotation_terms(v, dp, dev)[0] for v in views], "rotation terms")
    out = (codes, so, coef, rot)
    # weak references: views[0] holding the others (itself included) would be a reference cycle,
    # keeping a pool's buffers alive until the garbage collector runs
    views[0].launch_cache[key] = (tuple(weakref.ref(v) for v in views), out)
    return out


def _commit(ks: Sequence[torch.Tensor], vs: Sequence[torch.Tensor], loc: torch.Tensor,
            views: list[CompressedLayerView], launch: CommitLaunch | None) -> None:
    ks, vs = tuple(ks), tuple(vs)
    assert ks and len(ks) == len(vs), f"{len(ks)} K and {len(vs)} V loops: need one or more each"
    assert views, "no layer to commit"
    view = views[0]
    require_kernel("commit", unsupported_reason(view), rq_commit_kernel, ks[0])
    L, (NL, T, H, D) = len(ks), ks[0].shape
    dev = ks[0].device
    for i, (k, v) in enumerate(zip(ks, vs)):
        assert k.shape == v.shape == (NL, T, H, D) and k.device == v.device == dev, (
            f"loop {i}: K {tuple(k.shape)} on {k.device} and V {tuple(v.shape)} on {v.device} "
            f"must be [{NL}, {T}, {H}, {D}] on {dev}")
        assert k.dtype == v.dtype == torch.bfloat16, f"K/V must be bf16, got {k.dtype}/{v.dtype}"
        assert k.stride(-1) == v.stride(-1) == 1, f"loop {i}: K/V last dim must be contiguous"
    assert NL == len(views), f"K/V of {NL} layers for {len(views)} views"
    assert L == len(view.segments) and D == view.head_dim, (
        f"{L} K and {len(vs)} V loops of head_dim {D} do not match the view "
        f"({len(view.segments)} loops, head_dim {view.head_dim})")
    assert loc.shape == (T,) and loc.dtype == torch.int64 and loc.device == dev, (
        f"loc must be int64 [{T}] on {dev}, got {loc.dtype} {tuple(loc.shape)} on {loc.device}")
    check_view(view, dev)
    if T == 0:
        return
    cfg = view.cfg
    glen = cfg.group_len(L)
    dp = next_pow2(D)
    l_codes, l_so, l_coef, l_rot = _pool_layer_strides(views, dp, dev)
    (terms, s_rterm, s_rhead, s_rrow, alpha), nterms = rotation_args(view, dp, dev)
    dummy = view.codes[view.segments[0].base]
    codes = tuple(c if s.bits > 0 else dummy for c, s in zip(view.codes, view.segments))
    scale_offset = tuple(m if m is not None else dummy for m in view.scale_offset)
    coef = tuple(f if f is not None else dummy for f in view.coef)
    s_codes = sum(((ls, *strides3(c if s.bits > 0 else None))
                   for ls, c, s in zip(l_codes, view.codes, view.segments)), ())
    s_scale_offset = sum(((ls, *strides3(m)) for ls, m in zip(l_so, view.scale_offset)), ())
    s_coef = sum(((ls, *strides3(f)) for ls, f in zip(l_coef, view.coef)), ())
    chosen = default_launch(T)
    launch = launch or chosen
    block_t = launch.block_t or chosen.block_t
    per_loop = chosen.per_loop if launch.per_loop is None else launch.per_loop
    grid = (cdiv(T, block_t), NL * H, 2 * L if per_loop else 2)
    interp = interpreting(rq_commit_kernel)
    s_kv = sum((k.stride()[:3] + v.stride()[:3] for k, v in zip(ks, vs)), ())
    launch_kernel(
        rq_commit_kernel, grid,
        (ks, vs, s_kv, loc, T, H, codes, s_codes, scale_offset, s_scale_offset, coef, s_coef,
         terms, l_rot, s_rterm, s_rhead, s_rrow, alpha),
        dict(NUM_LOOPS=L, GROUP_LEN=glen, ANCHOR_POS=0 if cfg.anchor == "first" else glen - 1,
             BITS=tuple(s.bits for s in view.segments), LSQ=cfg.lsq,
             HAS_ROT=view.rotation is not None, TERMS=nterms, D=D, DP=dp, G=cfg.group_size,
             NG=D // cfg.group_size, NGP=dp // cfg.group_size, BLOCK_T=block_t,
             HOIST_R=nterms == 1, PER_LOOP=per_loop, INTERP=interp),
        num_warps=launch.num_warps or chosen.num_warps, enable_fp_fusion=False)
