"""The clock settlement's payload carried in a SUM all-reduce (lsgd.comm.settlement.CarriedSettlement):
float64 values through float32 (and other float) chunks, exact bit for bit, and the one-hot block
whose SUM over ranks is the all-gather."""

from __future__ import annotations

import contextlib
import struct
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lsgd.comm.settlement import CarriedSettlement, chunk_type, join_float64, split_float64

EDGES = [0.0, -0.0, 1.0, -1.0, 0.1, 1 / 3, 2.0 ** 53 - 1, 2.0 ** 53, 9_007_199_254_740_993.0, 1e-300,
         5e-324, 2.2250738585072014e-308, 2.2250738585072009e-308, 1e-40, 2.0 ** -97, 3.4e38, 1e300,
         np.finfo(np.float64).max, np.nextafter(1.0, 2.0), np.nextafter(1.0, 0.0), 86_400.123456789012,
         float("inf"), float("-inf"), 202.0, 123.456e-9]


def bits_of(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


@pytest.mark.parametrize("dtype, width", [(torch.float32, 16), (torch.float64, 32), (torch.float16, 8),
                                          (torch.bfloat16, 8)])
def test_split_is_exact_for_every_bit_pattern_through_the_dtype(dtype, width):
    """Edge values (signed zeros, subnormals, the float32 range's ends, 2**53 +- 1, infinities,
    NaN) and random bit patterns: each piece survives the conversion to ``dtype`` and back, and
    the join gives the same 64 bits."""
    chunk = chunk_type(dtype)
    assert chunk == np.dtype(f"uint{width}")
    rng = np.random.default_rng(0)
    patterns = rng.integers(0, 2**64, size=2000, dtype=np.uint64, endpoint=False)
    values = np.concatenate([np.array(EDGES + [float("nan")]), patterns.view(np.float64)])
    split = split_float64(values, chunk)
    assert split.shape == (values.size, 64 // width)
    through = torch.from_numpy(split.astype(np.float64)).to(dtype).to(torch.float64).numpy()
    assert np.array_equal(through, split)  # every piece is exact in dtype
    back = join_float64(through, chunk)
    assert [bits_of(x) for x in back] == [bits_of(x) for x in values]
    # the pieces are the pattern's own bits, least significant first (little-endian memory order)
    x = 1 / 3
    want = [(bits_of(x) >> (width * i)) & ((1 << width) - 1) for i in range(64 // width)]
    assert split_float64(np.array([x]), chunk)[0].tolist() == want


def test_chunk_type_needs_a_real_float():
    for dtype in (torch.int32, torch.complex64):
        with pytest.raises(ValueError, match="floating-point"):
            chunk_type(dtype)


def test_join_refuses_chunks_that_changed():
    u16 = np.dtype(np.uint16)
    for bad in (0.5, 2.0 ** 16, -1.0, float("nan")):
        with pytest.raises(ValueError, match="changed"):
            join_float64(np.array([[bad, 0.0, 0.0, 0.0]]), u16)
    assert join_float64(np.array([[0.0, 0.0, 0.0, 16368.0]]), u16).tolist() == [1.0]  # 0x3FF0 << 48


class _Comm:
    """What CarriedSettlement reads of its communicator: rank, world size, the blocked-time
    region; no exchange."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        self._s = SimpleNamespace(blocked=SimpleNamespace(region=contextlib.nullcontext))

    def _all_gather_payload(self, payload):
        raise AssertionError("no explicit exchange expected")


class _Done:
    """A completed future (the carrier's all-reduce)."""

    def done(self):
        return True

    def wait(self):
        return None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_sum_of_the_ranks_blocks_is_their_all_gather(dtype):
    """Each rank's block holds its payload's chunks in its own slot and +0.0 elsewhere; the
    elementwise SUM over 3 ranks (summed in float32 / float16, in two orders) decodes to every
    rank's payload: the all-gather, exactly."""
    p, rng = 3, np.random.default_rng(1)
    payloads = [np.concatenate([rng.random(6) * 1e3, [float(r), 203.0]]) for r in range(p)]
    blocks = [CarriedSettlement(_Comm(r, p), payloads[r]).block(dtype) for r in range(p)]
    assert all(b.dtype == dtype and b.numel() == p * 8 * 8 // chunk_type(dtype).itemsize for b in blocks)
    for order in ([0, 1, 2], [2, 0, 1]):
        total = torch.zeros_like(blocks[0])
        for r in order:
            total += blocks[r]
        mine = CarriedSettlement(_Comm(1, p), payloads[1])
        mine.block(dtype)  # rank 1's block went into the sum (sets its piece type)
        mine.ride(total, _Done())
        got = mine.gathered()
        assert got.shape == (p, 8)
        assert [bits_of(x) for x in got.reshape(-1)] == [bits_of(x) for x in np.stack(payloads).reshape(-1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_write_puts_the_block_into_the_carriers_tail(dtype):
    payload = np.array([0.25, 1e-310, 7.0, 203.0])
    settlement = CarriedSettlement(_Comm(2, 3), payload)
    carrier = torch.full((5 + settlement.block(dtype).numel(),), 9.0, dtype=dtype)
    settlement.write(carrier[5:])
    assert torch.equal(carrier[5:], settlement.block(dtype)) and torch.equal(carrier[:5], torch.full((5,), 9.0, dtype=dtype))


def test_a_failing_rank_makes_no_exchange():
    """Read while an exception is handled (a failing rank writing its summary), an unshipped
    settlement does not start the all-gather its peers are not in: this rank's own values."""
    payload = np.array([1.5, 2.5, 0.0])
    settlement = CarriedSettlement(_Comm(0, 4), payload)
    try:
        raise RuntimeError("rank 0 failed")
    except RuntimeError:
        assert sys.exc_info()[0] is RuntimeError
        got = settlement.gathered()
    assert got.tolist() == [payload.tolist()]
    with pytest.raises(AssertionError, match="no explicit exchange"):
        settlement.gathered()  # outside the handler: the exchange (a collective) is made


class _Failed:
    """The carrier's all-reduce failed (a peer died)."""

    def done(self):
        return True

    def wait(self):
        raise RuntimeError("Connection closed by peer")


def test_a_failing_rank_does_not_read_a_failed_carrier():
    payload = np.array([1.5, 2.5])
    settlement = CarriedSettlement(_Comm(0, 2), payload)
    tail = torch.zeros(settlement.block(torch.float32).numel())
    settlement.write(tail)
    settlement.ride(tail, _Failed())
    try:
        raise RuntimeError("the step failed")
    except RuntimeError:
        assert settlement.gathered().tolist() == [payload.tolist()]
    with pytest.raises(RuntimeError, match="Connection closed"):
        settlement.gathered()
