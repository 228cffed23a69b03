"""Portable CUDA mode: serve on a CUDA host without a working compiled ``sgl_kernel``.

When the sglang-kernel wheel is missing, or fails to import (built for another torch or CUDA),
the launcher puts `STANDIN_DIR` first on ``PYTHONPATH``: its ``sgl_kernel`` package implements
the dense-model ops with the Triton kernels of `rq_kernels.ops` and routes SGLang's JIT call
sites to them (see ``_cuda_standin/sgl_kernel/__init__.py``). `portable_environment` lists the
environment SGLang then needs. Module level imports only the standard library (``sglang-rq
doctor`` imports it before torch).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

STANDIN_DIR = Path(__file__).resolve().parent / "_cuda_standin"

# NOTE: run in a child so that a failing import (or a CUDA context) never touches this process.
_PROBE = (
    "import sgl_kernel, sys\n"
    "if getattr(sgl_kernel, 'STANDIN', False):\n"
    "    sys.exit('only the sglang-rq stand-in is importable')\n"
    "sgl_kernel.rmsnorm\n"
)


def _ours() -> set[str]:
    return {str(STANDIN_DIR), str(STANDIN_DIR.parent / "_cpu_shims")}


def _without_standin(pythonpath: str) -> str:
    return os.pathsep.join(p for p in pythonpath.split(os.pathsep)
                           if p and str(Path(p).resolve()) not in _ours())


def standin_reason(*, timeout_s: float = 300.0) -> str | None:
    """Why the stand-in is needed: None if a working real ``sgl_kernel`` imports here.

    Looks the package up on ``sys.path`` first (no import); if the package exists, imports it in
    a child interpreter (with our stand-in and CPU shims off its path).

    Returns
    -------
    str or None
        ``"sgl_kernel not installed"``, ``"sgl_kernel failed to import: <last error line>"``,
        or None.
    """
    from importlib.machinery import PathFinder

    search = [p for p in sys.path if str(Path(p or ".").resolve()) not in _ours()]
    if PathFinder.find_spec("sgl_kernel", search) is None:
        return "sgl_kernel not installed"
    env = dict(os.environ, PYTHONPATH=_without_standin(os.environ.get("PYTHONPATH", "")))
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"sgl_kernel failed to import: no answer within {timeout_s:.0f} s"
    if proc.returncode == 0:
        return None
    lines = [ln.strip() for ln in proc.stderr.strip().splitlines() if ln.strip()]
    return f"sgl_kernel failed to import: {lines[-1] if lines else f'exit {proc.returncode}'}"


def portable_environment() -> dict[str, str]:
    """Environment variables SGLang 0.5.23 needs with the stand-in (set for all processes).

    * ``SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1``: the engine asserts the sglang-kernel
      distribution's version at start-up; there is none.
    * ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python``: the Rust radix TreeCore is built
      against the torch SGLang pins and fails on the first insert under another torch (the
      hosts that need this mode are exactly those).

    ``SGLANG_FORCE_FUSED_OP_BACKEND`` is deliberately absent: ``torch`` would send RMSNorm,
    SiLU-and-mul and rotary to their many-small-op ``forward_native`` instead of the stand-in.
    """
    return {
        "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1",
        "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python",
    }
