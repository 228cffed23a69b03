"""Host side of the tensor-core CUDA split kernel (`csrc/rq_decode_tc.cu`): which formats it
serves, its compile-time variant, and its by-value argument struct.

`rq_kernels.decode.decode_attention` calls `tc_split`; the merge kernel it shares with the
Triton split kernels reduces the splits.
"""

from __future__ import annotations

import ctypes
import functools
from typing import TYPE_CHECKING, NamedTuple

import torch

from rq_kernels import cuda
from rq_kernels._host import (
    hadamard_signs, next_pow2, pdl_capable, rotation_terms, unsupported_reason,
)

if TYPE_CHECKING:
    from rq_kernels.view import CompressedLayerView

SOURCE = "rq_decode_tc.cu"
KERNEL = "rq_decode_tc_split"
HEAD_DIMS = (64, 96, 128)  # head_dims served; 96 runs as 128 with a padding group (width)
WARPS = 4  # (split, KV head) units per CTA (one warp each)
TILE = 16  # history tokens per tile (one stage of shared memory, the MMAs' M)


class Occupancy(NamedTuple):
    """A compiled shape of the split kernel: ``ctas_per_sm`` (``__launch_bounds__`` MINB, so
    the register cap), ``stages`` (16-token tiles of shared memory per warp) and ``subtiles``
    (tiles per loop iteration, i.e. per softmax step; ``stages - subtiles`` tiles are in flight
    while an iteration computes)."""

    ctas_per_sm: int
    stages: int
    subtiles: int


# The wide shape (16-token iterations, 2 stages) while two splits per (request, KV head) fit one
# wave, else the narrow one: 2 CTAs running 32-token iterations over 4 stages (~200 registers),
# 1.03-1.12x faster than 16-token iterations where one split per unit already fills the GPU
# (2026-12-02f, benchmarks/results/h200_2026-12-02f_tc_hybrid_ab.json, ..._tc_subtiles_ab.json).
# The wide shape is 4 CTAs (128 registers) on the integer K side: since its u8 codes and fp16 V
# codes (12-04) the variant fits 128 registers without spills (Ouro) and 4 CTAs beat 3 by
# 1.03-1.06x at Ouro 4 x 8k-16 x 16k, Huginn 16 x 16k and the Ouro step at 32 GiB (batch 13),
# 0.99-1.02x elsewhere (batch 1-2, 64 x 8k, 55 x 16k; step at batch 2 0.99x)
# (benchmarks/results/h200_2026-12-04f_occupancy4_ab.json). The fp16 K side keeps 3 CTAs (~152
# registers): there 4 lost 1.02-1.06x (SmolLM2 4 x 8k, 64 x 8k; before 12-04, when spills came
# with 128 registers, 4 CTAs lost everywhere: ..._2026-12-02h_tc_vmap_ab.json,
# ..._2026-12-03f_qsmem_ab.json). A third stage in the 4-CTA shape (79 % carveout) ran
# 0.95-0.99x (..._2026-12-04f_stages3_ab.json).
OCCUPANCY = {True: (Occupancy(4, 2, 1), Occupancy(2, 4, 2)),  # integer K side: (wide, narrow)
             False: (Occupancy(3, 2, 1), Occupancy(2, 4, 2))}  # fp16 K side


