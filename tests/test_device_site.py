"""`benchmarks/device_site.py`: which members of the offline bundle the device's SGLang site keeps,
and the evaluation texts' heads. The kept modules are the ones sessions 40 and 41 found imported at
start-up on an H100 (each missing one failed the server or the pool tests); the dropped ones are
what the checkout or nothing serves."""

from __future__ import annotations

import pytest

from benchmarks.device_site import keep, write_data_heads
from sglang_rq.models.embedded import EMBEDDED_MODEL
from sglang_rq.quality import data


@pytest.mark.parametrize("name", [
    "sglang/srt/multimodal/cache.py", "sglang/srt/hardware_backend/mlx/runtime.py",
    "sglang/srt/disaggregation/utils.py", "sglang/test/__init__.py",
    "sglang/test/scripted_runtime/scheduler_hook.py", "_soundfile_data/libsndfile_x86_64.so",
    "openai/__init__.py", "xgrammar/__init__.py", "gguf/__init__.py", "tvm_ffi/lib/libtvm_ffi.so",
    "tvm_ffi/lib/libtvm_ffi_testing.so", "xgrammar-0.2.7.dist-info/RECORD",
    "sglang-0.5.23.dist-info/METADATA", "./sglang/srt/models/llama.py", "zmq/__init__.py",
    "IPython/display.py", "sglang_rq_extra/x.py"])
def test_the_site_keeps_what_serving_imports(name):
    assert keep(name)


@pytest.mark.parametrize("name", [
    "sglang_rq/plugin.py", "rq_kernels/decode.py", "sglang/test/kits/x.py",
    "sglang/test/long_prompt.txt", "sglang/benchmark/datasets/a.py", "tvm_ffi/include/x.h",
    "tvm_ffi/3rdparty/dlpack/x.h",
    "zmq/tests/test_x.py", "IPython/terminal/tests/t.py",
    "./rq_kernels"])
def test_the_site_drops_what_the_checkout_or_nothing_serves(name):
    assert not keep(name)


def test_the_heads_hold_the_gpu_server_tests_documents(tmp_path):
    """The GPU server test's evaluation (4 documents of 512 tokens per text, from the start) reads
    the same token ids from the heads as from the whole texts."""
    src = data.data_dir_with("literature")
    if src is None or not (src / "wikitext2").exists():
        pytest.skip("no data directory with literature and wikitext2 (SGLANG_RQ_DATA_DIR)")
    written = write_data_heads(src, tmp_path)
    assert [p.relative_to(tmp_path) for p in written] == [data.dataset_file(n)
                                                          for n in data.DATASETS]
    assert all(p.stat().st_size <= 64 * 1024 for p in written)
    tok = data.load_tokenizer(EMBEDDED_MODEL)
    for name in data.DATASETS:
        whole, head = (data.documents(name, d, tok, num_docs=4, doc_tokens=512, bos_id=None)
                       for d in (src, tmp_path))
        assert head == whole, name
