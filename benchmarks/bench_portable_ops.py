"""The non-attention elementwise ops of one Ouro-1.4B decode step, three ways, side by side.

``python benchmarks/bench_portable_ops.py --out DIR [--smoke]``

One step = 24 layers x 4 loops of Ouro's sandwich layer minus its GEMMs and attention (buffers
stand in for their outputs): RMSNorm before and after attention and the MLP (4 per layer),
rotary on the q/k slices of a packed qkv buffer, SiLU-and-mul on ``[batch, 2 x 5632]``, the two
residual adds (torch in every variant), plus one final RMSNorm per loop. Variants:

* ``triton``: `rq_kernels.ops` (what the portable-mode ``sgl_kernel`` stand-in runs);
* ``native``: SGLang's ``forward_native`` of RMSNorm / SiluAndMul / RotaryEmbedding (what the
  GPU probe ran with ``SGLANG_FORCE_FUSED_OP_BACKEND=torch``: ~16 ms fixed cost per step);
* ``sgl_kernel``: the real compiled wheel (``rmsnorm``, ``silu_and_mul``, ``rotary_embedding``),
  only when it imports here.

Each step is timed as a CUDA-graph replay (what SGLang's decode runs) and eagerly (launch-bound,
like prefill), `do_bench` medians, at batch 1, 2 and 64. Prints ms per step and the ratios;
writes ``DIR/bench_portable_ops.json`` after every batch size. ``--smoke`` (or ``--dry-run``)
runs tiny shapes on CPU under ``TRITON_INTERPRET=1``, as a check that the script works.
"""

from __future__ import annotations

import os
import sys
import time

SMOKE = "--smoke" in sys.argv or "--dry-run" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"  # SGLang's layers take their CPU paths

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import bench_args, graph_ms, write_json  # noqa: E402
from rq_kernels import ops  # noqa: E402
from sglang_rq import portable  # noqa: E402

OURO = dict(hidden=2048, heads=16, kv_heads=16, head_dim=128, inter=5632, layers=24, loops=4,
            batches=(1, 2, 64))
TINY = dict(hidden=64, heads=2, kv_heads=1, head_dim=32, inter=96, layers=2, loops=1,
            batches=(1, 3))


def rope_cache(max_pos: int, rot: int, device) -> torch.Tensor:
    """``[max_pos, rot]`` fp32: cos then sin (base 10000), as SGLang builds it."""
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float32, device=device) / rot))
    f = torch.arange(max_pos, dtype=torch.float32, device=device)[:, None] * inv[None, :]
    return torch.cat((f.cos(), f.sin()), dim=-1)


def variants(shape: dict, device) -> dict:
    """{name: (rmsnorm(x, w), silu(x), rope(pos, q, k) in place, or an error string)}."""
    d, cache = shape["head_dim"], rope_cache(4096, shape["head_dim"], device)
    out = {"triton": (lambda x, w: ops.rmsnorm(x, w, eps=1e-6),
                      lambda x: ops.act_and_mul(x, act="silu"),
                      lambda p, q, k: ops.rope_inplace(p, q, k, cos_sin_cache=cache,
                                                       is_neox=True, head_size=d))}
    reason = portable.standin_reason()
    if reason is None:
        import sgl_kernel as sk

        out["sgl_kernel"] = (lambda x, w: sk.rmsnorm(x, w, 1e-6), sk.silu_and_mul,
                             lambda p, q, k: sk.rotary_embedding(p, q, k, d, cache, True))
    else:
        out["sgl_kernel"] = f"not measured: {reason}"
        sys.path.insert(0, str(portable.STANDIN_DIR))  # SGLang's layers import sgl_kernel
        os.environ.update(portable.portable_environment())
    try:
        from sglang.srt.layers.activation import SiluAndMul
        from sglang.srt.layers.layernorm import RMSNorm
        from sglang.srt.layers.rotary_embedding import get_rope
    except Exception as exc:  # noqa: BLE001 - report, keep the other variants
        out["native"] = f"not measured: SGLang layers do not import ({exc})"
        return out
    norm = RMSNorm(shape["hidden"], eps=1e-6).to(device=device, dtype=torch.bfloat16)
    rope = get_rope(d, rotary_dim=d, max_position=4096, base=10000, is_neox_style=True
                    ).to(device)
    act = SiluAndMul()

    def native_rope(p, q, k):
        q2, k2 = rope.forward_native(p, q, k)  # not in place: copy back as the model's view
        q.copy_(q2)
        k.copy_(k2)

    out["native"] = (lambda x, w: norm.forward_native(x), act.forward_native, native_rope)
    return out


