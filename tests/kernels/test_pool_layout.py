"""`rq_kernels.view.scale_offset_storage`: the storage order of the FP8 (scale, offset) rows
(docs/kernels.md, "Pool layout"). Strides are derived by hand from the documented orders."""

from __future__ import annotations

import torch

from rq_kernels.view import scale_offset_storage


def test_head_major_where_rows_are_a_multiple_of_4_bytes():
    # 4 groups: 8-byte rows, stored [layers=2, 2, H=3, rows=5, 4, 2], read [2, 5, 2, 3, 4, 2]
    t = scale_offset_storage(2, 5, 3, 4, device="cpu")
    assert t.shape == (2, 5, 2, 3, 4, 2) and t.dtype == torch.uint8
    # storage strides (2*3*5*8, 3*5*8, 5*8, 8, 2, 1) = (240, 120, 40, 8, 2, 1), permuted
    assert t.stride() == (240, 8, 120, 40, 2, 1)
    assert t.untyped_storage().nbytes() == 2 * 5 * 2 * 3 * 8  # the bytes are unchanged
    # 2 groups (head_dim 64 at group 32): 4-byte rows, head-major too: storage [1, 2, 2, 7, 2, 2]
    # strides (2*2*7*4, 2*7*4, 7*4, 4, 2, 1) = (112, 56, 28, 4, 2, 1), permuted
    assert scale_offset_storage(1, 7, 2, 2, device="cpu").stride() == (112, 4, 56, 28, 2, 1)


def test_token_major_for_six_byte_rows():
    # 3 groups (head_dim 96 at group 32): the CUDA kernel needs a row stride that is a multiple
    # of 4, so [layers, rows, 2, H, 3, 2] contiguous: (5*2*3*6, 2*3*6, 3*6, 6, 2, 1)
    t = scale_offset_storage(2, 5, 3, 3, device="cpu")
    assert t.shape == (2, 5, 2, 3, 3, 2) and t.is_contiguous()
    assert t.stride() == (180, 36, 18, 6, 2, 1)


def test_row_moves_through_the_logical_view():
    t = scale_offset_storage(2, 6, 3, 4, device="cpu")
    assert not t.any()
    t.copy_(torch.randint(0, 256, t.shape, dtype=torch.uint8))
    before = t.clone(memory_format=torch.contiguous_format)  # a plain token-major copy
    src, dst = torch.tensor([1, 4]), torch.tensor([5, 2])
    t[:, dst] = t[:, src]  # as the pool's move_kv_cache does
    # rows 5 and 2 now hold rows 1 and 4; every other row is as it was
    assert torch.equal(t[:, 5], before[:, 1]) and torch.equal(t[:, 2], before[:, 4])
    for row in (0, 1, 3, 4):
        assert torch.equal(t[:, row], before[:, row])
