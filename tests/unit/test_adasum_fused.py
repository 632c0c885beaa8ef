"""Adasum's compiled dot products (lsgd/algorithms/adasum/kernels.py) against the torch path of
lsgd.algorithms.adasum.adasum._partial_dots (float64 copies, MKL's gemv / dot, index_add_, segment_reduce):
on every machine against float64 dot products computed exactly (math.fsum of the exact products),
within the float64 bound of a sum of n exact terms in any order, (n - 1) 2**-53 sum |terms|; and,
where the kernels reproduce this machine's torch path (``A.torch_order_matches()``: MKL's and ATen's
orders on this project's AMD machines; another CPU's MKL adds in another order), the same float64
values bit for bit, for every chunk length modulo 8, both parities of the chunk buffer's row length
(MKL's ddot peels an element when its row is 8 bytes off a 16-byte boundary), regions that cut
tensors, short and long pieces together."""

from __future__ import annotations

import math
import random

import pytest
import torch

from lsgd.algorithms.adasum import adasum as A


@pytest.fixture(autouse=True)
def one_thread():
    """The kernel stands in for MKL's single-threaded calls (workers run one thread per core share)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_the_fused_kernel_loads():
    """numba is a dependency: the kernel must compile (or load from the cache) here."""
    assert A.fused_kernels() is not None


def exact_dots(a, b, segs):
    """Per tensor of ``segs``: ([a.b, |a|^2, |b|^2] summed exactly, rounded once; the bound
    (n - 1) 2**-53 sum |terms| of any order of float64 additions of the exact products)."""
    out = []
    for _, s, e in segs:
        x, y = a[s:e].double().tolist(), b[s:e].double().tolist()
        terms = ([p * q for p, q in zip(x, y)], [p * p for p in x], [q * q for q in y])
        out.append([(math.fsum(t), max(len(t) - 1, 0) * 2.0**-53 * math.fsum(abs(v) for v in t)) for t in terms])
    return out


def assert_dots(fused, ref, a, b, segs, lo):
    """``fused`` (shape (3 * num,)) within the bound of the exact sums; bitwise the torch path's
    ``ref`` where the kernels reproduce this machine's torch path."""
    got = fused.view(3, -1)
    for (t, s, e), rows in zip(segs, exact_dots(a, b, [(t, s - lo, e - lo) for t, s, e in segs])):
        for row, (exact, bound) in zip((0, 1, 2), rows):
            assert abs(got[row, t].item() - exact) <= bound * (1 + 1e-12) + 1e-300, (t, row)
    if A.torch_order_matches():
        assert torch.equal(fused, ref), (fused - ref)


def both_paths(monkeypatch, a, b, segs, lo, num):
    assert A.fused_kernels() is not None
    fused = A._partial_dots(a, b, segs, lo, num, False)
    assert torch.equal(fused, A._partial_dots(a, b, segs, lo, num, False))  # deterministic
    with monkeypatch.context() as m:
        m.setattr(A, "_FUSED", None)
        torch_path = A._partial_dots(a, b, segs, lo, num, False)
    return fused, torch_path


@pytest.mark.parametrize("n", list(range(1, 42)) + [4095, 4096, 4097, A._CHUNK - 1, A._CHUNK, A._CHUNK + 11])
def test_one_tensor_every_length(monkeypatch, n):
    """One tensor of ``n`` elements (a long piece when ``n >= 4096``: chunks of 64K; else a short
    one), also as the second of two tensors so that the chunk buffer's row length is odd or even."""
    g = torch.Generator().manual_seed(n)
    for numels in ([n], [3, n], [n, 4097]):
        layout = A._Layout(numels)
        a = torch.randn(layout.n, generator=g) * 3.0
        b = torch.randn(layout.n, generator=g)
        segs = layout.segments(0, layout.n)
        fused, ref = both_paths(monkeypatch, a, b, segs, 0, len(numels))
        assert fused.dtype == torch.float64
        assert_dots(fused, ref, a, b, segs, 0)


