"""CPU attention over the compressed cache: a small C/OpenMP library, built on first use.

`extend_attention_cpu` has the signature of `rq_kernels.extend_attention` (and of its twin
`sglang_rq.reference.extend_attention_reference`); decode is the case of one query row per
request. The history (the compressed prefix) is attended by ``csrc/rq_cpu_attention.c`` in the
rotated basis, rebuilt 32 tokens at a time in a scratch that stays in L1/L2 (never materialised
for the whole history); the in-flight chunk is attended by PyTorch's CPU flash attention, and the
two are merged through their log-sum-exp (the split-KV merge of FlashDecoding).

The library is compiled with the system C compiler (``$CC``, default ``cc``; ``-O3
-march=native -fopenmp``) into ``$XDG_CACHE_HOME/rq_kernels/`` (default ``~/.cache``), keyed by
the source, the compiler's version and the host CPU's flags, so a cached build never runs on a
CPU it was not built for. It links the OpenMP runtime already loaded by PyTorch (same soname),
so the two share one thread pool. Without a compiler, `library_error` says why. Formats or hosts
the C path does not serve (`fallback_reason`, `commit_fallback_reason`) are refused with a
ValueError; the serving package runs the PyTorch twin for them.
"""

from __future__ import annotations

from collections.abc import Sequence

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rq_kernels._host import unsupported_reason

if TYPE_CHECKING:
    from rq_kernels.view import CompressedLayerView

SOURCE = Path(__file__).with_name("csrc") / "rq_cpu_attention.c"
MAX_CHAIN = 16  # RQ_MAX_CHAIN in the C source
MAX_HEAD_DIM = 256  # RQ_MAX_D


class _StoredLoop(ctypes.Structure):
    _fields_ = [
        ("codes", ctypes.c_void_p), ("codes_row", ctypes.c_int64), ("codes_kv", ctypes.c_int64),
        ("codes_head", ctypes.c_int64),
        ("scale_offset", ctypes.c_void_p), ("scale_offset_row", ctypes.c_int64),
        ("scale_offset_kv", ctypes.c_int64), ("scale_offset_head", ctypes.c_int64),
        ("coef", ctypes.c_void_p), ("coef_row", ctypes.c_int64), ("coef_kv", ctypes.c_int64),
        ("coef_head", ctypes.c_int64),
        ("bits", ctypes.c_int32), ("base", ctypes.c_int32),
    ]


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_error: str | None = None


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _build() -> ctypes.CDLL:
    cc = os.environ.get("CC") or "cc"
    if shutil.which(cc) is None:
        raise RuntimeError(f"no C compiler: `{cc}` is not on PATH (set CC, or install gcc)")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    flags = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11"]
    key = hashlib.sha256("\0".join([SOURCE.read_text(), version, _cpu_flags(), *flags]).encode())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rq_kernels"
    target = cache / f"rq_cpu_attention-{key.hexdigest()[:16]}.so"
    if not target.exists():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            built = Path(tmp) / target.name
            proc = subprocess.run([cc, *flags, str(SOURCE), "-o", str(built), "-lm"],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"`{cc}` failed to build {SOURCE.name}:\n{proc.stderr[-2000:]}")
            os.replace(built, target)  # atomic: concurrent builders agree on one file
    lib = ctypes.CDLL(str(target))
    fn = lib.rq_history_attention
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int64] * 8 + [ctypes.c_void_p] * 4 + [
        ctypes.POINTER(_StoredLoop), ctypes.c_int64, ctypes.c_float, ctypes.c_void_p,
        ctypes.c_void_p]
    fn = lib.rq_commit
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int64] * 6 + [ctypes.c_void_p] * 2 + [
        ctypes.POINTER(_StoredLoop), ctypes.c_void_p, ctypes.c_int32]
    return lib


def library() -> ctypes.CDLL | None:
    """The compiled library, built on first call; None if it cannot be built (`library_error`)."""
    global _lib, _error
    with _lock:
        if _lib is None and _error is None:
            try:
                _lib = _build()
            except (RuntimeError, OSError) as e:
                _error = str(e)
    return _lib


def library_error() -> str | None:
    """Why the library is unavailable (None if it built)."""
    library()
    return _error


def fallback_reason(view: CompressedLayerView) -> str | None:
    """Why `extend_attention_cpu` cannot serve ``view`` (None: the C path serves it)."""
    why = unsupported_reason(view)
    if why is None and view.head_dim > MAX_HEAD_DIM:
        why = f"head_dim={view.head_dim} > {MAX_HEAD_DIM}"
    return why if why is not None else library_error()


def _chain(view: CompressedLayerView, loop_id: int) -> list[int]:
    """Loop ids from ``loop_id`` along its bases to the anchor (anchor last)."""
    chain = [loop_id]
    while view.segments[chain[-1]].role != "anchor":
        chain.append(view.segments[chain[-1]].base)
    return chain


