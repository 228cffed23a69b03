"""`benchmarks/device_site.py`: which members of the offline bundle the device's SGLang site keeps.
The kept modules are the ones session 40 found imported at start-up on an H100 (each missing one
failed the server or the pool tests); the dropped ones are what the checkout or nothing serves."""

from __future__ import annotations

import pytest

from benchmarks.device_site import keep


@pytest.mark.parametrize("name", [
    "sglang/srt/multimodal/cache.py", "sglang/srt/hardware_backend/mlx/runtime.py",
    "sglang/srt/disaggregation/utils.py", "sglang/test/__init__.py",
    "sglang/test/scripted_runtime/scheduler_hook.py", "_soundfile_data/libsndfile_x86_64.so",
    "openai/__init__.py", "xgrammar/__init__.py", "gguf/__init__.py", "tvm_ffi/lib/libtvm_ffi.so",
    "sglang-0.5.23.dist-info/METADATA", "./sglang/srt/models/llama.py", "zmq/__init__.py",
    "IPython/display.py", "sglang_rq_extra/x.py"])
def test_the_site_keeps_what_serving_imports(name):
    assert keep(name)


@pytest.mark.parametrize("name", [
    "sglang_rq/plugin.py", "rq_kernels/decode.py", "sglang/test/kits/x.py",
    "sglang/test/long_prompt.txt", "sglang/benchmark/datasets/a.py", "tvm_ffi/include/x.h",
    "tvm_ffi/3rdparty/dlpack/x.h", "tvm_ffi/lib/libtvm_ffi_testing.so",
    "sglang-0.5.23.dist-info/RECORD", "zmq/tests/test_x.py", "IPython/terminal/tests/t.py",
    "./rq_kernels"])
def test_the_site_drops_what_the_checkout_or_nothing_serves(name):
    assert not keep(name)
