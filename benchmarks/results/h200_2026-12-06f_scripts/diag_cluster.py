"""Session 44: one launch of the cluster-merge variant in a fresh process, reporting OK or the
CUDA error (sticky, hence one case per process). Usage: diag_cluster.py PDL(0/1) HKV LOOP."""
import sys

import torch

sys.path.insert(0, "tests/kernels")
from attn_cases import build, queries  # noqa: E402

from rq_kernels import decode_attention, decode_tc  # noqa: E402
from rq_kernels.decode import DecodeLaunch  # noqa: E402
from sglang_rq.reference import decode_attention_reference  # noqa: E402
from sglang_rq.config import RQConfig  # noqa: E402

pdl, hkv, loop = bool(int(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3])
view, ind, idx, _ = build(RQConfig(), loops=4, num_kv_heads=hkv, group=1, dim=128,
                          lens=[4000, 4000, 4000, 4101], rot="cfg", device="cuda", seed=35)
q, kc, vc = queries(4, hkv, hkv, 128, device="cuda", seed=35)
out = torch.full_like(q, float("nan"))
try:
    decode_attention(q, kc, vc, view, loop, ind, idx, sm_scale=128 ** -0.5, out=out,
                     launch=DecodeLaunch(split_kernel="tc", pdl=pdl))
    torch.cuda.synchronize()
    ref = decode_attention_reference(q.float(), kc, vc, view, loop, ind, idx,
                                     sm_scale=128 ** -0.5)
    err = (out.float() - ref).abs().max().item()
    print(f"pdl={pdl} hkv={hkv} loop={loop} cluster={decode_tc.CLUSTER}: OK, max err {err:.4f} "
          f"(ref max {ref.abs().max().item():.3f})")
except Exception as exc:  # noqa: BLE001
    print(f"pdl={pdl} hkv={hkv} loop={loop}: FAILED {str(exc).splitlines()[0]}")
