"""CUDA C++ kernels compiled at first use: ``nvcc -cubin`` into a disk cache, loaded and launched
through the CUDA driver API (``libcuda`` via ctypes), the way Triton launches its own cubins.

Why not a PyTorch C++ extension: no host compiler, pybind11 or ninja is needed, only ``nvcc``
(the CUDA toolkit, 12.4 or newer; the H200 machine has 13.0) when a variant is first compiled.
A compiled variant is cached under ``$SGLANG_RQ_CUDA_CACHE`` (default
``~/.cache/sglang-rq/cuda``), keyed by the source text, the defines and the GPU architecture,
so later processes (SGLang's TP workers, restarts) only load it.

Launches go to the current PyTorch stream, so they are captured by CUDA graphs. Compiling and
loading happen on the first eager call (SGLang runs eager warm-ups before capture).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

import torch

CSRC = Path(__file__).resolve().parent / "csrc"
_LOCK = threading.Lock()
_FUNCS: dict[tuple, int] = {}


def nvcc_path() -> str | None:
    """The ``nvcc`` that compiles the kernels: ``$CUDA_HOME/bin/nvcc`` or the one on ``PATH``."""
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def cache_dir() -> Path:
    return Path(os.environ.get("SGLANG_RQ_CUDA_CACHE",
                               Path.home() / ".cache" / "sglang-rq" / "cuda"))


def arch_of(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def _cubin_path(source: str, defines: dict[str, int], arch: str) -> Path:
    key = hashlib.sha256(repr((source, sorted(defines.items()), arch)).encode()).hexdigest()[:24]
    return cache_dir() / f"{key}.cubin"


def compiled_or_compilable(source: str, defines: dict[str, int], device: torch.device
                           ) -> str | None:
    """Why ``source`` with ``defines`` cannot be loaded on ``device`` (None if it can: cached, or
    ``nvcc`` is available to compile it)."""
    path = _cubin_path((CSRC / source).read_text(), defines, arch_of(device))
    if path.is_file() or nvcc_path() is not None:
        return None
    return "nvcc not found (set CUDA_HOME or put the CUDA toolkit's bin on PATH)"


def _compile(text: str, source: str, defines: dict[str, int], arch: str) -> bytes:
    path = _cubin_path(text, defines, arch)
    if path.is_file():
        return path.read_bytes()
    nvcc = nvcc_path()
    if nvcc is None:
        raise RuntimeError(f"compiling {source} needs nvcc: set CUDA_HOME or put the CUDA "
                           "toolkit's bin on PATH")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    cmd = [nvcc, "-cubin", f"-arch={arch}", "-O3", "-use_fast_math", "-std=c++17",
           *(f"-D{k}={v}" for k, v in sorted(defines.items())), "-o", str(tmp),
           str(CSRC / source)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"nvcc failed on {source} ({' '.join(cmd)}):\n{res.stderr[-4000:]}")
    os.replace(tmp, path)  # atomic: concurrent processes compiling the same variant
    return path.read_bytes()


class _Driver:
    """The few CUDA driver entry points the launcher needs."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(name))
            raise RuntimeError(f"{what} failed: CUDA driver error {rc} "
                               f"({(name.value or b'?').decode()})")

    def ensure_context(self, index: int) -> None:
        ctx = ctypes.c_void_p()
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if not ctx.value:
            dev = ctypes.c_int()
            self.check(self.lib.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
            self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev),
                       "cuDevicePrimaryCtxRetain")
            self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def load(self, cubin: bytes, name: str) -> int:
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        self.check(self.lib.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(cubin)),
                   "cuModuleLoadData")
        self.check(self.lib.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()),
                   f"cuModuleGetFunction({name})")
        return fn.value

    def launch(self, fn: int, grid: tuple[int, int, int], block: int, params: ctypes.Structure,
               shared_bytes: int, stream: int) -> None:
        argv = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(params), ctypes.c_void_p))
        self.check(self.lib.cuLaunchKernel(
            ctypes.c_void_p(fn), *map(ctypes.c_uint, grid), ctypes.c_uint(block),
            ctypes.c_uint(1), ctypes.c_uint(1), ctypes.c_uint(shared_bytes), ctypes.c_void_p(stream),
            argv, None), "cuLaunchKernel")


_DRIVER: _Driver | None = None


def function(source: str, name: str, defines: dict[str, int], device: torch.device, *,
             shared_bytes: int = 0) -> int:
    """The loaded ``extern "C"`` kernel ``name`` of ``csrc/source`` compiled with ``defines`` for
    ``device`` (compiled on first use, then cached on disk and in this process), allowed
    ``shared_bytes`` of dynamic shared memory per CTA.

    Raises RuntimeError if nvcc is missing or fails, or the driver refuses the module."""
    global _DRIVER
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (source, name, tuple(sorted(defines.items())), index, shared_bytes)
    fn = _FUNCS.get(key)
    if fn is not None:
        return fn
    with _LOCK:
        if key not in _FUNCS:
            _DRIVER = _DRIVER or _Driver()
            text = (CSRC / source).read_text()
            cubin = _compile(text, source, defines, arch_of(device))
            torch.cuda.init()
            with torch.cuda.device(index):
                _DRIVER.ensure_context(index)
                fn = _DRIVER.load(cubin, name)
                if shared_bytes > 48 * 1024:
                    _DRIVER.check(_DRIVER.lib.cuFuncSetAttribute(  # 8: MAX_DYNAMIC_SHARED_SIZE
                        ctypes.c_void_p(fn), 8, ctypes.c_int(shared_bytes)), "cuFuncSetAttribute")
                _FUNCS[key] = fn
        return _FUNCS[key]


def launch(fn: int, grid: tuple[int, int, int], block: int, params: ctypes.Structure,
           device: torch.device, *, shared_bytes: int = 0) -> None:
    """Launch ``fn`` with one by-value struct argument and ``shared_bytes`` of dynamic shared
    memory on PyTorch's current stream of ``device``."""
    assert _DRIVER is not None
    _DRIVER.launch(fn, grid, block, params, shared_bytes,
                   torch.cuda.current_stream(device).cuda_stream)
