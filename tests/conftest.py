"""Test-session setup: the CPU stand-in for sgl_kernel (see sglang_rq/_cpu_shims) when no CUDA."""

from __future__ import annotations

import os
import sys

import torch

from sglang_rq.launch_server import CPU_SHIMS

if not torch.cuda.is_available():
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    if str(CPU_SHIMS) not in sys.path:
        sys.path.insert(0, str(CPU_SHIMS))
