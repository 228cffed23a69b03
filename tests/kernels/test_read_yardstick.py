"""`benchmarks.common.stream_reader`, the pure read behind the decode benchmarks' speed of light
(`read_roofline`): it must read every byte it is timed for, or the yardstick would be too fast.
Each program's output is checked against the largest int32 word of its block computed by torch;
sizes off the program block and off the 64-byte rounding."""

from __future__ import annotations

import pytest
import torch

from benchmarks.common import read_arms, stream_reader


@pytest.mark.parametrize("nbytes,block", [(64, 16), (4 * 1000 + 37, 64), (8192, 2048)])
def test_stream_reader_reads_every_word(nbytes, block, device):
    gen = torch.Generator().manual_seed(nbytes)
    # on the kernel's device (a CPU tensor given to the CUDA launch was refused: "Pointer
    # argument ... cpu tensor?", H100 12-06)
    buf = torch.randint(0, 256, (nbytes + 100,), generator=gen, dtype=torch.uint8).to(device)
    words = buf[:nbytes // 64 * 64].view(torch.int32)
    launch, out = stream_reader(buf, nbytes, (block, 1))
    launch()
    want = [int(words[i:i + block].max()) for i in range(0, words.numel(), block)]
    assert out.tolist() == want


def test_stream_reader_refuses_a_short_buffer():
    with pytest.raises(ValueError, match="shorter than 128"):
        stream_reader(torch.zeros(64, dtype=torch.uint8), 128, (16, 1))


def test_read_arms_name_each_shape_and_torch_sum():
    arms = read_arms(torch.zeros(1 << 16, dtype=torch.uint8), 1 << 16)
    assert set(arms) == {"triton_2048x4", "triton_4096x4", "triton_8192x8", "triton_16384x8",
                         "torch_sum"}
