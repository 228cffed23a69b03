"""The GPU-only PTX code->fp16 conversion (`rq_kernels.triton.common._ASM_INT*`) emulated on CPU.

The interpreter runs the plain-integer path, so the inline asm is only exercised on a GPU. This
test executes the asm text with a tiny emulator of the five PTX instructions it uses and checks
every input byte pattern against `sglang_rq.reference.unpack_codes` (centred by 2^(bits-1)).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from rq_kernels.triton import common
from sglang_rq.reference import unpack_codes


def _prmt(a: int, b: int, sel: int) -> int:
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        assert nib < 8, "sign-replicating selectors are not used"
        out |= src[nib] << (8 * i)
    return out


def _f16x2_sub(a: int, b: int) -> int:
    def halves(x):
        return np.array([x & 0xFFFF, x >> 16], dtype=np.uint16).view(np.float16)

    r = (halves(a) - halves(b)).astype(np.float16).view(np.uint16)
    return int(r[0]) | (int(r[1]) << 16)


def run_asm(text: str, inputs: list[int], n_out: int) -> list[int]:
    """Execute the asm body; ``$k`` are the ``n_out`` outputs then the inputs."""
    regs: dict[str, int] = {f"${n_out + i}": v for i, v in enumerate(inputs)}

    def val(tok: str) -> int:
        tok = tok.strip()
        return int(tok, 16) if tok.startswith("0x") else regs[tok]

    for line in text.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        a = [x.strip() for x in args.split(",")]
        if op == "mov.b32":
            regs[a[0]] = val(a[1])
        elif op == "and.b32":
            regs[a[0]] = val(a[1]) & val(a[2])
        elif op == "shr.u32":
            regs[a[0]] = (val(a[1]) & 0xFFFFFFFF) >> int(a[2])
        elif op == "prmt.b32":
            regs[a[0]] = _prmt(val(a[1]), val(a[2]), val(a[3]))
        elif op == "sub.f16x2":
            regs[a[0]] = _f16x2_sub(val(a[1]), val(a[2]))
        else:
            raise AssertionError(f"unexpected PTX op {op}")
    return [regs[f"${i}"] for i in range(n_out)]


@pytest.mark.parametrize("bits,asm,n_out", [(4, common._ASM_INT4, 4), (2, common._ASM_INT2, 8),
                                            (8, common._ASM_INT8, 2)])
def test_asm_conversion_matches_unpack(bits, asm, n_out):
    text = asm.value if hasattr(asm, "value") else asm
    assert re.search(r"\$\d", text)
    rng = np.random.default_rng(0)
    words = list(rng.integers(0, 2**32, size=64, dtype=np.uint64)) + [
        int.from_bytes(bytes([v, (v * 7) & 255, 255 - v, (v * 13) & 255]), "little")
        for v in range(256)]
    planes = 8 // bits if bits < 8 else 1
    for w in words:
        w = int(w)
        byts = torch.tensor(list(w.to_bytes(4, "little")), dtype=torch.uint8)
        want = unpack_codes(byts, bits=bits).to(torch.int32) - (1 << (bits - 1))  # [4*planes]
        regs = run_asm(text, [w], n_out)
        # output p (one per plane) holds the 4 input bytes' plane-p codes, 2 per register
        vals = np.array(regs, dtype=np.uint32).view(np.uint16).view(np.float16).astype(np.int32)
        got = vals.reshape(planes, 4)  # [plane, byte]
        exp = want.view(4, planes).T.numpy() if planes > 1 else want.view(1, 4).numpy()
        assert (got == exp).all(), f"bits={bits} word={w:#010x}: {got} != {exp}"

