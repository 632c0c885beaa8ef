"""The bit packer of lsgd.compression.bitpack against an independent big-integer reference, and
LEAD's wire size (issue 22 item 6: 2^b + 1 levels take b + 1 bits, not the next power of two)."""

from __future__ import annotations

import math

import pytest
import torch

from lsgd.compression import bitpack
from lsgd.compression.bitpack import pack_bits, packed_nbytes, unpack_bits


def reference_pack(values: list[int], width: int) -> bytes:
    """The little-endian bit stream as one Python integer: value i at bit offset i * width."""
    stream = 0
    for i, v in enumerate(values):
        stream |= v << (i * width)
    return stream.to_bytes(math.ceil(len(values) * width / 8), "little")


@pytest.mark.parametrize("width", range(1, 17))
def test_round_trip_and_size_at_every_width(width):
    g = torch.Generator().manual_seed(width)
    top = (1 << width) - 1
    for n in (0, 1, 7, 8, 9, 61, 1000):
        values = torch.randint(0, top + 1, (n,), generator=g, dtype=torch.int64)
        if n >= 2:
            values[0], values[-1] = 0, top  # the extremes
        packed = pack_bits(values, width)
        assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(n * width / 8) == packed_nbytes(n, width)
        assert bytes(packed.tolist()) == reference_pack(values.tolist(), width)
        assert torch.equal(unpack_bits(packed, width, n), values)


def test_chunks_join_on_byte_boundaries(monkeypatch):
    monkeypatch.setattr(bitpack, "CHUNK", 16)  # many chunks, a ragged last one
    g = torch.Generator().manual_seed(0)
    for width in (1, 3, 5, 11, 16):
        values = torch.randint(0, 1 << width, (150,), generator=g)
        packed = pack_bits(values, width)
        assert bytes(packed.tolist()) == reference_pack(values.tolist(), width)
        assert torch.equal(unpack_bits(packed, width, 150), values)


def test_rejects_what_does_not_fit():
    with pytest.raises(ValueError, match="width"):
        pack_bits(torch.zeros(3, dtype=torch.int64), 17)
    with pytest.raises(ValueError, match=r"\[0, 8\)"):
        pack_bits(torch.tensor([0, 8]), 3)
    with pytest.raises(ValueError, match=r"\[0, 8\)"):
        pack_bits(torch.tensor([-1, 2]), 3)
    with pytest.raises(ValueError, match="need 2 uint8 bytes"):
        unpack_bits(torch.zeros(1, dtype=torch.uint8), 3, 5)


@pytest.mark.parametrize("bits", range(1, 16))
def test_lead_levels_take_b_plus_1_bits(bits):
    """2^b + 1 levels need ceil(log2(2^b + 1)) = b + 1 bits: b = 2 sends 3 bits a value (it sent 4),
    b = 4 five (it sent 8); the quantizer's levels round-trip through the packer at that width."""
    from lsgd.algorithms.gossip.lead import packed_bits, quantize

    assert packed_bits(bits) == math.ceil(math.log2(2**bits + 1)) == bits + 1
    v = torch.linspace(-1.0, 1.0, 101, dtype=torch.float64)
    levels, norm = quantize(v, bits, torch.Generator().manual_seed(bits))
    offset = 2 ** (bits - 1)
    assert int(levels.min()) == -offset and int(levels.max()) == offset  # both end levels occur
    packed = pack_bits(levels + offset, packed_bits(bits))
    assert packed.numel() == math.ceil(101 * (bits + 1) / 8)
    assert torch.equal(unpack_bits(packed, packed_bits(bits), 101) - offset, levels)
