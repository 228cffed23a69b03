"""`benchmarks.bench_decode.placed_rows`: where a request's history lies in the pool (the row
placements the decode benchmark times). Expected rows are written out by hand."""

from __future__ import annotations

import pytest
import torch

from benchmarks.bench_decode import PLACEMENTS, placed_rows


def test_consecutive_and_interleaved_rows():
    # two requests of 3 tokens: request 0 on rows 1-3, request 1 on rows 4-6
    assert placed_rows([3, 3], 10, "consecutive").tolist() == [1, 2, 3, 4, 5, 6]
    # decoded side by side: token j of request i at 1 + 2j + i
    assert placed_rows([3, 3], 10, "interleaved").tolist() == [1, 3, 5, 2, 4, 6]


def test_pages_of_16_are_whole_aligned_runs():
    lens = [40, 17]  # 3 + 2 pages of 16 rows
    rows = placed_rows(lens, 1 + 16 * 8, "pages16").cpu()
    assert rows.shape == (57,) and len(set(rows.tolist())) == 57 and int(rows.min()) >= 1
    for start, n in ((0, 40), (40, 17)):
        r = rows[start:start + n]
        for p in range(0, n, 16):
            page = r[p:p + 16]
            # each page: consecutive rows starting at 1 + 16k
            assert (page[0] - 1) % 16 == 0
            assert torch.equal(page, page[0] + torch.arange(len(page)))


def test_scattered_rows_are_distinct_and_in_range():
    rows = placed_rows([100, 50], 400, "scattered").cpu()
    assert len(set(rows.tolist())) == 150 and 1 <= int(rows.min()) and int(rows.max()) < 400
    assert not torch.equal(rows, torch.arange(1, 151))


def test_placement_errors_name_the_problem():
    with pytest.raises(ValueError, match="pages of 16 do not fit"):
        placed_rows([17, 17], 40, "pages16")  # 34 rows fit, 4 pages do not
    with pytest.raises(ValueError, match="equal lengths"):
        placed_rows([3, 4], 20, "interleaved")
    with pytest.raises(ValueError, match="unknown placement"):
        placed_rows([3], 20, "diagonal")
    with pytest.raises(ValueError, match="do not fit"):
        placed_rows([30], 20, "consecutive")
    assert PLACEMENTS[0] == "consecutive"
