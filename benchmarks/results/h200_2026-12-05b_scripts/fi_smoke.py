# ruff: noqa  (session 32: FlashInfer bundle smoke test on the GPU: load, one call vs SDPA, time)
import os, sys, time
sys.path.insert(0, os.getcwd())
import torch
from benchmarks.common import bench, sdpa_call
from benchmarks.flashinfer_decode import FlashInferDecode
fi = FlashInferDecode(".gpu-bundle")
print("loaded", fi.version, flush=True)
for (b, ctx, hq, hkv, d) in [(2, 16384, 16, 16, 128), (4, 8192, 9, 3, 64), (4, 8192, 24, 24, 96), (1, 100, 16, 16, 128)]:
    n = ctx + 1
    qs = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
    ks = torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16)
    vs = torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16)
    kp = ks.permute(0, 2, 1, 3).reshape(b * n, 1, hkv, d).contiguous()
    vp = vs.permute(0, 2, 1, 3).reshape(b * n, 1, hkv, d).contiguous()
    q1 = qs[:, :, 0].contiguous(); out = torch.empty_like(q1)
    try:
        call = fi.call(kp, vp, [n] * b, hq, sm_scale=d ** -0.5)
        got = call(q1, out).float()
        torch.cuda.synchronize()
        want = sdpa_call(qs, ks, vs)[0]()[:, :, 0].float()
        diff = (got - want).abs().max().item()
        print(f"b={b} ctx={ctx} hq={hq} hkv={hkv} d={d}: max|fi - sdpa| {diff:.2e} (max|sdpa| {want.abs().max().item():.2e}); "
              f"fi {bench(lambda: call(q1, out)) * 1e3:.1f} us, sdpa {bench(sdpa_call(qs, ks, vs)[0]) * 1e3:.1f} us", flush=True)
    except Exception as e:
        print(f"b={b} ctx={ctx} d={d}: {type(e).__name__}: {e}", flush=True)
