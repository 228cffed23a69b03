"""`benchmarks.flashinfer_decode`, the FlashInfer baseline's loader: its refusals on CPU, and the
bundle's modules loading where `benchmarks/flashinfer_bundle.py` built them (the timing itself
runs on the GPU, in `bench_decode.py` and `bench_decode_step.py`)."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks.flashinfer_decode import DEFAULT_BUNDLE as BUNDLE
from benchmarks.flashinfer_decode import FlashInferDecode


def test_missing_bundle_names_the_builder(tmp_path):
    with pytest.raises(FileNotFoundError, match="flashinfer_bundle.py"):
        FlashInferDecode(tmp_path)


def test_head_dim_outside_the_bundle_is_refused(tmp_path):
    pytest.importorskip("tvm_ffi")
    (tmp_path / "manifest.json").write_text(json.dumps(
        {"flashinfer": "flashinfer-python==0.7.4", "tvm_ffi_wheel": "none.whl",
         "modules": {"128": "bf16_d128.so"}}))
    fi = FlashInferDecode(tmp_path)
    with pytest.raises(ValueError, match=r"head_dim 64: the bundle holds \['128'\]"):
        fi.module(64)
    with pytest.raises(FileNotFoundError, match="bf16_d128.so: listed in the manifest but missing"):
        fi.module(128)


@pytest.mark.skipif(not os.path.exists(os.path.join(BUNDLE, "flashinfer-decode", "manifest.json")),
                    reason="no FlashInfer bundle (benchmarks/flashinfer_bundle.py .gpu-bundle)")
def test_bundle_modules_load():
    pytest.importorskip("tvm_ffi")
    fi = FlashInferDecode(BUNDLE)
    for d in fi.manifest["modules"]:
        mod = fi.module(int(d))
        assert callable(mod.plan) and callable(mod.run)


def test_benchmarks_record_why_the_arm_is_absent(tmp_path):
    import torch

    from benchmarks.flashinfer_decode import load_baseline
    fi, record = load_baseline(tmp_path)
    assert fi is None
    want = "no CUDA device" if not torch.cuda.is_available() else "flashinfer_bundle.py"
    assert want in record["absent"]
