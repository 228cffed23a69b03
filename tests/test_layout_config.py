"""Byte accounting against DESIGN.md's hand-derived figures, config validation, pool allocation."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from sglang_rq.config import RQConfig, RQConfigError
from sglang_rq.layout import (
    ModelKVShape,
    bf16_bytes_per_token,
    decode_read_bytes_per_token,
    effective_bits,
    kv_bytes_per_token,
    kv_slot,
    loop_read_nbytes,
    loop_segments,
    staged_loops,
    staging_bytes,
    tokens_in_budget,
)

OURO_1_4B = ModelKVShape(num_layers=24, num_loops=4, num_kv_heads=16, head_dim=128)


def test_ouro_1_4b_default_is_152064_bytes_per_token():
    # DESIGN.md section 1: anchor 64 + 8 = 72 B, residual 32 + 8 + 2 = 42 B per
    # (token, layer, head, K or V); 72 + 3 * 42 = 198; x 2 x 16 x 24 = 152,064.
    assert kv_bytes_per_token(OURO_1_4B, RQConfig()) == 152_064
    assert bf16_bytes_per_token(OURO_1_4B) == 786_432
    assert [s.nbytes for s in loop_segments(OURO_1_4B, RQConfig())] == [42, 42, 42, 72]
    assert effective_bits(OURO_1_4B, RQConfig()) == pytest.approx(3.09375)
    assert 786_432 / 152_064 == pytest.approx(5.17, abs=0.005)


def test_decode_reads_414_of_1024_bytes_per_token_head():
    per = decode_read_bytes_per_token(OURO_1_4B, RQConfig()) / (2 * 16 * 24)
    assert per == 3 * (72 + 42) + 72 == 414


def test_loop_read_bytes_follow_the_base_chain():
    segs = loop_segments(OURO_1_4B, RQConfig())
    # residual loops read 42 B of their own and the anchor's 72 (DESIGN.md section 1)
    assert [loop_read_nbytes(segs, i) for i in range(4)] == [114, 114, 114, 72]
    first = loop_segments(OURO_1_4B, RQConfig(anchor="first"))
    assert [loop_read_nbytes(first, i) for i in range(4)] == [72, 114, 114, 114]


def test_disabled_format_is_bf16_and_other_formats():
    assert kv_bytes_per_token(OURO_1_4B, RQConfig(enabled=False)) == 786_432
    # direct INT2 everywhere (anchor 2 bits, no LSQ): 32 + 8 = 40 B per loop.
    int2 = RQConfig(anchor_bits=2, residual_bits=2, loop_bits=(2, 2, 2, 2), lsq=False)
    assert kv_bytes_per_token(OURO_1_4B, int2) == 4 * 40 * 2 * 16 * 24
    # shared anchor (0-bit residuals): anchor 72 + 3 x c (2 B).
    assert kv_bytes_per_token(OURO_1_4B, RQConfig(residual_bits=0)) == (72 + 6) * 2 * 16 * 24


def test_staging_and_budget_arithmetic():
    cfg = RQConfig()
    st = staging_bytes(OURO_1_4B, cfg, staging_tokens=100)
    assert st == 3 * 24 * 100 * 2 * 16 * 128 * 2
    budget = 10 * (1 << 30)
    rot = 24 * 16 * 128 * 128 * 4
    assert tokens_in_budget(OURO_1_4B, cfg, budget_bytes=budget, staging_tokens=100) == \
        (budget - st - rot) // 152_064


@pytest.mark.parametrize("kwargs, flag", [
    ({"group_size": 48}, "--rq-group-size"),
    ({"anchor_bits": 3}, "--rq-anchor-bits"),
    ({"residual_bits": 5}, "--rq-residual-bits"),
    ({"anchor": "middle"}, "--rq-anchor"),
    ({"rotation": "qr"}, "--rq-rotation"),
    ({"loop_bits": (2, 7)}, "--rq-loop-bits"),
    ({"rotation_seed": 2 ** 64}, "--rq-rotation-seed"),  # past torch's seeds: a traceback after load
    ({"rotation_seed": -2 ** 63 - 1}, "--rq-rotation-seed"),
])
def test_invalid_config_names_the_flag(kwargs, flag):
    with pytest.raises(RQConfigError, match=flag):
        RQConfig(**kwargs)


def test_model_dependent_checks_name_the_flag():
    with pytest.raises(RQConfigError, match="--rq-group-size=64 does not divide"):
        loop_segments(ModelKVShape(2, 4, 2, 96), RQConfig(group_size=64))
    with pytest.raises(RQConfigError, match="no supported group size .* serve it with --rq-disable"):
        loop_segments(ModelKVShape(2, 4, 2, 100), RQConfig())
    with pytest.raises(RQConfigError, match="--rq-loop-bits gives 3"):
        loop_segments(OURO_1_4B, RQConfig(loop_bits=(2, 2, 4)))
    with pytest.raises(RQConfigError, match="--rq-loop-group-size=3"):
        loop_segments(OURO_1_4B, RQConfig(loop_group_size=3))


def test_loop_groups_give_one_anchor_per_group():
    huginn = ModelKVShape(num_layers=4, num_loops=32, num_kv_heads=55, head_dim=96)
    segs = loop_segments(huginn, RQConfig(loop_group_size=4))
    anchors = [s.loop_id for s in segs if s.role == "anchor"]
    assert anchors == list(range(3, 32, 4))
    assert segs[5].base == 7


def test_config_json_round_trip():
    cfg = RQConfig(loop_bits=(2, 4, 2, 4), anchor="first", lsq=False, loop_group_size=2)
    assert RQConfig.from_json(cfg.to_json()) == cfg


def test_pool_allocates_exactly_bytes_per_token_times_rows():
    from sglang_rq.pool import bind_pool_class

    shape = ModelKVShape(num_layers=3, num_loops=4, num_kv_heads=2, head_dim=64)
    cfg = RQConfig()
    cls = bind_pool_class(cfg=cfg, shape=shape, staging_tokens=20)
    pool = cls(size=37, page_size=1, dtype=torch.bfloat16, head_num=2, head_dim=64, layer_num=12,
               device="cpu", enable_memory_saver=False)
    assert pool.compressed_nbytes() == kv_bytes_per_token(shape, cfg) * (37 + 1)
    assert pool.fixed_nbytes() == staging_bytes(shape, cfg, staging_tokens=20) + 3 * 2 * 64 * 64 * 4
    # (scale, offset) rows token-major (docs/kernels.md, "Pool layout"): a slot's 2 x H=2 x 2
    # groups x 2 bytes = 16 bytes together, [layers=3, rows=38, 2, 2, 2, 2] contiguous
    so = pool.stacks["looped"].scale_offset[0]
    assert so.shape == (3, 38, 2, 2, 2, 2) and so.stride() == (38 * 16, 16, 8, 4, 2, 1)
    # A forward saves every slot: loops 0..2 are staged, loop 3 commits (a forward of at most
    # staging/2 tokens commits every layer at the last layer). Read back layer 1: loop 3 is the
    # INT4 anchor (~10% error).
    k = torch.randn(5, 2, 64, dtype=torch.bfloat16)
    loc = torch.tensor([3, 4, 5, 6, 7])
    for loop in range(4):
        for layer in range(3):
            pool.save(kv_slot(loop, layer, 3), k * (loop + 1) / 4 * (layer == 1), -k, loc)
    kh, vh = pool.dequantize(kv_slot(3, 1, 3), loc)
    assert ((kh - k.float()).norm() / k.float().norm()) < 0.12
    assert ((vh + k.float()).norm() / k.float().norm()) < 0.12
    k0, _ = pool.dequantize(kv_slot(0, 1, 3), loc)
    assert ((k0 - k.float() / 4).norm() / (k.float() / 4).norm()) < 0.15
    with pytest.raises(RuntimeError, match="--rq-staging-tokens"):
        pool.save(0, torch.zeros(21, 2, 64), torch.zeros(21, 2, 64), torch.arange(21))
    with pytest.raises(RuntimeError, match="no dense K/V buffers"):
        pool.get_key_buffer(0)


def test_kv_size_cli_json(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_hidden_layers": 24, "total_ut_steps": 4, "hidden_size": 2048,
                               "num_attention_heads": 16, "num_key_value_heads": 16}))
    out = subprocess.run([sys.executable, "-m", "sglang_rq.cli", "kv-size", "--model-config", str(cfg),
                          "--memory-gb", "32", "--json"], capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    assert data["bytes_per_token"] == 152_064 and data["bf16_bytes_per_token"] == 786_432
    assert data["effective_bits"] == pytest.approx(3.09375)
    assert data["tokens_in_budget"] > 4.4 * data["bf16_tokens_in_budget"]
    bad = subprocess.run([sys.executable, "-m", "sglang_rq.cli", "kv-size", "--model-config", str(cfg),
                          "--rq-group-size", "48"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--rq-group-size=48" in bad.stderr
    neg = subprocess.run([sys.executable, "-m", "sglang_rq.cli", "kv-size", "--model-config", str(cfg),
                          "--memory-gb", "-1"], capture_output=True, text=True)
    assert neg.returncode == 2 and "--memory-gb=-1.0 must be > 0" in neg.stderr
    for value in ("nan", "inf"):  # a ValueError / OverflowError traceback before (session 38)
        r = subprocess.run([sys.executable, "-m", "sglang_rq.cli", "kv-size", "--model-config",
                            str(cfg), "--memory-gb", value], capture_output=True, text=True)
        assert r.returncode == 2 and f"--memory-gb={float(value)} must be > 0 and finite" in r.stderr
        assert "Traceback" not in r.stderr
    # a budget the fixed staging fills (8,192 tokens x 24 layers x 3 earlier loops x K and V x
    # 16 heads x 128 x 2 B = 4.5 GiB, plus 24 MiB of rotations): 0 tokens, and a note why
    small = subprocess.run([sys.executable, "-m", "sglang_rq.cli", "kv-size", "--model-config",
                            str(cfg), "--memory-gb", "1"], capture_output=True, text=True,
                           check=True).stdout
    assert "tokens in 1.0 GiB: 0 " in small
    assert ("note: the fixed bytes, staging 4.50 GiB and rotation 0.023 GiB, leave no room for "
            "a token, and `serve` refuses this budget (fewer --staging-tokens" in small)


def test_cli_help_lists_commands_and_names_an_unknown_one():
    """A new-user review found `sglang-rq --help` printing one usage line with exit status 2,
    and `sglang-rq foo` the same line without saying why."""
    from sglang_rq.cli import COMMANDS

    ok = subprocess.run([sys.executable, "-m", "sglang_rq.cli", "--help"], capture_output=True,
                        text=True)
    assert ok.returncode == 0
    for name in ("serve", "kv-size", "eval", "calibrate", "tasks", "bundle", "doctor", "score"):
        assert f"  {name} " in ok.stdout and name in COMMANDS
    bad = subprocess.run([sys.executable, "-m", "sglang_rq.cli", "foo"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "error: unknown command 'foo'" in bad.stderr


def test_model_kv_shape_from_hf_config_and_tensor_parallel(tmp_path):
    from sglang_rq.layout import ModelKVShape

    hf = {"num_hidden_layers": 24, "total_ut_steps": 4, "hidden_size": 2048,
          "num_attention_heads": 16, "num_key_value_heads": 16}
    assert ModelKVShape.from_hf_config(hf) == OURO_1_4B
    (tmp_path / "config.json").write_text(json.dumps(hf))
    assert ModelKVShape.from_hf_config(tmp_path) == OURO_1_4B  # a model directory
    assert ModelKVShape.from_hf_config(tmp_path / "config.json", tp_size=4).num_kv_heads == 4
    with pytest.raises(RQConfigError, match="--tp-size 3 does not divide the model's 16 KV heads"):
        ModelKVShape.from_hf_config(hf, tp_size=3)
    # loop count fields of other looped families; plain models have one loop
    assert ModelKVShape.from_hf_config({**hf, "total_ut_steps": None, "loop_num": 2}).num_loops == 2
    plain = {k: v for k, v in hf.items() if k != "total_ut_steps"}
    assert ModelKVShape.from_hf_config(plain).num_loops == 1
    with pytest.raises(RQConfigError, match="missing field 'num_hidden_layers'"):
        ModelKVShape.from_hf_config({"num_attention_heads": 16})
    with pytest.raises(RQConfigError, match="cannot read a JSON config"):
        ModelKVShape.from_hf_config(tmp_path / "missing.json")
    # a count that is not a positive integer is refused, naming the field (it was a
    # ZeroDivisionError, a TypeError, or silently another model: 2.5 loops read as 2, 0 or
    # true as unlooped, 0 KV heads as MHA)
    for key, value in (("num_attention_heads", 0), ("num_hidden_layers", "4"),
                       ("total_ut_steps", 2.5), ("total_ut_steps", 0), ("total_ut_steps", True),
                       ("total_ut_steps", -3), ("num_key_value_heads", 0), ("head_dim", "128")):
        with pytest.raises(RQConfigError, match=f"field '{key}' must be a positive integer, "
                                                f"got {re.escape(repr(value))}"):
            ModelKVShape.from_hf_config({**hf, key: value})
    # KV heads that do not divide the query heads: no GQA model (kv-size accepted 16 / 6)
    with pytest.raises(RQConfigError, match=r"'num_key_value_heads' \(6\) must divide "
                                            r"'num_attention_heads' \(16\)"):
        ModelKVShape.from_hf_config({**hf, "num_key_value_heads": 6})
    with pytest.raises(RQConfigError, match="is a JSON list, not an object"):
        (tmp_path / "list.json").write_text("[1, 2]")
        ModelKVShape.from_hf_config(tmp_path / "list.json")
    with pytest.raises(RQConfigError, match="ModelKVShape.head_dim must be >= 1"):
        ModelKVShape.from_hf_config({**hf, "hidden_size": 8})  # 8 // 16 heads
    huginn = {"model_type": "huginn_raven", "n_heads": 4, "n_embd": 256, "mean_recurrence": 0,
              "n_layers_in_recurrent_block": 2, "n_layers_in_prelude": 1, "n_layers_in_coda": 1}
    with pytest.raises(RQConfigError, match="field 'mean_recurrence' must be a positive"):
        ModelKVShape.from_hf_config(huginn)
    with pytest.raises(RQConfigError, match="field 'n_layers_in_coda' must be a non-negative"):
        ModelKVShape.from_hf_config({**huginn, "mean_recurrence": 4, "n_layers_in_coda": -1})
    assert ModelKVShape.from_hf_config({**huginn, "mean_recurrence": 4,
                                        "n_layers_in_coda": 0}).coda_layers == 0


def test_model_kv_shape_from_sglang_model_config():
    from types import SimpleNamespace

    from sglang_rq.layout import ModelKVShape

    class FakeModelConfig:  # the four members of SGLang's ModelConfig the shape reads
        hf_config = SimpleNamespace(num_hidden_layers=24, num_loops=4)
        head_dim = 128

        def get_total_num_kv_heads(self):
            return 16

        def get_num_kv_heads(self, tp):
            return 16 // tp

    assert ModelKVShape.from_model_config(FakeModelConfig(), tp_size=1) == OURO_1_4B
    assert ModelKVShape.from_model_config(FakeModelConfig(), tp_size=2).num_kv_heads == 8
    with pytest.raises(RQConfigError, match="--tp-size 5"):
        ModelKVShape.from_model_config(FakeModelConfig(), tp_size=5)


def test_kv_slot_round_trip():
    from sglang_rq.layout import kv_slot, loop_and_layer

    assert kv_slot(2, 5, 24) == 53
    assert [loop_and_layer(kv_slot(u, li, 3), 3) for u in range(4) for li in range(3)] == [
        (u, li) for u in range(4) for li in range(3)]


def test_staging_tokens_from_sglang_flags():
    from sglang_rq.layout import staging_tokens

    base = dict(chunked_prefill_size=2048, max_prefill_tokens=16384, max_running_requests=32,
                enable_mixed_chunk=False)
    assert staging_tokens(**base) == 2048
    assert staging_tokens(**{**base, "enable_mixed_chunk": True}) == 2048 + 32
    assert staging_tokens(**{**base, "chunked_prefill_size": -1}) == 16384  # no chunking
    assert staging_tokens(**{**base, "chunked_prefill_size": 8192,
                             "max_running_requests": None}) == 8192  # unset: 4096 requests


def test_kv_size_cli_takes_the_serving_flags(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_hidden_layers": 24, "total_ut_steps": 4, "hidden_size": 2048,
                               "num_attention_heads": 16, "num_key_value_heads": 16}))

    def kv_size(*flags):
        out = subprocess.run([sys.executable, "-m", "sglang_rq.cli", "kv-size", "--model-config",
                              str(cfg), "--json", *flags], capture_output=True, text=True, check=True)
        return json.loads(out.stdout)

    default = kv_size()
    assert default["staging_tokens"] == 8192  # SGLang's chunk on a 60-160 GB GPU
    mixed = kv_size("--chunked-prefill-size", "2048", "--max-running-requests", "64",
                    "--enable-mixed-chunk")
    assert mixed["staging_tokens"] == 2048 + 64
    assert mixed["staging_bytes"] == staging_bytes(OURO_1_4B, RQConfig(), staging_tokens=2112)
    assert kv_size("--staging-tokens", "100", "--chunked-prefill-size", "2048")["staging_tokens"] == 100
    tp4 = kv_size("--tp-size", "4")
    assert tp4["num_kv_heads"] == 4 and tp4["bytes_per_token"] == 152_064 // 4


# ----------------------------------------------------------------------------- Huginn (issue 15)
HUGINN_3_5B = {"model_type": "huginn_raven", "n_embd": 5280, "n_heads": 55, "n_layers": 8,
               "n_layers_in_prelude": 2, "n_layers_in_recurrent_block": 4, "n_layers_in_coda": 2,
               "mean_recurrence": 32}


def test_huginn_3_5b_shape_and_bytes_per_token():
    shape = ModelKVShape.from_hf_config(HUGINN_3_5B)
    assert (shape.num_layers, shape.num_loops, shape.prelude_layers, shape.coda_layers) == (4, 32, 2, 2)
    assert (shape.num_kv_heads, shape.head_dim, shape.num_slots) == (55, 96, 132)
    # BF16, one slot per (block, recurrence): 132 slots x 2 (K, V) x 55 heads x 96 x 2 B.
    assert kv_bytes_per_token(shape, RQConfig(enabled=False)) == 2_787_840
    # Default: core in 8 groups of 4 recurrences. Per (token, core layer, K or V, head) and
    # group: INT4 anchor 96/2 + 2*96/32 = 54 B, three INT2 residuals 24 + 6 + 2 = 32 B each:
    # 150 B; x 8 groups x 2 x 55 heads x 4 core layers = 528,000. Prelude + coda in BF16:
    # 4 layers x 2 x 55 x 96 x 2 = 84,480.
    assert kv_bytes_per_token(shape, RQConfig()) == 528_000 + 84_480
    # INT4 anchor-only prelude/coda: 4 x 2 x 55 x 54 = 23,760 instead of 84,480.
    assert kv_bytes_per_token(shape, RQConfig(unlooped_bits=4)) == 528_000 + 23_760
    assert staged_loops(shape, RQConfig()) == 3  # staging holds one group's earlier recurrences
    # The authors' KV sharing: one BF16 slot per core layer (c = 1, 0-bit earlier recurrences).
    sharing = RQConfig(anchor_bits=16, residual_bits=0, lsq=False, rotation="none",
                       loop_group_size=32)
    assert kv_bytes_per_token(shape, sharing) == 8 * 2 * 55 * 96 * 2


def test_huginn_slot_places_follow_the_model_layout():
    from sglang_rq.models.huginn_config import HuginnConfig

    cfg = HuginnConfig(n_embd=192, n_heads=2, n_layers=5, n_layers_in_prelude=1,
                       n_layers_in_recurrent_block=2, n_layers_in_coda=2, mean_recurrence=8)
    shape = ModelKVShape.from_hf_config(cfg.to_dict())
    places = shape.slot_places()
    assert len(places) == shape.num_slots == cfg.num_hidden_layers == 1 + 2 * 8 + 2
    p = places[cfg.kv_slot("prelude", 0)]
    assert (p.stack, p.loop, p.layer, p.block) == ("unlooped", 0, 0, 0)
    for r in range(8):
        for b in range(2):
            p = places[cfg.kv_slot("core", b, r)]
            assert (p.stack, p.loop, p.layer, p.block) == ("looped", r, b, 1 + b)
    for c in range(2):
        p = places[cfg.kv_slot("coda", c)]
        assert (p.stack, p.loop, p.layer, p.block) == ("unlooped", 0, 1 + c, 3 + c)


def test_huginn_recurrences_a_loop_group_cannot_split_are_refused():
    shape = ModelKVShape.from_hf_config({**HUGINN_3_5B, "mean_recurrence": 30})
    assert shape.default_loop_group is None  # 30 is no multiple of 4: one group
    with pytest.raises(RQConfigError, match="--rq-loop-group-size=4 does not divide"):
        kv_bytes_per_token(shape, RQConfig(loop_group_size=4))


def test_pool_with_unlooped_layers_allocates_and_round_trips():
    from sglang_rq.pool import bind_pool_class

    shape = ModelKVShape(num_layers=2, num_loops=4, num_kv_heads=2, head_dim=64, prelude_layers=1,
                         coda_layers=1, default_loop_group=2)
    cfg = RQConfig()
    cls = bind_pool_class(cfg=cfg, shape=shape, staging_tokens=8)
    pool = cls(size=9, page_size=1, dtype=torch.bfloat16, head_num=2, head_dim=64,
               layer_num=shape.num_slots, device="cpu", enable_memory_saver=False)
    assert pool.compressed_nbytes() == kv_bytes_per_token(shape, cfg) * 10
    # looped: 2 groups of 2 per layer; staging [1, 2 layers, 8, 2, 2, 64] bf16; rotation of the
    # 2 looped layers only (the BF16 un-looped stack is not rotated).
    assert pool.fixed_nbytes() == 1 * 2 * 8 * 2 * 2 * 64 * 2 + 2 * 2 * 64 * 64 * 4
    k = torch.randn(3, 2, 64, dtype=torch.bfloat16)
    loc = torch.tensor([1, 4, 9])
    last_slot = shape.num_slots - 1  # the coda layer: BF16, committed at once, exact
    pool.save(last_slot, k, -k, loc)
    kh, vh = pool.dequantize(last_slot, loc)
    assert torch.equal(kh, k.float()) and torch.equal(vh, -k.float())
    for loop in (0, 1):  # core layer 1, group 0: loop 1 is its INT4 anchor
        pool.save(1 + kv_slot(loop, 1, 2), k * (loop + 1), k, loc)
    kh, _ = pool.dequantize(1 + kv_slot(1, 1, 2), loc)
    assert ((kh - 2 * k.float()).norm() / (2 * k.float()).norm()) < 0.12
