"""The CUDA tensor-core split kernel without a GPU: its host-side mirror of the argument struct and
shared-memory stage agree with the CUDA source, and every variant the launcher can request
compiles (NVRTC, sm_90; skipped where libnvrtc is absent). Its numerics are tested against the
PyTorch twin on a GPU (`test_decode.py::test_decode_tc_kernel`)."""

from __future__ import annotations

import ctypes
import itertools
import os
import re

import pytest

from rq_kernels import cuda
from rq_kernels.decode_tc import (
    HEAD_DIMS, OCCUPANCY, SOURCE, WARPS, _Args, coop_small_bytes, integer_k, stage_bytes,
    stream_shape, tc_occupancy, tc_plan, width,
)

TEXT = (cuda.CSRC / SOURCE).read_text()


def _struct_fields(text: str, name: str) -> list[tuple[str, str]]:
    """(C type, member) of ``struct name`` in declaration order."""
    body = re.search(rf"struct {name} \{{(.*?)\n\}};", text, re.S).group(1)
    fields = []
    for decl in re.sub(r"//[^\n]*", "", body).split(";"):
        decl = decl.strip()
        if not decl:
            continue
        m = re.match(r"((?:const )?\w+\s*\*?)\s*(.*)", decl)
        ctype = m.group(1).replace(" ", "")
        fields += [(ctype, n.strip()) for n in m.group(2).split(",")]
    return fields


def test_argument_struct_mirror_matches_the_cuda_source():
    c_fields = _struct_fields(TEXT, "Args")
    py_fields = _Args._fields_
    assert [n for _, n in c_fields] == [n for n, _ in py_fields]
    kinds = {"int64_t": ctypes.c_int64, "float": ctypes.c_float, "int": ctypes.c_int32}
    for (ctype, name), (_, pytype) in zip(c_fields, py_fields):
        want = ctypes.c_void_p if ctype.endswith("*") else kinds[ctype]
        assert pytype is want, f"{name}: C {ctype} vs ctypes {pytype}"


def _eval_macro(name: str, env: dict, coop: bool = False) -> int:
    """The source's macro ``name`` expanded with ``env`` (the -D defines) and evaluated (C's
    ``a ? b : c`` as Python's conditional)."""
    defs = dict(re.findall(r"^#define (\w+) (.+?)\s*(?://.*)?$", TEXT, re.M))
    if coop:  # the COOP branch's definitions (the last definition of each name is the other's)
        branch = re.search(r"^#if COOP\n(.*?)^#else", TEXT, re.M | re.S).group(1)
        defs.update(re.findall(r"^#define (\w+) (.+?)\s*(?://.*)?$", branch, re.M))
    expr = name
    for _ in range(10):  # expand macros
        expr = re.sub(r"\b([A-Z_]+)\b", lambda m: str(env.get(m.group(1), defs.get(
            m.group(1), m.group(1)))), expr)
    expr = re.sub(r"\(([^()?]+)\?([^():]+):([^()]+)\)", r"((\2) if (\1) else (\3))", expr)
    return int(eval(expr))  # noqa: S307 - arithmetic on the source's own macros


def test_stage_bytes_mirror_matches_the_cuda_source():
    """STAGE_BYTES and D of the source, evaluated for each bit pair and head_dim, equal
    `stage_bytes` and `width`."""
    for hd, (a, r) in itertools.product(HEAD_DIMS, ((4, 2), (4, 0), (4, 4), (2, 2), (2, 0))):
        env = dict(HEAD_DIM=hd, A_BITS=a, R_BITS=r, GS=32)
        assert _eval_macro("D", env) == width(hd)
        assert _eval_macro("STAGE_BYTES", env) == stage_bytes(a, r, hd)
        env["WARPS"] = WARPS
        for gs in (32, 64) if hd == 128 else (32,):
            if hd == 96:
                continue  # no COOP at head_dim 96
            env["GS"] = gs
            assert _eval_macro("STAGE_BYTES", env, coop=True) == stage_bytes(a, r, hd, coop=True)
            assert _eval_macro("SMALL_BYTES", env, coop=True) == coop_small_bytes(hd, gs)


