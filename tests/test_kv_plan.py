"""`sglang_rq.kv_plan.plan_history` against the plan built by hand (per-request slot lists)."""

from __future__ import annotations

import pytest
import torch

from sglang_rq.kv_plan import kv_indices_capacity, plan_history


@pytest.mark.parametrize("hist", [[5, 0, 17, 1], [0], [33], []])
def test_plan_matches_concatenated_slot_lists(hist):
    gen = torch.Generator().manual_seed(len(hist))
    width = 40
    table = torch.randint(1, 10_000, (7, width), generator=gen, dtype=torch.int32)
    req = torch.randperm(7, generator=gen)[:len(hist)]
    kv_indptr = torch.full((len(hist) + 3,), -1, dtype=torch.int32)
    kv_indices = torch.full((kv_indices_capacity(len(hist), width),), -1, dtype=torch.int64)
    plan_history(table, req, torch.tensor(hist, dtype=torch.int64), kv_indptr, kv_indices)
    want = [table[int(r), :n].tolist() for r, n in zip(req, hist)]
    ptr = [0]
    for n in hist:
        ptr.append(ptr[-1] + n)
    assert kv_indptr[:len(hist) + 1].tolist() == ptr
    assert kv_indptr[len(hist) + 1:].tolist() == [-1, -1]  # beyond the batch: untouched
    assert kv_indices[:ptr[-1]].tolist() == [s for row in want for s in row]
    if ptr[-1] + 1 < kv_indices.numel() - 1:
        assert (kv_indices[ptr[-1]:-1] == -1).all()  # only the scratch slot takes padding


def test_capacity_is_whole_contexts_plus_scratch():
    assert kv_indices_capacity(3, 100) == 301
