"""Commit kernel vs `sglang_rq.reference.commit_reference` (the twin).

Tolerance policy
----------------
* Under ``TRITON_INTERPRET=1`` (CPU) the kernel is **bit-identical** to the reference: every
  code, FP8 scale/offset byte and BF16 coefficient, and every row outside ``loc`` untouched.
* On the GPU the rotation ``x R`` is a tensor-core product with fp32 accumulation in another
  order than PyTorch's CPU einsum, and ``<x, a>`` is summed in another order, so a value that
  lands within ~1 fp32 ulp of a rounding boundary (a code's ``.5`` tie, an FP8 grid point,
  a bf16 tie of ``c``) may round the other way. Allowed: at most 0.1% of code elements, FP8
  scale_offset bytes and coefficients differ (measured on the H200: 0.4e-5 to 4e-5), and no stored
  vector's reconstruction (`dequantize_rows_reference` of both pools) moves by more than two
  of its quantization steps (L2 bound ``2 sqrt(D) * step``), i.e. tie flips only, never a
  systematic difference. Everything else must be equal.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from views import make_view

from rq_kernels import commit, commit_layers, stage_kv, unsupported_reason
from rq_kernels.commit import CommitLaunch
from rq_kernels.triton.commit import _div_rn_by
from rq_kernels.testing import loop_kv, random_orthogonal
from sglang_rq.config import RQConfig
from sglang_rq.reference import commit_reference, dequantize_rows_reference

CPU_CASES = [  # name, head_dim, num_loops, num_kv_heads, num_tokens, cfg, rotation
    ("ouro", 128, 4, 2, 37, RQConfig(), "cfg"),
    ("single_loop_norot", 64, 1, 3, 33, RQConfig(rotation="none"), "cfg"),
    ("d96_random_orth", 96, 4, 1, 19, RQConfig(), "rand"),
    ("first_nolsq_a8_r4", 64, 3, 2, 17,
     RQConfig(anchor="first", lsq=False, anchor_bits=8, residual_bits=4), "cfg"),
    ("groups_shared_hadamard12", 96, 4, 1, 9, RQConfig(loop_group_size=2, residual_bits=0), "cfg"),
]
GPU_CASES = [
    ("ouro_4k", 128, 4, 16, 4099, RQConfig(), "cfg"),
    ("smollm_gqa", 64, 4, 3, 2053, RQConfig(), "cfg"),
    ("huginn_d96", 96, 4, 8, 1031, RQConfig(), "cfg"),
]  # general (3-term) rotations: bit-exact in the interpreter cases; on GPU via test_decode


def _rotation(spec, heads, dim):
    return random_orthogonal(heads, dim, seed=7) if spec == "rand" else spec


def _pools(cfg, loops, heads, dim, tokens, rot, device, seed, head_major=(False, False)):
    rows = tokens + 9
    views = [make_view(cfg, num_loops=loops, num_kv_heads=heads, head_dim=dim, rows=rows,
                       rotation=_rotation(rot, heads, dim), device=device, fill=True, seed=seed,
                       head_major=hm) for hm in head_major]
    gen = torch.Generator().manual_seed(seed)
    loc = (torch.randperm(rows - 1, generator=gen)[:tokens] + 1).to(device)
    k, v = loop_kv(loops, tokens, heads, dim, seed=seed, device=device,
                   group_size=cfg.group_size)
    return views, loc, k, v


def _compare(a, b, *, exact: bool) -> dict:
    stats = {}
    for i in range(len(a.segments)):
        for kind in ("codes", "scale_offset", "coef"):
            x, y = getattr(a, kind)[i], getattr(b, kind)[i]
            if x is None or x.numel() == 0:
                continue
            diff = (x.view(torch.uint8) != y.view(torch.uint8)).float().mean().item()
            stats[f"{kind}[{i}]"] = diff
            if exact:
                assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), (
                    f"{kind}[{i}] differs on {diff:.2e} of bytes")
            else:
                assert diff <= 1e-3, f"{kind}[{i}] differs on {diff:.2e} of bytes (> 1e-3)"
    return stats


@pytest.mark.parametrize("per_loop", [False, True], ids=["groups", "per_loop"])
@pytest.mark.parametrize("name,dim,loops,heads,tokens,cfg,rot", CPU_CASES,
                         ids=[c[0] for c in CPU_CASES])
def test_commit_matches_reference(name, dim, loops, heads, tokens, cfg, rot, per_loop, device):
    """Both program shapes (whole loop groups; one loop per program, the few-token default)."""
    if device == "cuda":
        pytest.skip("small interpreter case; GPU runs test_commit_real_size")
    (ours, ref), loc, k, v = _pools(cfg, loops, heads, dim, tokens, rot, device, seed=1)
    assert unsupported_reason(ours) is None
    commit(k, v, loc, ours, launch=CommitLaunch(per_loop=per_loop))
    commit_reference(k, v, loc, ref)
    _compare(ours, ref, exact=True)


@pytest.mark.parametrize("launch", [CommitLaunch(block_t=32, num_warps=4),
                                    CommitLaunch(block_t=128, num_warps=16)],
                         ids=["block32_w4", "block128_w16"])
def test_commit_launches_match_reference(launch, device):
    """Launch variants give the reference's bytes (interpreter: exactly; GPU: the policy)."""
    tokens = 4099 if device == "cuda" else 37
    (ours, ref), loc, k, v = _pools(RQConfig(), 4, 2, 128, tokens, "cfg", device, seed=4)
    commit(k, v, loc, ours, launch=launch)
    commit_reference(k, v, loc, ref)
    _compare(ours, ref, exact=device != "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("name,dim,loops,heads,tokens,cfg,rot", GPU_CASES,
                         ids=[c[0] for c in GPU_CASES])