VARIANTS = [dict(HEAD_DIM=hd, A_BITS=a, R_BITS=r, GS=gs, GQ=gq, HAS_COEF=coef, WARPS=WARPS,
                 KINT=int(integer_k(gq, hd, gs)), MINB=minb, STAGES=stages, SUBT=subt, COOP=coop,
                 STREAM=int(stream_shape(hd, (a, r), bool(coop))))
            for hd, a, r, gs, gq, coef, coop in itertools.product(
                HEAD_DIMS, (2, 4), (0, 2, 4), (32, 64), (1, 2, 3, 4), (0, 1), (0, 1))
            for minb, stages, subt in OCCUPANCY[integer_k(gq, hd, gs)]
            if hd % gs == 0 and width(hd) // gs >= 2 and gq * width(hd) // gs <= 8
            and not (coef and r == 0 and a == 2) and not (coop and hd == 96)]
# every fifth, the last, and the shapes of SmolLM2 (64, GQA 3), Huginn (96, MHA) and Ouro (128,
# MHA, COOP) in the default format (4-bit anchor, 2-bit residual with LSQ coefficients) and
# anchor-only
SHAPES = [d for d in VARIANTS if (d["HEAD_DIM"], d["GQ"], d["COOP"]) in (
              (64, 3, 0), (96, 1, 0), (128, 1, 1))
          and d["GS"] == 32 and d["A_BITS"] == 4 and d["R_BITS"] in (0, 2)
          and d["HAS_COEF"] == int(d["R_BITS"] > 0)]


def test_the_variants_cover_every_head_dim():
    assert {d["HEAD_DIM"] for d in VARIANTS[::5]} == set(HEAD_DIMS)
    assert len(SHAPES) == 3 * 2 * 2  # (wide, narrow) shape each
    assert {d["KINT"] for d in SHAPES} == {0, 1}
    assert {d["STREAM"] for d in VARIANTS[::5] + SHAPES} == {0, 1}


@pytest.mark.skipif(cuda.nvrtc_path() is None, reason="libnvrtc not installed")
@pytest.mark.parametrize(
    "defines", VARIANTS[::5] + [VARIANTS[-1]] + SHAPES,
    ids=lambda d: "d{HEAD_DIM}a{A_BITS}r{R_BITS}g{GS}q{GQ}c{HAS_COEF}k{KINT}m{MINB}t{SUBT}o{COOP}s{STREAM}".format(
        **d))
def test_every_requested_variant_compiles(defines):
    cubin = cuda.compile_nvrtc(TEXT, SOURCE, defines, "sm_90")
    assert cubin[:4] == b"\x7fELF"


@pytest.mark.skipif(cuda.nvrtc_path() is None, reason="libnvrtc not installed")
def test_a_failing_nvcc_falls_back_to_nvrtc_and_the_cubin_is_cached(tmp_path, monkeypatch):
    """An nvcc that cannot build the kernel (e.g. too old for the GPU) is not fatal: NVRTC builds
    it; the second request reads the cache."""
    fake = tmp_path / "cuda" / "bin" / "nvcc"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho 'nvcc fatal : Unsupported gpu architecture' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert cuda.nvcc_path() == str(fake)
    cubin = cuda._compile(TEXT, SOURCE, VARIANTS[0], "sm_90")  # noqa: SLF001
    assert cubin[:4] == b"\x7fELF"
    assert len(list((tmp_path / "cache" / "rq_kernels").glob("*.cubin"))) == 1
    monkeypatch.setattr(cuda, "compile_nvrtc", None)  # a cache hit compiles nothing
    assert cuda._compile(TEXT, SOURCE, VARIANTS[0], "sm_90") == cubin  # noqa: SLF001


