"""Host-side helpers shared by the launchers: format support, rotation terms, pool-view args."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from rq_kernels.view import CompressedLayerView

FUSED_BITS = (2, 4, 8)  # integer widths the kernels unpack (anchor and residual)


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# (kernel, constexprs, options, device, argument specialisation) -> (run, function, metadata,
# constexpr values in signature order) of the compiled kernel. The keys hold classes of values,
# not the values (a row count differs on every forward), so the entries are a few per kernel:
# formats, alignments, model shapes.
_LAUNCHES: dict = {}


def _arg_key(a):
    # what Triton specialises a runtime argument on (triton/backends/compiler.py,
    # get_*_specialization): a tensor's dtype and 16-byte alignment; an int's being 1, a multiple
    # of 16, and its width; floats and None not at all
    if isinstance(a, torch.Tensor):
        return a.dtype, a.data_ptr() & 15 == 0
    if isinstance(a, bool):
        return "b", a
    if isinstance(a, int):
        return a == 1, a & 15 == 0, -0x80000000 <= a <= 0x7FFFFFFF, a >= 1 << 63
    if isinstance(a, tuple):
        return tuple(map(_arg_key, a))
    return type(a)


def launch_kernel(kernel, grid: tuple[int, ...], args: tuple, consts: dict, **options) -> None:
    """``kernel[grid](*args, **consts, **options)`` on CUDA, without the JIT's per-call binding.

    Triton's launch path (``JITFunction.run``) binds and specialises every argument, builds the
    cache key and the launch metadata on every call: 20-45 µs of host time per launch on the
    H200's host inside an extend call, which makes three such launches and two FlashAttention
    calls per (layer, loop) where SGLang's BF16 extend makes one call. Skipping it took an
    extend call (16 requests over 64-token prefixes) from 219 to 192 µs of host time in one
    run (benchmarks/results/h200_2026-12-02c_launch_ab.txt). Here the first launch of a variant
    goes through ``kernel[grid]``, which compiles it and returns the compiled kernel; later
    launches with the same key call its launcher directly (``CompiledKernel.run``, what
    ``JITFunction.run`` calls last, on the stream Triton would use). The key holds everything
    Triton specialises on (each tensor's dtype and 16-byte alignment, each int's divisibility by
    16, equality to 1 and width, the constexprs and options, the device), so a hit is the kernel
    the JIT would pick.

    ``args``: the runtime arguments, positional, in signature order; ``consts``: the constexpr
    arguments by name. Under the interpreter, or while a launch hook is set (a profiler such as
    Proton), it is the plain ``kernel[grid](...)``."""
    knobs = _triton_knobs()
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    hooked = any(h is not None and getattr(h, "calls", True) for h in (enter, leave))
    if hooked or interpreting(kernel):
        kernel[grid](*args, **consts, **options)
        return
    dev = torch.cuda.current_device()
    key = launch_key(kernel, args, consts, options, dev)
    hit = _LAUNCHES.get(key)
    if hit is None:
        compiled = kernel[grid](*args, **consts, **options)
        bound = inspect.signature(kernel.fn).bind(*args, **consts)
        bound.apply_defaults()
        tail = tuple(bound.arguments.values())[len(args):]
        _LAUNCHES[key] = (compiled.run, compiled.function, compiled.packed_metadata, tail)
        return
    run, function, metadata, tail = hit
    g = (*grid, 1, 1)
    run(g[0], g[1], g[2], torch._C._cuda_getCurrentRawStream(dev), function, metadata, None, None,
        None, *args, *tail)


def launch_key(kernel, args: tuple, consts: dict, options: dict, dev: int) -> tuple:
    """`launch_kernel`'s cache key: the kernel, its constexprs (by name, and those passed
    positionally in ``args``, such as a pool tensor's head stride, by value: each value is a
    different compiled kernel), the options, the device and the class of every runtime
    argument (`_arg_key`)."""
    pos = _constexpr_positions(kernel)
    return (kernel, tuple(consts.items()), tuple(options.items()), dev,
            tuple(_arg_key(a) for a in args), tuple(args[i] for i in pos if i < len(args)))


@functools.cache
def _constexpr_positions(kernel) -> tuple[int, ...]:
    """Positions of ``kernel``'s ``tl.constexpr`` parameters in its signature (a JIT or an
    interpreted function: both keep the Python function as ``fn``)."""
    params = inspect.signature(kernel.fn).parameters.values()
    return tuple(i for i, p in enumerate(params) if "constexpr" in str(p.annotation))


@functools.cache
def _triton_knobs():
    # NOTE: imported once, not per launch (as `_interpreted_function`)
    from triton import knobs

    return knobs


def interpreting(kernel) -> bool:
    """True if ``kernel`` was decorated under ``TRITON_INTERPRET=1`` (it then runs on CPU)."""
    return isinstance(kernel, _interpreted_function())


@functools.cache
def _interpreted_function() -> type:
    # NOTE: imported once, not per launch (the import statement cost ~4 µs per call, several
    # calls per attention call)
    from triton.runtime.interpreter import InterpretedFunction

    return InterpretedFunction


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def pdl_capable(device: torch.device) -> bool:
    """Whether kernels on ``device`` can launch as programmatic dependents (PDL: a kernel's CTAs
    start while the previous kernel on the stream still runs and wait for it with
    ``griddepcontrol.wait`` before reading its output): CUDA, compute capability >= 9.0."""
    return device.type == "cuda" and _capability(
        device.index if device.index is not None else torch.cuda.current_device()) >= (9, 0)


def unsupported_reason(view: CompressedLayerView) -> str | None:
    """Why the fused kernels cannot handle ``view``'s format (None if they can).

    Fused: anchor ``last``/``first`` (any loop group size), every stored loop with 2/4/8 bits
    (residual loops may also have 0 bits), LSQ on or off, rotation None or a matrix with
    ``rotate_anchor``. Everything else (chained, 16-bit or 1-bit loops, residual-only rotation)
    is refused by the launchers (`require_kernel`); the serving package runs the PyTorch twin.
    """
    cfg = view.cfg
    if cfg.anchor not in ("last", "first"):
        return f"anchor={cfg.anchor!r}"
    for s in view.segments:
        if s.role == "anchor" and s.bits not in FUSED_BITS:
            return f"anchor loop {s.loop_id} has {s.bits} bits"
        if s.role != "anchor" and s.bits not in FUSED_BITS + (0,):
            return f"loop {s.loop_id} has {s.bits} bits"
    if view.rotation is not None and not cfg.rotate_anchor:
        return "rotate_anchor=False"
    if view.head_dim > 256:
        return f"head_dim={view.head_dim} > 256"
    return None


def on_kernel_device(kernel, *tensors: torch.Tensor) -> bool:
    """True if the Triton path can run on these tensors (CUDA, or CPU under the interpreter)."""
    dev = tensors[0].device
    assert all(t.device == dev for t in tensors), (
        f"all tensors must be on one device, got {[str(t.device) for t in tensors]}")
    return dev.type == "cuda" or (dev.type == "cpu" and interpreting(kernel))


def kernel_device_reason(device: torch.device | str) -> str | None:
    """Why the Triton kernels cannot run on ``device`` (None: CUDA, or CPU when the kernels were
    decorated under ``TRITON_INTERPRET=1``)."""
    from rq_kernels.triton.common import to_bf16  # any @triton.jit function of this package

    dev = torch.device(device)
    if dev.type == "cuda" or (dev.type == "cpu" and interpreting(to_bf16)):
        return None
    return f"{dev.type} tensors outside TRITON_INTERPRET=1"


def require_kernel(launcher: str, why: str | None, kernel, *tensors: torch.Tensor) -> None:
    """Refuse a call the Triton kernel cannot serve: a format reason ``why`` (from
    `unsupported_reason` or a launcher's own check), or tensors off the kernel's device.

    Raises
    ------
    ValueError
        Naming ``launcher`` and the reason. The launchers never fall back: the serving
        package decides kernel or PyTorch twin, once per pool (`sglang_rq.dispatch`).
    """
    if why is None and not on_kernel_device(kernel, *tensors):
        why = f"{tensors[0].device.type} tensors outside TRITON_INTERPRET=1"
    if why is not None:
        raise ValueError(f"{launcher} cannot serve this call: {why} (run the PyTorch twin in "
                         "sglang_rq.reference instead)")


def _split_terms(r: torch.Tensor, padded_dim: int) -> tuple[torch.Tensor, float, int]:
    """``r [..., D, D]`` fp32 as ``alpha * sum(terms)``, bf16 ``terms [TERMS, ..., DP, DP]``
    (`rotation_terms`)."""
    d = r.shape[-1]
    mag = r.abs()
    alpha = float(mag.flatten()[0])
    if alpha > 0 and bool((mag == alpha).all()):
        parts = [torch.sign(r)]
    else:
        alpha, parts, rest = 1.0, [], r
        for _ in range(3):
            p = rest.to(torch.bfloat16)
            parts.append(p.float())
            rest = rest - p.float()
    terms = torch.zeros(len(parts), *r.shape[:-2], padded_dim, padded_dim, dtype=torch.bfloat16,
                        device=r.device)
    for t, p in enumerate(parts):
        terms[t, ..., :d, :d] = p.to(torch.bfloat16)
    return terms, alpha, len(parts)


def rotation_terms(view: CompressedLayerView, padded_dim: int, device: torch.device
                   ) -> tuple[torch.Tensor, float, int]:
    """The view's rotation in the kernels' form: ``R = alpha * sum(terms)`` with bf16 ``terms
    [TERMS, H, DP, DP]`` (zero padded to ``padded_dim``).

    A matrix whose entries all have one magnitude (Hadamard, signed Hadamard: ``+-1/sqrt(D)``)
    is ``alpha * sign(R)``, one exact bf16 term; any other matrix is split hi/mid/lo (3 terms,
    24 mantissa bits, exact fp32). Multiplying a bf16 vector by the terms on tensor cores then
    gives fp32-accurate rotations. Built once per view (`prepare_view`, or for the layers of one
    pool `prepare_layers`, which the serving pool calls when it builds its views) and kept in
    ``view.kernel_rotation``; building it syncs, so a view not prepared must see one eager call
    before CUDA-graph capture. Returns a 1-element dummy when the view has no rotation (also
    kept, so no launch allocates it again).
    """
    key = (padded_dim, str(torch.device(device)))
    hit = view.kernel_rotation.get(key)
    if hit is not None:
        return hit
    if view.rotation is None:
        out = torch.zeros(1, dtype=torch.bfloat16, device=device), 1.0, 1
    else:
        out = _split_terms(view.rotation.detach().to(device=device, dtype=torch.float32),
                           padded_dim)
    view.kernel_rotation[key] = out
    return out


def hadamard_signs(view: CompressedLayerView, device: torch.device) -> torch.Tensor | None:
    """The signs ``s`` ``[H, head_dim]`` fp32 (+-1) when the view's rotation is ``alpha diag(s_h)
    H`` with ``H`` the Sylvester Hadamard matrix (``--rq-rotation hadamard`` or ``signed-hadamard``
    at a power-of-two head_dim; QuaRot, Ashkboos et al. 2024, section 3), else None: such a
    rotation is one fast Walsh-Hadamard transform, which the CUDA decode kernel applies to the
    query itself. ``alpha`` is `rotation_terms`'s. Built once per view with its rotation terms
    (`prepare_view`; a sync) and kept in ``view.kernel_rotation``."""
    key = ("hadamard_signs", str(torch.device(device)))
    if key in view.kernel_rotation:
        return view.kernel_rotation[key]
    out = None
    d = view.head_dim
    if view.rotation is not None and d & (d - 1) == 0:
        terms, _, nterms = rotation_terms(view, d, device)
        if nterms == 1:
            sign = terms[0].float()  # [H, D, D]
            i = torch.arange(d, device=device)
            both = i[:, None] & i[None, :]
            parity = torch.zeros_like(both)
            for bit in range(d.bit_length()):
                parity ^= (both >> bit) & 1
            sylvester = 1.0 - 2.0 * parity.float()  # (-1)^popcount(i & j)
            # column 0 of H is all ones; made contiguous before the check's host sync, so no
            # kernel writing it is still running when a decode kernel reads it (the tc split
            # kernel loads the signs before its programmatic-dependent-launch wait)
            s = sign[:, :, 0].contiguous()
            if bool((sign == s[:, :, None] * sylvester).all()):
                out = s
    view.kernel_rotation[key] = out
    return out


def prepare_layers(views: Sequence[CompressedLayerView]) -> None:
    """`prepare_view` for the layers of one pool (one format, rotations of one shape): their
    rotation terms become slices ``[TERMS, H, DP, DP]`` of one ``[layers, TERMS, H, DP, DP]``
    tensor, evenly spaced as `rq_kernels.commit.commit_layers` needs (one term for all layers
    when every layer's matrix has entries of one magnitude, else three)."""
    views = list(views)
    if not views or views[0].rotation is None:
        for view in views:
            prepare_view(view)
        return
    dp, dev = next_pow2(views[0].head_dim), views[0].rotation.device
    r = torch.stack([v.rotation.detach().to(device=dev, dtype=torch.float32) for v in views])
    terms, alpha, nterms = _split_terms(r, dp)  # [TERMS, layers, H, DP, DP]
    stacked = terms.transpose(0, 1).contiguous()
    key = (dp, str(torch.device(dev)))
    for view, t in zip(views, stacked):
        view.kernel_rotation[key] = (t, alpha, nterms)
        for k in [k for k in view.launch_cache if k[0] == "rotation_args"]:
            del view.launch_cache[k]
        hadamard_signs(view, dev)


def rotation_args(view: CompressedLayerView, padded_dim: int, device: torch.device
                  ) -> tuple[tuple, int]:
    """`rotation_terms` as the kernels take it: ``((terms, term stride, head stride, row
    stride, alpha), TERMS)``; strides 0 for the 1-element dummy of a view without rotation.
    Kept in ``view.launch_cache`` (read on every launch)."""
    key = ("rotation_args", padded_dim, device)
    hit = view.launch_cache.get(key)
    if hit is not None:
        return hit
    terms, alpha, nterms = rotation_terms(view, padded_dim, device)
    if terms.dim() != 4:
        hit = (terms, 0, 0, 0, alpha), nterms
    else:
        hit = (terms, terms.stride(0), terms.stride(1), terms.stride(2), alpha), nterms
    view.launch_cache[key] = hit
    return hit


def prepare_view(view: CompressedLayerView) -> None:
    """Build the kernels' form of ``view``'s rotation once, on the rotation's device (a host
    sync), so that later launches, CUDA-graph capture included, only read it."""
    if view.rotation is not None:
        rotation_terms(view, next_pow2(view.head_dim), view.rotation.device)
        hadamard_signs(view, view.rotation.device)


def strides3(t: torch.Tensor | None) -> tuple[int, int, int]:
    """(row, kv, head) strides of a pool tensor ``[rows, 2, H, ...]``; zeros for None."""
    return (0, 0, 0) if t is None else (t.stride(0), t.stride(1), t.stride(2))


def check_view(view: CompressedLayerView, device: torch.device) -> None:
    """Assert the pool tensors' dtype/device/inner contiguity (what the kernels index).

    Any row/kv/head strides work (token-major ``[rows, 2, H, ...]`` storage or head-major
    ``[2, H, rows, ...]``); the head strides become compile-time constants, so a head stride
    that is a multiple of 8 (scale_offset) or 16 (codes) keeps the gathers vectorized.

    A view's tensors are fixed when it is built, so a view that passed on ``device`` is not
    checked again (``view.launch_cache``): the serving pool's views are checked on their first
    launch, not on each of the ~100 launches of every forward.
    """
    key = ("check_view", device)
    if key in view.launch_cache:
        return
    ng = view.head_dim // view.cfg.group_size
    for i, seg in enumerate(view.segments):
        c, m, f = view.codes[i], view.scale_offset[i], view.coef[i]
        assert c.dtype == torch.uint8 and c.device == device and c.dim() == 4, (
            f"codes[{i}] must be uint8 [rows, 2, H, code_bytes] on {device}, got "
            f"{c.dtype} {tuple(c.shape)} on {c.device}")
        assert c.shape[-1] == seg.code_bytes and (c.shape[-1] == 0 or c.stride(-1) == 1), (
            f"codes[{i}] last dim must be {seg.code_bytes} contiguous bytes, strides {c.stride()}")
        if m is not None:
            assert m.dtype == torch.uint8 and m.device == device and m.shape[-2:] == (ng, 2), (
                f"scale_offset[{i}] must be uint8 [rows, 2, H, {ng}, 2] on {device}")
            assert m.stride(-1) == 1 and m.stride(-2) == 2, (
                f"scale_offset[{i}] must have contiguous [{ng}, 2] bytes, strides {m.stride()}")
        if f is not None:
            assert f.dtype == torch.bfloat16 and f.device == device and f.dim() == 3, (
                f"coef[{i}] must be bf16 [rows, 2, H] on {device}")
    view.launch_cache[key] = True


def attention_loop_args(view: CompressedLayerView, loop_id: int) -> tuple[tuple, dict]:
    """Kernel arguments (anchor codes/scale_offset, residual codes/scale_offset, coef + strides)
    and constexprs for attention over loop ``loop_id``: its anchor (base) plus its own residual,
    if any. Built once per (view, loop) and kept in ``view.launch_cache``; read-only."""
    key = ("attention_loop_args", loop_id)
    hit = view.launch_cache.get(key)
    if hit is None:
        hit = view.launch_cache[key] = _attention_loop_args(view, loop_id)
    return hit


def _attention_loop_args(view: CompressedLayerView, loop_id: int) -> tuple[tuple, dict]:
    seg = view.segments[loop_id]
    base = view.segments[seg.base]
    a = seg.base
    ac, aso = view.codes[a], view.scale_offset[a]
    if seg.role == "anchor":
        rc, rso, cf, r_bits = ac, aso, ac, 0
    else:
        r_bits = seg.bits
        rc = view.codes[loop_id] if r_bits > 0 else ac
        rso = view.scale_offset[loop_id] if r_bits > 0 else aso
        cf = view.coef[loop_id]
    has_coef = seg.role != "anchor" and view.coef[loop_id] is not None
    args = (ac, *strides3(ac), aso, *strides3(aso), rc, *strides3(rc), rso, *strides3(rso),
            cf if has_coef else ac, *(strides3(cf) if has_coef else (0, 0, 0)))
    d, g = view.head_dim, view.cfg.group_size
    dp = next_pow2(d)
    consts = dict(D=d, DP=dp, G=g, NG=d // g, NGP=dp // g, A_BITS=base.bits, R_BITS=r_bits,
                  HAS_COEF=has_coef)
    return args, consts


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for host ints (``triton.cdiv`` is a constexpr function: ~15 µs a call
    from Python)."""
    return -(-a // b)


def check_decode_args(q: torch.Tensor, k_cur: torch.Tensor, v_cur: torch.Tensor,
                      view: CompressedLayerView, loop_id: int, kv_indptr: torch.Tensor,
                      kv_indices: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """Host-side checks shared by the decode launchers; returns ``out`` (allocated if None)."""
    B, HQ, D = q.shape
    HKV = k_cur.shape[1]
    dev = q.device
    assert q.dtype == k_cur.dtype == v_cur.dtype == torch.bfloat16, "q/k_cur/v_cur must be bf16"
    assert k_cur.shape == v_cur.shape == (B, HKV, D) and HQ % HKV == 0, (
        f"q {tuple(q.shape)}, k_cur {tuple(k_cur.shape)}, v_cur {tuple(v_cur.shape)} mismatch")
    assert D == view.head_dim and 0 <= loop_id < len(view.segments), "head_dim/loop_id vs view"
    for name, t in (("q", q), ("k_cur", k_cur), ("v_cur", v_cur)):
        assert t.device == dev and t.stride(-1) == 1, (
            f"{name} must be on {dev}, last dim contiguous")
    assert kv_indptr.shape == (B + 1,) and kv_indptr.dtype == torch.int32, "kv_indptr int32 [B+1]"
    assert kv_indices.dim() == 1 and kv_indices.dtype == torch.int64, "kv_indices int64 [nnz]"
    assert kv_indptr.device == dev and kv_indices.device == dev and kv_indptr.is_contiguous()
    assert kv_indices.is_contiguous()
    check_view(view, dev)
    if out is None:
        out = torch.empty_like(q)
    assert out.shape == q.shape and out.dtype == q.dtype and out.stride(-1) == 1
    return out


def check_extend_args(q: torch.Tensor, k_cur: torch.Tensor, v_cur: torch.Tensor,
                      view: CompressedLayerView, loop_id: int, qo_indptr: torch.Tensor,
                      kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                      out: torch.Tensor | None) -> torch.Tensor:
    """Host-side checks shared by the extend implementations; returns ``out`` (allocated if
    None)."""
    T, HQ, D = q.shape
    HKV = k_cur.shape[1]
    B = qo_indptr.shape[0] - 1
    dev = q.device
    assert q.dtype == k_cur.dtype == v_cur.dtype == torch.bfloat16, "q/k_cur/v_cur must be bf16"
    assert k_cur.shape == v_cur.shape == (T, HKV, D) and HQ % HKV == 0, (
        f"q {tuple(q.shape)}, k_cur {tuple(k_cur.shape)}, v_cur {tuple(v_cur.shape)} mismatch")
    assert D == view.head_dim and 0 <= loop_id < len(view.segments), "head_dim/loop_id vs view"
    for name, t in (("q", q), ("k_cur", k_cur), ("v_cur", v_cur)):
        assert t.device == dev and t.stride(-1) == 1, (
            f"{name} must be on {dev}, last dim contiguous")
    for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr)):
        assert t.shape == (B + 1,) and t.dtype == torch.int32 and t.device == dev, (
            f"{name} must be int32 [{B + 1}] on {dev} (batch size {B} from qo_indptr), got "
            f"{t.dtype} {tuple(t.shape)} on {t.device}")
        assert t.is_contiguous()
    assert kv_indices.dim() == 1 and kv_indices.dtype == torch.int64, "kv_indices int64 [nnz]"
    assert kv_indices.device == dev and kv_indices.is_contiguous()
    check_view(view, dev)
    if out is None:
        out = torch.empty_like(q)
    assert out.shape == q.shape and out.dtype == q.dtype and out.stride(-1) == 1
    return out