def test_commit_real_size(name, dim, loops, heads, tokens, cfg, rot, device):
    (ours, ref), loc, k, v = _pools(cfg, loops, heads, dim, tokens, rot, device, seed=2)
    commit(k, v, loc, ours)
    commit_reference(k, v, loc, ref)
    stats = _compare(ours, ref, exact=False)
    print(name, "mismatch fractions", {key: f"{val:.1e}" for key, val in stats.items()})
    for loop in range(loops):
        x_ours = torch.stack(dequantize_rows_reference(ours, loc, loop), 1)  # [T, 2, H, D]
        x_ref = torch.stack(dequantize_rows_reference(ref, loc, loop), 1)
        diff = (x_ours - x_ref).norm(dim=-1)  # [T, 2, H]
        bound = 2 * dim ** 0.5 * _max_step(ref, loc, loop)
        bad = (diff > bound).sum().item()
        assert bad == 0, f"loop {loop}: {bad} vectors differ by more than 2 quantization steps"


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 7, 64, 65])
@pytest.mark.parametrize("cfg", [RQConfig(), RQConfig(loop_group_size=2, anchor="first")],
                         ids=["last", "groups2_first"])
def test_commit_decode_sizes(tokens, cfg, device):
    """A decode step's few tokens (one per request) take the one-loop-per-program launch up to
    `FEW_TOKENS` and the whole-group launch above: the twin's bytes within the policy."""
    (ours, ref), loc, k, v = _pools(cfg, 4, 16, 128, tokens, "cfg", device, seed=6)
    commit(k, v, loc, ours)
    commit_reference(k, v, loc, ref)
    _compare(ours, ref, exact=False)


def _max_step(view, loc, loop):
    """Largest quantization step of each stored vector of ``loop``: ``max_g s_a,g * max(1, |c|)
    + max_g s_r,g`` (``[T, 2, H]``), from the reference pool's FP8 scales."""
    seg = view.segments[loop]
    s_a = view.scale_offset[seg.base][loc].view(torch.float8_e4m3fn)[..., 0].float().amax(-1)
    if seg.base == loop:
        return s_a
    c = view.coef[loop][loc].float().abs().clamp_min(1.0) if view.coef[loop] is not None else 1.0
    s_r = (view.scale_offset[loop][loc].view(torch.float8_e4m3fn)[..., 0].float().amax(-1)
           if view.scale_offset[loop] is not None else 0.0)
    return s_a * c + s_r


def test_commit_reads_loops_where_they_lie(device):
    """The serving pool's call: the earlier loops are slices of its staging buffer ([G-1, n, 2,
    H, D]: K and V interleaved per token) and the last loop's K and V are separate tensors with
    other strides (V a column slice of a wider projection). Same bytes as the twin given the
    stacked [L, T, H, D] loops."""
    tokens = 1031 if device == "cuda" else 21
    (ours, ref), loc, k, v = _pools(RQConfig(), 4, 2, 64, tokens, "cfg", device, seed=8)
    staging = torch.stack([k[:3], v[:3]], dim=2)  # [3, T, 2, H, D]
    wide = torch.cat([torch.zeros_like(v[3]), v[3]], dim=-1)  # [T, H, 2D]
    k_last, v_last = k[3].clone(), wide[..., 64:]
    assert v_last.stride() != k_last.stride()
    commit([*staging[:, :, 0], k_last], [*staging[:, :, 1], v_last], loc, ours)
    commit_reference(k, v, loc, ref)
    _compare(ours, ref, exact=device != "cuda")


