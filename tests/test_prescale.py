"""`sglang_rq.prescale`: the calibration rule and that attention is unchanged by the prescale."""

from __future__ import annotations

import math

import torch

from sglang_rq.prescale import NORM_LIMIT, Prescale


def _attention(q, k, v):  # [T, H, D] each, MHA, causal over T
    return torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True).transpose(0, 1)


def test_calibration_picks_the_smallest_power_of_two_under_the_limit():
    ps = Prescale(num_blocks=2, num_kv_heads=2, device="cpu")
    k = torch.zeros(3, 2, 128)
    k[1, 0, 5] = 1e4  # head 0: norm 1e4 -> s = ceil(log2(1e4 / 112)) = ceil(6.48) = 7
    k[2, 1, 0] = 100.0  # head 1: norm 100 <= 112 -> s = 0
    v = torch.ones(3, 2, 128)  # norm sqrt(128) = 11.3 -> 0
    ps.calibrate(1, k, v)
    assert ps.factors[1].tolist() == [[128.0, 1.0], [1.0, 1.0]]
    assert ps.factors[0].tolist() == [[1.0, 1.0], [1.0, 1.0]]  # block 0 untouched
    assert 1e4 / 128 <= NORM_LIMIT < 1e4 / 64
    ps.calibrate(1, 10 * k, v)  # once only
    assert ps.factors[1, 0, 0].item() == 128.0
    assert math.log2(ps.factors[1, 0, 0].item()) == 7


def test_prescaled_attention_equals_plain_attention():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(6, 2, 64, generator=g) for _ in range(3))
    k[:, 0] *= 3e3
    v[:, 1] *= 5e3
    ps = Prescale(num_blocks=1, num_kv_heads=2, device="cpu")
    ps.calibrate(0, k, v)
    qs, ks, vs, out_factor = ps.apply(0, q, k, v)
    assert ks.norm(dim=-1).max() <= NORM_LIMIT and vs.norm(dim=-1).max() <= NORM_LIMIT
    got = _attention(qs, ks, vs) * out_factor
    torch.testing.assert_close(got, _attention(q, k, v), rtol=1e-5, atol=1e-2)
    kr, vr = ps.restore(0, ks, vs)  # powers of two: exact
    assert torch.equal(kr, k) and torch.equal(vr, v)


def test_prescale_after_graph_capture_stops_the_graphs_first():
    """A block that needs a factor after decode graphs were captured asks to turn graph replay off
    (once), then scales as without graphs; blocks within range never ask."""
    ps = Prescale(num_blocks=2, num_kv_heads=1, device="cpu")
    reasons: list[str] = []
    ps.graphs_captured(lambda why: reasons.append(why) or True)
    small = torch.ones(2, 1, 64)  # norm 8: no factor
    ps.calibrate(0, small, small)
    assert reasons == []
    k = torch.full((2, 1, 64), 1e3)  # norm 8e3 -> s = ceil(log2(8e3 / 112)) = 7
    ps.calibrate(1, k, small)
    assert len(reasons) == 1 and "layer 1" in reasons[0]
    q = torch.ones(2, 1, 64)
    assert ps.factors[1, 0, 0].item() == 128.0 and ps.apply(1, q, k, small)[3] is not None


def test_prescale_stays_off_when_graphs_cannot_be_stopped():
    ps = Prescale(num_blocks=2, num_kv_heads=1, device="cpu")
    ps.graphs_captured(lambda why: False)
    k = torch.full((2, 1, 64), 1e3)
    ps.calibrate(0, k, k)
    ps.calibrate(1, k, k)  # no block may scale while the unscaled graphs replay
    q = torch.ones(2, 1, 64)
    assert ps.apply(0, q, k, k)[3] is None and ps.apply(1, q, k, k)[3] is None
    assert ps.factors.eq(1).all()
