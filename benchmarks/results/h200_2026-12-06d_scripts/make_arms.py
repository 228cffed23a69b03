"""Session 42: the fused merge's arms, written from main's rq_decode_tc.cu into arms/ (run from the
checkout root): acqrel (the arrival's atomic acquires itself, no separate fence in the last
arrival), chunk (a pair whose splits fit two merge rounds reduces them in one level), both."""
from pathlib import Path

SRC = Path("rq_kernels/csrc/rq_decode_tc.cu").read_text()
OUT = Path(__file__).resolve().parent / "arms"


def sub(s, old, new):
    assert s.count(old) == 1, old
    return s.replace(old, new)


def acqrel(s):
    s = sub(s, 'asm volatile("atom.release.gpu.global.inc.u32 %0, [%1], %2;\\n"',
            'asm volatile("atom.acq_rel.gpu.global.inc.u32 %0, [%1], %2;\\n"')
    return sub(s, '  if (old != (unsigned)(members - 1)) return false;\n  asm volatile("fence.acq_rel.gpu;\\n" ::: "memory");\n',
               '  if (old != (unsigned)(members - 1)) return false;\n')


def chunk(s):
    s = sub(s, "  const int C = A.merge_chunk;\n  reduce_rows(",
            "  const int C = used <= 2 * MERGE_U ? used : A.merge_chunk;\n  reduce_rows(")
    return sub(s, "    const int C = A.merge_chunk, c = split / C, chunks = (used + C - 1) / C;\n    const int slots = (A.num_splits + C - 1) / C;",
               "    const int C = used <= 2 * MERGE_U ? used : A.merge_chunk, c = split / C, chunks = (used + C - 1) / C;\n    const int slots = (A.num_splits + A.merge_chunk - 1) / A.merge_chunk;")


OUT.mkdir(exist_ok=True)
(OUT / "acqrel.cu").write_text(acqrel(SRC))
(OUT / "chunk.cu").write_text(chunk(SRC))
(OUT / "both.cu").write_text(chunk(acqrel(SRC)))
