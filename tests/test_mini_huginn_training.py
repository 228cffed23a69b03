"""Training helpers of the Huginn reference (CPU, tiny sizes, fp32): the truncated-backprop
training forward (`HuginnReferenceModel.forward_train`) against the inference forward and a
hand-written truncated loop, `save_pretrained` round trip, and the recurrence sampler of
``training/train_mini_huginn.py``."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from sglang_rq.models.huginn_reference import (
    HuginnReferenceModel,
    random_state_dict,
    rope_table,
    tiny_config,
    upstream_param_names,
)

R, K = 6, 2  # recurrences, backprop depth
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _model(seed: int = 0) -> HuginnReferenceModel:
    cfg = tiny_config(mean_recurrence=R)
    model = HuginnReferenceModel(cfg)
    model.load_state_dict(random_state_dict(cfg, seed), strict=False)
    return model.train()


def _ids(b: int = 2, t: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 512, (b, t), generator=torch.Generator().manual_seed(seed))


def _loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                             ids[:, 1:].reshape(-1))


def _hand_truncated_logits(model: HuginnReferenceModel, ids: torch.Tensor, r_total: int, k: int):
    """The Huginn forward written out from the module parts (not via the model's stage helpers),
    with the first ``r_total - k`` recurrences under ``no_grad``."""
    c, tr = model.config, model.transformer
    t = ids.shape[1]
    table = rope_table(torch.arange(t), c.head_dim, c.rope_base)
    e = tr.wte(ids) * math.sqrt(c.n_embd)
    for i, blk in enumerate(tr.prelude):
        e = blk(e, table, None, i)
    s = torch.zeros_like(e)

    def rec(s, r):
        s = tr.adapter(torch.cat([s, e], -1))
        for b, blk in enumerate(tr.core_block):
            s = blk(s, table, None, c.n_layers_in_prelude + r * c.n_layers_in_recurrent_block + b)
        return s

    with torch.no_grad():
        for r in range(r_total - k):
            s = rec(s, r)
    s = s.detach()
    for r in range(r_total - k, r_total):
        s = rec(s, r)
    x = tr.ln_f(s)
    for blk in tr.coda:
        x = blk(x, table, None, 0)
    return (tr.ln_f(x) @ tr.wte.weight.T).float()


def _grads(model: HuginnReferenceModel) -> dict[str, torch.Tensor | None]:
    return {n: (None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()}


def test_forward_train_logits_equal_inference_forward():
    model, ids = _model(), _ids()
    with torch.no_grad():
        ref = model(ids, num_recurrences=R)
    for k in (0, K, R, 100):
        got = model.forward_train(ids, num_recurrences=R, backprop_depth=k)
        torch.testing.assert_close(got, ref, rtol=0, atol=0)
    # and the inference forward itself against the hand-written loop (k irrelevant without grad)
    with torch.no_grad():
        torch.testing.assert_close(_hand_truncated_logits(model, ids, R, K), ref, rtol=1e-5, atol=1e-4)


def test_gradients_reach_only_the_last_k_recurrences():
    model, ids = _model(), _ids()
    logits, states = model.forward_train(ids, num_recurrences=R, backprop_depth=K, return_states=True)
    assert len(states) == R
    assert [s.requires_grad for s in states] == [False] * (R - K) + [True] * K
    for s in states[R - K:]:
        s.retain_grad()
    _loss(logits, ids).backward()
    for s in states[R - K:]:
        assert s.grad is not None and s.grad.abs().sum() > 0
    got = _grads(model)

    # every parameter gets a gradient: core blocks and adapter through the last K recurrences,
    # the prelude and the embedding also through the adapter's input e
    for name in upstream_param_names(model.config):
        g = got[name]
        assert g is not None and g.abs().sum() > 0, name

    # the same gradients as the hand-written truncated loop
    model.zero_grad(set_to_none=True)
    _loss(_hand_truncated_logits(model, ids, R, K), ids).backward()
    want = _grads(model)
    for name in got:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=name)

    # truncation matters: full backpropagation gives different core/prelude gradients
    model.zero_grad(set_to_none=True)
    _loss(model.forward_train(ids, num_recurrences=R, backprop_depth=None), ids).backward()
    full = _grads(model)
    for name in ("transformer.core_block.0.attn.Wqkv.weight", "transformer.prelude.0.mlp.fc.weight",
                 "transformer.adapter.weight"):
        assert not torch.allclose(full[name], got[name], rtol=1e-3, atol=0), name
    # ... but not the coda's, which sits after the recurrence
    torch.testing.assert_close(full["transformer.coda.0.mlp.fc.weight"],
                               got["transformer.coda.0.mlp.fc.weight"], rtol=1e-4, atol=1e-6)


def test_zero_backprop_depth_leaves_recurrence_and_prelude_without_gradients():
    """With k = 0 the prelude is cut off too: its only route to the loss is through e in the
    recurrences that carry gradients."""
    model, ids = _model(), _ids()
    _loss(model.forward_train(ids, num_recurrences=R, backprop_depth=0), ids).backward()
    g = _grads(model)
    for name, grad in g.items():
        upstream = name.replace("lm_head.weight", "transformer.wte.weight")
        if upstream.startswith(("transformer.prelude", "transformer.core_block", "transformer.adapter")):
            assert grad is None, name
        elif upstream.startswith(("transformer.coda", "transformer.ln_f", "transformer.wte")):
            assert grad is not None and grad.abs().sum() > 0, name


def test_save_pretrained_round_trip(tmp_path):
    model = _model().eval()
    files = model.save_pretrained(tmp_path, dtype=torch.bfloat16, max_shard_bytes=60_000)
    assert len(files) >= 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    names = set()
    for f in files:
        with safe_open(str(tmp_path / f), "pt") as fh:
            names |= set(fh.keys())
    assert names == set(upstream_param_names(model.config)) == set(index["weight_map"])
    assert "freqs_cis" not in names and "lm_head.weight" not in names
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["RavenForCausalLM"] and cfg["torch_dtype"] == "bfloat16"
    loaded = HuginnReferenceModel.from_pretrained(tmp_path)
    for n, p in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[n], p.to(torch.bfloat16).float(), rtol=0, atol=0)
    # with the upstream RoPE buffer it still loads
    model.save_pretrained(tmp_path / "fc", keep_freqs_cis=True)
    HuginnReferenceModel.from_pretrained(tmp_path / "fc")


def test_init_weights_scales():
    cfg = tiny_config(mean_recurrence=R)
    model = HuginnReferenceModel(cfg)
    model.init_weights(seed=0)
    model.requires_grad_(False)
    std = math.sqrt(2 / (5 * cfg.n_embd))
    w = model.transformer.core_block[0].attn.Wqkv.weight
    assert abs(float(w.std()) / std - 1) < 0.05 and float(w.abs().max()) <= 3 * std + 1e-7
    proj = model.transformer.core_block[0].mlp.proj.weight
    assert abs(float(proj.std()) / (std / math.sqrt(2 * cfg.num_kv_slots)) - 1) < 0.1
    assert torch.all(model.transformer.ln_f.weight == 1)
    assert torch.all(model.transformer.prelude[0].attn.qk_bias == 0)


def test_recurrence_sampler_is_upstreams_log_normal_poisson():
    spec = importlib.util.spec_from_file_location("train_mini_huginn",
                                                  REPO / "training" / "train_mini_huginn.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    gen = torch.Generator().manual_seed(0)
    draws = [mod.sample_recurrences(gen, 32, 8) for _ in range(4000)]
    rs = torch.tensor([r for r, _ in draws], dtype=torch.float64)
    assert all(k == min(8, r) for r, k in draws)
    assert rs.min() >= 1 and rs.max() <= 96
    # E[r] = mean + 1; log-normal rate with sigma 0.5: sd(r) ~ sqrt(m + m^2 (e^{0.25} - 1)) ~ 17.5
    assert abs(float(rs.mean()) - 33) < 1.5
    assert 14 < float(rs.std()) < 21
    cfg = mod.mini_huginn_config()
    assert cfg.head_dim == 96 and cfg.mean_recurrence == 32 and cfg.tie_embeddings