def integer_k(group: int, head_dim: int, group_size: int) -> bool:
    """Whether the split kernel's K side runs on integer tensor cores (the source's ``KINT``):
    where the query rows, ``group`` query heads per KV head x groups of ``group_size`` per
    `width`, fit half the MMA's 8 columns (<= 4; the low halves of the fixed-point query take
    the other half): Ouro and Huginn (MHA), GQA 2 at head_dim 64. Else fp16 codes against the
    fp16 query (SmolLM2's GQA 3)."""
    return group * (width(head_dim) // group_size) <= 4


def tc_occupancy(units: int, num_sms: int, int_k: bool) -> Occupancy:
    """The `OCCUPANCY` shape of the K side ``int_k`` (`integer_k`) for ``units`` (request, KV
    head) pairs on ``num_sms`` SMs: the wide shape while that leaves at least two splits per unit
    in one wave, else the narrow one. Tuned on the H200 (227 KB of shared memory per SM; a GPU
    with less may fit fewer CTAs of the wide shape, which then keep its register cap without
    the occupancy)."""
    wide, narrow = OCCUPANCY[int_k]
    return wide if WARPS * wide.ctas_per_sm * num_sms >= 2 * units else narrow


# A split's fixed cost in tile times: the query load and rotation, the pipeline's first tiles,
# the partial's write and the merge's arrival
SPLIT_OVERHEAD_TILES = 2
MIN_SPLIT_TILES = 4  # a split reads at least this many tiles (the previous one-wave rule's floor)


def tc_plan(batch_size: int, num_kv_heads: int, nnz: int, num_sms: int, int_k: bool,
            splits: int | None = None) -> tuple[Occupancy, int]:
    """The `OCCUPANCY` shape (`tc_occupancy`) and the splits per request's history for a decode
    call of ``batch_size`` requests holding ``nnz`` history tokens in all, on ``num_sms`` SMs,
    on the K side ``int_k`` (`integer_k`).

    The splits minimise the modelled time ``waves x (tiles per split + SPLIT_OVERHEAD_TILES)``:
    ``waves`` is the launch's CTAs (``batch_size x cdiv(splits x num_kv_heads, 4)``) over the
    CTAs that fit the GPU at once, rounded up, and a split reads ``cdiv(nnz / batch_size,
    splits)`` tokens rounded up to whole iterations (`Occupancy.subtiles` tiles of 16), at least
    `MIN_SPLIT_TILES` tiles; the fewest splits among equal times. Equal-length splits make a
    partly filled wave cost a whole one, so where the (request, KV head) pairs leave a wave
    partly filled this picks several full waves of shorter splits (FlashAttention-2's
    ``num_splits_heuristic`` weighs the same wave efficiency); where one wave already fills,
    it is the one-wave count. ``splits``: a forced count (`DecodeLaunch.num_splits`), returned
    with the shape. Host-only (``nnz`` is host-known), so CUDA-graph friendly."""
    occ = tc_occupancy(batch_size * num_kv_heads, num_sms, int_k)
    if splits:
        return occ, splits
    avg = max(1, nnz // max(1, batch_size))
    step = occ.subtiles * TILE
    most = max(1, -(-avg // (MIN_SPLIT_TILES * TILE)))
    slots = occ.ctas_per_sm * num_sms
    best, best_cost = 1, None
    for s in range(1, most + 1):
        ctas = batch_size * -(-(s * num_kv_heads) // WARPS)
        waves = -(-ctas // slots)
        tiles = -(-(-(-avg // s)) // step) * occ.subtiles
        cost = waves * (tiles + SPLIT_OVERHEAD_TILES)
        if best_cost is None or cost < best_cost:
            best, best_cost = s, cost
    return occ, best


@functools.cache
def carveout_percent(index: int) -> int | None:
    """The preferred shared-memory carveout (percent of the SM's shared memory) of the split
    kernel and of the query rotation and merge launched around it on CUDA device ``index``: the
    least that holds the largest variant's `OCCUPANCY` shape (4-bit anchor and residual at width
    128, plus the 1 KB the driver reserves per CTA; 67 % on the H200, the 4-CTA shape's: 50 %
    before the 2-CTA shape took 4 stages, which left the 3-CTA shape's speed unchanged).
    Programmatically dependent CTAs can share an SM only if their kernels prefer the same
    carveout; left to the driver, the split kernel launched as a dependent of the rotation ran
    1.1-1.3x slower at batch >= 2 (12-02, `benchmarks/results/h200_2026-12-02e_decode_pdl_ab.json`),
    as it does with the whole carveout given to shared memory (its shared small reads need L1).
    None (the driver decides) below compute capability 9.0, where nothing launches as a
    dependent."""
    if not pdl_capable(torch.device("cuda", index)):
        return None
    per_sm = torch.cuda.get_device_properties(index).shared_memory_per_multiprocessor
    need = max(o.ctas_per_sm * (WARPS * o.stages * stage_bytes(4, 4, 128) + 1024)
               for shapes in OCCUPANCY.values() for o in shapes)
    return min(100, -(-100 * need // per_sm))


def width(head_dim: int) -> int:
    """The kernel's width D at ``head_dim`` (the source's D): head_dim rounded up to a power of two,
    so 64 or 128; it is also the row length of the split output MidO (the merge kernel's DP)."""
    return next_pow2(head_dim)


def stage_bytes(anchor_bits: int, residual_bits: int, head_dim: int, coop: bool = False) -> int:
    """Shared memory of one pipeline stage of one warp (the CUDA source's STAGE_BYTES): the codes
    of K and V for 16 tokens at the kernel's `width` (head_dim 96: pitch 128, 96 copied) and,
    unless ``coop`` (`coop_copies`), 4 x 16 (scale, offset) rows padded to 8 bytes and 2 x 16
    32-bit words holding the K and V LSQ coefficients."""
    d = width(head_dim)
    codes = 2 * TILE * (d * (anchor_bits + residual_bits) // 8)
    return codes if coop else codes + 4 * TILE * 8 + 2 * TILE * 4


def so_bytes(head_dim: int, group_size: int) -> int:
    """(scale, offset) bytes of one (token, KV head) as the kernel copies them (the source's SB):
    one FP8 pair per quantization group of the `width`."""
    return 2 * (width(head_dim) // group_size)


def coop_small_bytes(head_dim: int, group_size: int) -> int:
    """Shared memory of one stage's (scale, offset) rows and coefficients of a CTA's `WARPS` KV
    heads where their warps copy them together (`coop_copies`; the source's SMALL_BYTES under
    COOP): 4 kinds x 16 tokens x WARPS rows of 2 bytes per group, 2 x 16 x WARPS bf16."""
    return 4 * TILE * WARPS * so_bytes(head_dim, group_size) + 2 * TILE * WARPS * 2


def coop_copies(view: CompressedLayerView, loop_id: int) -> bool:
    """Whether the `WARPS` warps of a CTA, `WARPS` adjacent KV heads of one split, copy the
    (scale, offset) rows and LSQ coefficients of their tiles once for the CTA (the source's
    COOP): where the KV heads come in whole CTAs and each token's rows of adjacent heads are one
    span of its pool row (token-major rows, head stride = row bytes) that 16-byte copies reach
    (rows, K/V and the tensor 16-byte aligned; coefficients 8-byte aligned, head stride 1), not
    at head_dim 96. Otherwise every warp copies its own head's, and the CTA's warps share the
    sectors through L1. Decided once per (view, loop) and kept in ``view.launch_cache``."""
    key = ("coop", loop_id)
    if key not in view.launch_cache:
        view.launch_cache[key] = _coop_copies(view, loop_id)
    return view.launch_cache[key]


def coop_shape(num_kv_heads: int, head_dim: int, group_size: int) -> bool:
    """The shape's part of `coop_copies`: the KV heads fill whole CTAs of `WARPS`, head_dim is not
    96, and a CTA's (scale, offset) bytes per token are whole 16-byte chunks. The pool's strides
    and alignment decide the rest (`coop_copies`)."""
    return (head_dim != 96 and num_kv_heads % WARPS == 0
            and WARPS * so_bytes(head_dim, group_size) % 16 == 0)


def _coop_copies(view: CompressedLayerView, loop_id: int) -> bool:
    _, aso, _, rso, cf, _, _ = _loop_tensors(view, loop_id)
    hd = view.head_dim
    sb = so_bytes(hd, view.cfg.group_size)
    if not coop_shape(aso.shape[2], hd, view.cfg.group_size):
        return False
    for t in (aso, rso):
        if t is not None and (t.stride(2) * t.element_size() != sb or t.data_ptr() % 16
                              or any(x * t.element_size() % 16 for x in t.stride()[:2])):
            return False
    return cf is None or (cf.stride(2) == 1 and cf.data_ptr() % 8 == 0
                          and not any(x * cf.element_size() % 8 for x in cf.stride()[:2]))


L2_LINE = 128  # bytes of an L2 cache line (sm_80, sm_90)


def stream_shape(head_dim: int, bits: tuple[int, ...], coop: bool) -> bool:
    """The shape's part of `stream_codes`: under COOP (`coop_copies`: a CTA's `WARPS` warps are
    adjacent KV heads of one split) a CTA's codes of each kind in ``bits`` (0: none) span whole
    `L2_LINE` lines of a token row. The pool's strides and alignment decide the rest."""
    return coop and all(WARPS * head_dim * b // 8 % L2_LINE == 0 for b in bits)


def stream_codes(view: CompressedLayerView, loop_id: int) -> bool:
    """Whether the split kernel copies the codes with an L2 evict_first policy (the source's
    STREAM): where no two CTAs read one code line, so a line is dead once its CTA has copied it:
    `stream_shape`, and the code tensors' token rows, K-to-V offsets and bases `L2_LINE`-aligned
    with the heads side by side (token-major). Ouro-1.4B's pool (16 KV heads, head_dim 128, 4-
    and 2-bit codes) meets it. Where CTAs share lines (Huginn's head_dim 96: 192 bytes of a
    CTA's 4-bit codes per row), evict_first made the L2 fetch them again: 0.67x at Huginn 64 x 8k
    (``benchmarks/results/h100_2026-12-05f_first_ab.json``), where Ouro runs 1.015-1.07x from
    1 x 8k to 64 x 8k against normal eviction (H100, chained;
    ``benchmarks/results/h100_2026-12-05f_stream_ab.json``). Decided once per (view, loop) and
    kept in ``view.launch_cache``."""
    key = ("stream", loop_id)
    if key not in view.launch_cache:
        view.launch_cache[key] = _stream_codes(view, loop_id)
    return view.launch_cache[key]


def _stream_codes(view: CompressedLayerView, loop_id: int) -> bool:
    ac, _, rc, _, _, a_bits, r_bits = _loop_tensors(view, loop_id)
    if not stream_shape(view.head_dim, (a_bits, r_bits), coop_copies(view, loop_id)):
        return False
    for t, bits in ((ac, a_bits), (rc, r_bits)):
        if t is None:
            continue
        es = t.element_size()
        if (t.stride(2) * es != view.head_dim * bits // 8 or t.data_ptr() % L2_LINE
                or any(x * es % L2_LINE for x in t.stride()[:2])):
            return False
    return True


def code_chunk(head_dim: int, bits: int) -> int:
    """Bytes of one cp.async of a (token, head)'s codes (the source's `code_chunk`): 16 where the
    head_dim x bits / 8 code bytes are a multiple of 16, else 8 (head_dim 96 at 2 bits: 24)."""
    return 16 if (head_dim * bits // 8) % 16 == 0 else 8


class _Args(ctypes.Structure):
    """Mirror of ``struct Args`` in the CUDA source (same order, natural alignment)."""

    _fields_ = [("q", ctypes.c_void_p), ("q_b", ctypes.c_int64), ("q_h", ctypes.c_int64),
                ("signs", ctypes.c_void_p), ("kv_indptr", ctypes.c_void_p),
                ("kv_indices", ctypes.c_void_p)] + [
        (f"{n}{s}", ctypes.c_void_p if s == "" else ctypes.c_int64)
        for n in ("ac", "aso", "rc", "rso", "cf") for s in ("", "_r", "_kv", "_h")] + [
        ("mid_o", ctypes.c_void_p), ("mid_ml", ctypes.c_void_p), ("qk_scale", ctypes.c_float),
        ("q_alpha", ctypes.c_float), ("num_splits", ctypes.c_int32),
        ("num_qo_heads", ctypes.c_int32), ("q_mode", ctypes.c_int32), ("batch", ctypes.c_int32),
        ("fill_rows", ctypes.c_int32), ("split_rows", ctypes.c_void_p), ("fused", ctypes.c_int32),
        ("merge_chunk", ctypes.c_int32)] + [
        (f"{n}{s}", ctypes.c_void_p if s == "" else ctypes.c_int64)
        for n in ("k_cur", "v_cur", "out") for s in ("", "_b", "_h")] + [
        ("counters", ctypes.c_void_p)]


MERGE_COUNTERS = 1 << 16  # the fused merge's arrival counters per device (int32)
_COUNTERS: dict[int, torch.Tensor] = {}


def merge_chunk(splits: int, group: int) -> int:
    """Splits per chunk of the fused merge's two-level reduction for ``splits`` splits of
    ``group`` query heads per KV head: all of them (one level) up to 64 rows (splits x group),
    else 16. A warp reduces 16 rows per round, ~1 µs; a second level costs ~3 rounds (release,
    acquire, one more round). Measured on the H200: Ouro 1 x 8k at 99 splits one level 28.3 µs,
    chunks of 16 27.1, the merge kernel 27.0; SmolLM2 4 x 8k at 132 splits (GQA 3) 30.6, 21.8,
    35.8 (`benchmarks/results/h200_2026-12-03_fused_merge_ab.json`)."""
    return splits if splits * group <= 64 else min(splits, 16)


def merge_counters(device: torch.device, pairs: int, splits: int,
                   group: int) -> torch.Tensor | None:
    """The fused merge's arrival counters on CUDA ``device`` for a launch of ``pairs`` (request,
    KV head) pairs of ``splits`` splits and ``group`` query heads each: ``[MERGE_COUNTERS]``
    int32, one per chunk (`merge_chunk`) and one per pair (``pairs * (chunks + 1)`` used), zero
    between launches (each last arrival wraps its counter back to 0), allocated once per
    device. None (the launcher then runs the merge kernel) where they do not fit, or where the
    first call happens while a CUDA graph is being captured. One decode launch at a time per
    device (the serving runtime's case: one forward stream per GPU); a launch cut short would
    leave counts behind."""
    if pairs * (-(-splits // merge_chunk(splits, group)) + 1) > MERGE_COUNTERS:
        return None
    if _device_index(device) not in _COUNTERS and torch.cuda.is_current_stream_capturing():
        return None
    return reserve_merge_counters(device)


def _device_index(device: torch.device | str) -> int:
    device = torch.device(device)
    return torch.cuda.current_device() if device.index is None else device.index


def reserve_merge_counters(device: torch.device | str) -> torch.Tensor:
    """Allocate (once) and return the fused merge's counters on CUDA ``device`` (`merge_counters`);
    call it before capturing decode CUDA graphs (a first call inside a capture merges with the
    merge kernel instead)."""
    index = _device_index(device)
    t = _COUNTERS.get(index)
    if t is None:
        t = torch.zeros(MERGE_COUNTERS, dtype=torch.int32, device=f"cuda:{index}")
        torch.cuda.synchronize(index)
        _COUNTERS[index] = t
    return t


def query_rotation(view: CompressedLayerView, device: torch.device
                   ) -> tuple[int, torch.Tensor | None, float]:
    """How the split kernel gets its query in the rotated basis: ``(q_mode, signs, alpha)``
    (the source's ``Args``). 1: the view has no rotation, the kernel reads the model's bf16
    query; 2: the rotation is ``alpha diag(s) H`` (Sylvester Hadamard, `_host.hadamard_signs`),
    the kernel rotates the bf16 query itself (one fast Walsh-Hadamard transform per row, no
    launch before it); 0: any other rotation, the query rotation kernel runs first and the
    kernel reads its fp32 output."""
    if view.rotation is None:
        return 1, None, 1.0
    signs = hadamard_signs(view, device)
    if signs is None:
        return 0, None, 1.0
    _, alpha, _ = rotation_terms(view, view.head_dim, device)
    return 2, signs, alpha


def _loop_tensors(view: CompressedLayerView, loop_id: int):
    """(anchor codes, anchor scale_offset, residual codes or None, residual scale_offset or None,
    coefficients or None, anchor bits, residual bits) of attention over ``loop_id``."""
    seg = view.segments[loop_id]
    a = seg.base
    anchor_bits = view.segments[a].bits
    if seg.role == "anchor":
        return view.codes[a], view.scale_offset[a], None, None, None, anchor_bits, 0
    r_bits = seg.bits
    rc = view.codes[loop_id] if r_bits else None
    rso = view.scale_offset[loop_id] if r_bits else None
    return view.codes[a], view.scale_offset[a], rc, rso, view.coef[loop_id], anchor_bits, r_bits


def tc_unsupported_reason(view: CompressedLayerView, loop_id: int, group: int,
                          device: torch.device) -> str | None:
    """`_tc_unsupported_reason`, decided once per (view, loop, group, device) and kept in
    ``view.launch_cache``."""
    key = ("tc", loop_id, group, str(device))
    if key not in view.launch_cache:
        view.launch_cache[key] = _tc_unsupported_reason(view, loop_id, group, device)
    return view.launch_cache[key]


def _tc_unsupported_reason(view: CompressedLayerView, loop_id: int, group: int,
                           device: torch.device) -> str | None:
    """Why the tensor-core CUDA split kernel cannot serve attention over ``loop_id`` with
    ``group`` query heads per KV head on ``device`` (None if it can): a fused format, CUDA with
    compute capability >= 8.9 (FP8 conversions), head_dim in `HEAD_DIMS`, 2- or 4-bit anchor,
    0/2/4-bit residual, group_size 32/64 giving at least two groups per `width` (head_dim 64
    and 96: 32 only) with ``group * width / group_size <= 8`` MMA rows, the pool's code and
    (scale, offset) rows aligned for the kernel's cp.async copies, coefficient rows at an even
    bf16 stride, rows and row strides below 2^32, and the variant compiled and loaded
    (`rq_kernels.cuda.load_reason`: the compile happens here, once)."""
    why = unsupported_reason(view)
    if why is not None:
        return why
    if device.type != "cuda":
        return f"{device.type} tensors (the CUDA kernel runs on CUDA only)"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    if torch.cuda.get_device_capability(device) < (8, 9):
        return "compute capability < 8.9"
    hd = view.head_dim
    if hd not in HEAD_DIMS:
        return f"head_dim={hd} (the CUDA kernel serves head_dim {'/'.join(map(str, HEAD_DIMS))})"
    gs, d = view.cfg.group_size, width(hd)
    if gs not in (32, 64) or hd % gs or d // gs < 2:
        # (scale, offset) rows of >= 4 bytes for cp.async; a thread's two K columns one head's
        return f"group_size={gs} at head_dim {hd} (CUDA kernel: 32, or 64 at head_dim 128)"
    if group * (d // gs) > 8:
        return f"{group} query heads x {d // gs} groups > 8 MMA rows"
    ac, aso, rc, rso, cf, a_bits, r_bits = _loop_tensors(view, loop_id)
    if a_bits not in (2, 4) or r_bits not in (0, 2, 4):
        return f"anchor {a_bits} / residual {r_bits} bits (CUDA kernel: 2/4 and 0/2/4)"
    for name, t, bits in (("anchor", ac, a_bits), ("residual", rc, r_bits)):
        if t is None:
            continue
        align = code_chunk(hd, bits)
        if t.data_ptr() % align or any(s % align for s in t.stride()[:-1]):
            return f"{name} codes not aligned to {align} bytes"
    for t in (aso, rso):
        if t is None:
            continue
        # copied by cp.async as one row of 2 * groups bytes; head_dim 96 (6-byte rows): as the
        # two aligned words holding it, at the same offset in them for every token of a head
        align = 2 if hd == 96 else 2 * (hd // gs)
        if t.data_ptr() % align or any(s % align for s in t.stride()[:-2]):
            return f"scale_offset rows not {align}-byte aligned"
        if hd == 96 and t.stride(0) % 4:
            return "scale_offset row stride not a multiple of 4 bytes (head_dim 96)"
    # the kernel copies the aligned 32-bit word holding each bf16 coefficient and picks its half
    # once per KV head, so every row must keep the same half: an even row stride in elements
    if cf is not None and cf.stride(0) % 2:
        return "coefficient rows at an odd bf16 stride"
    for t in (ac, aso, rc, rso, cf):  # row offsets are one 32 x 32 -> 64-bit multiply
        if t is not None and (t.shape[0] >= 2**32 or t.stride(0) * t.element_size() >= 2**32):
            return "pool rows or row strides not below 2^32"
    for occupancy in OCCUPANCY[integer_k(group, hd, gs)]:
        defines, smem = _variant(view, loop_id, group, occupancy)
        why = cuda.load_reason(SOURCE, KERNEL, defines, device, shared_bytes=smem)
        if why is not None:
            return why
    return None


def _variant(view: CompressedLayerView, loop_id: int, group: int,
             occupancy: Occupancy) -> tuple[dict[str, int], int]:
    """The compile-time defines of the kernel serving ``loop_id`` in one `OCCUPANCY` shape and its
    dynamic shared memory per CTA (bytes)."""
    _, _, _, _, cf, a_bits, r_bits = _loop_tensors(view, loop_id)
    coop = coop_copies(view, loop_id)
    defines = dict(HEAD_DIM=view.head_dim, A_BITS=a_bits, R_BITS=r_bits,
                   GS=view.cfg.group_size, GQ=group, HAS_COEF=int(cf is not None), WARPS=WARPS,
                   KINT=int(integer_k(group, view.head_dim, view.cfg.group_size)),
                   MINB=occupancy.ctas_per_sm, STAGES=occupancy.stages,
                   SUBT=occupancy.subtiles, COOP=int(coop),
                   STREAM=int(stream_codes(view, loop_id)))
    small = occupancy.stages * coop_small_bytes(view.head_dim, view.cfg.group_size) if coop else 0
    return defines, WARPS * occupancy.stages * stage_bytes(a_bits, r_bits, view.head_dim,
                                                           coop) + small


def balanced_rows(batch_size: int, splits: int) -> int:
    """The split rows a balanced launch (`tc_split`) shares across ``batch_size`` > 1 requests
    whose plan (`tc_plan`) gives ``splits`` equal splits each: ``batch_size x splits``, plus
    ``cdiv(batch_size, 2)`` for a one-split plan, so that a long request can still take more
    splits than one. A uniform batch leaves those rows empty: B of them (B x 2 rows, the rule
    before) made Ouro 64 x 8k 2-3 % slower than cdiv(B, 2)
    (`benchmarks/results/h200_2026-12-03e_balanced_merge_ab.json`, arm g15)."""
    return batch_size * splits + (-(-batch_size // 2) if splits == 1 else 0)


def tc_split(q: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
             view: CompressedLayerView, loop_id: int, num_kv_heads: int, qk_scale: float,
             num_splits: int, occupancy: Occupancy, *, balanced: bool = False,
             pdl: bool = False,
             merge: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Run the split kernel in the `OCCUPANCY` shape ``occupancy`` (`tc_occupancy`):
    ``q`` ``[B, Hq, head_dim]`` as `query_rotation` says (fp32 in the rotated basis, the query
    rotation kernel's output, where its ``q_mode`` is 0; else the model's bf16 query, last dim
    contiguous) -> (MidO ``[B, Hq, S, width(head_dim)]`` fp32 unnormalised (head_dim 96:
    columns 96-127 are 0), MidML ``[B, Hq, S, 2]`` fp32 (max in log2 units, sum)), S =
    ``num_splits`` equal splits of each request's history (`tc_plan`'s count), and None.
    ``balanced``: token-balanced splits in G = `balanced_rows` rows shared by the batch (MidO
    ``[Hq, G, ...]``; without ``merge``, the third result is ``[B, 2]`` int32, each request's
    first row and split count, for the merge kernel); the kernel picks one split length for all
    requests, the shortest of 32 candidates whose splits fit the G rows and no shorter than the
    batch's tokens over B x S (a uniform batch keeps the equal splits), from ``kv_indptr`` on
    the device, so a captured launch follows the lengths: a long request gets more splits than
    a short one and every split reads about as much. ``cdiv(units * num_kv_heads, 4)`` CTAs of
    4 warps (units: G, or B x S), one (split, KV head) per warp, KV head fastest, a request's
    splits adjacent.
    ``pdl``: launched as a programmatic dependent of the kernel that wrote ``q``
    (`rq_kernels.cuda.launch`): it copies its first history tiles, then waits for ``q``.
    ``merge``: ``(k_cur, v_cur, out, counters)`` (`merge_counters`; only where `query_rotation`
    gives mode 1 or 2): the kernel also merges the splits, as the merge kernel would: the last
    warp of each (request, KV head) to finish reduces them by log-sum-exp, un-rotates (the
    Hadamard's FWHT), adds the in-flight token (``k_cur``/``v_cur`` ``[B, Hkv, head_dim]``
    bf16) and writes ``out`` ``[B, Hq, head_dim]`` bf16 (last dims contiguous)."""
    B, HQ, hd = q.shape
    dev = q.device
    q_mode, signs, alpha = query_rotation(view, dev)
    want = torch.float32 if q_mode == 0 else torch.bfloat16
    assert hd == view.head_dim and q.dtype == want and q.stride(-1) == 1, (
        f"q must be [B, Hq, {view.head_dim}] {want}, last dim contiguous")
    D = width(hd)
    group = HQ // num_kv_heads
    ac, aso, rc, rso, cf, _, _ = _loop_tensors(view, loop_id)
    # the kernel's KV heads are the pool's (COOP's CTA-wide copies and barrier rest on it)
    assert aso.shape[2] == num_kv_heads, (
        f"the pool holds {aso.shape[2]} KV heads, the launch {num_kv_heads}")
    defines, smem = _variant(view, loop_id, group, occupancy)
    fn = cuda.function(SOURCE, KERNEL, defines, dev, shared_bytes=smem,
                       carveout=carveout_percent(dev.index))
    fill_rows = B * num_splits if balanced else 0
    if balanced:
        num_splits = balanced_rows(B, num_splits)
    rows = (HQ, num_splits) if balanced else (B, HQ, num_splits)
    mid_o = torch.empty(*rows, D, dtype=torch.float32, device=dev)
    mid_ml = torch.empty(*rows, 2, dtype=torch.float32, device=dev)
    split_rows = (torch.empty(B, 2, dtype=torch.int32, device=dev)
                  if balanced and merge is None else None)

    def parts(t, elem=1):
        if t is None:
            return (ac.data_ptr(), 0, 0, 0)
        return (t.data_ptr(), t.stride(0) * elem, t.stride(1) * elem, t.stride(2) * elem)

    if merge is not None:
        assert q_mode != 0, "the fused merge needs no rotation or a Sylvester Hadamard"
        k_cur, v_cur, out, counters = merge
        chunk = merge_chunk(num_splits, HQ // num_kv_heads)
        chunks = -(-num_splits // chunk)
        assert counters.numel() >= B * num_kv_heads * (chunks + 1) and counters.dtype == torch.int32
        for t, heads in ((k_cur, num_kv_heads), (v_cur, num_kv_heads), (out, HQ)):
            assert (t.shape == (B, heads, hd) and t.dtype == torch.bfloat16
                    and t.stride(-1) == 1 and t.device == dev), "k_cur, v_cur, out: layout"
        fused = (1, chunk, *(x for t in (k_cur, v_cur, out)
                             for x in (t.data_ptr(), t.stride(0), t.stride(1))),
                 counters.data_ptr())
    else:
        fused = (0,) * 12
    args = _Args(q.data_ptr(), q.stride(0), q.stride(1), 0 if signs is None else signs.data_ptr(),
                 kv_indptr.data_ptr(), kv_indices.data_ptr(),
                 *parts(ac), *parts(aso), *parts(rc if rc is not None else ac),
                 *parts(rso if rso is not None else aso), *parts(cf),
                 mid_o.data_ptr(), mid_ml.data_ptr(), qk_scale, alpha, num_splits, HQ, q_mode,
                 B, fill_rows, 0 if split_rows is None else split_rows.data_ptr(), *fused)
    units = (num_splits if balanced else num_splits * B) * num_kv_heads
    grid = ((units + WARPS - 1) // WARPS, 1, 1)
    cuda.launch(fn, grid, WARPS * 32, args, dev, shared_bytes=smem, pdl=pdl)
    return mid_o, mid_ml, split_rows
