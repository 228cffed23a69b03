"""Triton kernels of the ResidualQuant KV cache (DESIGN.md section 4).

* `commit` -- quantize all loops of new tokens into the compressed pool (one launch per layer;
  `commit_layers`: several layers of one pool in one launch; `stage_kv`: an earlier loop's K/V
  into the staging rows);
* `decode_attention` -- fused split-K decode attention over anchor + residual, plus the
  in-flight token;
* `extend_attention` -- compressed prefix + causal BF16 chunk (prefill / chunked prefill).

Device code lives in ``rq_kernels/triton/``; the argument types in `rq_kernels.view`. Every
launcher has a pure-torch twin with the same signature in `sglang_rq.reference` and raises
ValueError for a format the kernels do not cover; the serving package decides which of the two
runs (`sglang_rq.dispatch`). This package imports nothing from the serving package.
"""

from rq_kernels._host import (
    kernel_device_reason, prepare_layers, prepare_view, unsupported_reason,
)
from rq_kernels.commit import commit, commit_layers, stage_kv
from rq_kernels.decode import decode_attention
from rq_kernels.extend import extend_attention

__all__ = ["commit", "commit_layers", "decode_attention", "extend_attention",
           "kernel_device_reason", "prepare_layers", "prepare_view", "stage_kv",
           "unsupported_reason"]
