"""Kernel tests: on a machine without CUDA, run the Triton kernels in the interpreter.

``TRITON_INTERPRET`` must be set before triton is imported (it is read when kernels are
decorated), so this conftest sets it first thing. ``import torch`` does not import triton.
"""

import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:  # rq_kernels is a top-level package next to sglang_rq
    sys.path.insert(0, ROOT)

import pytest  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device() -> str:
    return DEVICE


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="real-size kernel tests need CUDA")
    for item in items:  # NOTE: the marker, not item.keywords (a parametrize id "gpu" is one)
        if item.get_closest_marker("gpu") is not None and DEVICE != "cuda":
            item.add_marker(skip)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: real-size kernel test, runs only with CUDA")
