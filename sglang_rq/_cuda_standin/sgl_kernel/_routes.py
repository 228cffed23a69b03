"""Point SGLang 0.5.23's JIT-kernel call sites on the dense-model path at the stand-in's ops.

NOTE: a deliberate hack, and only active when the stand-in is imported (portable CUDA mode).
SGLang binds these names at import time (``from ... import f``), so each is replaced in its
defining module *and* in the module that imported it: right away for modules already loaded,
and by a post-import hook for modules loaded later. Together this covers any import order: a
consumer that binds after the stand-in loaded sees the replaced source; one that bound before
is patched directly. Names absent from the installed SGLang are skipped (`APPLIED` lists what
was replaced in this process).

Routes (module -> names):

* ``sglang.kernels.ops.activation.activation`` / ``sglang.srt.layers.activation``: the JIT
  silu/gelu/gelu-tanh-and-mul -> `sgl_kernel.silu_and_mul` etc. (MoE's ``expert_ids`` raises);
* ``sglang.kernels.ops.attention.rope`` / ``sglang.srt.layers.rotary_embedding.base``: the JIT
  ``apply_rope_with_cos_sin_cache_inplace`` (fused KV store raises) and ``rotary_embedding``;
* ``sglang.kernels.ops.kvcache.kvcache`` / ``sglang.srt.mem_cache.memory_pool``:
  ``can_use_store_cache`` -> False (SGLang's plain indexed store, no per-call build attempt);
* ``sglang.kernels.ops.layernorm.*`` / ``sglang.srt.layers.layernorm``: the HF-cast RMSNorm
  JIT gates -> False (``forward_native``);
* ``sglang.kernels.fused_op.BaseFusedOp``: auto-selection considers only the ``triton`` and
  ``torch_compile`` backends (no JIT/AOT/CuTe/FlashInfer builds), so ops fall through to their
  ``forward_cuda`` (-> this stand-in) or ``forward_native``.
"""

from __future__ import annotations

import importlib.abc
import sys
from types import ModuleType
from typing import Any, Callable

APPLIED: list[str] = []
PORTABLE_BACKENDS = ("triton", "torch_compile")
_ROUTES: dict[str, dict[str, Callable[[ModuleType], Any]]] = {}


def _false(*args, **kwargs) -> bool:
    return False


def _jit_act(sk: ModuleType, name: str) -> Callable:
    fn = getattr(sk, name)

    def act(input, out=None, expert_ids=None, *args, **kwargs):
        if expert_ids is not None or args or kwargs:
            raise NotImplementedError(f"sgl_kernel stand-in: JIT {name} with expert filtering "
                                      "(MoE) has no portable version")
        return fn(input, out)

    act.__name__ = name
    return act


def _jit_rope(sk: ModuleType) -> Callable:
    def apply_rope_with_cos_sin_cache_inplace(q, k, cos_sin_cache, positions, *, is_neox,
                                              rope_dim=0, fused_args=None):
        if fused_args is not None:
            raise NotImplementedError("sgl_kernel stand-in: rope fused with the KV-cache store "
                                      "has no portable version")
        assert rope_dim in (0, cos_sin_cache.shape[-1]), (
            f"rope_dim={rope_dim} vs cos_sin_cache width {cos_sin_cache.shape[-1]}")
        sk.apply_rope_with_cos_sin_cache_inplace(positions, q, k, q.shape[-1], cos_sin_cache,
                                                 is_neox)

    return apply_rope_with_cos_sin_cache_inplace


def _portable_candidates(original: Callable) -> Callable:
    def _auto_backend_candidates(self):
        return tuple(b for b in original(self) if b.value in PORTABLE_BACKENDS)

    _auto_backend_candidates.__wrapped__ = original
    return _auto_backend_candidates


def _fused_op(module: ModuleType) -> None:
    cls = getattr(module, "BaseFusedOp", None)
    meth = getattr(cls, "_auto_backend_candidates", None)
    if meth is not None and not hasattr(meth, "__wrapped__"):
        cls._auto_backend_candidates = _portable_candidates(meth)
        APPLIED.append(f"{module.__name__}.BaseFusedOp._auto_backend_candidates")


def _build(sk: ModuleType) -> None:
    acts = {f"{n}_and_mul": _jit_act(sk, f"{n}_and_mul") for n in ("silu", "gelu", "gelu_tanh")}
    rope = _jit_rope(sk)
    _ROUTES.update({
        "sglang.kernels.ops.activation.activation": acts,
        "sglang.srt.layers.activation": {f"_jit_{k}": v for k, v in acts.items()},
        "sglang.kernels.ops.attention.rope": {
            "apply_rope_with_cos_sin_cache_inplace": rope, "rotary_embedding": sk.rotary_embedding},
        "sglang.srt.layers.rotary_embedding.base": {"apply_rope_with_cos_sin_cache_inplace": rope},
        "sglang.kernels.ops.kvcache.kvcache": {"can_use_store_cache": _false},
        "sglang.srt.mem_cache.memory_pool": {"can_use_store_cache": _false},
        "sglang.kernels.ops.layernorm.norm": {
            "is_supported_jit_fused_add_rmsnorm_hidden_size": _false},
        "sglang.kernels.ops.layernorm.rmsnorm_hf": {"is_supported_rmsnorm_hf_hidden_size": _false},
        "sglang.srt.layers.layernorm": {
            "is_supported_jit_fused_add_rmsnorm_hidden_size": _false,
            "is_supported_rmsnorm_hf_hidden_size": _false},
        "sglang.kernels.fused_op": {},
    })


def _apply(module: ModuleType) -> None:
    if module.__name__ == "sglang.kernels.fused_op":
        _fused_op(module)
    for attr, value in _ROUTES.get(module.__name__, {}).items():
        if attr in vars(module) and getattr(module, attr) is not value:
            setattr(module, attr, value)
            APPLIED.append(f"{module.__name__}.{attr}")


class _PostImportHook(importlib.abc.MetaPathFinder):
    """Wraps the loader of a routed module so that `_apply` runs right after it executes."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _ROUTES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_route(module):
            exec_module(module)
            _apply(module)

        loader.exec_module = exec_then_route
        return spec


def install(sk: ModuleType) -> None:
    """Build the routes to ``sk``'s ops, patch loaded modules, hook the rest (idempotent)."""
    if _ROUTES:
        return
    _build(sk)
    for name in _ROUTES:
        module = sys.modules.get(name)
        if module is not None:
            _apply(module)
    sys.meta_path.insert(0, _PostImportHook())