def _stored_loops(view: CompressedLayerView, chain: list[int]) -> ctypes.Array:
    arr = (_StoredLoop * len(chain))()
    for slot, i in zip(arr, chain):
        codes, scale_offset, coef = view.codes[i], view.scale_offset[i], view.coef[i]
        seg = view.segments[i]
        slot.codes, slot.bits, slot.base = codes.data_ptr(), seg.bits, seg.base
        slot.codes_row, slot.codes_kv, slot.codes_head = codes.stride()[:3]
        if scale_offset is not None:
            slot.scale_offset = scale_offset.data_ptr()
            (slot.scale_offset_row, slot.scale_offset_kv,
             slot.scale_offset_head) = scale_offset.stride()[:3]
        if coef is not None:
            slot.coef = coef.data_ptr()
            slot.coef_row, slot.coef_kv, slot.coef_head = coef.stride()[:3]
    return arr


def _kv_heads(view: CompressedLayerView) -> int:
    """KV heads of ``view`` (its codes' third dimension)."""
    return view.codes[0].shape[2]


def _check_index(name: str, t: torch.Tensor) -> None:
    """An index tensor the C library may read: integer (not bool), on the CPU, 1-D."""
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise ValueError(f"{name} must be integer pool rows or offsets, got {t.dtype}")
    if t.device.type != "cpu" or t.dim() != 1:
        raise ValueError(f"{name} must be a 1-D CPU tensor, got {t.dim()}-D on {t.device}")


def _pool_rows(view: CompressedLayerView) -> int:
    """Pool rows every tensor of ``view`` has (the bound the C library checks indices against)."""
    tensors = [t for ts in (view.codes, view.scale_offset, view.coef) for t in ts if t is not None]
    return min(t.shape[0] for t in tensors)


def _call_error(name: str, rc: int, *, T: int, nnz: int, rows: int) -> Exception:
    """The exception for the C library's return code ``rc`` (its functions' comments list them)."""
    if rc == -4:
        return ValueError(f"qo_indptr must rise from 0 to the {T} query rows")
    if rc == -5:
        return ValueError(f"kv_indptr must rise from 0 or more to at most the {nnz} entries of "
                          "kv_indices")
    if rc == -6:
        which = "loc" if name == "rq_commit" else "kv_indices"
        return ValueError(f"{which} holds a pool row outside [0, {rows})")
    return RuntimeError(f"{name} failed with code {rc}")


# The pool's views live as long as the server and their buffers never move, so each (view,
# loop)'s argument block is built once, keyed by the view's id; a finalizer drops the entry when
# the view is collected, so a later object reusing the id never sees it.
_ARGS: dict[int, dict[int, tuple[ctypes.Array, int]]] = {}


def _loop_args(view: CompressedLayerView, loop_id: int) -> tuple[ctypes.Array, int]:
    key = id(view)
    per_view = _ARGS.get(key)
    if per_view is None:
        per_view = _ARGS[key] = {}
        weakref.finalize(view, _ARGS.pop, key, None)
    if loop_id not in per_view:
        chain = _chain(view, loop_id)
        per_view[loop_id] = (_stored_loops(view, chain), len(chain))
    return per_view[loop_id]


def _chunk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qo: list[int],
                     sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of each request's chunk on itself: ``[T, HQ, D]`` fp32 and lse ``[T, HQ]``."""
    T, HQ, D = q.shape
    gq = HQ // k.shape[1]
    if qo == list(range(len(qo))):  # decode (one row per request): the token itself
        if gq > 1:
            k, v = k.repeat_interleave(gq, dim=1), v.repeat_interleave(gq, dim=1)
        return v, (q * k).sum(-1) * sm_scale
    out, lse = torch.empty_like(q), q.new_empty(T, HQ)
    for b in range(len(qo) - 1):
        s, e = qo[b], qo[b + 1]
        if s == e:
            continue
        qb = q[s:e].transpose(0, 1).unsqueeze(0)
        kb = k[s:e].repeat_interleave(gq, dim=1).transpose(0, 1).unsqueeze(0)
        vb = v[s:e].repeat_interleave(gq, dim=1).transpose(0, 1).unsqueeze(0)
        o, lb = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            qb, kb, vb, 0.0, True, scale=sm_scale)[:2]
        out[s:e] = o[0].transpose(0, 1)
        lse[s:e] = lb[0].transpose(0, 1)
    return out, lse


