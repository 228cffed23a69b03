"""FlashInfer's BF16 paged decode as a baseline next to PyTorch SDPA (issue 12's second yardstick).

Loads the modules `benchmarks/flashinfer_bundle.py` builds (``DIR/flashinfer-decode``: FlashInfer
0.7.4's batch decode module per head_dim, compiled for sm_90a, and the tvm-ffi wheel its
bindings need) and calls them as ``BatchDecodeWithPagedKVCacheWrapper`` does without tensor
cores (SGLang 0.5.23's FlashInfer backend for BF16 decode at fewer than 4 query heads per KV
head, `should_use_tensor_core`): ``plan``
once on the host, ``run`` per call. The cache is SGLang's at page size 1: ``[tokens, 1, Hkv,
D]`` K and V (NHD), one page per token; a request's pages consecutive.
"""

from __future__ import annotations

import json
import pathlib
import sys
import tempfile
import zipfile

import torch

DEFAULT_BUNDLE = pathlib.Path(__file__).resolve().parent.parent / ".gpu-bundle"  # --flashinfer
FLOAT_WORKSPACE = 128 << 20  # FlashInfer's recommended split-KV workspace
INT_WORKSPACE = 8 << 20


class FlashInferDecode:
    """The bundle's modules; `call` builds one planned decode call.

    Raises ``FileNotFoundError`` naming the file when the bundle or a module is missing, and
    ``ValueError`` for a head_dim the bundle was not built for."""

    def __init__(self, bundle: str | pathlib.Path) -> None:
        self.dir = pathlib.Path(bundle)
        if (self.dir / "flashinfer-decode").is_dir():
            self.dir = self.dir / "flashinfer-decode"
        manifest = self.dir / "manifest.json"
        if not manifest.exists():
            raise FileNotFoundError(f"{manifest}: build it with benchmarks/flashinfer_bundle.py")
        self.manifest = json.loads(manifest.read_text())
        try:
            import tvm_ffi
        except ImportError:  # the GPU machine: the bundle's wheel, unpacked once
            site = pathlib.Path(tempfile.gettempdir()) / ("rq-" + self.manifest["tvm_ffi_wheel"])
            if not (site / "tvm_ffi").is_dir():
                with zipfile.ZipFile(self.dir / self.manifest["tvm_ffi_wheel"]) as z:
                    z.extractall(site)
            sys.path.insert(0, str(site))
            import tvm_ffi
        self._ffi = tvm_ffi
        self._modules: dict[int, object] = {}
        self._workspaces: dict[torch.device, tuple] = {}
        self._planned: dict[torch.device, tuple] = {}  # the plan each device's workspace holds

    @property
    def version(self) -> str:
        return self.manifest["flashinfer"]

    def module(self, head_dim: int):
        if head_dim not in self._modules:
            name = self.manifest["modules"].get(str(head_dim))
            if name is None:
                raise ValueError(f"head_dim {head_dim}: the bundle holds "
                                 f"{sorted(self.manifest['modules'])}")
            path = self.dir / name
            if not path.exists():
                raise FileNotFoundError(f"{path}: listed in the manifest but missing; rebuild the "
                                        "bundle with benchmarks/flashinfer_bundle.py")
            self._modules[head_dim] = self._ffi.load_module(str(path))
        return self._modules[head_dim]

    def _workspace(self, device: torch.device) -> tuple:
        if device not in self._workspaces:
            self._workspaces[device] = (
                torch.empty(FLOAT_WORKSPACE, dtype=torch.uint8, device=device),
                torch.empty(INT_WORKSPACE, dtype=torch.uint8, device=device),
                torch.empty(INT_WORKSPACE, dtype=torch.uint8, pin_memory=True))
        return self._workspaces[device]

    def call(self, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_lens: list[int],
             num_qo_heads: int, *, sm_scale: float):
        """``run(q, out=None) -> out``: one decode call over this cache (planned here, on the
        host, as the wrapper's ``plan``; the launch is ``run``'s).

        k_cache, v_cache ``[tokens, 1, Hkv, D]`` bf16 (pages of one token), request i's
        ``kv_lens[i]`` tokens at the pages after request i - 1's; q ``[B, Hq, D]`` bf16 with
        ``B = len(kv_lens)``, ``Hq = num_qo_heads``, any request and head strides; out ``[B,
        Hq, D]`` bf16 (allocated if None). ``run`` launches on torch's current stream and is CUDA-graph capturable (the plan
        assumes graphs, as SGLang's does) and, from compute capability 9.0, with programmatic
        dependent launch, as the wrapper's ``run`` defaults to and SGLang leaves it. The calls
        share the bundle's workspaces: ``run`` raises ``RuntimeError`` once a call with other
        ``kv_lens`` or shapes has been planned since (its plan was overwritten)."""
        b, d, hkv = len(kv_lens), k_cache.shape[3], k_cache.shape[2]
        if sum(kv_lens) > k_cache.shape[0] or v_cache.shape != k_cache.shape:
            raise ValueError(f"kv_lens hold {sum(kv_lens)} tokens; k_cache "
                             f"{tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}")
        mod = self.module(d)
        dev = k_cache.device
        fws, iws, pinned = self._workspace(dev)
        indptr_host = torch.tensor([0, *kv_lens], dtype=torch.int32).cumsum(0, dtype=torch.int32)
        indptr = indptr_host.to(dev)
        indices = torch.arange(int(indptr_host[-1]), dtype=torch.int32, device=dev)
        last_page_len = torch.ones(b, dtype=torch.int32, device=dev)
        key = (tuple(kv_lens), num_qo_heads, hkv, d)
        plan = mod.plan(fws, iws, pinned, indptr_host, b, num_qo_heads, hkv, 1, True, -1, 0.0,
                        d, d, torch.empty(0, dtype=torch.bfloat16),
                        torch.empty(0, dtype=k_cache.dtype))
        torch.cuda.current_stream(dev).synchronize()  # the plan's copies landed
        self._planned[dev] = key
        pdl = torch.cuda.get_device_capability(dev)[0] >= 9  # FlashInfer's device_support_pdl
        ffi, planned = self._ffi, self._planned

        def run(q: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
            if tuple(q.shape) != (b, num_qo_heads, d):
                raise ValueError(f"q {tuple(q.shape)}: the call was planned for "
                                 f"{(b, num_qo_heads, d)}")
            if planned.get(dev) != key:
                raise RuntimeError("this call's plan was overwritten by a later call's: plan "
                                   "again (FlashInferDecode.call)")
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
            if not out.is_contiguous():
                raise ValueError("out must be contiguous (FlashInfer writes [B, Hq, D] densely)")
            # NHD layout (0), no window (-1), no lse, no ALiBi slopes, no soft cap; RoPE's
            # reciprocal scale and theta (unused without RoPE)
            with ffi.use_torch_stream():
                mod.run(fws, iws, plan, q, k_cache, v_cache, indptr, indices, last_page_len,
                        out, None, 0, -1, pdl, None, 0.0, sm_scale, 1.0, 1e-4)
            return out
        return run


def load_baseline(bundle: str | pathlib.Path) -> tuple[FlashInferDecode | None, dict]:
    """The benchmarks' FlashInfer arm: (the bundle's decode, or None off CUDA or without a
    loadable bundle; the results JSON's record: its version and manifest, or why it is absent)."""
    if not torch.cuda.is_available():
        return None, dict(absent="no CUDA device")
    try:
        fi = FlashInferDecode(bundle)
    except (FileNotFoundError, ImportError, OSError) as exc:
        return None, dict(absent=f"{type(exc).__name__}: {exc}")
    return fi, dict(version=fi.version, bundle=fi.manifest)
