"""The dispatcher (`sglang_rq.dispatch`): which implementation serves commit, decode and extend.

CPU only: `resolve` reads the format and the device type, never a tensor on that device, so the
CUDA decisions are checked with ``device="cuda"`` on a machine without a GPU.
"""

from __future__ import annotations

import logging

import pytest
import torch

from rq_kernels import cpu_attention, decode_attention
from sglang_rq import dispatch, metrics
from sglang_rq.config import RQConfig
from sglang_rq.dispatch import KernelRequest, resolve
from sglang_rq.layout import ModelKVShape, kv_slot
from sglang_rq.reference import commit_reference, decode_attention_reference
from tests.kernels.views import make_view

TRITON = KernelRequest(backend="rq_triton")


def view_of(cfg: RQConfig, *, loops: int = 4, heads: int = 2, dim: int = 64):
    return make_view(cfg, num_loops=loops, num_kv_heads=heads, head_dim=dim, rows=8, fill=False)


def impls(paths: dispatch.KernelPaths) -> dict[str, str]:
    return {p.path: p.impl for p in paths}


def test_format_the_triton_kernels_refuse_runs_the_twin_with_its_reason():
    paths = resolve(view_of(RQConfig(anchor="chained")), device="cuda", request=TRITON)
    assert impls(paths) == {"commit": "twin", "decode": "twin", "extend": "twin"}
    assert {p.reason for p in paths} == {"anchor='chained'"}
    assert paths.commit.fn is commit_reference
    assert paths.decode.fn is decode_attention_reference
    one_bit = resolve(view_of(RQConfig(residual_bits=1)), device="cuda", request=TRITON)
    assert one_bit.decode.is_twin and "has 1 bits" in one_bit.decode.reason


def test_default_format_on_cuda_is_served_by_the_fma_kernel_for_mha_and_mma_for_gqa():
    mha = resolve(view_of(RQConfig()), device="cuda", request=TRITON)
    if torch.cuda.is_available():  # head_dim 64: not the CUDA tensor-core kernel's
        assert mha.decode.reason.startswith("decode tc: head_dim=64")
    else:
        assert mha.decode.reason == "decode tc: CUDA is not available"
    assert impls(mha) == {"commit": "triton", "decode": "triton_fma", "extend": "triton"}
    assert mha.decode.fn is decode_attention and mha.commit.reason == mha.extend.reason == ""
    gqa = resolve(view_of(RQConfig()), device="cuda",
                  request=KernelRequest(backend="rq_triton", qo_heads_per_kv=4))
    assert impls(gqa) == {"commit": "triton", "decode": "triton", "extend": "triton"}
    # no backend named: CUDA means rq_triton
    assert impls(resolve(view_of(RQConfig()), device="cuda:0")) == impls(mha)


def test_use_kernels_false_means_twins_for_every_path_on_every_backend():
    off = "SGLANG_RQ_USE_KERNELS=false"
    for backend, device in (("rq_triton", "cuda"), ("rq_native", "cpu")):
        paths = resolve(view_of(RQConfig()), device=device,
                        request=KernelRequest(backend=backend, use_kernels=False))
        assert [(p.impl, p.reason) for p in paths] == [("twin", off)] * 3


def test_cpu_backend_serves_with_the_c_library_or_says_why_not():
    paths = resolve(view_of(RQConfig()), device="cpu")
    why = cpu_attention.library_error()
    if why is None:
        assert impls(paths) == {"commit": "c", "decode": "c", "extend": "c"}
    else:  # no C compiler here: the build error is the reason
        assert [(p.impl, p.reason) for p in paths] == [("twin", why)] * 3
    wide = resolve(view_of(RQConfig(anchor_bits=16), loops=2), device="cpu")
    assert all(p.is_twin and "16 bits" in p.reason for p in wide)
    on_gpu = resolve(view_of(RQConfig()), device="cuda", request=KernelRequest(backend="rq_native"))
    assert all(p.is_twin and "CPU tensors" in p.reason for p in on_gpu)


def test_unknown_backend_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="rq_native"):
        KernelRequest(backend="flashinfer")


