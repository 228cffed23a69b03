"""Error across depth (issue 13, "Error across depth"): how much the compressed history changes
every (loop, layer) attention output of the embedded mini-Ouro, and how that changes from the
first loop to the last. No engine: the plain PyTorch reference forward
(`sglang_rq.models.ouro_reference`) and the reference codec (`sglang_rq.reference`).

`depth_errors` runs the model token by token, as decode does, with two arms in one batch:

* **BF16**: every earlier token's K/V read back as BF16 (the `--rq-disable` pool);
* **RQ**: every earlier token's K/V read back from `reference.encode`/`decode` of its BF16
  K/V (all loops of a layer committed together once the token has run every loop, as the pool
  does); the current token's own K/V exact, as in the engine's in-flight path.

The model runs in fp32 with q, K and V rounded to BF16 (what the served BF16 model hands the
attention backend); attention is fp32. Three relative errors ``||o - o_bf16|| / ||o_bf16||``
of the attention output (before ``o_proj``; all heads, positions 1..T-1, the three prompts
pooled) per (loop, layer):

* ``isolated``: on identical inputs: the BF16 arm's own q, K, V, with its history replaced by
  the codec's reconstruction (the codec's error alone, nothing propagated);
* ``propagated``: the RQ arm against the BF16 arm, each run on its own history from the same
  token ids (the codec's error plus what earlier layers and loops carried forward);
* and at the end the next-token distribution: KL(BF16 || RQ) and top-1 agreement.

Measured (default format: anchor = last loop at 4 bits, loops 0-2 as 2-bit residuals against
it, groups of 32, Hadamard rotation; three 64-token windows of *Pride and Prejudice*, held out
of the embedded model's training; 1 thread, ~12 s): `MEASURED`, table in docs/robustness.md
section 7. The error is largest in the first loop (farthest from the anchor) and smallest in
loop 2 (nearest it), with the 4-bit anchor in between; propagation adds little in the first
loop and most in the later ones (loop 2: 0.03-0.06 isolated, 0.10-0.12 propagated), but the last
loop's error stays below half the first's.

Tolerance: each loop's worst layer, the last-to-first ratio and the KL are bounded at the
measured value times `MARGIN` = 1.25 (top-1 disagreement likewise). The computation is
deterministic on one machine and thread count (bit-identical reruns), but the propagated arm
amplifies BLAS summation-order differences through code flips at rounding ties: with 2 threads
instead of 1 the propagated figures moved by up to 2.6% and top-1 by 0.010. Format regressions
move them further (same inputs): no rotation raises the mean KL to 0.0270 (bound 0.0204), no
least-squares ``c`` raises loop 0's isolated error to 0.2999 (bound 0.2993) and the KL to
0.0440, a 2-bit anchor raises loop 3's isolated error to 0.4897 (bound 0.1251).
"""

from __future__ import annotations

import pytest
import torch

from sglang_rq.config import RQConfig
from sglang_rq.layout import ModelKVShape, loop_segments
from sglang_rq.models.embedded import EMBEDDED_MODEL
from sglang_rq.models.ouro_reference import OuroReferenceModel, apply_rope, rope_cos_sin
from sglang_rq.quality.data import data_dir_with, documents, load_tokenizer
from sglang_rq.reference import decode, encode
from sglang_rq.rotation import build_rotation

NUM_DOCS, DOC_TOKENS = 3, 63  # + BOS = 64 positions each
MARGIN = 1.25


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def _attend(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, scale: float) -> torch.Tensor:
    """q ``[B, Hq, D]``, keys/vals ``[n, B, Hkv, D]`` fp32 -> ``[B, Hq, D]`` fp32."""
    rep = q.shape[1] // keys.shape[2]
    k, v = keys.repeat_interleave(rep, 2), vals.repeat_interleave(rep, 2)
    p = torch.softmax(torch.einsum("bhd,nbhd->bhn", q, k) * scale, -1)
    return torch.einsum("bhn,nbhd->bhd", p, v)


