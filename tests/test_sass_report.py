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
