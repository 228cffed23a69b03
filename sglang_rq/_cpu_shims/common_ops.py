"""CPU-only stand-in for ``sgl_kernel``'s compiled ``common_ops`` library.

The PyPI ``sglang-kernel`` wheel is CUDA-only: importing it without ``libcuda.so.1`` fails, and
SGLang imports it at module load even on the CPU engine. ``sgl_kernel`` falls back to
``import common_ops`` when its compiled library cannot load; the launcher puts this directory on
``PYTHONPATH`` only on machines without CUDA, so the import succeeds and no CUDA op is ever
registered (any call to one fails loudly with ``torch.ops`` "no attribute").
"""
