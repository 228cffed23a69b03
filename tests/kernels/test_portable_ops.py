"""Portable CUDA mode: the Triton ops of `rq_kernels.ops` vs their fp32 twins and SGLang's own
``forward_native``, the ``sgl_kernel`` stand-in in a fresh interpreter, the launcher and the
``/metrics`` gauge.

Tolerance policy (STYLE.md). All ops compute in fp32 and round once, as the twins do, so the
comparison is against the twin run on the fp32-widened inputs (its unrounded fp32 result):

* bf16/fp16 outputs: within one rounding step of the output dtype at each value, plus 1e-5
  relative for fp32 operation order (``tl.sum``'s tree vs torch's reduction, GPU ``exp``). One
  step, not half: the Triton interpreter (triton 3.8) converts fp32 -> bf16 by truncation,
  while CUDA rounds to nearest even; both are within one step.
* fp32 outputs: 1e-5 relative + 1e-6 absolute (operation order only). For act-and-mul the
  relative part is taken of ``|gate * up|``: GELU's ``1 + erf(a)`` cancels for ``a << 0``, so
  erf's own error (numpy's in the interpreter, libdevice's on CUDA vs torch's) scales with the
  factors, not with the tiny result.
* Against SGLang's ``forward_native`` (an independent reference, which rounds more often): the
  flash-attn rule, max error <= 2x the native op's max error on the same low-precision inputs,
  both measured against the fp32 twin (plus half a step under the truncating interpreter).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from rq_kernels import ops
from rq_kernels import ops_reference as ref
from sglang_rq import portable

DTYPES = [torch.bfloat16, torch.float32]
TOKENS = [1, 3, 17, 97]


def _step(ref32: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor | None) -> torch.Tensor:
    """One rounding step (ulp) of ``dtype`` at each value of ``ref32``, plus order slack."""
    slack = 1e-5 * (ref32.abs() if scale is None else scale) + 1e-6
    if dtype == torch.float32:
        return slack
    bits = {torch.bfloat16: 8, torch.float16: 11}[dtype]
    _, e = torch.frexp(ref32)
    return torch.ldexp(torch.ones_like(ref32), e - bits) + slack


def assert_one_step(out: torch.Tensor, ref32: torch.Tensor,
                    scale: torch.Tensor | None = None) -> None:
    err = (out.float() - ref32).abs()
    tol = _step(ref32, out.dtype, scale)
    bad = err > tol
    assert not bad.any(), (f"{int(bad.sum())} of {err.numel()} values off by more than one step: "
                           f"max err {float(err.max()):.3g}")


@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 96, 2048])
@pytest.mark.parametrize("tokens", TOKENS)
def test_rmsnorm_matches_twin(device, tokens, hidden, dtype, gemma):
    if gemma and hidden == 2048:
        pytest.skip("gemma covered at small sizes")
    g = torch.Generator().manual_seed(tokens * hidden)
    buf = torch.randn(tokens, hidden + 8, generator=g).to(dtype).to(device)
    x = buf[:, :hidden]  # row stride hidden + 8: strided rows, as SGLang's slices give
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype).to(device)
    out = torch.full((tokens, hidden), float("nan"), dtype=dtype, device=device)
    got = ops.rmsnorm(x, w, eps=1e-6, out=out, gemma=gemma)
    assert got is out
    assert_one_step(out, ref.rmsnorm_reference(x.float(), w.float(), eps=1e-6, gemma=gemma))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 96, 2048])
@pytest.mark.parametrize("tokens", TOKENS)
def test_fused_add_rmsnorm_is_in_place_like_sgl_kernel(device, tokens, hidden, dtype):
    """``residual`` <- input + residual (rounded); ``input`` <- norm of the *unrounded* sum;
    the weight and the bytes next to the strided rows stay untouched; returns None."""
    g = torch.Generator().manual_seed(7 + tokens)
    xbuf = torch.randn(tokens, hidden + 4, generator=g).to(dtype).to(device)
    r = torch.randn(tokens, hidden, generator=g).to(dtype).to(device)
    w = torch.randn(hidden, generator=g).to(dtype).to(device)
    x = xbuf[:, :hidden]
    x32, r32, w0, pad0 = x.float().clone(), r.float().clone(), w.clone(), xbuf[:, hidden:].clone()
    assert ops.fused_add_rmsnorm(x, r, w, eps=1e-5) is None
    ref.fused_add_rmsnorm_reference(x32, r32, w.float(), eps=1e-5)
    assert_one_step(r, r32)
    assert_one_step(x, x32)
    assert torch.equal(w, w0) and torch.equal(xbuf[:, hidden:], pad0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("d", [32, 48, 1408])
@pytest.mark.parametrize("tokens", TOKENS)
def test_act_and_mul_matches_twin(device, tokens, d, act, dtype):
    g = torch.Generator().manual_seed(d + tokens)
    x = (3 * torch.randn(tokens, 2 * d, generator=g)).to(dtype).to(device)
    out = ops.act_and_mul(x, act=act)
    assert out.shape == (tokens, d) and out.dtype == dtype
    scale = (x[:, :d].float() * x[:, d:].float()).abs()  # 1 + erf(a) cancels for a << 0
    assert_one_step(out, ref.act_and_mul_reference(x.float(), act=act), scale)


ROPE_SHAPES = [(4, 4, 64, 64), (16, 2, 128, 128), (3, 1, 96, 64)]  # (Hq, Hk, head_dim, rot_dim)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["heads", "flat"])
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("shape", ROPE_SHAPES)
@pytest.mark.parametrize("tokens", TOKENS)
def test_rope_in_place_on_qkv_slices(device, tokens, shape, neox, layout, dtype):
    """q and k are column slices of one packed qkv buffer (SGLang's ``qkv.split``): rotated in
    place, dims past rot_dim and the v part untouched; positions are int64, cache fp32."""
    hq, hk, d, rot = shape
    g = torch.Generator().manual_seed(tokens + d + rot)
    qkv = torch.randn(tokens, (hq + 2 * hk) * d, generator=g).to(dtype).to(device)
    cache = torch.randn(4096, rot, generator=g).to(device)
    pos = torch.randint(0, 4096, (tokens,), generator=g).to(device)
    q, k = qkv[:, :hq * d], qkv[:, hq * d:(hq + hk) * d]
    if layout == "heads":
        q, k = q.view(tokens, hq, d), k.view(tokens, hk, d)
    q32, k32, qkv0 = q.float().clone(), k.float().clone(), qkv.clone()
    ops.rope_inplace(pos, q, k, cos_sin_cache=cache, is_neox=neox, head_size=d)
    ref.rope_inplace_reference(pos, q32, k32, cos_sin_cache=cache, is_neox=neox, head_size=d)
    assert_one_step(q, q32)
    assert_one_step(k, k32)
    assert torch.equal(qkv[:, (hq + hk) * d:], qkv0[:, (hq + hk) * d:])
    if rot < d:
        heads = qkv.view(tokens, hq + 2 * hk, d)
        assert torch.equal(heads[..., rot:], qkv0.view(tokens, hq + 2 * hk, d)[..., rot:])


def test_launchers_reject_bad_inputs(device):
    x = torch.randn(3, 64, device=device)
    with pytest.raises(AssertionError, match="weight"):
        ops.rmsnorm(x, torch.ones(32, device=device))
    with pytest.raises(AssertionError, match="contiguous last dim"):
        ops.rmsnorm(x.t(), torch.ones(3, device=device))
    with pytest.raises(ValueError, match="gelu_tanh"):
        ops.act_and_mul(x, act="relu")
    with pytest.raises(AssertionError, match="rot_dim"):
        ops.rope_inplace(torch.zeros(3, dtype=torch.long, device=device), x.view(3, 1, 64), None,
                         cos_sin_cache=torch.zeros(8, 128, device=device), is_neox=True)


def test_top_k_top_p_renorm():
    p = torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.25, 0.25, 0.25, 0.25]])
    k1 = ref.top_k_renorm_prob_reference(p, torch.tensor([1, 2]))
    assert torch.equal(k1[0], torch.tensor([0.0, 1.0, 0.0, 0.0]))
    assert torch.allclose(k1[1], torch.full((4,), 0.25))  # ties at the k-th value are kept
    p1 = ref.top_p_renorm_prob_reference(p, 0.6)
    assert torch.allclose(p1[0], torch.tensor([0.0, 4 / 7, 0.0, 3 / 7]))
    assert torch.allclose(ref.top_p_renorm_prob_reference(p, 1.0), p)


# ----------------------------------------------------------------- SGLang's forward_native
def _native_err_rule(out: torch.Tensor, native: torch.Tensor, ref32: torch.Tensor) -> None:
    ours = float((out.float() - ref32).abs().max())
    theirs = float((native.float() - ref32).abs().max())
    # NOTE: the interpreter truncates to bf16 (error < 1 step where rounding gives <= 1/2): on
    # CPU the bound gets that extra half step at the largest value; on CUDA it is the plain 2x.
    extra = 0.0 if out.is_cuda else 0.5 * float(_step(ref32.abs().max(), out.dtype, None))
    assert ours <= 2 * theirs + extra + 1e-6, f"ours {ours:.3g} > 2 x native {theirs:.3g}"


@torch.no_grad()
def test_twins_agree_with_sglang_forward_native(device):
    """Independent reference: SGLang's RMSNorm / SiluAndMul / RotaryEmbedding forward_native
    (bf16 inputs, 17 tokens, Ouro-1.4B widths)."""
    pytest.importorskip("sglang")
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.layers.rotary_embedding import get_rope

    g = torch.Generator().manual_seed(0)
    bf = torch.bfloat16
    x = torch.randn(17, 2048, generator=g).to(bf).to(device)
    res = torch.randn(17, 2048, generator=g).to(bf).to(device)
    norm = RMSNorm(2048, eps=1e-6).to(device=device, dtype=bf)
    norm.weight.data.copy_(1 + 0.1 * torch.randn(2048, generator=g))
    _native_err_rule(ops.rmsnorm(x, norm.weight.data, eps=1e-6), norm.forward_native(x),
                     ref.rmsnorm_reference(x.float(), norm.weight.data.float(), eps=1e-6))
    nat_out, nat_res = norm.forward_native(x, res)
    x2, r2, x32, r32 = x.clone(), res.clone(), x.float(), res.float()
    ops.fused_add_rmsnorm(x2, r2, norm.weight.data, eps=1e-6)
    ref.fused_add_rmsnorm_reference(x32, r32, norm.weight.data.float(), eps=1e-6)
    _native_err_rule(x2, nat_out, x32)
    _native_err_rule(r2, nat_res, r32)

    a = (3 * torch.randn(17, 2 * 5632, generator=g)).to(bf).to(device)
    _native_err_rule(ops.act_and_mul(a, act="silu"), SiluAndMul().forward_native(a),
                     ref.act_and_mul_reference(a.float(), act="silu"))

    for neox in (True, False):
        rope = get_rope(128, rotary_dim=128, max_position=4096, base=10000,
                        is_neox_style=neox).to(device)
        pos = torch.randint(0, 4096, (17,), generator=g).to(device)
        q = torch.randn(17, 16 * 128, generator=g).to(bf).to(device)
        k = torch.randn(17, 4 * 128, generator=g).to(bf).to(device)
        nq, nk = rope.forward_native(pos, q.clone(), k.clone())
        q32, k32 = q.float(), k.float()
        ref.rope_inplace_reference(pos, q32, k32, cos_sin_cache=rope.cos_sin_cache,
                                   is_neox=neox, head_size=128)
        ops.rope_inplace(pos, q, k, cos_sin_cache=rope.cos_sin_cache, is_neox=neox,
                         head_size=128)
        _native_err_rule(q, nq, q32)
        _native_err_rule(k, nk, k32)


# ----------------------------------------------------------------- stand-in, launcher, metrics
STANDIN_SCRIPT = textwrap.dedent("""
    import sys, torch
    import sgl_kernel as sk
    assert sk.STANDIN is True and sk.__file__.startswith(sys.argv[1]), sk.__file__
    assert set(sk.SUBSTITUTES.values()) == {"triton", "torch"}
    x = torch.randn(3, 64, dtype=torch.bfloat16); r = torch.randn(3, 64, dtype=torch.bfloat16)
    w = torch.ones(64, dtype=torch.bfloat16)
    assert sk.rmsnorm(x, w, 1e-6).shape == (3, 64)
    assert sk.fused_add_rmsnorm(x, r, w, 1e-6) is None
    out = torch.empty(3, 32, dtype=torch.bfloat16)
    assert sk.silu_and_mul(x, out) is out
    q = torch.randn(3, 4 * 16); k = torch.randn(3, 2 * 16)
    sk.apply_rope_with_cos_sin_cache_inplace(torch.arange(3), q, k, 16, torch.randn(8, 16), True)
    assert sk.top_k_renorm_prob(torch.softmax(torch.randn(2, 9), -1), 3).shape == (2, 9)
    assert sk.CALLS["rmsnorm"] == 1 and sk.CALLS["apply_rope_with_cos_sin_cache_inplace"] == 1
    from sgl_kernel.utils import is_arch_support_pdl
    from sgl_kernel.kvcacheio import transfer_kv_all_layer
    assert is_arch_support_pdl() is False
    for stub, name in ((sk.fp8_scaled_mm, "sgl_kernel.fp8_scaled_mm"),
                       (transfer_kv_all_layer, "sgl_kernel.kvcacheio.transfer_kv_all_layer"),
                       (sk.scalar_types.uint4b8, "sgl_kernel.scalar_types.uint4b8")):
        try:
            stub(1)
        except NotImplementedError as exc:
            assert name in str(exc), exc
        else:
            raise AssertionError(name + " did not raise")
    import sglang.kernels.fused_op as fused_op
    import sglang.kernels.ops.kvcache.kvcache as kvcache
    from sgl_kernel import _routes
    assert kvcache.can_use_store_cache(256) is False
    assert "sglang.kernels.fused_op.BaseFusedOp._auto_backend_candidates" in _routes.APPLIED
    print("OK", len(_routes.APPLIED))
""")


def test_standin_in_a_fresh_interpreter():
    """With ``sys.path`` led by STANDIN_DIR: STANDIN, working substitutes, naming stubs, and
    SGLang's JIT call sites routed (the real, here unloadable, wheel is shadowed)."""
    pytest.importorskip("sglang")
    path = os.pathsep.join(filter(None, [str(portable.STANDIN_DIR), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, TRITON_INTERPRET="1")  # SGLang may be on PYTHONPATH
    proc = subprocess.run([sys.executable, "-c", STANDIN_SCRIPT, str(portable.STANDIN_DIR)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_portable_module_is_stdlib_only_and_reports_a_reason():
    code = ("import sys; from sglang_rq import portable as p; "
            "assert 'torch' not in sys.modules; print(p.standin_reason()); "
            "print(sorted(p.portable_environment()))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    reason, keys = proc.stdout.strip().splitlines()[-2:]
    assert reason == "None" or reason.startswith("sgl_kernel ")
    assert "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND" in keys
    assert "SGLANG_FORCE_FUSED_OP_BACKEND" not in keys
    assert (portable.STANDIN_DIR / "sgl_kernel" / "__init__.py").is_file()


@pytest.fixture
def fake_cuda_without_kernels(monkeypatch):
    """The launcher's CUDA branch on a host whose sgl_kernel is missing (no torch CUDA needed:
    `has_cuda` and `standin_reason` are replaced; a stand-in module object is pre-imported)."""
    import types

    from sglang_rq import launch_server

    saved_env, saved_path = dict(os.environ), list(sys.path)
    monkeypatch.setattr(launch_server, "has_cuda", lambda: True)
    monkeypatch.setattr(portable, "standin_reason", lambda: "sgl_kernel not installed")
    monkeypatch.setitem(sys.modules, "sgl_kernel",
                        types.SimpleNamespace(SUBSTITUTES={"rmsnorm": "triton"}))
    yield launch_server
    os.environ.clear()
    os.environ.update(saved_env)
    sys.path[:] = saved_path


def test_launcher_enters_portable_mode(fake_cuda_without_kernels, capsys):
    argv = fake_cuda_without_kernels.prepare_environment(["--tp-size", "2"])
    assert argv[argv.index("--sampling-backend") + 1] == "pytorch"
    assert "--disable-custom-all-reduce" in argv
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(portable.STANDIN_DIR)
    assert sys.path[0] == str(portable.STANDIN_DIR)
    for var, value in portable.portable_environment().items():
        assert os.environ[var] == value
    err = capsys.readouterr().err
    assert "portable CUDA mode (sgl_kernel not installed)" in err and "rmsnorm=triton" in err


@pytest.mark.parametrize("flags, named", [
    (["--attention-backend", "flashinfer"], "--attention-backend flashinfer"),
    (["--rq-disable", "--decode-attention-backend=fa3"], "--decode-attention-backend fa3"),
    (["--sampling-backend", "flashinfer"], "--sampling-backend flashinfer"),
    (["--speculative-algorithm", "EAGLE"], "--speculative-algorithm")])
def test_launcher_refuses_compiled_kernel_paths(fake_cuda_without_kernels, flags, named):
    from sglang_rq.config import RQConfigError

    with pytest.raises(RQConfigError, match=named):
        fake_cuda_without_kernels.prepare_environment(flags)


METRICS_SCRIPT = textwrap.dedent("""
    import logging, sys, types
    logging.basicConfig(level=logging.INFO)
    sys.modules["sgl_kernel"] = types.SimpleNamespace(
        SUBSTITUTES={"rmsnorm": "triton", "top_k_renorm_prob": "torch"})
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector
    from sglang_rq import metrics
    assert metrics.publish_portable_ops() == sys.modules["sgl_kernel"].SUBSTITUTES
    reg = CollectorRegistry(); MultiProcessCollector(reg)
    print(generate_latest(reg).decode())
""")


def test_metrics_gauge_lists_substituted_ops(tmp_path):
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", METRICS_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 'sglang_rq_portable_ops{impl="triton",op="rmsnorm"} 1.0' in proc.stdout
    assert 'sglang_rq_portable_ops{impl="torch",op="top_k_renorm_prob"} 1.0' in proc.stdout
    assert "portable CUDA mode" in proc.stderr


# ----------------------------------------------------------------- real sizes on CUDA
@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 64, 4096])
def test_ouro_sizes_on_cuda(tokens):
    """Ouro-1.4B widths (hidden 2048, intermediate 5632, 16 x 128 heads) on the GPU, where
    bf16 rounding is to nearest: within one step of the fp32 twin."""
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(tokens, 2048, device=dev, dtype=bf)
    r = torch.randn(tokens, 2048, device=dev, dtype=bf)
    w = torch.randn(2048, device=dev, dtype=bf)
    assert_one_step(ops.rmsnorm(x, w), ref.rmsnorm_reference(x.float(), w.float()))
    x32, r32 = x.float(), r.float()
    ops.fused_add_rmsnorm(x, r, w)
    ref.fused_add_rmsnorm_reference(x32, r32, w.float())
    assert_one_step(x, x32)
    assert_one_step(r, r32)
    a = torch.randn(tokens, 2 * 5632, device=dev, dtype=bf)
    assert_one_step(ops.act_and_mul(a, act="silu"), ref.act_and_mul_reference(a.float()))
    qkv = torch.randn(tokens, 48 * 128, device=dev, dtype=bf)
    cache = torch.randn(32768, 128, device=dev)
    pos = torch.randint(0, 32768, (tokens,), device=dev)
    q, k = qkv[:, :2048].view(tokens, 16, 128), qkv[:, 2048:4096].view(tokens, 16, 128)
    q32, k32 = q.float(), k.float()
    ops.rope_inplace(pos, q, k, cos_sin_cache=cache, is_neox=True)
    ref.rope_inplace_reference(pos, q32, k32, cos_sin_cache=cache, is_neox=True)
    assert_one_step(q, q32)
    assert_one_step(k, k32)
