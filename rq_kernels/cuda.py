"""CUDA C++ kernels compiled at first use into a disk cache, loaded and launched through the CUDA
driver API (``libcuda`` via ctypes), the way Triton launches its own cubins.

The compiler is ``nvcc -cubin`` when the CUDA toolkit is installed (12.x/13.x; the H200 machine's
13.0 built every measured cubin), else NVRTC: ``libnvrtc`` from the ``nvidia-cuda-nvrtc`` wheel
that CUDA builds of PyTorch install, so a runtime-only image needs nothing extra. No host
compiler, pybind11 or ninja is involved. A compiled variant is cached under
``$XDG_CACHE_HOME/rq_kernels`` (default ``~/.cache``), keyed by the source text, the
defines and the GPU architecture, so later processes (SGLang's TP workers, restarts) only load it.

Launches go to the current PyTorch stream, so they are captured by CUDA graphs. Compiling and
loading happen on the first eager call (SGLang runs eager warm-ups before capture).
"""

from __future__ import annotations

import ctypes
import ctypes.util
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
    """Where cubins are cached: ``$XDG_CACHE_HOME/rq_kernels`` (default ``~/.cache``), next to
    the CPU library's builds (`rq_kernels.cpu_attention`)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rq_kernels"


def arch_of(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def _cubin_path(source: str, defines: dict[str, int], arch: str) -> Path:
    key = hashlib.sha256(repr((source, sorted(defines.items()), arch)).encode()).hexdigest()[:24]
    return cache_dir() / f"{key}.cubin"


def nvrtc_path() -> str | None:
    """``libnvrtc`` of the ``nvidia-cuda-nvrtc`` wheel (cu13 or cu12 layout), else the system's."""
    try:
        import nvidia  # namespace package of NVIDIA's CUDA wheels
        roots = [Path(p) for p in nvidia.__path__]
    except ImportError:
        roots = []
    for root in roots:
        for pattern in ("cu13/lib/libnvrtc.so.*", "cuda_nvrtc/lib/libnvrtc.so.*",
                        "*/lib/libnvrtc.so.*"):
            hits = sorted(h for h in root.glob(pattern) if "builtins" not in h.name
                          and ".alt." not in h.name)
            if hits:
                return str(hits[0])
    return ctypes.util.find_library("nvrtc")


def load_reason(source: str, name: str, defines: dict[str, int], device: torch.device, *,
                shared_bytes: int = 0) -> str | None:
    """Why kernel ``name`` of ``csrc/source`` with ``defines`` cannot be loaded on ``device``
    (None if it can). Compiles and loads it (`function`), so a missing or failing compiler or a
    refused module becomes a reason the launcher can fall back on, not an error at the first
    forward."""
    if not (CSRC / source).is_file():
        return f"{CSRC / source} is missing (a wheel built without rq_kernels/csrc/*.cu)"
    try:
        function(source, name, defines, device, shared_bytes=shared_bytes)
    except (RuntimeError, OSError) as exc:
        return str(exc).splitlines()[0][:300]
    return None


def _compile(text: str, source: str, defines: dict[str, int], arch: str) -> bytes:
    """The cubin of ``text`` for ``arch``: from the cache, else nvcc, else (nvcc missing or
    failing, e.g. too old for ``arch``) NVRTC. Raises RuntimeError naming both failures."""
    path = _cubin_path(text, defines, arch)
    if path.is_file():
        return path.read_bytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    own = f"{os.getpid()}.{threading.get_ident()}"  # this thread's files: concurrent builds
    tmp = path.with_suffix(f".{own}.tmp")
    nvcc, nvcc_error = nvcc_path(), "nvcc not found"
    if nvcc is not None:  # compiles text itself, the cache's key (not csrc/source, which may differ)
        src = path.with_name(f"{path.stem}.{own}.{source}")
        src.write_text(text)
        cmd = [nvcc, "-cubin", f"-arch={arch}", "-O3", "-use_fast_math", "-std=c++17",
               *(f"-D{k}={v}" for k, v in sorted(defines.items())), "-o", str(tmp), str(src)]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True)
        finally:
            src.unlink(missing_ok=True)
        if res.returncode == 0:
            os.replace(tmp, path)  # atomic: concurrent processes compiling the same variant
            return path.read_bytes()
        nvcc_error = f"nvcc failed ({' '.join(cmd)}): {res.stderr.strip()[-2000:]}"
    try:
        cubin = compile_nvrtc(text, source, defines, arch)
    except RuntimeError as exc:
        raise RuntimeError(f"cannot compile {source}: {nvcc_error}; {exc}") from exc
    tmp.write_bytes(cubin)
    os.replace(tmp, path)
    return cubin


