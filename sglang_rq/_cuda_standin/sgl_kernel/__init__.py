"""sglang-rq stand-in for ``sgl_kernel`` (the compiled sglang-kernel wheel) on CUDA hosts.

Not the real package. `sglang_rq.launch_server` puts ``sglang_rq/_cuda_standin`` first on
``PYTHONPATH`` (so every SGLang subprocess sees it too) when the real wheel is missing or fails
to import (`sglang_rq.portable.standin_reason`). The ops on SGLang's dense-model path are
implemented by the Triton launchers of `rq_kernels.ops` (``SUBSTITUTES`` says which, "triton"
or "torch"); every other name resolves to a stub that raises ``NotImplementedError`` naming
the op when called (attributes nest; ``sgl_kernel.<sub>`` imports give stub modules), so a
path that needs a real compiled kernel fails loudly. ``CALLS`` counts calls per op.

NOTE: SGLang 0.5.23 on CUDA does not take every dense-model op from ``sgl_kernel``:
``SiluAndMul.forward_cuda`` calls the JIT (nvcc + tvm_ffi) act-and-mul kernels,
``RotaryEmbedding.forward_cuda`` the JIT rope of ``sglang.kernels.ops.attention.rope``, the KV
store the JIT ``store_cache`` (it falls back, but retries the build on every call), and
``BaseFusedOp`` auto-selects JIT/AOT backends (e.g. ``ClampPositionOp`` on the decode path).
Importing this package therefore also installs `sgl_kernel._routes`, which points those at the
ops here (and keeps JIT/AOT backends out of auto-selection). ``SGLANG_FORCE_FUSED_OP_BACKEND``
must stay unset: ``torch`` would send RMSNorm/SiLU/rotary to ``forward_native`` again.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

import torch

from rq_kernels import ops
from rq_kernels import ops_reference as ref

__version__ = "0.4.10"  # the version SGLang 0.5.23 expects (its check is skipped anyway)
STANDIN = True
SUBSTITUTES: dict[str, str] = {
    "rmsnorm": "triton", "fused_add_rmsnorm": "triton", "gemma_rmsnorm": "triton",
    "gemma_fused_add_rmsnorm": "triton", "silu_and_mul": "triton", "gelu_and_mul": "triton",
    "gelu_tanh_and_mul": "triton", "apply_rope_with_cos_sin_cache_inplace": "triton",
    "rotary_embedding": "triton", "top_k_renorm_prob": "torch", "top_p_renorm_prob": "torch",
}
CALLS: dict[str, int] = {name: 0 for name in SUBSTITUTES}


def _count(name: str) -> None:
    CALLS[name] += 1


def rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
            out: torch.Tensor | None = None, enable_pdl: bool | None = None) -> torch.Tensor:
    """``sgl_kernel.rmsnorm``: `rq_kernels.ops.rmsnorm` (``enable_pdl`` ignored)."""
    _count("rmsnorm")
    return ops.rmsnorm(input, weight, eps=eps, out=out)


def fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float = 1e-6, enable_pdl: bool | None = None) -> None:
    """``sgl_kernel.fused_add_rmsnorm``: in place, ``residual += input; input = norm(residual)``."""
    _count("fused_add_rmsnorm")
    ops.fused_add_rmsnorm(input, residual, weight, eps=eps)


def gemma_rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                  out: torch.Tensor | None = None, enable_pdl: bool | None = None) -> torch.Tensor:
    """``sgl_kernel.gemma_rmsnorm`` (scale ``1 + weight``)."""
    _count("gemma_rmsnorm")
    return ops.rmsnorm(input, weight, eps=eps, out=out, gemma=True)


def gemma_fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            eps: float = 1e-6, enable_pdl: bool | None = None) -> None:
    """``sgl_kernel.gemma_fused_add_rmsnorm`` (in place, scale ``1 + weight``)."""
    _count("gemma_fused_add_rmsnorm")
    ops.fused_add_rmsnorm(input, residual, weight, eps=eps, gemma=True)


def silu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None,
                 enable_pdl: bool | None = None) -> torch.Tensor:
    """``sgl_kernel.silu_and_mul``: ``silu(x[..., :d]) * x[..., d:]``."""
    _count("silu_and_mul")
    return ops.act_and_mul(input, act="silu", out=out)


def gelu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None,
                 enable_pdl: bool | None = None) -> torch.Tensor:
    """``sgl_kernel.gelu_and_mul`` (erf GELU)."""
    _count("gelu_and_mul")
    return ops.act_and_mul(input, act="gelu", out=out)


def gelu_tanh_and_mul(input: torch.Tensor, out: torch.Tensor | None = None,
                      enable_pdl: bool | None = None) -> torch.Tensor:
    """``sgl_kernel.gelu_tanh_and_mul`` (tanh-approximated GELU)."""
    _count("gelu_tanh_and_mul")
    return ops.act_and_mul(input, act="gelu_tanh", out=out)


def apply_rope_with_cos_sin_cache_inplace(positions: torch.Tensor, query: torch.Tensor,
                                          key: torch.Tensor | None, head_size: int,
                                          cos_sin_cache: torch.Tensor, is_neox: bool = True,
                                          *args, **kwargs) -> None:
    """Rotary embedding in place; ``query``/``key`` ``[T, H * head_size]`` or ``[T, H, D]``,
    ``cos_sin_cache`` ``[max_position, rot_dim]`` (cos then sin)."""
    _count("apply_rope_with_cos_sin_cache_inplace")
    ops.rope_inplace(positions, query, key, cos_sin_cache=cos_sin_cache, is_neox=is_neox,
                     head_size=head_size)


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None,
                     head_size: int, cos_sin_cache: torch.Tensor, is_neox: bool = True) -> None:
    """``sgl_kernel.rotary_embedding`` (vLLM's signature): same op as the one above."""
    _count("rotary_embedding")
    ops.rope_inplace(positions, query, key, cos_sin_cache=cos_sin_cache, is_neox=is_neox,
                     head_size=head_size)


def top_k_renorm_prob(probs: torch.Tensor, top_k, *args, **kwargs) -> torch.Tensor:
    """``sgl_kernel.top_k_renorm_prob`` in torch (`ops_reference.top_k_renorm_prob_reference`)."""
    _count("top_k_renorm_prob")
    return ref.top_k_renorm_prob_reference(probs, top_k)


def top_p_renorm_prob(probs: torch.Tensor, top_p, *args, **kwargs) -> torch.Tensor:
    """``sgl_kernel.top_p_renorm_prob`` in torch (`ops_reference.top_p_renorm_prob_reference`)."""
    _count("top_p_renorm_prob")
    return ref.top_p_renorm_prob_reference(probs, top_p)


top_k_renorm_probs = top_k_renorm_prob  # the real wheel exports both spellings
top_p_renorm_probs = top_p_renorm_prob


def is_arch_support_pdl() -> bool:
    """``sgl_kernel.utils.is_arch_support_pdl``: programmatic dependent launch stays off."""
    return False


class _Stub:
    """A name of the real wheel without a stand-in: attributes nest, calling raises."""

    def __init__(self, qualname: str) -> None:
        self._q = qualname

    def __getattr__(self, name: str) -> _Stub:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stub(f"{self._q}.{name}")

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel stand-in: '{self._q}' is a compiled kernel of the sglang-kernel wheel, "
            "which is missing or does not load here (sglang-rq portable CUDA mode); use a path "
            f"that does not need it. Substituted ops: {', '.join(sorted(SUBSTITUTES))}")

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in stub {self._q}>"


def _module_getattr(modname: str):
    def __getattr__(name: str):
        if name.startswith("_"):  # private names (and dunders) are never ops
            raise AttributeError(name)
        obj = _Stub(f"{modname}.{name}")
        setattr(sys.modules[modname], name, obj)
        return obj
    return __getattr__


__getattr__ = _module_getattr(__name__)
_REAL_SUBMODULES = {f"{__name__}._routes"}


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any ``sgl_kernel.<sub>`` (``kvcacheio``, ``flash_attn``, ...) resolves to a stub module;
    ``sgl_kernel.utils`` carries the real `is_arch_support_pdl`."""

    def find_spec(self, fullname, path, target=None):
        if (fullname.startswith(__name__ + ".") and fullname not in sys.modules
                and fullname not in _REAL_SUBMODULES):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__getattr__ = _module_getattr(spec.name)
        if spec.name == f"{__name__}.utils":
            m.is_arch_support_pdl = is_arch_support_pdl
        return m

    def exec_module(self, module):
        pass


if not any(isinstance(f, _SubmoduleFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _SubmoduleFinder())

importlib.import_module(f"{__name__}._routes").install(sys.modules[__name__])
