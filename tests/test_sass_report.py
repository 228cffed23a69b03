"""`benchmarks.sass_report._loop_stats` on hand-written SASS: which loop it counts."""

from __future__ import annotations

from benchmarks.sass_report import _loop_stats

# an outer loop (0x0000-0x00a0) around an inner loop holding the MMAs (0x0020-0x0060) and code
# after it (the tc kernel's merge sits in the outer region this way)
SASS = """
        /*0000*/                   IADD3 R1, R1, 0x1, RZ ;
        /*0010*/                   LOP3.LUT R2, R1, 0xf, RZ, 0xc0, !PT ;
        /*0020*/                   LOP3.LUT R3, R2, 0xf000f, R4, 0xea, !PT ;
        /*0030*/                   HMMA.16816.F32 R8, R3, R6, R8 ;
        /*0040*/                   IMMA.16832.S8.S8 R12, R3, R6, R12 ;
        /*0050*/                   ISETP.GE.AND P0, PT, R1, R5, PT ;
        /*0060*/               @P0 BRA 0x20 ;
        /*0070*/                   FADD.FTZ R9, R8, R12 ;
        /*0080*/                   SHFL.BFLY PT, R10, R9, 0x1, 0x1f ;
        /*0090*/                   ISETP.GE.AND P1, PT, R1, R7, PT ;
        /*00a0*/               @P1 BRA 0x0 ;
        /*00b0*/                   EXIT ;
"""


def test_largest_loop_by_default():
    st = _loop_stats(SASS)
    assert st["total"] == 12 and st["loop_total"] == 11  # 0x0000-0x00a0
    assert st["loop_ops"]["LOP3.LUT"] == 2 and st["loop_ops"]["BRA"] == 2


def test_mma_loop_is_the_smallest_region_holding_the_mmas():
    st = _loop_stats(SASS, mma_loop=True)
    assert st["loop_total"] == 5  # 0x0020-0x0060: LOP3, HMMA, IMMA, ISETP, BRA
    assert st["loop_ops"] == {"LOP3.LUT": 1, "HMMA.16816.F32": 1, "IMMA.16832.S8.S8": 1,
                              "ISETP.GE.AND": 1, "BRA": 1}


def test_cuda_only_report_puts_sources_side_by_side(tmp_path):
    """`--cuda-only` with two sources (the checkout's kernel and a copy of it): every variant of
    the Ouro shape once per source, in the same order, the copy's loops equal to the original's
    (the same text compiles to the same cubin), the served COOP (16 KV heads in whole CTAs) and
    the tile loop found (it holds the 16 HMMA and 8 IMMA of the residual loop's V and K sides)."""
    import pytest

    from rq_kernels import cuda
    from rq_kernels.decode_tc import OCCUPANCY, SOURCE

    if cuda.nvcc_path() is None and cuda.nvrtc_path() is None:
        pytest.skip("neither nvcc nor NVRTC to compile the kernel")
    from benchmarks.sass_report import cuda_report

    copy = tmp_path / "copy.cu"
    copy.write_text((cuda.CSRC / SOURCE).read_text())
    rows = cuda_report(["ouro"], [None, str(copy)], str(tmp_path / "r.json"))
    per = 2 * len(OCCUPANCY[True])  # residual and anchor loops x occupancy shapes
    assert len(rows) == 2 * per
    for a, b in zip(rows[:per], rows[per:]):
        assert a["options"] == b["options"] and a["options"]["COOP"] == 1
        assert a["loop_total"] == b["loop_total"] and a["registers"] == b["registers"]
        assert b["source"] == str(copy)
    residual = rows[0]
    assert residual["path"] == "decode residual" and residual["options"]["SUBT"] == 1
    assert residual["loop_ops"].get("HMMA.16816.F32") == 16
    assert residual["loop_ops"].get("IMMA.16832.U8.S8") == 8