@torch.no_grad()
def depth_errors(model: OuroReferenceModel, ids: torch.Tensor, cfg: RQConfig) -> dict:
    """Relative attention-output errors per (loop, layer) and next-token figures, see the module
    docstring. ``ids`` ``[B, T]`` long. Returns ``isolated`` and ``propagated`` ``[U, L]``
    float, ``kl_mean``, ``kl_max`` (nats) and ``top1`` (fraction)."""
    c = model.config
    b, t_len = ids.shape
    u_n, l_n, d = c.total_ut_steps, c.num_hidden_layers, c.head_dim
    hq, hkv = c.num_attention_heads, c.num_key_value_heads
    shape = ModelKVShape(num_layers=l_n, num_loops=u_n, num_kv_heads=hkv, head_dim=d)
    segs = loop_segments(shape, cfg)
    rot = build_rotation(cfg, num_layers=l_n, num_kv_heads=hkv, head_dim=d)
    scale = d ** -0.5
    cos, sin = rope_cos_sin(torch.arange(t_len), d, c.rope_theta)
    emb = model.model.embed_tokens(ids).repeat(2, 1, 1)  # rows :b the BF16 arm, b: the RQ arm
    hist = torch.zeros(u_n, l_n, 2, t_len, 2 * b, hkv, d)  # K/V as each arm reads them
    shadow = torch.zeros(u_n, l_n, 2, t_len, b, hkv, d)  # the BF16 arm's K/V, reconstructed
    sums = torch.zeros(3, u_n, l_n)  # |o_iso - o_bf16|^2, |o_rq - o_bf16|^2, |o_bf16|^2
    logits = torch.zeros(2 * b, t_len, c.vocab_size)
    for t in range(t_len):
        x = emb[:, t:t + 1]
        kv_tok = torch.zeros(u_n, l_n, 2 * b, 2, hkv, d)
        cs, sn = cos[t:t + 1], sin[t:t + 1]
        for u in range(u_n):
            for li, layer in enumerate(model.model.layers):
                a = layer.self_attn
                h = layer.input_layernorm(x)  # [2b, 1, H]
                q = _bf16(apply_rope(a.q_proj(h).view(2 * b, 1, hq, d).transpose(1, 2), cs, sn)[:, :, 0])
                k = _bf16(apply_rope(a.k_proj(h).view(2 * b, 1, hkv, d).transpose(1, 2), cs, sn)[:, :, 0])
                v = _bf16(a.v_proj(h).view(2 * b, hkv, d))
                kv_tok[u, li, :, 0], kv_tok[u, li, :, 1] = k, v
                hist[u, li, 0, t], hist[u, li, 1, t] = k, v  # in flight: exact
                o = _attend(q, hist[u, li, 0, :t + 1], hist[u, li, 1, :t + 1], scale)
                if t > 0:
                    shadow[u, li, 0, t], shadow[u, li, 1, t] = k[:b], v[:b]
                    o_iso = _attend(q[:b], shadow[u, li, 0, :t + 1], shadow[u, li, 1, :t + 1], scale)
                    sums[0, u, li] += (o_iso - o[:b]).pow(2).sum()
                    sums[1, u, li] += (o[b:] - o[:b]).pow(2).sum()
                    sums[2, u, li] += o[:b].pow(2).sum()
                hh = x + layer.input_layernorm_2(a.o_proj(o.reshape(2 * b, 1, hq * d)))
                x = hh + layer.post_attention_layernorm_2(layer.mlp(layer.post_attention_layernorm(hh)))
            x = model.model.norm(x)
        logits[:, t] = model.lm_head(x[:, 0])
        for li in range(l_n):  # commit token t: every loop of the layer together
            stored = encode(kv_tok[:, li], segments=segs, cfg=cfg,
                            rotation=None if rot is None else rot[li])
            for u in range(u_n):
                rec = decode(stored, u, segments=segs, cfg=cfg, head_dim=d,
                             rotation=None if rot is None else rot[li])  # [2b, 2, Hkv, D]
                hist[u, li, :, t, b:] = rec[b:].transpose(0, 1)
                shadow[u, li, :, t] = rec[:b].transpose(0, 1)
    lp_ref, lp_rq = logits[:b].log_softmax(-1), logits[b:].log_softmax(-1)
    kl = (lp_ref.exp() * (lp_ref - lp_rq)).sum(-1)
    return {"isolated": (sums[0] / sums[2]).sqrt(), "propagated": (sums[1] / sums[2]).sqrt(),
            "kl_mean": kl.mean().item(), "kl_max": kl.max().item(),
            "top1": (lp_ref.argmax(-1) == lp_rq.argmax(-1)).float().mean().item()}