def extend_attention_cpu(q: torch.Tensor, k_cur: torch.Tensor, v_cur: torch.Tensor,
                         view: CompressedLayerView, loop_id: int, qo_indptr: torch.Tensor,
                         kv_indptr: torch.Tensor, kv_indices: torch.Tensor, *, sm_scale: float,
                         out: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of loop ``loop_id`` on CPU: each request's compressed history, then its chunk.

    Parameters
    ----------
    q:
        ``[num_tokens, num_qo_heads, head_dim]`` float (bf16/fp16/fp32), CPU: the chunk's
        queries, requests concatenated (``qo_indptr``). Decode: one row per request.
    k_cur, v_cur:
        ``[num_tokens, num_kv_heads, head_dim]``: the chunk's own K/V (original basis), attended
        causally after the history.
    view:
        The layer's `CompressedLayerView` (CPU tensors, read only).
    loop_id:
        Loop whose K/V are attended (its anchor plus its residual).
    qo_indptr, kv_indptr:
        ``[batch_size + 1]`` integer: request b's chunk rows and history rows
        ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` (pool rows, may be empty).
    kv_indices:
        ``[nnz]`` integer pool rows.
    sm_scale:
        Softmax scale.
    out:
        Optional ``[num_tokens, num_qo_heads, head_dim]`` output in q's dtype.

    Returns
    -------
    ``[num_tokens, num_qo_heads, head_dim]`` in q's dtype, original basis. Math: DESIGN.md
    section 1 (rotated basis, ``x_i = c_i a + r_i``); the merge is FlashDecoding's LSE merge
    (Dao et al., 2023).

    Raises
    ------
    ValueError
        For a format or host the C path does not serve (`fallback_reason`); the caller runs the
        twin `sglang_rq.reference.extend_attention_reference`. Also for index tensors that do
        not describe the call (the library checks them before any work): ``qo_indptr`` not
        rising from 0 to ``num_tokens``, ``kv_indptr`` not rising within ``kv_indices``, or a
        pool row outside the view.
    """
    why = fallback_reason(view)
    if why is not None:
        raise ValueError(f"extend_attention_cpu cannot serve this call: {why} (run the PyTorch "
                         "twin in sglang_rq.reference instead)")
    T, HQ, D = q.shape
    HKV = k_cur.shape[1]
    if q.device.type != "cpu":
        raise ValueError(f"extend_attention_cpu needs CPU tensors, got q on {q.device}")
    if (HQ % HKV or k_cur.shape != (T, HKV, D) or v_cur.shape != (T, HKV, D)
            or (HKV, D) != (_kv_heads(view), view.head_dim)):
        raise ValueError(f"q {tuple(q.shape)}, k_cur {tuple(k_cur.shape)}, v_cur "
                         f"{tuple(v_cur.shape)} and the view's {_kv_heads(view)} KV heads of "
                         f"head_dim {view.head_dim} do not match")
    for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr),
                    ("kv_indices", kv_indices)):
        _check_index(name, t)
    gq, g = HQ // HKV, view.cfg.group_size
    qo_list = qo_indptr.tolist()
    qf = q.float()
    rot = view.rotation
    q_rot = qf if rot is None else torch.einsum(
        "tkgd,kde->tkge", qf.view(T, HKV, gq, D), rot.float()).reshape(T, HQ, D)
    q_rot = q_rot.contiguous()
    hist, lse_h = torch.empty_like(q_rot), q_rot.new_empty(T, HQ)
    qo64 = qo_indptr.to(torch.int64).contiguous()
    kv64 = kv_indptr.to(torch.int64).contiguous()
    idx64 = kv_indices.to(torch.int64).contiguous()
    chain_args, chain_len = _loop_args(view, loop_id)
    if len(kv64) != len(qo64):
        raise ValueError(f"kv_indptr has {len(kv64)} entries and qo_indptr {len(qo64)}: need "
                         "batch_size + 1 each")
    rows = _pool_rows(view)
    rc = library().rq_history_attention(
        len(qo_list) - 1, T, len(idx64), rows, HQ, HKV, D, g, q_rot.data_ptr(),
        qo64.data_ptr(), kv64.data_ptr(), idx64.data_ptr(), chain_args, chain_len,
        float(sm_scale), hist.data_ptr(), lse_h.data_ptr())
    if rc != 0:
        raise _call_error("rq_history_attention", rc, T=T, nnz=len(idx64), rows=rows)
    if rot is not None:
        hist = torch.einsum("tkge,kde->tkgd", hist.view(T, HKV, gq, D), rot.float()).reshape(T, HQ, D)
    chunk, lse_c = _chunk_attention(qf, k_cur.float(), v_cur.float(), qo_list, sm_scale)
    # LSE merge: the history's share is e^lse_h / (e^lse_h + e^lse_c) = sigmoid(lse_h - lse_c)
    # (0 for an empty history, lse_h = -inf).
    share = torch.sigmoid(lse_h - lse_c).unsqueeze(-1)
    merged = torch.lerp(chunk, hist, share)
    if out is None:
        return merged.to(q.dtype).contiguous()
    out.copy_(merged)
    return out


# ----------------------------------------------------------------------------- commit
def commit_fallback_reason(view: CompressedLayerView) -> str | None:
    """Why `commit_cpu` cannot serve ``view`` (None: the C path serves it)."""
    for seg in view.segments:
        if seg.bits not in (0, 2, 4, 8) or (seg.role == "anchor" and seg.bits == 0):
            return f"loop {seg.loop_id} has {seg.bits} bits"
    if view.rotation is not None and not view.cfg.rotate_anchor:
        return "rotate_anchor=False"
    if view.head_dim > MAX_HEAD_DIM or len(view.segments) > MAX_CHAIN:
        return f"head_dim={view.head_dim} or {len(view.segments)} loops out of range"
    return library_error()


_COMMIT_ARGS: dict[int, tuple[ctypes.Array, torch.Tensor]] = {}


def _commit_args(view: CompressedLayerView) -> tuple[ctypes.Array, torch.Tensor]:
    key = id(view)
    if key not in _COMMIT_ARGS:
        segs = view.segments
        arr = _stored_loops(view, [seg.loop_id for seg in segs])
        order, done = [], set()
        while len(order) < len(segs):  # every base before the loops stored against it
            for seg in segs:
                if seg.loop_id not in done and (seg.base == seg.loop_id or seg.base in done):
                    order.append(seg.loop_id)
                    done.add(seg.loop_id)
        _COMMIT_ARGS[key] = (arr, torch.tensor(order, dtype=torch.int32))
        weakref.finalize(view, _COMMIT_ARGS.pop, key, None)
    return _COMMIT_ARGS[key]


def commit_cpu(k_loops: Sequence[torch.Tensor], v_loops: Sequence[torch.Tensor],
               loc: torch.Tensor, view: CompressedLayerView) -> None:
    """Compress every loop of ``num_tokens`` tokens into pool rows ``loc`` on CPU.

    Same signature and semantics as `sglang_rq.reference.commit_reference` (its twin) and
    `rq_kernels.commit`: ``k_loops``/``v_loops`` ``num_loops`` float tensors ``[num_tokens,
    num_kv_heads, head_dim]`` (or one ``[num_loops, ...]`` tensor), ``loc`` ``[num_tokens]``
    integer rows (distinct), ``view`` written in place.
    The rotation is the twin's own einsum; the C library then quantizes each (token, K-or-V, head)
    in the twin's arithmetic order (DESIGN.md section 1), so every byte equals the twin's except
    where the least-squares dot products, summed in another order, round ``c`` to the other
    bf16 neighbour (a tie flip). Raises ValueError for the formats `commit_fallback_reason`
    names (the caller runs the twin), and for a loop count other than the view's, or a ``loc``
    that is not one integer pool row per token inside the view (checked before any write).
    """
    why = commit_fallback_reason(view)
    if why is not None:
        raise ValueError(f"commit_cpu cannot serve this call: {why} (run the PyTorch twin in "
                         "sglang_rq.reference instead)")
    ks, vs = tuple(k_loops), tuple(v_loops)
    assert ks and len(ks) == len(vs), f"{len(ks)} K and {len(vs)} V loops: need one or more each"
    if ks[0].device.type != "cpu" or loc.device.type != "cpu":
        raise ValueError(f"commit_cpu needs CPU tensors, got K/V on {ks[0].device}")
    x = torch.stack([torch.stack(ks), torch.stack(vs)], dim=2).float()  # [L, T, 2, H, D]
    L, T, _, H, D = x.shape
    if L != len(view.segments):
        raise ValueError(f"commit_cpu got {L} loops of K/V for a view of {len(view.segments)}")
    if (H, D) != (_kv_heads(view), view.head_dim):
        raise ValueError(f"commit_cpu got K/V of {H} heads x {D} for a view of "
                         f"{_kv_heads(view)} KV heads x head_dim {view.head_dim}")
    _check_index("loc", loc)
    if loc.shape != (T,):
        raise ValueError(f"loc must be [{T}] integer pool rows (one per token), got "
                         f"{tuple(loc.shape)}")
    if T == 0:
        return
    if view.rotation is not None:
        x = torch.einsum("...hd,hde->...he", x, view.rotation.float())
    x = x.contiguous()
    loc64 = loc.to(torch.int64).contiguous()
    loops, order = _commit_args(view)
    rows = _pool_rows(view)
    rc = library().rq_commit(L, T, rows, H, D, view.cfg.group_size, x.data_ptr(),
                             loc64.data_ptr(), loops, order.data_ptr(), int(view.cfg.lsq))
    if rc != 0:
        raise _call_error("rq_commit", rc, T=T, nnz=T, rows=rows)
