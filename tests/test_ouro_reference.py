"""Hand-checkable tests of the plain-PyTorch Ouro reference (CPU, tiny sizes, a few seconds)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from safetensors import safe_open

from sglang_rq.models.ouro_config import OuroConfig, register_ouro_config
from sglang_rq.models.ouro_reference import (
    OuroReferenceModel,
    OuroRMSNorm,
    random_state_dict,
    tiny_config,
    upstream_param_names,
    write_random_checkpoint,
)

REPO = Path(__file__).resolve().parents[1]
MINI_OURO = REPO / "sglang_rq" / "assets" / "mini-ouro"


def _expected_names(num_layers: int) -> list[str]:
    """The upstream Ouro checkpoint names, written out by hand."""
    names = ["model.embed_tokens.weight"]
    for i in range(num_layers):
        names += [
            f"model.layers.{i}.self_attn.q_proj.weight",
            f"model.layers.{i}.self_attn.k_proj.weight",
            f"model.layers.{i}.self_attn.v_proj.weight",
            f"model.layers.{i}.self_attn.o_proj.weight",
            f"model.layers.{i}.mlp.gate_proj.weight",
            f"model.layers.{i}.mlp.up_proj.weight",
            f"model.layers.{i}.mlp.down_proj.weight",
            f"model.layers.{i}.input_layernorm.weight",
            f"model.layers.{i}.input_layernorm_2.weight",
            f"model.layers.{i}.post_attention_layernorm.weight",
            f"model.layers.{i}.post_attention_layernorm_2.weight",
        ]
    names += ["model.norm.weight", "model.early_exit_gate.weight", "model.early_exit_gate.bias", "lm_head.weight"]
    return names


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("ouro_ckpt")
    cfg = write_random_checkpoint(path, seed=1)
    return path, cfg


@pytest.fixture(scope="module")
def model(ckpt):
    return OuroReferenceModel.from_pretrained(ckpt[0], dtype=torch.float32)


# ------------------------------------------------------------------------------- config


def test_config_defaults_and_aliases():
    c = OuroConfig()
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (49152, 2048, 5632, 24)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (16, 16, 128)
    assert c.rope_theta == 1e6 and c.rms_norm_eps == 1e-6 and c.max_position_embeddings == 65536
    assert c.tie_word_embeddings is False and c.hidden_act == "silu"
    assert c.total_ut_steps == 4 and c.num_loops == 4 and c.early_exit_threshold == 1.0
    assert (c.bos_token_id, c.eos_token_id, c.pad_token_id) == (1, 2, 0)
    assert c.kv_slot(2, 5) == 2 * 24 + 5


def test_config_upstream_token_defect_corrected_and_rope_survives(tmp_path):
    d = OuroConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, rope_theta=12345.0).to_dict()
    d.update(bos_token_id=0, eos_token_id=0, pad_token_id=0)
    d.pop("rope_parameters")
    (tmp_path / "config.json").write_text(json.dumps(d))
    register_ouro_config()
    register_ouro_config()  # idempotent
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(c, OuroConfig)
    assert (c.bos_token_id, c.eos_token_id, c.pad_token_id) == (1, 2, 0)
    assert c.rope_theta == 12345.0 and c.head_dim == 16 and c.num_loops == 4


# ------------------------------------------------------------------------------- checkpoint I/O


def test_checkpoint_names_round_trip(ckpt, model, tmp_path):
    path, cfg = ckpt
    expected = _expected_names(cfg.num_hidden_layers)
    assert upstream_param_names(cfg) == expected
    assert list(model.state_dict().keys()) == expected
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert sorted(index["weight_map"]) == sorted(expected)
    on_disk = []
    for fn in sorted(set(index["weight_map"].values())):
        with safe_open(str(path / fn), "pt") as f:
            on_disk += list(f.keys())
            assert all(f.get_tensor(k).dtype == torch.bfloat16 for k in f.keys())
    assert sorted(on_disk) == sorted(expected)
    assert len(set(index["weight_map"].values())) > 1  # several shards
    cfg_json = json.loads((path / "config.json").read_text())
    assert cfg_json["model_type"] == "ouro" and cfg_json["architectures"] == ["OuroForCausalLM"]
    assert (cfg_json["bos_token_id"], cfg_json["eos_token_id"], cfg_json["pad_token_id"]) == (1, 2, 0)

    # save_pretrained -> from_pretrained (without an index file) reproduces every tensor
    out = tmp_path / "resaved"
    model.save_pretrained(out, max_shard_bytes=10**9, dtype=torch.float32)
    (out / "model.safetensors.index.json").unlink()
    again = OuroReferenceModel.from_pretrained(out)
    for k, v in model.state_dict().items():
        assert torch.equal(v, again.state_dict()[k]), k


# ------------------------------------------------------------------------------- building blocks


def test_rmsnorm_hand_formula():
    n = OuroRMSNorm(2, eps=0.0)
    with torch.no_grad():
        n.weight.copy_(torch.tensor([1.0, 2.0]))
    y = n(torch.tensor([[3.0, 4.0]]))
    r = math.sqrt((9 + 16) / 2)
    assert torch.allclose(y, torch.tensor([[3 / r, 8 / r]]), atol=1e-6)

    n = OuroRMSNorm(8, eps=1e-6)
    with torch.no_grad():
        n.weight.copy_(torch.linspace(0.5, 1.5, 8))
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    x32 = x.float()
    ref = n.weight * (x32 / torch.sqrt((x32 * x32).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
    assert torch.equal(n(x), ref)


def _rms(x, w, eps):
    return w * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope_pairs(x, pos, theta):
    """RoPE written per (i, i + D/2) pair: x [T, D] at positions pos [T]."""
    t_len, d = x.shape
    out = x.clone()
    for t in range(t_len):
        for i in range(d // 2):
            ang = float(pos[t]) * theta ** (-2.0 * i / d)
            a, b = x[t, i].item(), x[t, i + d // 2].item()
            out[t, i] = a * math.cos(ang) - b * math.sin(ang)
            out[t, i + d // 2] = b * math.cos(ang) + a * math.sin(ang)
    return out


def test_one_loop_without_sandwich_norms_equals_manual_layer():
    cfg = tiny_config(num_hidden_layers=1, total_ut_steps=1, vocab_size=50, max_position_embeddings=64)
    m = OuroReferenceModel(cfg)
    m.load_state_dict(random_state_dict(cfg, seed=3))
    m.eval()
    layer = m.model.layers[0]
    layer.input_layernorm_2 = nn.Identity()
    layer.post_attention_layernorm_2 = nn.Identity()
    ids = torch.tensor([[5, 17, 3, 42, 8, 8, 1]])
    got = m(ids)[0]

    sd = {k: v.detach() for k, v in m.state_dict().items()}
    p = "model.layers.0."
    eps, hd, nh, nkv = cfg.rms_norm_eps, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    x = sd["model.embed_tokens.weight"][ids[0]]  # [T, H]
    t_len = x.shape[0]
    a = _rms(x, sd[p + "input_layernorm.weight"], eps)
    q = a @ sd[p + "self_attn.q_proj.weight"].T
    k = a @ sd[p + "self_attn.k_proj.weight"].T
    v = a @ sd[p + "self_attn.v_proj.weight"].T
    pos = torch.arange(t_len)
    heads = []
    for h in range(nh):
        g = h // (nh // nkv)
        qh = _rope_pairs(q[:, h * hd:(h + 1) * hd], pos, cfg.rope_theta)
        kh = _rope_pairs(k[:, g * hd:(g + 1) * hd], pos, cfg.rope_theta)
        vh = v[:, g * hd:(g + 1) * hd]
        s = qh @ kh.T / math.sqrt(hd)
        s = s.masked_fill(torch.triu(torch.ones(t_len, t_len, dtype=torch.bool), 1), float("-inf"))
        heads.append(torch.softmax(s, -1) @ vh)
    hcat = x + torch.cat(heads, -1) @ sd[p + "self_attn.o_proj.weight"].T
    c = _rms(hcat, sd[p + "post_attention_layernorm.weight"], eps)
    gate = c @ sd[p + "mlp.gate_proj.weight"].T
    up = c @ sd[p + "mlp.up_proj.weight"].T
    y = hcat + (gate * torch.sigmoid(gate) * up) @ sd[p + "mlp.down_proj.weight"].T
    y = _rms(y, sd["model.norm.weight"], eps)
    want = y @ sd["lm_head.weight"].T
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_sandwich_norms_and_loops_matter(model):
    """Sanity: the ``_2`` norms and the loop count change the result (they are really used)."""
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    base = model(ids)
    cfg2 = OuroConfig(**{**model.config.to_dict(), "total_ut_steps": 2})
    m2 = OuroReferenceModel(cfg2)
    m2.load_state_dict(model.state_dict())
    m2.eval()
    assert not torch.allclose(base, m2(ids))
    # two loops == exit after loop 1 of the four-loop model
    assert torch.allclose(m2(ids), model(ids, exit_mode="step", exit_step=1), atol=1e-5)


# ------------------------------------------------------------------------------- exits, causality


def test_step_last_equals_last_and_kv_slots(model):
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    last = model(ids)
    assert last.dtype == torch.float32 and last.shape == (2, 9, model.config.vocab_size)
    u = model.config.total_ut_steps
    assert torch.equal(model(ids, exit_mode="step", exit_step=u - 1), last)
    assert torch.equal(model(ids, exit_mode="threshold", exit_threshold=1.0), last)
    states, kv = model.loop_states(ids, collect_kv=True)
    n_layers = model.config.num_hidden_layers
    assert sorted(kv) == list(range(u * n_layers))
    k, v = kv[model.config.kv_slot(u - 1, n_layers - 1)]
    assert k.shape == v.shape == (2, model.config.num_key_value_heads, 9, model.config.head_dim)
    probs = model.exit_probabilities(states)
    assert probs.shape == (u, 2, 9)
    assert torch.allclose(probs.sum(0), torch.ones(2, 9), atol=1e-6)


def test_gate_bias_large_makes_weighted_equal_step0(ckpt):
    m = OuroReferenceModel.from_pretrained(ckpt[0])
    ids = torch.tensor([[7, 7, 2, 9, 100, 31]])
    with torch.no_grad():
        m.model.early_exit_gate.weight.zero_()
        m.model.early_exit_gate.bias.fill_(50.0)  # lambda_0 = 1 -> p_0 = 1
    step0 = m(ids, exit_mode="step", exit_step=0)
    assert torch.allclose(m(ids, exit_mode="weighted"), step0, atol=1e-5)
    assert torch.equal(m(ids, exit_mode="threshold", exit_threshold=0.5), step0)
    with torch.no_grad():
        m.model.early_exit_gate.bias.fill_(-50.0)  # lambda = 0 -> all mass on the last loop
    assert torch.allclose(m(ids, exit_mode="weighted"), m(ids), atol=1e-5)
    assert torch.equal(m(ids, exit_mode="threshold", exit_threshold=0.9), m(ids))


def test_threshold_hand_example(model):
    """lambda = 0.2 at every loop (gate bias logit(0.2)): p = (0.2, 0.16, 0.128, 0.512)."""
    m = model
    ids = torch.tensor([[1, 2, 3]])
    states, _ = m.loop_states(ids)
    with torch.no_grad():
        old_w, old_b = m.model.early_exit_gate.weight.clone(), m.model.early_exit_gate.bias.clone()
        m.model.early_exit_gate.weight.zero_()
        m.model.early_exit_gate.bias.fill_(math.log(0.2 / 0.8))  # lambda = 0.2 at every loop
    try:
        p = m.exit_probabilities(states)[:, 0, 0]
        assert torch.allclose(p, torch.tensor([0.2, 0.16, 0.128, 0.512]), atol=1e-6)
        # cdf = 0.2, 0.36, 0.488, 1.0 -> threshold 0.3 exits at loop 1, 0.4 at loop 2, 0.5 at loop 3
        assert torch.equal(m(ids, exit_mode="threshold", exit_threshold=0.3), m(ids, exit_mode="step", exit_step=1))
        assert torch.equal(m(ids, exit_mode="threshold", exit_threshold=0.4), m(ids, exit_mode="step", exit_step=2))
        assert torch.equal(m(ids, exit_mode="threshold", exit_threshold=0.5), m(ids))
        weighted = sum(pi * m(ids, exit_mode="step", exit_step=i) for i, pi in enumerate(p.tolist()))
        assert torch.allclose(m(ids, exit_mode="weighted"), weighted, atol=1e-4)
    finally:
        with torch.no_grad():
            m.model.early_exit_gate.weight.copy_(old_w)
            m.model.early_exit_gate.bias.copy_(old_b)


def test_causal(model):
    ids = torch.tensor([[11, 22, 33, 44, 55, 66, 77, 88, 99, 10]])
    changed = ids.clone()
    changed[0, 7] = 5
    for mode in ("last", "weighted"):
        a, b = model(ids, exit_mode=mode), model(changed, exit_mode=mode)
        assert torch.allclose(a[:, :7], b[:, :7], atol=1e-5)
        assert not torch.allclose(a[:, 7:], b[:, 7:], atol=1e-3)


def test_greedy_generate_matches_argmax(model):
    prompt = [4, 8, 15, 16, 23, 42]
    out = model.greedy_generate([prompt, prompt[:3]], 3, stop_token_ids=[])
    assert [len(o) for o in out] == [3, 3]
    seq = list(prompt)
    for tok in out[0]:
        assert tok == int(model(torch.tensor([seq]))[0, -1].argmax())
        seq.append(tok)


# ------------------------------------------------------------------------------- shipped asset


@pytest.mark.skipif(not (MINI_OURO / "config.json").exists(), reason="mini-Ouro asset not present")
def test_mini_ouro_asset_format():
    cfg = json.loads((MINI_OURO / "config.json").read_text())
    assert cfg["architectures"] == ["OuroForCausalLM"] and cfg["model_type"] == "ouro"
    assert cfg["torch_dtype"] == "bfloat16" and cfg["total_ut_steps"] == 4
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (1, 2, 0)
    shards = sorted(MINI_OURO.glob("*.safetensors"))
    assert shards and all(p.stat().st_size <= 15_000_000 for p in shards)
    assert sum(p.stat().st_size for p in shards) <= 40_000_000
    assert json.loads((MINI_OURO / "generation_config.json").read_text())["eos_token_id"] == [2, 0]
    tok = json.loads((MINI_OURO / "tokenizer.json").read_text())
    special = {t["content"]: t["id"] for t in tok["added_tokens"]}
    assert special == {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    m = OuroReferenceModel.from_pretrained(MINI_OURO)
    assert list(m.state_dict()) == _expected_names(cfg["num_hidden_layers"])
    logits = m(torch.tensor([[1, 2, 3, 4]]))
    assert torch.isfinite(logits).all()