def test_commit_special_groups_exact(device):
    """Zero and constant (FP8-representable) groups reconstruct exactly; large outliers stay
    within half a step of their group."""
    cfg = RQConfig(rotation="none")
    (view, _), loc, k, v = _pools(cfg, 4, 1, 64, 5, None, device, seed=3)
    commit(k, v, loc, view)
    rec, _ = dequantize_rows_reference(view, loc, 3)  # the anchor loop, K
    assert torch.equal(rec[0, :, :32], torch.zeros_like(rec[0, :, :32]))
    assert torch.equal(rec[1, :, :32], torch.full_like(rec[1, :, :32], 0.75))
    assert torch.isfinite(rec).all()


def test_commit_head_major_pool(device):
    """Commit into a head-major pool ([2, H, rows, bytes] storage) writes the same bytes."""
    (ours, ref), loc, k, v = _pools(RQConfig(), 4, 2, 64, 11, "cfg", device, seed=6,
                                    head_major=(True, False))
    commit(k, v, loc, ours)
    commit_reference(k, v, loc, ref)
    _compare(ours, ref, exact=device == "cpu")


def test_unsupported_format_is_refused(device):
    """Chained anchors are not fused: `commit` raises naming the reason and writes nothing (the
    serving package runs the twin for such formats)."""
    cfg = RQConfig(anchor="chained", rotation="none")
    (ours, ref), loc, k, v = _pools(cfg, 3, 2, 64, 7, None, device, seed=4)
    assert unsupported_reason(ours) == "anchor='chained'"
    with pytest.raises(ValueError, match="commit cannot serve this call: anchor='chained'"):
        commit(k, v, loc, ours)
    _compare(ours, ref, exact=True)  # both untouched


def test_commit_rejects_bad_input(device):
    cfg = RQConfig()
    (view, _), loc, k, v = _pools(cfg, 4, 2, 64, 5, "cfg", device, seed=5)
    with pytest.raises(AssertionError, match="loc"):
        commit(k, v, loc.to(torch.int32), view)
    with pytest.raises(AssertionError, match="bf16"):
        commit(k.float(), v.float(), loc, view)


def test_kernels_really_run(device):
    """Guard: on CPU the kernels must run in the interpreter, not be refused as off-device
    (TRITON_INTERPRET must be set before anything imports triton)."""
    from rq_kernels._host import interpreting, on_kernel_device
    from rq_kernels.triton.commit import rq_commit_kernel

    assert on_kernel_device(rq_commit_kernel, torch.zeros(1, device=device))
    assert interpreting(rq_commit_kernel) == (device == "cpu")