@pytest.mark.skipif(cuda.nvcc_path() is None and cuda.nvrtc_path() is None,
                    reason="neither nvcc nor libnvrtc installed")
def test_the_cubin_is_the_texts_not_the_file_of_that_name(tmp_path, monkeypatch):
    """The cache is keyed by the text, so the compiler must build that text: a text that differs
    from csrc/SOURCE (here by an #error) fails, where compiling the file would have succeeded."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(RuntimeError, match="text_not_file"):
        cuda._compile("#error text_not_file\n" + TEXT, SOURCE, VARIANTS[0], "sm_90")  # noqa: SLF001
    assert not list((tmp_path / "cache" / "rq_kernels").glob("*.cu"))  # its copy removed


def test_no_working_compiler_is_an_error_naming_both(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))  # no bin/nvcc here
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(cuda, "nvcc_path", lambda: None)
    monkeypatch.setattr(cuda, "nvrtc_path", lambda: None)
    with pytest.raises(RuntimeError, match="nvcc not found; compiling rq_decode_tc.cu needs"):
        cuda._compile(TEXT, SOURCE, VARIANTS[0], "sm_90")  # noqa: SLF001


def test_integer_k_side_where_the_query_rows_fit_four_columns():
    """Query heads per KV head x groups per width (head_dim rounded up to 64 or 128) <= 4."""
    assert integer_k(1, 128, 32) and integer_k(1, 96, 32) and integer_k(2, 64, 32)
    assert integer_k(2, 128, 64) and integer_k(4, 64, 64)
    assert not integer_k(3, 64, 32) and not integer_k(2, 128, 32) and not integer_k(4, 128, 64)


def test_occupancy_shape_follows_the_wave():
    """The wide shape while two splits per (request, KV head) fit one wave, else the narrow one
    (2 CTAs). On 132 SMs a wave of 3-CTA programs (fp16 K side) is 4 * 3 * 132 = 1,584 warps,
    i.e. 792 units; of 4-CTA programs (integer K side) 4 * 4 * 132 = 2,112 warps, 1,056 units."""
    three, two = OCCUPANCY[False]
    four, two_i = OCCUPANCY[True]
    assert (three.ctas_per_sm, four.ctas_per_sm, two.ctas_per_sm, two_i.ctas_per_sm) == (3, 4, 2, 2)
    assert tc_occupancy(16 * 49, 132, False) == three  # 784 units
    assert tc_occupancy(792, 132, False) == three
    assert tc_occupancy(793, 132, False) == two
    assert tc_occupancy(16 * 64, 132, False) == two  # 64 x 8k: one split each
    assert tc_occupancy(16 * 64, 132, True) == four
    assert tc_occupancy(1056, 132, True) == four
    assert tc_occupancy(1057, 132, True) == two_i


def test_plan_fills_whole_waves():
    """`tc_plan` on 132 SMs (16 KV heads), times in tile times, derived by hand.

    fp16 K side (3-CTA wide shape, 396 CTAs at once): 55 x 16k: 880 pairs, so the 2-CTA shape
    (264 CTAs at once, 32-token iterations). One split each is 220 CTAs, one partly filled wave
    of 1,024 tiles (+ 2 overhead) = 1,026; six are 55 x 24 = 1,320 CTAs = 5 full waves of
    cdiv(2731, 32) = 86 iterations = 172 tiles: 5 x 174 = 870. 16 x 16k: six splits are 384
    CTAs <= 396, one wave; twelve need two waves of 86 + 2 (176 > 173), so the one-wave count
    stays. 1 x 8k: 86 splits read cdiv(8192, 86) = 96 tokens = 6 tiles (85 would read 97, 7
    tiles); up to 99 still 6 tiles in one wave of <= 396 CTAs, 100 need a second wave, so 86,
    the fewest. 64 x 8k: one split each is 256 of 264 CTAs. A forced count is returned with the
    shape.

    Integer K side (Ouro; 4-CTA wide shape, 528 CTAs at once): 16 x 16k: 8 splits are 512 CTAs,
    one wave of 128 tiles (cost 130; 7: 147 + 2; 9: two waves of 114 + 2). 1 x 8k: 128 splits
    (the most: 8192 / (4 x 16)) read 64 tokens = 4 tiles in one wave of 512 CTAs. 64 x 8k: 1,024
    pairs keep the wide shape; 2 splits are 512 CTAs, one wave of 256 tiles (258; 1: 514; 4: two
    waves of 128 + 2 = 260). 55 x 16k: 12 splits are 2,640 CTAs = 5 full waves of 86 tiles
    (5 x 88 = 440; 11: 5 x 96 = 480; 13: 6 x 81 = 486; 7: 3 x 149 = 447)."""
    three, two = OCCUPANCY[False]
    assert tc_plan(55, 16, 55 * 16384, 132, False) == (two, 6)
    assert tc_plan(16, 16, 16 * 16384, 132, False) == (three, 6)
    assert tc_plan(1, 16, 8192, 132, False) == (three, 86)
    assert tc_plan(64, 16, 64 * 8192, 132, False) == (two, 1)
    assert tc_plan(55, 16, 55 * 16384, 132, False, splits=3) == (two, 3)
    four, _ = OCCUPANCY[True]
    assert tc_plan(16, 16, 16 * 16384, 132, True) == (four, 8)
    assert tc_plan(1, 16, 8192, 132, True) == (four, 128)
    assert tc_plan(64, 16, 64 * 8192, 132, True) == (four, 2)
    assert tc_plan(55, 16, 55 * 16384, 132, True) == (four, 12)


def _cuda_header() -> str | None:
    """cuda.h of the CUDA driver API as shipped with Triton's NVIDIA backend (None if absent)."""
    import triton

    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "include",
                        "cuda.h")
    return path if os.path.exists(path) else None