def test_regions_of_mixed_layouts(monkeypatch):
    """Random layouts (short and long tensors, several chunks per tensor) and regions that start and
    end inside tensors, as the halving levels cut them; plus exact sums as the reference."""
    rnd = random.Random(0)
    g = torch.Generator().manual_seed(0)
    sizes = [1, 3, 7, 64, 100, 1000, 4095, 4096, 5000, 70001, 131073]
    for _ in range(12):
        numels = [rnd.choice(sizes) for _ in range(rnd.randint(1, 8))]
        layout = A._Layout(numels)
        a = torch.randn(layout.n, generator=g) * rnd.choice([1e-3, 1.0, 1e3])
        b = torch.randn(layout.n, generator=g)
        for lo, hi in [(0, layout.n), (layout.n // 2, layout.n), (rnd.randrange(layout.n), layout.n)]:
            if hi <= lo:
                continue
            segs = layout.segments(lo, hi)
            fused, ref = both_paths(monkeypatch, a[lo:hi], b[lo:hi], segs, lo, len(numels))
            assert_dots(fused, ref, a[lo:hi], b[lo:hi], segs, lo)


def test_other_dtypes_and_threads_take_the_torch_path(monkeypatch):
    """float64 and bfloat16 buffers are not the kernel's (float64 products are not exact), nor a
    process with several torch threads (MKL then splits its sums between threads)."""
    calls = []
    fused = A.fused_kernels()
    monkeypatch.setattr(A, "_FUSED", type("Spy", (), {"partial_dots": lambda *args: calls.append(args)})())
    layout = A._Layout([5000, 7])
    for dtype in (torch.float64, torch.bfloat16):
        a = torch.randn(layout.n).to(dtype)
        A._partial_dots(a, a.clone(), layout.segments(0, layout.n), 0, 2, False)
    torch.set_num_threads(2)
    a = torch.randn(layout.n)
    A._partial_dots(a, a.clone(), layout.segments(0, layout.n), 0, 2, False)
    assert not calls and fused is not None


def test_combine_matches_the_torch_path(monkeypatch):
    """The combination, long pieces (ATen's mul_ then add_ with alpha, a fused multiply-add) and short
    ones (three roundings), bit for bit, for random layouts and regions; and against the float64
    value rounded to float32 within one float32 rounding of each step (the definition)."""
    rnd = random.Random(1)
    g = torch.Generator().manual_seed(1)
    sizes = [1, 5, 17, 100, 4095, 4096, 4099, 70001]
    for _ in range(10):
        numels = [rnd.choice(sizes) for _ in range(rnd.randint(1, 8))]
        layout = A._Layout(numels)
        own = torch.randn(layout.n, generator=g)
        other = torch.randn(layout.n, generator=g) * rnd.choice([1e-3, 1.0, 1e3])
        c_own = torch.rand(len(numels), generator=g, dtype=torch.float64) * 2 - 0.5
        c_other = torch.rand(len(numels), generator=g, dtype=torch.float64) * 2 - 0.5
        for lo, hi in [(0, layout.n), (layout.n // 2, layout.n), (rnd.randrange(layout.n), layout.n)]:
            if hi <= lo:
                continue
            segs = layout.segments(lo, hi)
            fused, ref = own[lo:hi].clone(), own[lo:hi].clone()
            A._combine_(fused, other[lo:hi], c_own, c_other, segs, lo, False)
            with monkeypatch.context() as m:
                m.setattr(A, "_FUSED", None)
                A._combine_(ref, other[lo:hi], c_own, c_other, segs, lo, False)
            if A.torch_order_matches():  # this machine's torch path fuses the multiply-add too
                assert torch.equal(fused, ref), (numels, lo, hi)
            for t, s, e in segs:
                exact = own[s:e].double() * c_own[t] + other[s:e].double() * c_other[t]
                scale = (own[s:e].double() * c_own[t]).abs() + (other[s:e].double() * c_other[t]).abs()
                err = (fused[s - lo : e - lo].double() - exact).abs()
                assert bool((err <= 3 * 2.0**-24 * scale + 1e-45).all())


def test_the_probe_tells_other_orders_apart_and_the_kernels_stay(monkeypatch):
    """The probe (:func:`A.torch_order_matches`, which decides whether the bitwise checks above
    apply) tells a kernel summing in another order apart from the torch path; where it says the
    orders differ (another CPU or BLAS), the kernels are used all the same (their fixed order)."""
    fused = A.fused_kernels()
    assert fused is not None

    def reversed_dots(a, b, chunk_lo, chunk_hi, chunk_id, chunk_order, small_lo, small_hi, small_id, peel, out):
        fused.partial_dots(a, b, chunk_lo, chunk_hi, chunk_id, chunk_order, small_lo, small_hi, small_id, peel, out)
        out[:, chunk_id] = 0.0
        for lo, hi, t in zip(chunk_lo, chunk_hi, chunk_id):  # the same sums, added backwards
            x, y = a[lo:hi].astype("float64")[::-1], b[lo:hi].astype("float64")[::-1]
            out[0, t] += float(sum(x * y)); out[1, t] += float(sum(x * x)); out[2, t] += float(sum(y * y))

    other = type("Other", (), {"partial_dots": staticmethod(reversed_dots), "combine": fused.combine})
    assert not A._agrees_with_torch(other)
    monkeypatch.setattr(A, "_MATCHES", None)
    monkeypatch.setattr(A, "_agrees_with_torch", lambda module: False)
    assert A.torch_order_matches() is False and A.fused_kernels() is fused
