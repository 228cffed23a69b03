"""`rq_kernels._host.launch_kernel`'s cache key: it must separate every pair of arguments Triton
compiles different variants for (triton/backends/compiler.py: a tensor's dtype and 16-byte
alignment; an int's equality to 1, divisibility by 16 and width), and must not grow with values
that change every forward (row counts). The launches themselves are checked on the GPU
(test_extend_workspace.py::test_reconstruct_output_alignment)."""

from __future__ import annotations

import torch

from rq_kernels._host import _arg_key, launch_key
from rq_kernels.triton.reconstruct import rq_reconstruct_kernel


def test_tensors_keyed_by_dtype_and_alignment():
    buf = torch.zeros(64, dtype=torch.bfloat16)
    assert buf.data_ptr() % 16 == 0
    assert _arg_key(buf) == _arg_key(buf[8:])  # 16 bytes on
    assert _arg_key(buf) != _arg_key(buf[1:])  # 2 bytes on
    assert _arg_key(buf) != _arg_key(buf.view(torch.int16))


def test_ints_keyed_by_the_classes_triton_specialises_on():
    assert _arg_key(17) == _arg_key(33) == _arg_key(2049)  # neither 1 nor a multiple of 16
    assert _arg_key(16) == _arg_key(2048)
    assert len({_arg_key(1), _arg_key(16), _arg_key(17)}) == 3
    assert _arg_key(2**31 - 1) != _arg_key(2**31)  # i32 vs i64
    assert _arg_key(True) != _arg_key(1)
    assert len({_arg_key(n) for n in range(2, 100_000)}) == 2  # row counts add no entries


def test_tuples_keyed_by_their_items():
    a = torch.zeros(16, dtype=torch.bfloat16)
    assert _arg_key((a, 16)) == _arg_key((a[8:], 32))
    assert _arg_key((a, 16)) != _arg_key((a[1:], 16))


def test_positional_constexprs_keyed_by_value():
    # rq_reconstruct_kernel takes each pool tensor's head stride as a positional constexpr; a
    # head-major view's is rows x bytes, so two views of other row counts need two kernels
    # (one key would reuse the first pool's stride: out-of-bounds reads on the second)
    def args(head_stride):
        return (0, 64, 0, 4096, 128, 64, 0, 8, 131072, head_stride)
    a, b = (launch_key(rq_reconstruct_kernel, args(h), {"D": 128}, {}, 0) for h in (16, 131088))
    assert a != b
    assert a == launch_key(rq_reconstruct_kernel, args(16), {"D": 128}, {}, 0)
    # runtime ints stay keyed by class: a row count adds no entry
    assert (launch_key(rq_reconstruct_kernel, (0, 17) + args(16)[2:], {}, {}, 0)
            == launch_key(rq_reconstruct_kernel, (0, 33) + args(16)[2:], {}, {}, 0))