def test_count_forward_counts_only_paths_a_twin_serves(monkeypatch):
    counted: list[str] = []
    monkeypatch.setattr(metrics, "count_fallback", counted.append)
    twin = resolve(view_of(RQConfig(anchor="chained")), device="cuda", request=TRITON)
    twin.count_forward(decode=True)
    twin.count_forward(decode=False)
    assert counted == ["commit", "decode", "commit", "extend"]
    counted.clear()
    resolve(view_of(RQConfig()), device="cuda", request=TRITON).count_forward(decode=True)
    assert counted == []
    assert set(metrics.FALLBACK_PATHS) == {pre + p for pre in ("", "unlooped_") for p in dispatch.PATHS}


def test_pool_resolves_once_logs_and_publishes_and_commits_through_the_twin(monkeypatch, caplog):
    from sglang_rq.pool import bind_pool_class

    published: list = []
    monkeypatch.setattr(metrics, "publish_kernel_paths", published.append)
    shape = ModelKVShape(num_layers=2, num_loops=2, num_kv_heads=2, head_dim=64)
    cls = bind_pool_class(cfg=RQConfig(anchor_bits=16, rotation="none"), shape=shape,
                          staging_tokens=8)
    with caplog.at_level(logging.INFO, logger="sglang_rq.dispatch"):
        pool = cls(size=16, page_size=1, dtype=torch.bfloat16, head_num=2, head_dim=64,
                   layer_num=4, device="cpu", enable_memory_saver=False)
    paths = pool.stacks["looped"].kernel_paths
    assert paths.commit.is_twin and "16 bits" in paths.commit.reason
    assert published == [paths.rows()]
    assert "running the PyTorch twin" in caplog.text
    k = torch.randn(3, 2, 64, dtype=torch.bfloat16)
    loc = torch.tensor([2, 5, 7])
    for loop in range(2):
        pool.save(kv_slot(loop, 1, 2), k, -k, loc)
    kh, vh = pool.dequantize(kv_slot(1, 1, 2), loc)  # loop 1: the BF16 anchor, unrotated: exact
    assert torch.equal(kh, k.float()) and torch.equal(vh, -k.float())


def test_c_decode_adapter_matches_the_twin():
    """The C library's decode is its extend with one query row per request."""
    if cpu_attention.library_error() is not None:
        pytest.skip(cpu_attention.library_error())
    cfg = RQConfig()
    view = view_of(cfg, heads=1, dim=64)
    gen = torch.Generator().manual_seed(3)
    k = torch.randn(4, 5, 1, 64, generator=gen)
    v = torch.randn(4, 5, 1, 64, generator=gen)
    commit_reference(k, v, torch.arange(1, 6), view)
    paths = resolve(view, device="cpu")
    q, kc, vc = (torch.randn(2, n, 64, generator=gen) for n in (2, 1, 1))
    kv_indptr = torch.tensor([0, 3, 5])
    idx = torch.arange(1, 6)
    out = paths.decode.fn(q, kc, vc, view, 2, kv_indptr, idx, sm_scale=0.125)
    ref = decode_attention_reference(q, kc, vc, view, 2, kv_indptr, idx, sm_scale=0.125)
    assert (out - ref).abs().max().item() <= 2e-4 * ref.abs().max().item()


def test_graph_blocker_names_the_stack_a_twin_decodes():
    from sglang_rq.dispatch import graph_blocker

    huginn = ModelKVShape(num_layers=2, num_loops=32, num_kv_heads=2, head_dim=96,
                          prelude_layers=1, coda_layers=1, default_loop_group=4)
    # BF16 prelude/coda (16-bit anchors are not fused): the twin decodes them.
    assert "unlooped layers" in graph_blocker(huginn, RQConfig())
    assert graph_blocker(huginn, RQConfig(unlooped_bits=8)) is None
    assert graph_blocker(ModelKVShape(4, 4, 4, 128), RQConfig()) is None
    assert graph_blocker(huginn, RQConfig(enabled=False)) is None
    assert "looped layers" in graph_blocker(huginn, RQConfig(anchor="chained", unlooped_bits=8))
