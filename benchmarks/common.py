"""Shared by the benchmark scripts: CUDA-graph timing and a realistic random compressed pool."""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel

from sglang_rq.layout import ModelKVShape, loop_read_nbytes, loop_segments
from tests.kernels.views import make_view


def graph_ms(fn, *, warmup: int = 25, rep: int = 100) -> float:
    """Median ms of ``fn`` replayed from a CUDA graph (after one eager warm-up call that compiles
    kernels and fills caches); on CPU one eager timed call."""
    fn()
    if not torch.cuda.is_available():
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return triton.testing.do_bench(g.replay, warmup=warmup, rep=rep, return_mode="median")


def chain_copies(nbytes: int) -> int:
    """How many copies of a call's ``nbytes`` of data `chain_ms` cycles through: together at
    least 3x the GPU's L2 (so each call finds none of its bytes there: the calls before it read
    the other copies), and at least 2. On CPU 2."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size if torch.cuda.is_available() else 0
    return max(2, -(-3 * l2 // max(1, nbytes)))


CHAIN_CALLS = 16  # calls per graph of `chain_ms` at least


def chain_ms(fns, *, reps: int = 20) -> float:
    """Median ms per call of the calls ``fns`` (each over its own copy of the data,
    `chain_copies` of them) run back to back from one CUDA graph, as a model's layers run
    their attention: the L2 holds none of a call's bytes (the other copies evicted them) and
    none dirty (no flush writes before the call, unlike `graph_ms`, whose `triton.testing.do_bench`
    zeroes a 256 MiB buffer before each rep, so a short call also pays for writing back the L2's
    dirty lines). Each call runs behind a one-element separator kernel that starts only when
    the call before it has ended, as a model's other kernels do (so a programmatic dependent
    launch cannot overlap consecutive calls); the separators' own chain is subtracted. No graph
    launch per call: the list is repeated to at least `CHAIN_CALLS` calls per graph, so the
    graph's launch and ramp weigh little. On CPU: the eager calls' mean."""
    for fn in fns:
        fn()
    if not torch.cuda.is_available():
        t = time.perf_counter()
        for fn in fns:
            fn()
        return (time.perf_counter() - t) * 1e3 / len(fns)
    fns = list(fns) * -(-CHAIN_CALLS // len(fns))
    sep = torch.zeros(1, device=DEV)

    def replay_ms(body) -> float:
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            body()
        for _ in range(3):
            g.replay()
        times = []
        for _ in range(reps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            g.replay()
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1))
        return sorted(times)[len(times) // 2]

    def calls():
        for fn in fns:
            sep.add_(1)
            fn()

    def seps():
        for _ in fns:
            sep.add_(1)

    return (replay_ms(calls) - replay_ms(seps)) / len(fns)


DEV = "cuda" if torch.cuda.is_available() else "cpu"
FAMILIES = {  # the three model shapes of the kernel benchmarks: (num_qo_heads, num_kv_heads, head_dim)
    "ouro-1.4b": (16, 16, 128),
    "smollm2-gqa": (9, 3, 64),
    "huginn-d96": (24, 24, 96),
}


def bench(fn) -> float:
    """Median ms of ``fn`` replayed from a CUDA graph (`graph_ms`)."""
    return graph_ms(fn)


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second (TB/s)."""
    a = torch.empty((2 << 30) if DEV == "cuda" else 1 << 20, dtype=torch.uint8,
                    device=DEV).random_(0, 256)
    b = torch.empty_like(a)
    ms = (triton.testing.do_bench(lambda: b.copy_(a), warmup=25, rep=100, return_mode="median")
          if DEV == "cuda" else bench(lambda: b.copy_(a)))
    return 2 * a.numel() / ms / 1e9


@triton.jit
def _stream_read_kernel(src, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + tl.program_id(0), tl.max(tl.load(src + offs, mask=offs < n, other=0), axis=0))


# (int32 words per program, warps): the reader's shapes, the fastest of which is the yardstick
READ_SHAPES = ((2048, 4), (4096, 4), (8192, 8), (16384, 8))


