"""`sglang-rq calibrate`: learned rotations are orthogonal, load in the server's loader, and do
not increase the quantization objective they minimise."""

from __future__ import annotations

import math

import pytest
import torch

from sglang_rq.config import RQConfig
from sglang_rq.quality import calibrate
from sglang_rq.quality.data import data_dir_with
from sglang_rq.rotation import build_rotation, hadamard_matrix


def test_cayley_is_orthogonal_for_any_matrix():
    w = torch.randn(3, 24, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    r = calibrate.cayley(w)
    assert torch.allclose(r @ r.transpose(-1, -2), torch.eye(24, dtype=torch.float64).expand(3, 24, 24),
                          atol=1e-10)


def test_fake_quant_exact_on_grid_values():
    # a group holding 0..3 is exactly representable at 2 bits: scale 1, offset 0
    y = torch.tensor([[0.0, 1.0, 2.0, 3.0] * 8])
    assert torch.equal(calibrate.fake_quant(y, 2, 32), y)


def test_learned_rotation_orthogonal_and_no_worse_than_hadamard():
    g = torch.Generator().manual_seed(0)
    d = 32
    y = torch.randn(2, 256, d, generator=g)
    y[..., 3] *= 12.0  # an outlier channel, as in real keys
    targets = [(y, 2)]
    r0 = hadamard_matrix(d).expand(2, d, d).contiguous()
    learned = calibrate.learn_rotation(targets, r0, group_size=16, steps=30, lr=5e-3, log=lambda m: None)
    assert torch.allclose(learned @ learned.transpose(-1, -2), torch.eye(d).expand(2, d, d), atol=1e-4)
    assert calibrate.objective(targets, learned, 16) <= calibrate.objective(targets, r0, 16)


@pytest.mark.skipif(data_dir_with("gsm8k") is None,
                    reason="no data directory with gsm8k (SGLANG_RQ_DATA_DIR or ../shared/data)")
def test_calibrate_command_writes_a_loadable_rotation(tmp_path, capsys):
    out = tmp_path / "rot.safetensors"
    assert calibrate.main(["--windows", "2", "--window-tokens", "16", "--steps", "3",
                           "--out", str(out)]) == 0
    rot = build_rotation(RQConfig(rotation=str(out)), num_layers=4, num_kv_heads=4, head_dim=128)
    err = (rot @ rot.transpose(-1, -2) - torch.eye(128)).abs().max().item()
    assert err < 1e-4
    text = capsys.readouterr().out
    assert "calibrated" in text and "hadamard" in text
    # the held-out report is a relative error per loop: finite and below 1
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("calibrated"))
    mean = float(line.split("mean")[-1])
    assert math.isfinite(mean) and 0 < mean < 1


def test_calibrate_refuses_bad_output_name(tmp_path):
    with pytest.raises(SystemExit):
        calibrate.parse_args(["--out", str(tmp_path / "rot.pt")])