def make_step(fns, shape: dict, batch: int, device):
    """A closure running one decode step's elementwise ops on static buffers."""
    rms, silu, rope = fns
    h, hq, hk, d = shape["hidden"], shape["heads"], shape["kv_heads"], shape["head_dim"]
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*s):
        return torch.randn(*s, generator=g).to(device=device, dtype=torch.bfloat16)

    x, attn_out, mlp_out = rand(batch, h), rand(batch, h), rand(batch, h)
    qkv, gate_up = rand(batch, (hq + 2 * hk) * d), rand(batch, 2 * shape["inter"])
    w = (1 + 0.1 * rand(h)).contiguous()
    pos = torch.arange(batch, device=device) + 100
    q, k = qkv[:, :hq * d], qkv[:, hq * d:(hq + hk) * d]

    def step():
        for _ in range(shape["loops"]):
            for _ in range(shape["layers"]):
                rms(x, w)  # input_layernorm -> qkv_proj
                rope(pos, q, k)
                hid = x + rms(attn_out, w)  # input_layernorm_2 on o_proj's output
                rms(hid, w)  # post_attention_layernorm -> gate_up_proj
                silu(gate_up)  # -> down_proj
                hid + rms(mlp_out, w)  # post_attention_layernorm_2
            rms(x, w)  # final norm of the loop
    return step


def eager_ms(fn) -> float:
    fn()
    if not torch.cuda.is_available():
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    import triton

    return triton.testing.do_bench(fn, warmup=5, rep=50, return_mode="median")


def main() -> None:
    args = bench_args(lambda ap: ap.add_argument("--smoke", action="store_true"))
    shape = TINY if SMOKE else OURO
    device = "cpu" if SMOKE else "cuda"
    impls = variants(shape, device)
    res = {"shape": {k: v for k, v in shape.items() if k != "batches"},
           "device": "cpu (interpreter)" if SMOKE else torch.cuda.get_device_name(),
           "skipped": {n: v for n, v in impls.items() if isinstance(v, str)}, "rows": []}
    names = [n for n, v in impls.items() if not isinstance(v, str)]
    for n, why in res["skipped"].items():
        print(f"{n}: {why}")
    print(f"{'batch':>5} {'mode':>6} " + " ".join(f"{n:>11}" for n in names)
          + "   native/triton  triton/sgl_kernel")
    for batch in shape["batches"]:
        for mode, timer in (("graph", graph_ms), ("eager", eager_ms)):
            row = {"batch": batch, "mode": mode}
            for n in names:
                row[f"{n}_ms"] = timer(make_step(impls[n], shape, batch, device))
            if "native_ms" in row:
                row["native_over_triton"] = row["native_ms"] / row["triton_ms"]
            if "sgl_kernel_ms" in row:
                row["triton_over_sgl_kernel"] = row["triton_ms"] / row["sgl_kernel_ms"]
            res["rows"].append(row)
            print(f"{batch:>5} {mode:>6} " + " ".join(f"{row[n + '_ms']:>9.3f}ms" for n in names)
                  + f"   {row.get('native_over_triton', float('nan')):>13.2f}"
                  + f"  {row.get('triton_over_sgl_kernel', float('nan')):>17.2f}")
            write_json(res, args.out, "bench_portable_ops.json")


if __name__ == "__main__":
    main()
