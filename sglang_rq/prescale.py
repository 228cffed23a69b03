"""Per-head power-of-two prescale of K and V against FP8 clipping (issue 13 item 2).

The FP8 e4m3fn scale and offset of a quantized group cannot leave ±448 (`sglang_rq.clipping`), so
K/V with an (after rotation) coordinate beyond about 448 are clipped. A rotation is orthonormal,
so every rotated coordinate, the offset and, for 2-bit codes and up, the scale of a group are
bounded by the vector's L2 norm; a residual ``x_i - c * anchor`` by about twice that. Storing
``x / 2^s`` with ``||x|| / 2^s <= NORM_LIMIT`` (112 = 448 / 4) therefore keeps the FP8 fields in
range with a 4x margin for later tokens. Powers of two are exact in bf16/fp32, so nothing else
changes:

* scores: ``q . k = (q * 2^s_k) . (k / 2^s_k)``: the query is multiplied, the forward's own
  (in-flight) K divided, the compressed history holds ``k / 2^s_k``;
* output: ``sum p v = 2^s_v * sum p (v / 2^s_v)``: the in-flight V is divided, the attention
  output multiplied.

So the kernels and the codec are untouched; the backends apply `Prescale.apply` around every
(slot) call. ``s`` is per (physical layer, K or V, KV head) and **calibrated once**, from the first
prefill/extend forward that reaches the layer (SGLang's start-up warm-up request, or the first
real one): ``s = max(0, ceil(log2(max ||x|| / NORM_LIMIT)))`` over that forward's tokens (a host
sync, in an eager forward). A block whose factors are all 1 costs nothing (`apply` returns its
inputs). Decode CUDA graphs are captured at start-up, before any calibration, with that no-op
path. When a later calibration finds a block that needs a factor, correctness wins over graph
speed: the backend's ``stop_graphs`` callback (`Prescale.graphs_captured`) turns decode graph
replay off for the rest of the server's life, with a warning naming the layer, and every later
decode runs eagerly with the prescale. Models whose K/V stay in range (every model measured so
far) keep their graphs and pay nothing. Later K/V more than 4x beyond the calibration can still
clip, and are counted (`sglang_rq.clipping`). ``--rq-no-prescale`` turns it off.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch

logger = logging.getLogger(__name__)

NORM_LIMIT = 112.0
"""Largest per-(token, head) L2 norm stored unscaled: 448 / 4 (FP8 e4m3fn field limit, 4x
margin)."""


class Prescale:
    """The factors ``2^s`` of one pool: ``[num_blocks, 2 (K, V), num_kv_heads]`` fp32 on the
    pool's device, 1 until a block is calibrated."""

    def __init__(self, *, num_blocks: int, num_kv_heads: int, device: torch.device | str) -> None:
        self.factors = torch.ones((num_blocks, 2, num_kv_heads), dtype=torch.float32, device=device)
        self._calibrated = [False] * num_blocks
        self._active = [False] * num_blocks
        self._stop_graphs: Callable[[str], bool] | None = None

    def graphs_captured(self, stop_graphs: Callable[[str], bool]) -> None:
        """Decode CUDA graphs are being captured with every block unscaled. A block calibrated
        later to a factor other than 1 first calls ``stop_graphs(reason)`` (once), which turns
        graph replay off and returns True; if it returns False (the seam is missing), the block
        stays unscaled: it clips, counted, and the warning says so."""
        self._stop_graphs = stop_graphs

    def calibrate(self, block: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Set block ``block``'s factors from this forward's ``k``, ``v`` (``[num_tokens,
        num_kv_heads, head_dim]``), once; skipped while a CUDA graph is being captured."""
        if self._calibrated[block] or k.shape[0] == 0:
            return
        if k.is_cuda and torch.cuda.is_current_stream_capturing():
            return
        norms = torch.stack([k.float().norm(dim=-1).amax(0), v.float().norm(dim=-1).amax(0)])
        exps = [[max(0, math.ceil(math.log2(n / NORM_LIMIT))) if n > NORM_LIMIT else 0
                 for n in row] for row in norms.tolist()]
        self._calibrated[block] = True
        if not any(e for row in exps for e in row):
            return
        maxima = [[round(n, 1) for n in r] for r in norms.tolist()]
        if self._stop_graphs is not None:
            stopped = self._stop_graphs(
                f"layer {block} needs a K/V prescale (max norms {maxima}) and the captured "
                "graphs hold the unscaled path")
            self._stop_graphs = None
            if not stopped:
                self._calibrated = [True] * len(self._calibrated)  # graphs stay: nothing may scale
                logger.warning("sglang-rq: layer %d has K/V norms up to %s, beyond the FP8 "
                               "scale/offset range, and decode CUDA graphs could not be turned "
                               "off: K/V are stored unscaled and clip "
                               "(sglang_rq_clipped_groups_total). Serve with --disable-cuda-graph",
                               block, maxima)
                return
        self.factors[block].copy_(torch.tensor(exps, dtype=torch.float32).exp2())
        self._active[block] = True
        logger.warning("sglang-rq: layer %d stores K/V divided by 2^s per KV head (s: K %s, V %s) "
                       "to keep them inside the FP8 scale/offset range (max norms %s)",
                       block, exps[0], exps[1], maxima)

    def apply(self, block: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(q * 2^s_k, k / 2^s_k, v / 2^s_v, out_factor)`` for block ``block``, or the inputs
        and None while the block is unscaled.

        q: ``[num_tokens, num_qo_heads, head_dim]``; k, v: ``[num_tokens, num_kv_heads,
        head_dim]``, any float dtype (kept); ``out_factor`` ``[num_qo_heads, 1]`` in q's dtype
        multiplies the attention output.
        """
        if not self._active[block]:
            return q, k, v, None
        f = self.factors[block]
        group = q.shape[1] // k.shape[1]
        kq = f[0].repeat_interleave(group).to(q.dtype)[:, None]
        vq = f[1].repeat_interleave(group).to(q.dtype)[:, None]
        return (q * kq, k / f[0].to(k.dtype)[:, None], v / f[1].to(v.dtype)[:, None], vq)

    def restore(self, block: int, k: torch.Tensor, v: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stored (divided) ``k``, ``v`` ``[n, num_kv_heads, head_dim]`` back to the model's scale."""
        f = self.factors[block].to(k.dtype)
        return k * f[0][:, None], v * f[1][:, None]
