"""The compressors' fast paths (issue: compressor fast paths) against closed forms and independent
references: PCG64 floats on their grid with uniform moments, random-k's rotated stratified sampling
keeping every index with probability k / n, the lattice checksum's float64 product against the
definition in Python integers, the float64 lattice path unchanged, DGC's blocked selection, and
the BENCH line convention of scripts/bench_all.py (lsgd.analysis.bench)."""

from __future__ import annotations

import math

import pytest
import torch

from lsgd.analysis import bench
from lsgd.compression import build
from lsgd.compression import compressors as C
from lsgd.compression.fastrand import random_float32, random_int32
from lsgd.compression.lattice import CHECKSUM_PRIME, LatticeQuantizer, lattice_checksum


# -- fastrand --------------------------------------------------------------------------------------
@pytest.mark.parametrize("low,bits", [(1.0, 23), (128.0, 16), (2.0, 4)])
def test_random_float32_grid_and_moments(low, bits):
    n = 200_001  # odd: the last 64-bit word is half used
    u = random_float32(n, seed=7, low=low, bits=bits)
    assert u.dtype == torch.float32 and u.shape == (n,)
    step = low * 2.0**-23
    m = (u.double() - low) / step  # the integer m of low + m ulp
    assert torch.equal(m, m.round()) and m.min() >= 0 and m.max() <= 2**bits - 1
    # m uniform on {0 .. M - 1}: mean (M - 1) / 2, variance (M^2 - 1) / 12; 5 sigma of the sample mean
    M = 2**bits
    mean, var = (M - 1) / 2, (M * M - 1) / 12
    assert abs(float(m.mean()) - mean) < 5 * math.sqrt(var / n)
    assert float(m.var()) == pytest.approx(var, rel=0.02)
    assert torch.equal(u, random_float32(n, seed=7, low=low, bits=bits))
    assert not torch.equal(u, random_float32(n, seed=8, low=low, bits=bits))


def test_random_float32_rejects_bad_arguments():
    with pytest.raises(ValueError, match="power of two"):
        random_float32(10, 0, low=3.0)
    with pytest.raises(ValueError, match="bits"):
        random_float32(10, 0, bits=24)


def test_random_int32_bits_are_fair():
    w = random_int32(50_000, seed=3)
    assert w.dtype == torch.int32
    ones = ((w.long().unsqueeze(1) >> torch.arange(32)) & 1).double().mean(dim=0)
    assert (ones - 0.5).abs().max() < 5 * 0.5 / math.sqrt(w.numel())


# -- random-k ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,k", [(23, 5), (30, 10), (7, 6)])
def test_stratified_indices_keep_every_index_with_probability_k_over_n(n, k):
    draws = 4000
    counts = torch.zeros(n, dtype=torch.float64)
    for seed in range(draws):
        idx = C.stratified_indices(n, k, seed)
        assert idx.numel() == k and torch.all(idx[1:] > idx[:-1]) and idx.min() >= 0 and idx.max() < n
        counts[idx] += 1
    p = k / n
    assert (counts / draws - p).abs().max() < 5 * math.sqrt(p * (1 - p) / draws)


def test_stratified_indices_take_one_per_stratum_of_the_rotated_circle():
    """n = 23, k = 5: strata of 5, 5, 5, 4, 4 from the rotation; any valid rotation r puts exactly
    one index in each stratum (checked by trying every r)."""
    n, k = 23, 5
    m, extra = divmod(n, k)
    starts = [j * m + min(j, extra) for j in range(k + 1)]
    for seed in range(200):
        idx = C.stratified_indices(n, k, seed).tolist()
        ok = any(all(sum(starts[j] <= (i + r) % n < starts[j + 1] for i in idx) == 1 for j in range(k))
                 for r in range(n))
        assert ok, idx


