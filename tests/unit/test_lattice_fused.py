"""The lattice quantizer's fused numba loops (lsgd/compression/lattice_fused.py) against its torch
fast path, an independent implementation of the same float32 arithmetic (lsgd/compression/lattice.py):
the same payload bytes, checksum, lattice points, decode flags and random stream, bit for bit; the
checksum against its definition; and the torch path taken when numba is unavailable."""

from __future__ import annotations

import sys

import pytest
import torch

from lsgd.compression import lattice as L
from lsgd.compression.lattice import BITS, CHECKSUM_PRIME, LatticeQuantizer, lattice_checksum


def test_the_fused_loops_load():
    """numba is a dependency: its loops must compile (or load from the cache) here."""
    assert L.fused_kernels() is not None

# tiny, odd, one block exactly, one past it, several blocks with a tail (not multiples of 65521
# nor of the 1024-element stage)
SIZES = [1, 2, 3, 7, 1000, CHECKSUM_PRIME, CHECKSUM_PRIME + 1, 2 * CHECKSUM_PRIME + 77]


def both_paths(monkeypatch, fn):
    """``fn()`` with the fused loops, then with the torch path (numba's loops switched off)."""
    fused = fn()
    with monkeypatch.context() as m:
        m.setattr(L, "_FUSED", None)
        torch_path = fn()
    return fused, torch_path