@triton.jit
def _fast_div_kernel(A, B, Q, N, BLOCK: tl.constexpr, INTERP: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    a = tl.load(A + i, mask=m, other=0.0)
    b = tl.load(B + i, mask=m, other=1.0)
    rcp = tl.div_rn(tl.full([BLOCK], 1.0, tl.float32), b)
    tl.store(Q + i, _div_rn_by(a, b, rcp, INTERP), mask=m)


def test_fast_division_is_correctly_rounded(device):
    """`_div_rn_by` (reciprocal + FMA correction) gives IEEE division's quotient bit for bit on
    the commit kernel's operands: ``x - offset`` over FP8-representable scales, random and at
    exact quarter multiples (rounding ties of the code) and their neighbours."""
    gen = torch.Generator().manual_seed(3)
    n = (1 << 20) if device == "cuda" else 4099
    grid = torch.arange(1, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # >0 e4m3
    b = grid[torch.randint(0, grid.numel(), (n,), generator=gen)]
    a = torch.rand(n, generator=gen) * b * 15.5  # codes 0..15 plus rounding margin
    a[:64] = b[:64] * torch.arange(64).float() / 4
    a[64:128] = torch.nextafter(a[:64], torch.tensor(1e9))
    a, b = a.to(device), b.to(device)
    q = torch.empty_like(a)
    _fast_div_kernel[(triton.cdiv(n, 1024),)](a, b, q, n, BLOCK=1024, INTERP=device != "cuda",
                                              enable_fp_fusion=False)
    want = a / b  # IEEE correctly rounded division
    bad = (q != want).sum().item()
    assert bad == 0, f"{bad} of {n} quotients differ from IEEE division"


def test_prepared_view_carries_the_rotation_terms():
    """`prepare_view` builds the kernels' rotation form once (the pool calls it before CUDA-graph
    capture, where building it would sync); launches then read the same tensors."""
    from rq_kernels import prepare_view
    from rq_kernels._host import next_pow2, rotation_terms

    view = make_view(RQConfig(), num_loops=2, num_kv_heads=2, head_dim=96, rows=4)
    assert not view.kernel_rotation
    prepare_view(view)
    assert view.kernel_rotation.pop(("hadamard_signs", "cpu")) is None  # Paley: not Sylvester
    (key, (terms, alpha, nterms)), = view.kernel_rotation.items()
    assert key == (128, "cpu") and nterms == 1 and alpha == pytest.approx(96 ** -0.5)
    assert terms.shape == (1, 2, 128, 128)  # Hadamard 96 = Paley-12 x Sylvester-8, padded
    assert torch.equal(terms[0, :, :96, :96].float(), torch.sign(view.rotation))  # R = alpha sign(R)
    assert not terms[0, :, 96:].any() and not terms[0, :, :, 96:].any()
    assert rotation_terms(view, next_pow2(96), torch.device("cpu"))[0] is terms


def _stack(cfg, *, layers, loops, heads, dim, rows, device, seed):
    """The serving pool's buffers of one stack (`sglang_rq.pool.StackBuffers`: every tensor
    ``[layers, rows, ...]``, views per (layer, loop group)), random bytes in every row.
    Skips where SGLang is not installed (the pool subclasses SGLang's; a GPU host may run the
    kernel tests without it)."""
    pytest.importorskip("sglang")
    from sglang_rq.layout import ModelKVShape, kv_stacks
    from sglang_rq.pool import StackBuffers

    shape = ModelKVShape(num_layers=layers, num_loops=loops, num_kv_heads=heads, head_dim=dim)
    bufs = StackBuffers.allocate(kv_stacks(shape, cfg)[0], rows=rows, staging_tokens=0,
                                 dtype=torch.bfloat16, device=device)
    gen = torch.Generator().manual_seed(seed)
    for b in bufs.buffers():
        b.view(torch.uint8).copy_(torch.randint(0, 256, b.view(torch.uint8).shape,
                                                generator=gen, dtype=torch.uint8))
    return bufs


@pytest.mark.parametrize("tokens", [3, 21], ids=["few_per_loop", "groups"])
@pytest.mark.parametrize("cfg", [RQConfig(rotation="signed-hadamard", rotation_seed=5),
                                 RQConfig(loop_group_size=2, anchor="first", rotation="none")],
                         ids=["signed_hadamard", "groups2_first_norot"])
def test_commit_layers_matches_reference(cfg, tokens, device):
    """One `commit_layers` launch over every layer of a real pool stack (each layer its own
    signed-Hadamard rotation; loop group 1 of two) writes, layer by layer, the twin's bytes
    (`commit_reference` per layer; on the GPU `commit` per layer) and nothing else. The
    rotation terms are laid out by the launcher itself here (the views were not prepared with
    `prepare_layers`)."""
    layers, loops, heads, dim, rows = 3, 4, 2, 64, tokens + 9
    ours, ref = (_stack(cfg, layers=layers, loops=loops, heads=heads, dim=dim, rows=rows,
                        device=device, seed=11) for _ in range(2))
    gen = torch.Generator().manual_seed(2)
    loc = (torch.randperm(rows - 1, generator=gen)[:tokens] + 1).to(device)
    kv = [loop_kv(loops, tokens, heads, dim, seed=20 + layer, device=device,
                  group_size=cfg.group_size) for layer in range(layers)]
    k = torch.stack([x[0] for x in kv], dim=1)  # [loops, layers, T, H, D]
    v = torch.stack([x[1] for x in kv], dim=1)
    glen = cfg.group_len(loops)
    grp = len(ours.group_views[0]) - 1
    sl = slice(grp * glen, (grp + 1) * glen)
    commit_layers(list(k[sl]), list(v[sl]), loc, ours.layer_views(grp))
    # the twin in the interpreter; on the GPU the kernel layer by layer (the same programs: the
    # kernel's own distance to the twin is test_commit_real_size's policy, which a few tokens
    # cannot measure: one coefficient's tie flip is ~1 % of these buffers)
    per_layer = commit if device == "cuda" else commit_reference
    for layer in range(layers):
        per_layer(list(k[sl, layer]), list(v[sl, layer]), loc, ref.group_views[layer][grp])
    for a, b in zip(ours.buffers(), ref.buffers()):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_commit_layers_refuses_views_that_are_not_layers_of_one_buffer(device):
    """Layers 0, 1 and 3 of a pool are not evenly spaced: a ValueError says so (the caller
    commits them one by one)."""
    cfg = RQConfig(rotation="none")
    bufs = _stack(cfg, layers=4, loops=4, heads=2, dim=64, rows=8, device=device, seed=9)
    views = bufs.layer_views(0)
    _, loc, k, v = _pools(cfg, 4, 2, 64, 5, None, device, seed=9)
    with pytest.raises(ValueError, match="not evenly spaced layers of one buffer"):
        commit_layers([torch.stack([x] * 3) for x in k], [torch.stack([x] * 3) for x in v], loc,
                      [views[0], views[1], views[3]])


@pytest.mark.parametrize("backend", ["rq_native", "rq_triton"])
def test_decode_forward_commits_every_layer_at_once_with_the_per_layer_bytes(backend, device):
    """A forward of at most staging/2 tokens (a decode step) parks each layer's last loop and
    commits all layers in one call at the last layer; a forward too large for that commits layer
    by layer. Same K/V, same pool bytes (C library, and the Triton kernel in the interpreter).
    Skips where SGLang is not installed (as `_stack`)."""
    pytest.importorskip("sglang")
    from sglang_rq.dispatch import KernelRequest
    from sglang_rq.layout import ModelKVShape, kv_slot
    from sglang_rq.pool import bind_pool_class

    shape = ModelKVShape(num_layers=3, num_loops=4, num_kv_heads=2, head_dim=64)
    cfg = RQConfig(loop_group_size=2, rotation="signed-hadamard")
    pools = []
    if backend == "rq_native" and device == "cuda":
        pytest.skip("the C library serves CPU pools")
    for staging in (8, 7):  # 4 tokens: 2 * 4 <= 8 defers, 2 * 4 > 7 does not
        cls = bind_pool_class(cfg=cfg, shape=shape, staging_tokens=staging,
                              kernels=KernelRequest(backend=backend))
        pools.append(cls(size=12, page_size=1, dtype=torch.bfloat16, head_num=2, head_dim=64,
                         layer_num=12, device=device, enable_memory_saver=False))
    gen = torch.Generator().manual_seed(4)
    loc = torch.tensor([2, 5, 11, 7], device=device)
    kv = torch.randn(12, 2, 4, 2, 64, generator=gen).to(device=device, dtype=torch.bfloat16)
    for pool in pools:
        assert pool.stacks["looped"].kernel_paths.commit.impl != "twin"
        for slot in range(12):  # loop-major, as the model calls them
            pool.save(slot, kv[slot, 0], kv[slot, 1], loc)
    for a, b in zip(pools[0].rq_buffers(), pools[1].rq_buffers()):
        assert torch.equal(a, b)  # the same kernel over the same inputs, also on the GPU
    k3, _ = pools[0].dequantize(kv_slot(3, 2, 3), loc)  # loop 3 of layer 2: its group's anchor
    assert ((k3 - kv[kv_slot(3, 2, 3), 0].float()).norm() / k3.norm()) < 0.12


def test_stage_kv_writes_what_torch_stack_writes(device):
    """`stage_kv` (the pool's staging write) against its twin ``torch.stack([k, v], 1)``: K and
    V at other strides (V a column slice of a wider projection), 3 KV heads (not a power of
    two), into a slice of a staging buffer; rows outside untouched."""
    gen = torch.Generator().manual_seed(12)
    k = torch.randn(7, 3, 64, generator=gen).to(device=device, dtype=torch.bfloat16)
    wide = torch.randn(7, 3, 128, generator=gen).to(device=device, dtype=torch.bfloat16)
    v = wide[..., 64:]
    staging = torch.full((2, 10, 2, 3, 64), 7.0, dtype=torch.bfloat16, device=device)
    want = staging.clone()
    want[1, 2:9] = torch.stack([k, v], dim=1)
    stage_kv(k, v, staging[1, 2:9])
    assert torch.equal(staging, want)
