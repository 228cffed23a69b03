"""Test-session setup so that SGLang imports in the test process: on a machine without CUDA the
CPU stand-in for sgl_kernel's compiled library (sglang_rq/_cpu_shims); on a CUDA host without a
working sgl_kernel (an offline bundle) the portable-mode stand-in (`sglang_rq.portable`), as the
launcher does for the server."""

from __future__ import annotations

import os
import sys

import torch

from sglang_rq.launch_server import CPU_SHIMS

if not torch.cuda.is_available():
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    if str(CPU_SHIMS) not in sys.path:
        sys.path.insert(0, str(CPU_SHIMS))
else:
    from sglang_rq import portable

    if portable.standin_reason() is not None:
        for key, value in portable.portable_environment().items():
            os.environ.setdefault(key, value)
        if str(portable.STANDIN_DIR) not in sys.path:
            sys.path.insert(0, str(portable.STANDIN_DIR))


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _seeded_torch():
    """Every test starts from the same global torch RNG state, so a test that draws unseeded
    random tensors draws the same ones on every run and in every order (a test that passes
    once passes in CI)."""
    torch.manual_seed(0)
    yield