def encode(quant, x, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    code, own = quant.encode(x, g, dtype=dtype)
    return code, own, torch.randint(0, 1 << 30, (4,), generator=g)  # where the stream went on


def same_code(a, b):
    (ca, pa, ra), (cb, pb, rb) = a, b
    return (ca.payload.dtype == cb.payload.dtype and torch.equal(ca.payload, cb.payload)
            and torch.equal(ca.checksum, cb.checksum) and ca.numel == cb.numel
            and pa.dtype == pb.dtype and torch.equal(pa, pb) and torch.equal(ra, rb))


@pytest.mark.parametrize("n", SIZES)
def test_fused_equals_the_torch_path_8_bits(monkeypatch, n):
    """Payload, checksum, points (float32 and float64) and the generator's state after the encode;
    decoded points and flags against references inside the safe radius and beyond it."""
    side = 1e-3
    quant = LatticeQuantizer(8, side)
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * 0.3
    reach = (quant.q / 2 - 1) * side
    inside = x + (torch.rand(n, generator=g) * 2 - 1) * reach * 0.999
    outside = inside.clone()
    outside[:: max(1, n // 5)] += 2 * reach  # some coordinates one radius too far: caught
    for dtype in (torch.float32, torch.float64):
        enc_f, enc_t = both_paths(monkeypatch, lambda: encode(quant, x, n + 1, dtype))
        assert same_code(enc_f, enc_t)
        code, own = enc_f[0], enc_f[1]
        for ref, expect_ok in ((inside, True), (outside, False)):
            (vf, okf), (vt, okt) = both_paths(monkeypatch, lambda: quant.decode(code, ref, dtype=dtype))
            assert okf == okt == expect_ok
            assert vf.dtype == vt.dtype == dtype and torch.equal(vf, vt)
            if expect_ok:
                assert torch.equal(vf, own)


@pytest.mark.parametrize("bits", [b for b in BITS if b != 8])
def test_fused_equals_the_torch_path_other_bits(monkeypatch, bits):
    side = 0.0123
    quant = LatticeQuantizer(bits, side)
    for n in (1, 5, 1001, CHECKSUM_PRIME + 3):  # 1001, 65524: not multiples of the lanes per byte
        g = torch.Generator().manual_seed(bits * n)
        x = torch.randn(n, generator=g)
        enc_f, enc_t = both_paths(monkeypatch, lambda: encode(quant, x, n, torch.float32))
        assert same_code(enc_f, enc_t)
        reach = max(0.0, quant.q / 2 - 1.0) * side * 0.999
        ref = x + (torch.rand(n, generator=g) * 2 - 1) * reach
        ref[n // 2] += quant.q * side * 1.5  # beyond the radius: the decode of that one is off by q
        (vf, okf), (vt, okt) = both_paths(monkeypatch, lambda: quant.decode(enc_f[0], ref, dtype=torch.float32))
        assert okf == okt is False and torch.equal(vf, vt)


def test_fused_checksum_is_the_definition():
    """The sums accumulated in the loop equal lattice_checksum of the integers s k (whose float64
    product and int64 reduction tests/unit/test_compression_fastpaths.py holds to the definition)."""
    side = 1e-3
    quant = LatticeQuantizer(8, side)
    x = torch.randn(2 * CHECKSUM_PRIME + 11, generator=torch.Generator().manual_seed(3)) * 0.3
    code, own = quant.encode(x, torch.Generator().manual_seed(4), dtype=torch.float64)
    k = torch.round(own / side).long()
    assert torch.equal(code.checksum, lattice_checksum(k))
    assert torch.equal(code.payload, k.remainder(256).to(torch.uint8))


def test_out_of_range_takes_the_float64_path_with_the_same_stream(monkeypatch):
    """|x / s| >= 2**20 somewhere or a NaN: the fused loop gives up, the generator is put back,
    and the float64 path draws what it would have drawn without the fused loop."""
    quant = LatticeQuantizer(8, 1e-6)
    x = torch.full((3000,), 0.05)
    x[2999] = 2.0  # 2e6 steps, in the last element: the loop has run through the rest
    enc_f, enc_t = both_paths(monkeypatch, lambda: encode(quant, x, 9, torch.float32))
    assert same_code(enc_f, enc_t)
    x[2999] = float("nan")
    ref = torch.full((3000,), 0.05)
    code, _, _ = encode(quant, ref, 1, torch.float32)
    ref[7] = float("nan")
    (vf, okf), (vt, okt) = both_paths(monkeypatch, lambda: quant.decode(code, ref, dtype=torch.float32))
    assert okf == okt and torch.equal(vf.isnan(), vt.isnan())


def test_falls_back_to_torch_without_numba(monkeypatch):
    """numba missing (its import fails): one warning, the torch path, the same results."""
    quant = LatticeQuantizer(8, 1e-3)
    x = torch.randn(5000, generator=torch.Generator().manual_seed(0)) * 0.1
    want = encode(quant, x, 1, torch.float32)
    want_dec = quant.decode(want[0], x + 1e-2, dtype=torch.float32)
    monkeypatch.setitem(sys.modules, "numba", None)  # `import numba` raises ImportError
    monkeypatch.delitem(sys.modules, "lsgd.compression.lattice_fused")
    monkeypatch.setattr(L, "_FUSED", L._UNSET)
    calls = []
    real = L._integers_float32
    monkeypatch.setattr(L, "_integers_float32", lambda *a, **k: calls.append(1) or real(*a, **k))
    with pytest.warns(RuntimeWarning, match="numba"):
        got = encode(quant, x, 1, torch.float32)
    assert L.fused_kernels() is None and calls == [1]  # the torch fast path ran
    assert same_code(got, want)
    dec, ok = quant.decode(got[0], x + 1e-2, dtype=torch.float32)
    assert ok == want_dec[1] and torch.equal(dec, want_dec[0])


@pytest.mark.parametrize("bits", [8, 16])
def test_payloads_received_into_a_larger_buffer(monkeypatch, bits):
    """As SwarmSGD receives them: the codes a slice of a flat uint8 buffer at an offset (bits 8), or
    a clone of such a slice viewed as int16 (bits 16)."""
    quant = LatticeQuantizer(bits, 1e-3)
    x = torch.randn(3001, generator=torch.Generator().manual_seed(bits)) * 0.1
    code, own, _ = encode(quant, x, 2, torch.float32)
    raw = code.payload.view(torch.uint8)
    buf = torch.cat([torch.arange(13, dtype=torch.uint8), raw, torch.arange(5, dtype=torch.uint8)])
    piece = buf[13 : 13 + raw.numel()]
    payload = piece.clone().view(torch.int16) if bits == 16 else piece
    received = L.LatticeCode(payload, code.checksum.clone(), code.numel)
    y = x + 0.05
    (vf, okf), (vt, okt) = both_paths(monkeypatch, lambda: quant.decode(received, y, dtype=torch.float32))
    assert okf and okt and torch.equal(vf, vt) and torch.equal(vf, own)


def test_decode_ties_round_half_to_even_as_torch_round(monkeypatch):
    """References exactly half a period (q s / 2) from a lattice point of the colour: fl32(t - c) / q
    is m + 1/2 exactly (s = 1, q = 256: every step exact), and both paths round it to the even m."""
    quant = LatticeQuantizer(8, 1.0)
    code, own, _ = encode(quant, torch.zeros(12), 0, torch.float32)  # k = floor(0 + u) = 0: colour 0
    assert not own.any()
    m = torch.arange(-6, 6, dtype=torch.float32)
    y = (m + 0.5) * 256
    (vf, okf), (vt, okt) = both_paths(monkeypatch, lambda: quant.decode(code, y, dtype=torch.float32))
    even = torch.where(torch.remainder(m, 2) == 0, m, m + 1)  # the even one of m, m + 1
    assert torch.equal(vf, vt) and torch.equal(vf, even * 256) and okf == okt