def test_driver_launch_structs_match_cuda_h(tmp_path):
    """The ctypes mirrors `cuda._LaunchConfig` / `cuda._LaunchAttribute` (programmatic dependent
    launches through ``cuLaunchKernelEx``) have cuda.h's sizes and field offsets, and the
    attribute ids are cuda.h's: a C program compiled against the header prints them."""
    import shutil
    import subprocess

    header, cc = _cuda_header(), shutil.which("cc") or shutil.which("gcc")
    if header is None or cc is None:
        pytest.skip("needs a C compiler and Triton's cuda.h")
    src = tmp_path / "layout.c"
    src.write_text(
        '#include <stdio.h>\n#include <stddef.h>\n#include "cuda.h"\n'
        "int main(void) {\n"
        '  printf("%zu %zu %zu %zu %zu %zu %zu %d %d\\n", sizeof(CUlaunchConfig),\n'
        "    offsetof(CUlaunchConfig, sharedMemBytes), offsetof(CUlaunchConfig, hStream),\n"
        "    offsetof(CUlaunchConfig, attrs), offsetof(CUlaunchConfig, numAttrs),\n"
        "    sizeof(CUlaunchAttribute), offsetof(CUlaunchAttribute, value),\n"
        "    (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,\n"
        "    (int)CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT);\n"
        "  return 0;\n}\n")
    exe = tmp_path / "layout"
    subprocess.run([cc, "-I", os.path.dirname(header), str(src), "-o", str(exe)], check=True)
    got = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True,
                                          check=True).stdout.split()]
    C, A = cuda._LaunchConfig, cuda._LaunchAttribute
    assert got == [ctypes.sizeof(C), C.shared_bytes.offset, C.stream.offset, C.attrs.offset,
                   C.num_attrs.offset, ctypes.sizeof(A), A.value.offset,
                   cuda._PROGRAMMATIC_STREAM_SERIALIZATION,
                   cuda._PREFERRED_SHARED_MEMORY_CARVEOUT]
