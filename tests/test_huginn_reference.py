"""The plain-PyTorch Huginn reference and config (CPU, tiny sizes): upstream names and shapes,
the KV-slot layout, pairwise RoPE by hand, and the cached greedy generate against a full
recompute per token."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors import safe_open

from sglang_rq.models.huginn_config import HuginnConfig, register_huginn_config
from sglang_rq.models.huginn_reference import (
    HuginnReferenceModel,
    apply_rope,
    rope_table,
    write_random_checkpoint,
)

PROMPTS = [[5, 17, 300, 42], [9] * 7, list(range(100, 121))]


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny matmuls: one intra-op thread is faster than a contended pool (2 shared cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _block_names(prefix: str) -> list[str]:
    return [f"{prefix}.{n}" for n in (
        "norm_1.weight", "attn.Wqkv.weight", "attn.qk_bias", "attn.proj.weight", "norm_2.weight",
        "mlp.fc.weight", "mlp.proj.weight", "norm_3.weight", "norm_4.weight")]


def test_config_defaults_are_huginn_3_5b():
    c = HuginnConfig()
    assert (c.n_embd, c.n_heads, c.head_dim, c.num_key_value_heads) == (5280, 55, 96, 55)
    assert (c.hidden_size, c.num_attention_heads) == (5280, 55)
    assert (c.n_layers_in_prelude, c.n_layers_in_recurrent_block, c.n_layers_in_coda) == (2, 4, 2)
    assert c.mean_recurrence == c.num_recurrences == 32
    assert (c.vocab_size, c.rope_base, c.norm_eps, c.intermediate_size) == (65536, 50000.0, 1e-6, 17920)
    assert c.tie_embeddings and c.tie_word_embeddings and c.qk_bias and not c.bias
    assert c.embed_scale == pytest.approx(math.sqrt(5280))
    # SGLang's layer count is the number of KV slots: 2 + 4 * 32 + 2.
    assert c.num_hidden_layers == 132 and c.n_layers == 8
    assert not hasattr(c, "num_loops")  # SGLang would multiply the slot count by it
    assert [c.kv_slot("prelude", 1), c.kv_slot("core", 0, 0), c.kv_slot("core", 3, 31),
            c.kv_slot("coda", 0), c.kv_slot("coda", 1)] == [1, 2, 129, 130, 131]
    with pytest.raises(ValueError, match="no KV slot"):
        c.kv_slot("core", 4, 0)
    with pytest.raises(ValueError, match="n_layers=9"):
        HuginnConfig(n_layers=9)


def test_checkpoint_has_upstream_names_and_autoconfig_reads_it(tmp_path):
    cfg = write_random_checkpoint(tmp_path, dict(n_embd=64, n_heads=4, n_layers_in_prelude=2,
                                                 n_layers_in_recurrent_block=2, n_layers_in_coda=2))
    shapes = {}
    for f in tmp_path.glob("*.safetensors"):
        with safe_open(str(f), "pt") as fh:
            shapes.update({k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()})
    expected = ["transformer.wte.weight", "transformer.adapter.weight", "transformer.ln_f.weight",
                "freqs_cis"]
    for stage, n in (("prelude", 2), ("core_block", 2), ("coda", 2)):
        for i in range(n):
            expected += _block_names(f"transformer.{stage}.{i}")
    assert sorted(shapes) == sorted(expected)  # no lm_head.weight: tied
    assert shapes["transformer.prelude.0.attn.Wqkv.weight"] == (3 * 64, 64)
    assert shapes["transformer.prelude.0.attn.qk_bias"] == (2, 1, 4, 16)
    assert shapes["transformer.coda.1.mlp.fc.weight"] == (2 * 128, 64)
    assert shapes["transformer.adapter.weight"] == (64, 128)
    assert shapes["freqs_cis"] == (1, 512, 1, 8, 2)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["model_type"] == "huginn_raven" and raw["architectures"] == ["RavenForCausalLM"]
    assert "num_hidden_layers" not in raw and raw["n_layers"] == 6

    from transformers import AutoConfig

    register_huginn_config()
    auto = AutoConfig.from_pretrained(str(tmp_path))
    assert isinstance(auto, HuginnConfig)
    assert (auto.num_hidden_layers, auto.head_dim, auto.hidden_size) == (2 + 2 * 4 + 2, 16, 64)
    assert HuginnConfig(**auto.to_dict()).num_hidden_layers == cfg.num_hidden_layers


def test_rope_rotates_adjacent_pairs():
    d, base = 8, 50_000.0
    table = rope_table(torch.tensor([0, 3]), d, base)
    x = torch.zeros(1, 2, 1, d)
    x[..., 0] = 1.0  # pair (0, 1), frequency 1
    x[..., 2] = 1.0  # pair (2, 3), frequency base ** (-2 / d)
    y = apply_rope(x, table)[0, :, 0]
    assert torch.allclose(y[0], x[0, 0, 0])  # position 0: identity
    a0, a1 = 3.0, 3.0 * base ** (-2 / d)
    expected = torch.tensor([math.cos(a0), math.sin(a0), math.cos(a1), math.sin(a1), 0, 0, 0, 0])
    assert torch.allclose(y[1], expected, atol=1e-6)


@pytest.mark.parametrize("overrides", [
    dict(n_embd=64, n_heads=4, mean_recurrence=8),                       # head_dim 16
    dict(n_embd=96, n_heads=3),                                          # head_dim 32
    dict(n_embd=192, n_heads=2, n_layers_in_prelude=2, n_layers_in_recurrent_block=4,
         n_layers_in_coda=2, mean_recurrence=5),                         # head_dim 96
])
def test_cached_greedy_equals_full_recompute(tmp_path, overrides):
    cfg = write_random_checkpoint(tmp_path, overrides, seed=3)
    model = HuginnReferenceModel.from_pretrained(tmp_path, dtype=torch.float32)
    cached = model.greedy_generate(PROMPTS, 6)
    full = model.greedy_generate(PROMPTS, 6, use_cache=False)
    assert cached == full
    cache: dict = {}
    model(torch.tensor([PROMPTS[0]]), cache=cache)
    p, c, k, r = (cfg.n_layers_in_prelude, cfg.n_layers_in_recurrent_block, cfg.n_layers_in_coda,
                  cfg.mean_recurrence)
    assert sorted(cache) == list(range(p + c * r + k))
    assert cache[0][0].shape == (1, cfg.n_heads, len(PROMPTS[0]), cfg.head_dim)


def test_more_recurrences_change_the_output(tmp_path):
    write_random_checkpoint(tmp_path, dict(n_embd=64, n_heads=4), seed=4)
    model = HuginnReferenceModel.from_pretrained(tmp_path, dtype=torch.float32)
    ids = torch.tensor([PROMPTS[2]])
    assert not torch.allclose(model(ids, num_recurrences=1), model(ids, num_recurrences=4))