def test_randomk_unbiased_mean_matches_x():
    n, cf, draws = 40, 8, 3000  # k = 5, n / k = 8
    x = torch.randn(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    comp = build("randomk", cf=cf, unbiased=True)
    total = torch.zeros(n, dtype=torch.float64)
    for step in range(draws):
        total += comp.decompress(comp.compress(x, step=step))
    # each coordinate: (n/k) x_i w.p. k/n: std of the mean |x_i| sqrt(n/k - 1) / sqrt(draws)
    bound = 5 * x.abs() * math.sqrt(n / 5 - 1) / math.sqrt(draws)
    assert torch.all((total / draws - x).abs() <= bound + 1e-12)


# -- lattice -----------------------------------------------------------------------------------------
def python_checksum(k: list[int]) -> list[int]:
    """The checksum's definition in Python integers: sum(r), sum_j h^j sum_i r_ji g^i (mod p)."""
    p = CHECKSUM_PRIME
    out = [sum(v % p for v in k) % p]
    for g, h in ((17, 41), (29, 46)):  # (element root, block root) pairs
        total = 0
        for j in range(0, len(k), p):
            block = sum((v % p) * pow(g, i, p) for i, v in enumerate(k[j : j + p])) % p
            total += block * pow(h, j // p, p)
        out.append(total % p)
    return out


@pytest.mark.parametrize("bound", [300, 2**20, 2**20 + 5, 2**40])
def test_checksum_equals_its_definition(bound):
    """Blocks of 65521 and a tail; |k| up to 2**20 (the float64 product) and beyond (int64)."""
    n = 2 * CHECKSUM_PRIME + 77
    k = torch.randint(-bound, bound + 1, (n,), generator=torch.Generator().manual_seed(bound % 1000))
    k[5] = bound
    k[n - 1] = -bound
    want = python_checksum(k.tolist())
    assert lattice_checksum(k).tolist() == want
    assert lattice_checksum(k.double()).tolist() == want  # float integers: the same value
    if bound <= 2**20:
        assert lattice_checksum(k.float()).tolist() == want


def test_float64_tensors_keep_the_float64_path():
    """float64 x: k = floor(x / s + u), u from torch.rand(float64) on the caller's generator, as
    before the fast path (the goldens' runs); float32 x: float32 points equal the float64 ones
    rounded to float32."""
    side = 1e-3
    x = torch.randn(3000, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.05
    quant = LatticeQuantizer(8, side)
    code, own = quant.encode(x, torch.Generator().manual_seed(4))
    u = torch.rand(3000, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    k = torch.floor(x / side + u)
    assert own.dtype == torch.float64 and torch.equal(own, k * side)
    x32 = x.float()
    _, p64 = quant.encode(x32, torch.Generator().manual_seed(5))
    code32, p32 = quant.encode(x32, torch.Generator().manual_seed(5), dtype=torch.float32)
    assert p32.dtype == torch.float32 and torch.equal(p32, p64.float())
    dec32, ok = quant.decode(code32, x32 + 0.01, dtype=torch.float32)
    assert ok and torch.equal(dec32, p32)


def test_float32_decode_equals_the_float64_decode_across_the_radius():
    """References up to 0.999 of (q/2 - 1) s away (and some beyond): the float32 decode gives the
    float64 path's integers, and both checksums agree on which tensors decoded."""
    quant = LatticeQuantizer(8, 1e-3)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200_000, generator=g) * 0.3
    reach = (quant.q / 2 - 1) * quant.side
    y = x + (torch.rand(200_000, generator=g) * 2 - 1) * reach * 0.999
    code, own = quant.encode(x, torch.Generator().manual_seed(1), dtype=torch.float32)
    d32, ok32 = quant.decode(code, y, dtype=torch.float32)
    d64, ok64 = quant.decode(code, y.double())
    assert ok32 and ok64 and torch.equal(d32, d64.float()) and torch.equal(d32, own)
    far = y.clone()
    far[::1000] += 2 * reach
    d32, ok32 = quant.decode(code, far, dtype=torch.float32)
    d64, ok64 = quant.decode(code, far.double())
    assert not ok32 and not ok64 and torch.equal(d32, d64.float())


def test_fast_path_falls_back_beyond_its_range():
    """|x / s| >= 2**20 somewhere: the float64 path (exact), the decode still exact."""
    quant = LatticeQuantizer(8, 1e-6)
    x = torch.full((100,), 0.05)
    x[3] = 2.0  # 2e6 steps > 2**20
    code, own = quant.encode(x, torch.Generator().manual_seed(0), dtype=torch.float32)
    assert (own.double() - x.double()).abs().max() <= 1e-6 * (1 + 1e-6)
    dec, ok = quant.decode(code, x, dtype=torch.float32)
    assert ok and torch.equal(dec, own)


# -- DGC's selection --------------------------------------------------------------------------------
def test_abs_at_least_equals_the_one_pass_rule():
    x = torch.randn(3500, generator=torch.Generator().manual_seed(2))
    x[7] = 2.5
    x[9] = -2.5
    for t in (0.0, 1.0, 2.5, 10.0):
        thr = torch.tensor(t)
        want = torch.tensor([i for i, v in enumerate(x.tolist()) if abs(v) >= t], dtype=torch.long)
        assert torch.equal(C.abs_at_least(x, thr), want)


# -- make bench's table ------------------------------------------------------------------------------
def _bench_all():
    return bench


def test_bench_lines_parse_and_compare():
    b = _bench_all()
    f = b.parse_bench_line("BENCH dgc_speedup_vs_topk 8.4 >= 8\n", "bench_compression.py")
    assert (f.name, f.now, f.op, f.goal, f.met) == ("dgc_speedup_vs_topk", 8.4, ">=", 8.0, True)
    assert not b.parse_bench_line("BENCH ddp_overhead_ratio 1.041 <= 1.03", "x").met
    assert b.parse_bench_line("(a) encode+decode", "x") is None
    with pytest.raises(ValueError, match="malformed"):
        b.parse_bench_line("BENCH x 1.0 < 2", "x")
    table = b.summary([f], {"bench_gossip.py": "exited with status 1"})
    assert "dgc_speedup_vs_topk" in table and "FAILED" in table
