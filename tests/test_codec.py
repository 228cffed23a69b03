"""Reference codec (sglang_rq/reference.py) against hand-derived values and error bounds.

Tolerance policy: packing and FP8 rounding are exact (``torch.equal``); group quantization is
checked against its analytic bound (|x - x̂| <= scale / 2 per element, because the offset is
rounded down and the scale up onto the FP8 grid, so no code clips); the lossy round trip through
anchor + residual is checked with statistical bars (relative error), never a loosened allclose.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sglang_rq.config import RQConfig
from sglang_rq.layout import ModelKVShape, loop_segments
from sglang_rq.reference import (
    FP8,
    decode,
    dequantize_groups,
    encode,
    fp8_round,
    pack_codes,
    quantize_groups,
    unpack_codes,
)
from sglang_rq.rotation import build_rotation, hadamard_matrix


def _loops(num_loops, t, h, d, seed=0, corr=0.9):
    """Loop vectors correlated like a looped model's (each loop = scaled last loop + noise)."""
    g = torch.Generator().manual_seed(seed)
    last = torch.randn(t, h, d, generator=g)
    loops = [(0.5 + 0.5 * torch.rand(t, h, 1, generator=g)) * last * corr
             + (1 - corr) * torch.randn(t, h, d, generator=g) for _ in range(num_loops - 1)]
    return torch.stack(loops + [last])


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_pack_unpack_is_exact(bits):
    codes = torch.randint(0, 1 << bits, (7, 3, 96), dtype=torch.uint8)
    packed = pack_codes(codes, bits=bits)
    assert packed.shape == (7, 3, 96 * bits // 8)
    assert torch.equal(unpack_codes(packed, bits=bits), codes)


def test_pack_layout_matches_hand_example():
    # INT4: element 0 in the low nibble, element 1 in the high nibble.
    assert pack_codes(torch.tensor([[3, 10]], dtype=torch.uint8), bits=4).item() == 3 + 10 * 16
    # INT2: four codes per byte, element j at bit 2j.
    assert pack_codes(torch.tensor([[1, 2, 3, 0]], dtype=torch.uint8), bits=2).item() == 1 + 2 * 4 + 3 * 16


def test_bad_bits_and_codes_are_refused_not_wrapped():
    codes = torch.tensor([[1, 2, 3, 0]], dtype=torch.uint8)
    for bits in (0, 3, 16):
        with pytest.raises(ValueError, match="bits must be 1, 2, 4 or 8"):
            pack_codes(codes, bits=bits)
        with pytest.raises(ValueError, match="bits must be 1, 2, 4 or 8"):
            quantize_groups(torch.randn(2, 32), bits=bits, group_size=32)
    with pytest.raises(ValueError, match="unpack|bits must be"):
        unpack_codes(codes, bits=3)
    # 5 does not fit 2 bits: packed it spilled into the next code ([[1, 1, 0, 0]] unpacked)
    with pytest.raises(ValueError, match="a code is 5, above the 3"):
        pack_codes(torch.tensor([[5, 0, 0, 0]], dtype=torch.uint8), bits=2)
    # -1 as int64 packed to 255 (all four codes 3); 1.7 truncated to 1
    for bad in (torch.tensor([[-1, 0, 0, 0]]), torch.tensor([[1.7, 0, 0, 0]])):
        with pytest.raises(ValueError, match="codes must be uint8"):
            pack_codes(bad, bits=2)
    with pytest.raises(ValueError, match="3 codes of 2 bits do not fill whole bytes"):
        pack_codes(torch.tensor([[1, 2, 3]], dtype=torch.uint8), bits=2)
    with pytest.raises(ValueError, match="head_dim 48 is not a multiple of group_size 32"):
        quantize_groups(torch.randn(2, 48), bits=2, group_size=32)


def test_encode_refuses_a_loop_count_other_than_the_segments():
    cfg = RQConfig()
    segs = loop_segments(ModelKVShape(num_layers=1, num_loops=4, num_kv_heads=2, head_dim=64), cfg)
    with pytest.raises(ValueError, match="x_loops holds 6 loops, segments describe 4"):
        encode(_loops(6, 3, 2, 64), segments=segs, cfg=cfg, rotation=None)


def test_fp8_round_directions_and_grid():
    x = torch.cat([torch.randn(5000) * 10, torch.tensor([0.0, 1e-6, -1e-6, 447.9, -447.9, 0.3])])
    down, up = fp8_round(x, direction="down"), fp8_round(x, direction="up")
    assert torch.all(down <= x) and torch.all(up >= x)
    assert torch.equal(down.to(FP8).float(), down) and torch.equal(up.to(FP8).float(), up)
    # Neighbouring grid points: nothing representable strictly between down and x.
    assert torch.all((down == x) | (down.to(FP8).float() < x))
    assert fp8_round(torch.tensor([0.3]), direction="down").item() == 0.28125  # e4m3 grid near 0.3
    assert fp8_round(torch.tensor([0.3]), direction="up").item() == 0.3125


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_group_quantization_error_bound(bits):
    g = torch.Generator().manual_seed(100 + bits)
    x = torch.randn(13, 5, 64, generator=g) * torch.linspace(0.1, 20, 64)  # very different ranges
    q, s, m = quantize_groups(x, bits=bits, group_size=32)
    assert q.max() <= (1 << bits) - 1
    xh = dequantize_groups(q, s, m, group_size=32)
    # Half a step, plus float32 rounding: (x - m)/s is computed with relative error <= 2u and
    # m + s*q adds <= 2u(|m| + |s*q|), u = 2^-24 (eps = 2u). Ties at .5 reach the bound exactly,
    # so a relative slack on s/2 alone is not enough at |x - m| ~ 20 (seen in CI, bits=8).
    m_el = m.repeat_interleave(32, dim=-1)
    bound = (s / 2).repeat_interleave(32, dim=-1)
    fp_slack = 2 * torch.finfo(torch.float32).eps * (x.abs() + m_el.abs() + xh.abs())
    assert torch.all((x - xh).abs() <= bound + fp_slack)


@pytest.mark.parametrize("value", [0.0, 1.0, -2.0, 0.5, 3.5])
def test_constant_groups_reconstruct_exactly(value):
    x = torch.full((4, 2, 64), value)
    q, s, m = quantize_groups(x, bits=2, group_size=32)
    assert torch.all(s == 0)
    out = dequantize_groups(q, s, m, group_size=32)
    assert torch.isfinite(out).all() and torch.equal(out, x)


def test_zero_and_constant_tokens_survive_the_full_codec():
    cfg = RQConfig()
    shape = ModelKVShape(1, 4, 2, 64)
    segs = loop_segments(shape, cfg)
    rot = build_rotation(cfg, num_layers=1, num_kv_heads=2, head_dim=64)[0]
    x = torch.zeros(4, 3, 2, 64)
    x[:, 1] = 1.0  # constant token
    stored = encode(x, segments=segs, cfg=cfg, rotation=rot)
    for loop in range(4):
        y = decode(stored, loop, segments=segs, cfg=cfg, rotation=rot, head_dim=64)
        assert torch.isfinite(y).all()
        assert torch.equal(y[0], torch.zeros(2, 64))  # zero token exact
        assert (y[1] - 1.0).abs().max() < 0.02  # constant through a rotation: FP8/bf16 rounding only


def test_lsq_coefficient_is_the_projection_on_the_dequantized_anchor():
    cfg = RQConfig(rotation="none")
    shape = ModelKVShape(1, 2, 1, 32)
    segs = loop_segments(shape, cfg)
    x = _loops(2, 6, 1, 32)
    stored = encode(x, segments=segs, cfg=cfg, rotation=None)
    anchor = decode(stored, 1, segments=segs, cfg=cfg, rotation=None, head_dim=32)
    expected = ((x[0] * anchor).sum(-1) / (anchor * anchor).sum(-1)).to(torch.bfloat16)
    assert torch.equal(stored[0].coef, expected)


def test_default_format_round_trip_error():
    cfg = RQConfig()
    shape = ModelKVShape(1, 4, 3, 128)
    segs = loop_segments(shape, cfg)
    rot = build_rotation(cfg, num_layers=1, num_kv_heads=3, head_dim=128)[0]
    x = _loops(4, 97, 3, 128)
    stored = encode(x, segments=segs, cfg=cfg, rotation=rot)
    errs = []
    for loop in range(4):
        y = decode(stored, loop, segments=segs, cfg=cfg, rotation=rot, head_dim=128)
        errs.append(((y - x[loop]).norm() / x[loop].norm()).item())
    # INT4 anchor of Gaussian data: ~10% relative error; residual loops stay close to it because
    # the 2-bit residual only carries the part the scaled anchor misses.
    assert errs[3] < 0.12
    assert all(e < 0.15 for e in errs[:3]), errs
    # Without the residual (0 bits, c * anchor) the earlier loops are clearly worse.
    shared = dataclasses.replace(cfg, residual_bits=0)
    ss = loop_segments(shape, shared)
    st0 = encode(x, segments=ss, cfg=shared, rotation=rot)
    err0 = ((decode(st0, 0, segments=ss, cfg=shared, rotation=rot, head_dim=128) - x[0]).norm()
            / x[0].norm()).item()
    assert err0 > errs[0] * 1.2


@pytest.mark.parametrize("anchor", ["last", "first", "chained"])
@pytest.mark.parametrize("rotate_anchor", [True, False])
def test_every_anchor_variant_reconstructs(anchor, rotate_anchor):
    cfg = RQConfig(anchor=anchor, rotate_anchor=rotate_anchor, anchor_bits=8, residual_bits=8)
    shape = ModelKVShape(1, 4, 2, 64)
    segs = loop_segments(shape, cfg)
    rot = build_rotation(cfg, num_layers=1, num_kv_heads=2, head_dim=64)[0]
    x = _loops(4, 17, 2, 64)
    stored = encode(x, segments=segs, cfg=cfg, rotation=rot)
    for loop in range(4):
        y = decode(stored, loop, segments=segs, cfg=cfg, rotation=rot, head_dim=64)
        assert ((y - x[loop]).norm() / x[loop].norm()).item() < 0.02  # 8-bit everywhere


def test_bf16_loops_are_lossless_up_to_bf16():
    cfg = RQConfig(anchor_bits=16, residual_bits=16, rotation="none")
    shape = ModelKVShape(1, 4, 2, 64)
    segs = loop_segments(shape, cfg)
    x = _loops(4, 9, 2, 64)
    stored = encode(x, segments=segs, cfg=cfg, rotation=None)
    y = decode(stored, 3, segments=segs, cfg=cfg, rotation=None, head_dim=64)
    assert torch.equal(y, x[3].to(torch.bfloat16).float())


@pytest.mark.parametrize("d", [64, 96, 128])
def test_hadamard_is_orthogonal(d):
    h = hadamard_matrix(d)
    assert torch.allclose(h @ h.T, torch.eye(d), atol=1e-5)
    assert torch.allclose(h.abs(), torch.full_like(h, d**-0.5))


def test_signed_hadamard_differs_per_head_and_is_orthogonal():
    r = build_rotation(RQConfig(rotation="signed-hadamard", rotation_seed=3), num_layers=2,
                       num_kv_heads=2, head_dim=64)
    assert not torch.equal(r[0, 0], r[0, 1])
    assert torch.allclose(r[1, 1] @ r[1, 1].T, torch.eye(64), atol=1e-5)