def compile_nvrtc(text: str, source: str, defines: dict[str, int], arch: str) -> bytes:
    """Compile CUDA C++ ``text`` to a cubin for ``arch`` (``sm_90``...) with NVRTC.

    Raises RuntimeError with NVRTC's log if libnvrtc is missing or compilation fails."""
    lib_path = nvrtc_path()
    if lib_path is None:
        raise RuntimeError(f"compiling {source} needs nvcc or libnvrtc (nvidia-cuda-nvrtc)")
    lib = ctypes.CDLL(lib_path)
    prog = ctypes.c_void_p()

    def check(rc: int, what: str) -> None:
        if rc != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value + 1)
            lib.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(f"NVRTC {what} failed on {source} (error {rc}):\n"
                               f"{log.value.decode(errors='replace')[-4000:]}")

    check(lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), source.encode(), 0, None,
                                 None), "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={arch}", "--use_fast_math", "-std=c++17",
                *(f"-D{k}={v}" for k, v in sorted(defines.items()))]
        argv = (ctypes.c_char_p * len(opts))(*(o.encode() for o in opts))
        check(lib.nvrtcCompileProgram(prog, len(opts), argv), "compile")
        size = ctypes.c_size_t()
        check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
        buf = ctypes.create_string_buffer(size.value)
        check(lib.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
        return buf.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


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
               shared_bytes: int, stream: int, pdl: bool) -> None:
        argv = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(params), ctypes.c_void_p))
        if not pdl:
            self.check(self.lib.cuLaunchKernel(
                ctypes.c_void_p(fn), *map(ctypes.c_uint, grid), ctypes.c_uint(block),
                ctypes.c_uint(1), ctypes.c_uint(1), ctypes.c_uint(shared_bytes),
                ctypes.c_void_p(stream), argv, None), "cuLaunchKernel")
            return
        attr = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
        attr.value[0] = 1  # programmaticStreamSerializationAllowed
        config = _LaunchConfig(*grid, block, 1, 1, shared_bytes, stream, ctypes.pointer(attr), 1)
        self.check(self.lib.cuLaunchKernelEx(ctypes.byref(config), ctypes.c_void_p(fn), argv,
                                             None), "cuLaunchKernelEx")


_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID (cuda.h)
_PREFERRED_SHARED_MEMORY_CARVEOUT = 9  # CUfunction_attribute (cuda.h)


class _LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute`` (cuda.h): an id, padding to 8 bytes, a 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` (cuda.h)."""

    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("shared_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


_DRIVER: _Driver | None = None


def function(source: str, name: str, defines: dict[str, int], device: torch.device, *,
             shared_bytes: int = 0, carveout: int | None = None) -> int:
    """The loaded ``extern "C"`` kernel ``name`` of ``csrc/source`` compiled with ``defines`` for
    ``device`` (compiled on first use, then cached on disk and in this process), allowed
    ``shared_bytes`` of dynamic shared memory per CTA, with the preferred shared-memory
    ``carveout`` (`set_carveout`) if given.

    Raises RuntimeError if neither nvcc nor NVRTC builds it (`_compile`), or the driver refuses
    the module."""
    global _DRIVER
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (source, name, tuple(sorted(defines.items())), index, shared_bytes, carveout)
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
                if carveout is not None:
                    set_carveout(fn, carveout)
                _FUNCS[key] = fn
        return _FUNCS[key]


_CARVEOUTS: dict[int, int] = {}


def set_carveout(fn: int, percent: int | None) -> None:
    """Set the preferred shared-memory carveout of the loaded kernel ``fn`` (a ``CUfunction``:
    ours, or a Triton ``CompiledKernel.function`` of the same context) to ``percent`` of the
    SM's maximum shared memory; the rest of the unified L1/shared memory stays L1. CTAs of
    kernels whose carveouts differ cannot share an SM until it drains: kernels that overlap
    through programmatic dependent launch should prefer the same one. Once per (fn, percent);
    None: nothing (the driver decides)."""
    global _DRIVER
    if percent is None or _CARVEOUTS.get(fn) == percent:
        return
    _DRIVER = _DRIVER or _Driver()
    _DRIVER.check(_DRIVER.lib.cuFuncSetAttribute(
        ctypes.c_void_p(fn), _PREFERRED_SHARED_MEMORY_CARVEOUT, ctypes.c_int(percent)),
        "cuFuncSetAttribute(carveout)")
    _CARVEOUTS[fn] = percent


def launch(fn: int, grid: tuple[int, int, int], block: int, params: ctypes.Structure,
           device: torch.device, *, shared_bytes: int = 0, pdl: bool = False) -> None:
    """Launch ``fn`` with one by-value struct argument and ``shared_bytes`` of dynamic shared
    memory on PyTorch's current stream of ``device``; ``pdl``: as a programmatic dependent
    launch (``cuLaunchKernelEx`` with programmatic stream serialization: its CTAs may start
    before the previous kernel on the stream ends, so ``fn`` must ``griddepcontrol.wait``
    before reading that kernel's output; CUDA graphs capture the edge; sm_90+)."""
    assert _DRIVER is not None
    _DRIVER.launch(fn, grid, block, params, shared_bytes,
                   torch.cuda.current_stream(device).cuda_stream, pdl)