def markdown(res: dict) -> str:
    """The per-(loop, layer) table of docs/robustness.md."""
    num_layers = res["isolated"].shape[1]
    head = "| loop | " + " | ".join(f"layer {i}" for i in range(num_layers)) + " |"
    rows = [head, "|" + "---|" * (num_layers + 1)]
    for u in range(res["isolated"].shape[0]):
        cells = [f"{res['isolated'][u, i]:.4f} / {res['propagated'][u, i]:.4f}"
                 for i in range(num_layers)]
        rows.append(f"| {u} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


# First run (default format, 1 thread), per loop the worst layer of each measure, the mean over
# layers of the last loop divided by that of the first, and the next-token figures.
MEASURED = {
    "isolated_max": [0.2394, 0.1221, 0.0642, 0.1001],
    "propagated_max": [0.2646, 0.1702, 0.1179, 0.1396],
    "isolated_last_over_first": 0.357,
    "propagated_last_over_first": 0.486,
    "kl_mean": 0.0163, "top1_min": 0.901,
}


@pytest.fixture(scope="module")
def inputs():
    data_dir = data_dir_with("literature")
    if data_dir is None:
        pytest.skip("no data directory with literature/ (SGLANG_RQ_DATA_DIR or ../shared/data)")
    tok = load_tokenizer(EMBEDDED_MODEL)
    docs = documents("pride", data_dir, tok, num_docs=NUM_DOCS, doc_tokens=DOC_TOKENS, bos_id=1)
    model = OuroReferenceModel.from_pretrained(EMBEDDED_MODEL, dtype=torch.float32)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # NOTE: small ops; more threads thrash on the shared 2-core machine
    yield model, torch.tensor(docs)
    torch.set_num_threads(threads)


def test_attention_error_across_depth_is_bounded(inputs):
    model, ids = inputs
    res = depth_errors(model, ids, RQConfig())
    print("\nisolated / propagated relative error of the attention output:\n" + markdown(res))
    iso, prop = res["isolated"], res["propagated"]
    ratio_iso = (iso[-1].mean() / iso[0].mean()).item()
    ratio_prop = (prop[-1].mean() / prop[0].mean()).item()
    print(f"last/first loop: isolated {ratio_iso:.3f}, propagated {ratio_prop:.3f}; "
          f"KL mean {res['kl_mean']:.4f} max {res['kl_max']:.4f} nats; top-1 {res['top1']:.3f}")
    for u, bound in enumerate(MEASURED["isolated_max"]):
        assert iso[u].max() <= bound * MARGIN, (u, iso[u])
    for u, bound in enumerate(MEASURED["propagated_max"]):
        assert prop[u].max() <= bound * MARGIN, (u, prop[u])
    assert ratio_iso <= MEASURED["isolated_last_over_first"] * MARGIN
    assert ratio_prop <= MEASURED["propagated_last_over_first"] * MARGIN
    assert res["kl_mean"] <= MEASURED["kl_mean"] * MARGIN
    assert res["top1"] >= 1 - (1 - MEASURED["top1_min"]) * MARGIN
