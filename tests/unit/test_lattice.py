"""The lattice quantizer (lsgd/compression/lattice.py) against its definition (Davies et al. 2021):
exact round trip inside the safe radius, unbiased randomized rounding, caught decodes outside it."""

import math

import pytest
import torch

from lsgd.compression.lattice import (
    BITS,
    LatticeQuantizer,
    check_params,
    lattice_integers,
    pack,
    unpack,
)


@pytest.mark.parametrize("bits", BITS)
def test_pack_unpack_round_trip(bits):
    n = 1001  # not a multiple of any lane count
    colours = torch.randint(0, 2 ** bits, (n,), generator=torch.Generator().manual_seed(bits))
    packed = pack(colours, bits)
    assert packed.numel() * packed.element_size() == math.ceil(bits * n / 8)
    assert torch.equal(unpack(packed, bits, n), colours)


@pytest.mark.parametrize("bits", BITS)
def test_round_trip_exact_inside_the_radius(bits):
    side = 1e-3
    quant = LatticeQuantizer(bits, side)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5000, generator=g) * 0.05
    # references within (q/2 - 1) s of x in every coordinate (q = 2: only y = x qualifies)
    reach = max(0.0, quant.q / 2 - 1.0) * side * 0.999
    y = x + (torch.rand(5000, generator=g) * 2 - 1) * reach
    code, own = quant.encode(x, torch.Generator().manual_seed(1))
    decoded, ok = quant.decode(code, y)
    assert ok
    assert torch.equal(decoded, own)
    assert (own - x.double()).abs().max() < side  # one lattice step at most
    assert code.nbytes == math.ceil(bits * 5000 / 8) + 24


def test_deterministic_rounding_is_the_nearest_point():
    quant = LatticeQuantizer(8, 0.01)
    x = torch.tensor([0.004, 0.006, -0.004, -0.016, 1.2349])
    code, own = quant.encode(x)
    assert torch.allclose(own, torch.tensor([0.0, 0.01, 0.0, -0.02, 1.23], dtype=torch.float64))
    decoded, ok = quant.decode(code, x + 0.3)  # 30 steps away, inside 128 steps
    assert ok and torch.equal(decoded, own)


def test_randomized_rounding_is_unbiased():
    side = 0.1
    x = torch.linspace(-0.37, 0.41, 64)
    draws = 4000
    g = torch.Generator().manual_seed(3)
    total = torch.zeros(64, dtype=torch.float64)
    ups = torch.zeros(64, dtype=torch.float64)
    for _ in range(draws):
        k = lattice_integers(x, side, g)
        total += k.double() * side
        ups += (k.double() > torch.floor(x.double() / side)).double()
    mean = total / draws
    # E[s k] = x, each draw within one step: standard error <= s / (2 sqrt(draws)); 5 sigma
    assert (mean - x.double()).abs().max() < 5 * side / (2 * math.sqrt(draws))
    # P(round up) = frac(x / s), the closed form of unbiased rounding
    frac = x.double() / side - torch.floor(x.double() / side)
    assert (ups / draws - frac).abs().max() < 5 * 0.5 / math.sqrt(draws)


@pytest.mark.parametrize("shift_steps", [0.75, 1.0, 3.0])
def test_decode_outside_the_radius_is_caught(shift_steps):
    quant = LatticeQuantizer(4, 1e-2)  # q = 16: radius 8 steps
    x = torch.randn(300, generator=torch.Generator().manual_seed(5)) * 0.02
    y = x.clone()
    y[17] += shift_steps * quant.q * quant.side  # one coordinate beyond the radius
    code, own = quant.encode(x, torch.Generator().manual_seed(6))
    decoded, ok = quant.decode(code, y)
    assert not ok
    assert not torch.equal(decoded, own)  # it would have been silently wrong


def test_cancelling_errors_are_caught():
    """Errors of +q and -q steps cancel in the plain sum of k; the weighted sums still differ."""
    quant = LatticeQuantizer(8, 1e-3)
    x = torch.zeros(1000)
    y = x.clone()
    y[10] += quant.q * quant.side
    y[900] -= quant.q * quant.side
    code, own = quant.encode(x)
    decoded, ok = quant.decode(code, y)
    assert decoded.sum() == own.sum()  # the plain sum cannot see it
    assert not ok


@pytest.mark.parametrize("bits,side", [(3, 1e-3), (8, 0.0), (8, -1.0), (True, 1e-3)])
def test_bad_parameters_name_the_key(bits, side):
    with pytest.raises(ValueError, match="algo.bits|algo.side"):
        check_params(bits, side)


def test_checksum_catches_errors_with_zero_first_and_second_moments():
    """+q, -2q, +q at evenly spaced indices (a second difference: what a wrong decode of a gradient
    produced in a real run) and +q / -q one block (65521 elements) apart: weights linear in the
    index, or repeating every block, pass both; the polynomial checksum catches them."""
    from lsgd.compression.lattice import lattice_checksum

    q = 256
    k = torch.randint(-300, 300, (10,), generator=torch.Generator().manual_seed(0))
    e = k.clone()
    e[0] += q
    e[4] -= 2 * q
    e[8] += q
    assert not torch.equal(lattice_checksum(e), lattice_checksum(k))
    big = torch.randint(-300, 300, (2 * 65521 + 5,), generator=torch.Generator().manual_seed(1))
    e = big.clone()
    e[7] += q
    e[7 + 65521] -= q
    assert not torch.equal(lattice_checksum(e), lattice_checksum(big))
    # and a random single error, and a random pair with opposite signs, anywhere
    g = torch.Generator().manual_seed(2)
    for _ in range(200):
        i, j = torch.randint(0, big.numel(), (2,), generator=g).tolist()
        if i == j:
            continue
        e = big.clone()
        e[i] += q
        e[j] -= q
        assert not torch.equal(lattice_checksum(e), lattice_checksum(big))