def stream_reader(buf: torch.Tensor, nbytes: int, shape: tuple[int, int]):
    """(launch, out): a launch that reads the first ``nbytes`` of ``buf`` (uint8, contiguous;
    rounded down to whole 64-byte blocks) once, with one Triton program per ``shape[0]`` int32
    words and ``shape[1]`` warps, each writing the largest of its words to ``out`` (int32
    ``[programs]``): the pure memory traffic of a kernel that reads those bytes. Raises
    ValueError if ``buf`` is shorter than ``nbytes``."""
    if buf.numel() < nbytes:
        raise ValueError(f"buffer of {buf.numel()} bytes is shorter than {nbytes}")
    src = buf[:nbytes // 64 * 64].view(torch.int32)
    block, warps = shape
    grid = max(1, triton.cdiv(src.numel(), block))
    out = torch.empty(grid, dtype=torch.int32, device=buf.device)
    return lambda: _stream_read_kernel[(grid,)](src, out, src.numel(), BLOCK=block,
                                                num_warps=warps), out


def loop_bytes_per_token(cfg, num_kv_heads: int, head_dim: int, num_loops: int, loop: int) -> int:
    """Bytes the decode attention of ``loop`` reads per history token of one layer (all KV
    heads, K and V): `sglang_rq.layout.loop_read_nbytes` x 2 x heads."""
    shape = ModelKVShape(num_layers=1, num_loops=num_loops, num_kv_heads=num_kv_heads,
                         head_dim=head_dim)
    return loop_read_nbytes(loop_segments(shape, cfg), loop) * 2 * num_kv_heads


def read_roofline(buf: torch.Tensor, nbytes: int) -> tuple[float, str]:
    """(ms, arm) of the fastest pure read of ``nbytes`` of ``buf`` under `bench` (graph replay,
    L2 flushed): the `READ_SHAPES` readers and ``torch.sum`` of the bytes as int32 words. The
    speed of light of a decode call that reads as many bytes in one launch."""
    times = {name: bench(fn) for name, fn in read_arms(buf, nbytes).items()}
    best = min(times, key=times.get)
    return times[best], best


def read_arms(buf: torch.Tensor, nbytes: int) -> dict:
    """The pure reads of the first ``nbytes`` of ``buf`` that `read_roofline` times, by name: a
    `stream_reader` per `READ_SHAPES` entry (``triton_<words>x<warps>``) and ``torch_sum``."""
    src = buf[:nbytes // 64 * 64].view(torch.int32)
    arms = {f"triton_{b}x{w}": stream_reader(buf, nbytes, (b, w))[0] for b, w in READ_SHAPES}
    arms["torch_sum"] = lambda: src.sum()
    return arms


def pool(cfg, hkv, dim, rows, loops=4):
    """A pool on ``DEV`` with random (finite, realistic) codes, FP8 scale/offset, coefficients."""
    return realistic_pool(cfg, num_loops=loops, num_kv_heads=hkv, head_dim=dim, rows=rows,
                          device=DEV)


def loop_average(t: dict, loops: int) -> float:
    """A layer's time per loop from ``t`` (loop -> time) of loop 0 and the anchor loop
    ``loops - 1``: loops 0..L-2 cost the same (anchor plus their own residual)."""
    return ((loops - 1) * t[0] + t[loops - 1]) / loops


def sdpa_call(q, k, v, *, causal=False):
    """(fn, backend name): PyTorch SDPA of ``q [B, Hq, n, D]`` over ``k/v [B, Hkv, m, D]`` bf16 on
    the first fused backend that takes the shapes (each tried once), GQA natively if the
    backend takes it, else K/V expanded to Hq heads (noted in the name)."""
    def call(backends, kk, vv, gqa):
        def fn():
            with sdpa_kernel(backends):
                return torch.nn.functional.scaled_dot_product_attention(
                    q, kk, vv, is_causal=causal, enable_gqa=gqa)
        return fn

    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        fn = call([backend], k, v, q.shape[1] != k.shape[1])
        try:
            fn()
        except RuntimeError:
            continue
        return fn, backend.name
    g = q.shape[1] // k.shape[1]
    backends = [SDPBackend.FLASH_ATTENTION] if DEV == "cuda" else [SDPBackend.MATH]
    return (call(backends, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), False),
            "FLASH_ATTENTION(expanded kv)")


def sdpa_time(q, k, v, *, causal=False) -> tuple[float, str]:
    """Median ms (`bench`) and backend name of `sdpa_call`'s SDPA."""
    fn, name = sdpa_call(q, k, v, causal=causal)
    return bench(fn), name


def realistic_pool(cfg, *, num_loops: int, num_kv_heads: int, head_dim: int, rows: int,
                   device, head_major: bool = False):
    """A `CompressedLayerView` with random codes, FP8 scales in [0.01, 0.3], offsets in
    [-2, -0.1] and coefficients in [0.7, 1.3] (finite, realistic; not zeros)."""
    v = make_view(cfg, num_loops=num_loops, num_kv_heads=num_kv_heads, head_dim=head_dim,
                  rows=rows, rotation="cfg", device=device, fill=False, head_major=head_major)
    chunk = 1 << 18  # rows per fill: the fp32 temporaries stay small beside a whole-card pool
    for i in range(num_loops):
        v.codes[i].random_(0, 256)
        for r in range(0, rows, chunk):
            so, cf = v.scale_offset[i], v.coef[i]
            if so is not None:
                m = torch.empty(so[r:r + chunk].shape, device=device)
                m[..., 0].uniform_(0.01, 0.3)
                m[..., 1].uniform_(-2.0, -0.1)
                so[r:r + chunk].copy_(m.to(torch.float8_e4m3fn).view(torch.uint8))
                del m
            if cf is not None:
                cf[r:r + chunk].copy_(torch.empty(cf[r:r + chunk].shape, device=device)
                                      .uniform_(0.7, 1.3))
    return v


def bench_args(extra=None) -> argparse.Namespace:
    """The benchmark scripts' common command line: ``--out DIR`` (created) and ``--dry-run``
    (the scripts set TRITON_INTERPRET themselves before importing triton). ``extra(parser)`` adds
    script-specific options."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--dry-run", action="store_true")
    if extra is not None:
        extra(ap)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    return args


def write_json(results: dict, out_dir: str, name: str) -> None:
    """Write ``results`` to ``out_dir/name`` (after every stage, so a cut-off run keeps data)."""
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump(results, f, indent=1)
