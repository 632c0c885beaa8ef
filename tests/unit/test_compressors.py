"""Compressors, error-feedback memories and the single-process exchange against closed forms."""

from __future__ import annotations

import math

import pytest
import torch

from lsgd.comm.communicator import Communicator
from lsgd.compression import (
    COMPRESSORS,
    DGCMemory,
    ErrorFeedback,
    NoMemory,
    build,
    exchange,
    topk_indices,
)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def reference_topk(x: torch.Tensor, k: int) -> torch.Tensor:
    """Ascending indices of the k largest |x|, ties to the lowest index (full stable sort)."""
    order = torch.sort(-x.abs().reshape(-1), stable=True).indices[:k]
    return order.sort().values


# -- topk ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,cf", [(1000, 10), (1000, 7), (777, 3.3), (5, 1000), (64, 1)])
def test_topk_keeps_k_largest(n, cf):
    x = randn(n, seed=n)
    c = build("topk", cf=cf).compress(x)
    k = min(n, max(1, math.ceil(n / cf)))
    assert c.values.numel() == c.indices.numel() == k
    assert c.indices.dtype == torch.int32
    assert torch.equal(c.indices.long(), reference_topk(x, k))
    assert torch.equal(c.values, x[c.indices.long()])
    kept = x.abs()[c.indices.long()].min()
    mask = torch.ones(n, dtype=torch.bool)
    mask[c.indices.long()] = False
    assert n == k or x.abs()[mask].max() <= kept


def test_topk_ties_lowest_index():
    x = torch.tensor([1.0, 3.0, -3.0, 2.0, 3.0, 0.5])
    c = build("topk", cf=3).compress(x)  # k = 2 of the three |x| == 3
    assert c.indices.tolist() == [1, 2]
    assert c.values.tolist() == [3.0, -3.0]
    x = torch.tensor([5.0, 1.0, 1.0, -1.0, 1.0, -5.0, 1.0, 0.0])
    c = build("topk", cf=2).compress(x)  # k = 4: both 5s, then the lowest-index 1s
    assert c.indices.tolist() == [0, 1, 2, 5]
    # many ties on a larger tensor (integer values): the rule, not torch.topk's arbitrary split
    x = torch.randint(-3, 4, (10_000,), generator=torch.Generator().manual_seed(1)).float()
    for cf in (3, 10, 100):
        k = math.ceil(10_000 / cf)
        c = build("topk", cf=cf).compress(x)
        assert torch.equal(c.indices.long(), reference_topk(x, k))
        assert torch.equal(topk_indices(x.abs(), k), reference_topk(x, k))


def test_topk_shape_and_decompress():
    x = randn(8, 5, 3)
    comp = build("topk", cf=4)
    c = comp.compress(x)
    d = comp.decompress(c)
    assert d.shape == x.shape and d.dtype == x.dtype
    flat = torch.zeros(x.numel())
    flat[c.indices.long()] = x.reshape(-1)[c.indices.long()]
    assert torch.equal(d, flat.view_as(x))
    assert c.numel == x.numel() and c.shape == x.shape


# -- randomk -------------------------------------------------------------------------------------
@pytest.mark.parametrize("cf", [100, 10, 2, 1.5])  # rejection sampling (unique by sort or mask), randperm
def test_randomk_shared_seed(cf):
    n = 5000
    x = randn(n)
    a = build("randomk", cf=cf, seed=3).compress(x, step=7, key=2)
    b = build("randomk", cf=cf, seed=3).compress(randn(n, seed=9), step=7, key=2)
    k = math.ceil(n / cf)
    assert a.values.numel() == k and a.send_indices is False
    assert torch.equal(a.indices, b.indices)
    assert torch.unique(a.indices).numel() == k
    assert torch.all(a.indices[1:] > a.indices[:-1])
    assert torch.equal(a.values, x[a.indices.long()])
    for other in ({"step": 8, "key": 2}, {"step": 7, "key": 3}):
        c = build("randomk", cf=cf, seed=3).compress(x, **other)
        assert not torch.equal(c.indices, a.indices)
    c = build("randomk", cf=cf, seed=4).compress(x, step=7, key=2)
    assert not torch.equal(c.indices, a.indices)


def test_randomk_uniform_and_unbiased_option():
    n, cf, steps = 50, 5, 2000
    comp = build("randomk", cf=cf)
    counts = torch.zeros(n)
    for step in range(steps):
        counts[comp.compress(torch.ones(n), step=step).indices.long()] += 1
    expected = steps * (n / cf) / n  # 400, std about 18
    assert (counts - expected).abs().max() < 100
    x = randn(n)
    unb = build("randomk", cf=cf, unbiased=True)
    c = unb.compress(x, step=1)
    d = unb.decompress(c)
    idx = c.indices.long()
    assert torch.allclose(d[idx], x[idx] * n / 10)
    assert torch.count_nonzero(d) == 10


# -- qsgd ------------------------------------------------------------------------------------------
def test_qsgd_unbiased():
    s, draws, n = 4, 2000, 64
    x = randn(n)
    comp = build("qsgd", levels=s, seed=1, rank=0)
    total = torch.zeros(n, dtype=torch.float64)
    norm = x.norm()
    for step in range(draws):
        c = comp.compress(x, step=step)
        assert c.values.dtype == torch.int8 and c.values.abs().max() <= s
        d = comp.decompress(c)
        assert (d - x).abs().max() <= norm / s + 1e-6  # one quantization step at most
        total += d.double()
    mean = total / draws
    # per coordinate Var <= (norm / s)^2 / 4: the std of the mean is at most norm / (2 s sqrt(draws))
    bound = float(norm) / (2 * s * math.sqrt(draws))
    assert (mean - x.double()).abs().max() < 5 * bound


def test_qsgd_payload():
    x = randn(10, 10)
    comp = build("qsgd")
    c = comp.compress(x, step=3, key=1)
    assert comp.levels == 127 and c.values.dtype == torch.int8
    assert c.scale.dtype == torch.float32 and c.scale.shape == (1,)
    assert torch.allclose(c.scale, x.norm().reshape(1))
    assert c.nbytes == 100 + 4 and comp.exchange == "all_gather"
    # independent rounding on different ranks, identical for the same rank
    a = build("qsgd", rank=0).compress(x)
    b = build("qsgd", rank=1).compress(x)
    assert not torch.equal(a.values, b.values)
    assert torch.equal(a.values, build("qsgd", rank=0).compress(x).values)
    zero = comp.compress(torch.zeros(5))
    assert torch.equal(comp.decompress(zero), torch.zeros(5))


# -- fp16 / none -----------------------------------------------------------------------------------
def test_fp16_round_trip():
    x = randn(1000) * 10
    for dtype, eps in (("float16", 2.0**-11), ("bfloat16", 2.0**-8)):
        comp = build("fp16", dtype=dtype)
        c = comp.compress(x)
        d = comp.decompress(c)
        assert d.dtype == torch.float32 and d.shape == x.shape
        assert torch.all((d - x).abs() <= x.abs() * eps + 1e-7)
        assert c.nbytes == 2 * 1000 and comp.cf == 2 and comp.exchange == "all_reduce"


def test_none_identity():
    x = randn(4, 6)
    comp = build("none")
    c = comp.compress(x)
    assert torch.equal(comp.decompress(c), x)
    assert c.nbytes == 4 * 24 and comp.cf == 1 and not comp.lossy


# -- nbytes ------------------------------------------------------------------------------------------
def test_nbytes_analytic():
    n, cf = 10_000, 10
    x = randn(n)
    k = math.ceil(n / cf)
    expect = {"topk": 8 * k, "randomk": 4 * k, "fp16": 2 * n, "qsgd": n + 4, "none": 4 * n}
    for name, nbytes in expect.items():
        params = {"cf": cf} if name in ("topk", "randomk") else {}
        assert build(name, **params).compress(x).nbytes == nbytes, name
    for name in ("dgc", "redsync"):
        c = build(name, cf=cf).compress(x)
        assert c.nbytes == 8 * c.values.numel() == 8 * c.indices.numel(), name


# -- dgc -------------------------------------------------------------------------------------------
def test_dgc_warmup_schedule():
    """The paper's warm-up (Lin et al. 2018, Sec. 3.4): 4 epochs, densities about 25%, 6.25%,
    1.5625%, 0.4%, then the target 0.1%; the authors' rule density_e = (1/cf) ** ((e + 1) / 5)."""
    spe = 3
    comp = build("dgc", cf=1000, warmup_epochs=4, steps_per_epoch=spe)
    paper = [0.25, 0.0625, 0.015625, 0.004]
    for e, density in enumerate(paper):
        for step in range(e * spe, (e + 1) * spe):  # constant within the epoch
            assert 1 / comp.effective_cf(step) == pytest.approx(0.001 ** ((e + 1) / 5))
            assert 1 / comp.effective_cf(step) == pytest.approx(density, rel=0.03)
    assert comp.effective_cf(4 * spe) == 1000 and comp.effective_cf(100) == 1000
    assert comp.effective_cf(spe, cf=16) == pytest.approx(16 ** 0.4)  # ramp to the call's cf
    assert build("dgc", cf=1000).effective_cf(0) == 1000  # no warm-up by default
    with pytest.raises(ValueError, match="steps_per_epoch"):
        build("dgc", cf=10, warmup_epochs=2)
    with pytest.raises(ValueError, match="warmup_epochs"):
        build("dgc", cf=10, warmup_epochs=-1, steps_per_epoch=5)
    n = 100_000
    x = randn(n)
    k0 = math.ceil(n / 1000 ** 0.2)
    c0 = comp.compress(x, step=0)
    assert math.ceil(k0 / 2) <= c0.values.numel() <= k0
    c9 = comp.compress(x, step=4 * spe)
    assert math.ceil(n / 1000 / 2) <= c9.values.numel() <= math.ceil(n / 1000)


@pytest.mark.parametrize("cf", [10, 100, 1000])
def test_dgc_heavy_tailed(cf):
    n = 200_000
    torch.manual_seed(0)
    x = torch.distributions.StudentT(2.0).sample((n,))
    comp = build("dgc", cf=cf, seed=5)
    c = comp.compress(x, step=1, key=4)
    k = math.ceil(n / cf)
    m = c.values.numel()
    assert math.ceil(k / 2) <= m <= k
    assert torch.equal(c.indices.long(), reference_topk(x, m))  # the top-m set exactly
    assert set(reference_topk(x, math.ceil(k / 2)).tolist()) <= set(c.indices.tolist())
    assert torch.equal(c.values, x[c.indices.long()])
    again = build("dgc", cf=cf, seed=5).compress(x, step=1, key=4)
    assert torch.equal(again.indices, c.indices)


def test_dgc_threshold_retries_and_fallback(monkeypatch):
    # 30 outliers of 1e3 in a bulk of 1e-3: when the sample (1000 of 100k, k_s = 1) catches an
    # outlier the threshold selects 30 < ceil(k/2) = 50; three halvings cannot reach the bulk, so
    # exact top-k is used. Otherwise the threshold lies in the bulk and at most k are kept.
    import lsgd.compression.compressors as C

    n, cf = 100_000, 1000
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, generator=g) * 1e-3
    x[torch.randperm(n, generator=g)[:30]] = 1e3
    full_calls = []
    real = C.topk_indices

    def spy(a, k):
        if a.numel() == n:
            full_calls.append(k)
        return real(a, k)

    monkeypatch.setattr(C, "topk_indices", spy)
    comp = build("dgc", cf=cf)
    sizes = []
    for step in range(20):
        c = comp.compress(x, step=step)
        m = c.values.numel()
        assert 50 <= m <= 100
        assert torch.equal(c.indices.long(), reference_topk(x, m))
        sizes.append(m)
    assert full_calls and all(k == 100 for k in full_calls)  # the fallback ran
    assert len(full_calls) < 20  # ... and the sampled threshold sufficed on other steps
    assert sizes.count(100) >= len(full_calls)


def test_dgc_small_tensor_is_exact_topk():
    x = randn(500)
    assert torch.equal(build("dgc", cf=10).compress(x).indices, build("topk", cf=10).compress(x).indices)


# -- redsync ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dist", ["normal", "cauchy", "uniform"])
@pytest.mark.parametrize("cf", [1.01, 2, 10, 100, 1000])
def test_redsync_between_k_and_2k(cf, dist):
    # the cases cover the mean fallback (cf near 1), halving only, and bisection after a rejected try
    n = 50_000
    g = torch.Generator().manual_seed(2)
    x = {"normal": lambda: torch.randn(n, generator=g), "uniform": lambda: torch.rand(n, generator=g),
         "cauchy": lambda: torch.randn(n, generator=g) / torch.randn(n, generator=g)}[dist]()
    c = build("redsync", cf=cf).compress(x)
    k = math.ceil(n / cf)
    m = c.values.numel()
    assert k <= m <= 2 * k
    assert torch.equal(c.indices.long(), reference_topk(x, m))
    assert torch.equal(c.values, x[c.indices.long()])


def test_redsync_clustered_magnitudes():
    # the count jumps from 20 (< k) to 5020 (> 2k) at one threshold: bisection cannot land in
    # [k, 2k] and ends on a rejected try; the result is the exact top-k (ties to the lowest index)
    x = torch.zeros(10_000)
    x[:20] = 1.0
    x[100:5100] = 0.5
    x = x[torch.randperm(10_000, generator=torch.Generator().manual_seed(0))]
    c = build("redsync", cf=100).compress(x)
    assert c.values.numel() == 100
    assert torch.equal(c.indices.long(), reference_topk(x, 100))


def test_sparsifiers_on_constant_and_zero_tensors():
    for name in ("topk", "dgc", "redsync", "randomk"):
        comp = build(name, cf=10)
        for x in (torch.zeros(5000), torch.full((5000,), 2.0)):
            c = comp.compress(x)
            assert 500 <= c.values.numel() <= 1000, name
            assert torch.allclose(comp.decompress(c)[c.indices.long()], x[c.indices.long()])


# -- compress_further (GraVAC multi-level) -----------------------------------------------------------
def test_compress_further_topk_composes_indices():
    x = randn(10_000)
    comp = build("topk", cf=10)
    c1 = comp.compress(x)
    c2 = comp.compress_further(c1, 10)
    sub = reference_topk(c1.values, math.ceil(c1.values.numel() / 10))
    assert torch.equal(c2.indices, c1.indices[sub])
    assert torch.equal(c2.values, c1.values[sub])
    assert torch.equal(c2.values, x[c2.indices.long()])
    # top-k of a top-k set is the top-k: same as compressing from scratch at 100
    assert torch.equal(c2.indices, comp.compress(x, cf=100).indices)
    assert c2.shape == x.shape and c2.nbytes == 8 * 100


@pytest.mark.parametrize("name", ["dgc", "redsync", "randomk"])
def test_compress_further_other_sparsifiers(name):
    n = 100_000
    x = randn(n, seed=3)
    comp = build(name, cf=10)
    c1 = comp.compress(x, step=2, key=1)
    c2 = comp.compress_further(c1, 10, step=2, key=1)
    k2 = math.ceil(c1.values.numel() / 10)
    assert set(c2.indices.tolist()) <= set(c1.indices.tolist())
    assert torch.equal(c2.values, x[c2.indices.long()])
    assert math.ceil(k2 / 2) <= c2.values.numel() <= 2 * k2
    assert torch.all(c2.indices[1:] > c2.indices[:-1])
    if name == "randomk":
        assert c2.send_indices is False and c2.values.numel() == k2
        again = build(name, cf=10).compress_further(comp.compress(randn(n, seed=4), step=2, key=1), 10, step=2, key=1)
        assert torch.equal(again.indices, c2.indices)  # shared seed: same indices everywhere
    else:
        # the selected set is the top of c1's values
        sub = reference_topk(c1.values, c2.values.numel())
        assert torch.equal(c2.indices, c1.indices[sub])


def test_compress_further_non_sparsifiers_raise():
    x = randn(100)
    for name in ("none", "fp16", "qsgd"):
        comp = build(name)
        with pytest.raises(TypeError):
            comp.compress_further(comp.compress(x), 10)


# -- error feedback ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["topk", "randomk", "dgc", "redsync", "qsgd", "fp16"])
def test_error_feedback_invariant(name):
    params = {"cf": 20} if name in ("topk", "randomk", "dgc", "redsync") else {}
    comp = build(name, **params)
    mem = ErrorFeedback()
    shape = (40, 60)
    sum_g = torch.zeros(shape, dtype=torch.float64)
    sum_sent = torch.zeros(shape, dtype=torch.float64)
    for t in range(15):
        g = randn(*shape, seed=100 + t)
        g_copy = g.clone()
        g_ef = mem.compensate(0, g)
        c = comp.compress(g_ef, step=t, key=0)
        sent = comp.decompress(c)
        mem.update(0, g_ef, sent)
        assert torch.equal(g, g_copy)  # the gradient is not modified
        sum_g += g.double()
        sum_sent += sent.double()
    assert torch.allclose(sum_sent + mem.residual(0).double(), sum_g, atol=1e-4)
    # checkpoint round trip and reset
    other = ErrorFeedback()
    other.load_state_dict(mem.state_dict())
    assert torch.equal(other.residual(0), mem.residual(0))
    mem.reset()
    assert torch.count_nonzero(mem.residual(0)) == 0
    assert torch.count_nonzero(other.residual(0)) > 0


def test_no_memory():
    nm = NoMemory()
    g = randn(3)
    assert nm.compensate(0, g) is g and nm.residual(0) is None and nm.state_dict() == {}


def test_dgc_memory_momentum_correction_by_hand():
    m = 0.9
    mem = DGCMemory(m)
    g1 = torch.tensor([1.0, 2.0, -3.0, 4.0])
    g2 = torch.tensor([0.5, -1.0, 1.0, 2.0])
    g3 = torch.tensor([1.0, 1.0, 1.0, 1.0])
    # step 1: u = g1, v = g1; send coordinates {2, 3}
    v = mem.compensate(0, g1)
    assert torch.equal(v, g1)
    mem.update(0, v, torch.tensor([0.0, 0.0, -3.0, 4.0]))
    u1 = torch.tensor([1.0, 2.0, 0.0, 0.0])
    v1 = torch.tensor([1.0, 2.0, 0.0, 0.0])
    assert torch.equal(mem.u[0], u1) and torch.equal(mem.residual(0), v1)
    # step 2: u = m u1 + g2, v = v1 + u; send coordinate {1}
    u2 = m * u1 + g2
    v2 = v1 + u2
    v = mem.compensate(0, g2)
    assert torch.allclose(v, v2)
    mem.update(0, v, torch.tensor([0.0, float(v2[1]), 0.0, 0.0]))
    u2[1] = 0
    v2[1] = 0
    assert torch.allclose(mem.u[0], u2) and torch.allclose(mem.residual(0), v2)
    # step 3
    u3 = m * u2 + g3
    v3 = v2 + u3
    assert torch.allclose(mem.compensate(0, g3), v3)
    # checkpoint round trip, reset zeroes both buffers
    other = DGCMemory(0.5)
    other.load_state_dict(mem.state_dict())
    assert other.momentum == m and torch.equal(other.u[0], mem.u[0]) and torch.equal(other.v[0], mem.v[0])
    mem.reset(0)
    assert torch.count_nonzero(mem.u[0]) == 0 and torch.count_nonzero(mem.v[0]) == 0
    with pytest.raises(ValueError, match="momentum"):
        DGCMemory(1.0)


@pytest.mark.parametrize("nesterov", [False, True])
def test_dgc_memory_accumulates_torch_sgd_updates(nesterov):
    """With nothing sent, the accumulation v is the sum of the updates torch's SGD (lr 1, dampening
    0) would have applied: momentum correction is momentum SGD's update, delayed (Lin et al. 2018,
    Sec. 3.2; Nesterov as the authors' DGCSGDMemory)."""
    m, shape = 0.9, (5, 7)
    mem = DGCMemory(m, nesterov=nesterov)
    w = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([w], lr=1.0, momentum=m, nesterov=nesterov)
    for t in range(6):
        g = randn(*shape, seed=40 + t).double()
        v = mem.compensate(0, g)
        mem.update(0, v, torch.zeros_like(v))
        w.grad = g.clone()
        opt.step()
    assert torch.allclose(mem.residual(0), -w.detach(), rtol=1e-12, atol=1e-12)
    other = DGCMemory(0.5)
    other.load_state_dict(mem.state_dict())
    assert other.nesterov == nesterov and other.momentum == m


def test_dgc_with_memory_sends_accumulated_velocity():
    comp = build("dgc", cf=4)
    mem = DGCMemory(0.5)
    g = torch.tensor([4.0, 1.0, 0.5, 0.25, 3.0, 0.1, 0.2, 0.3])
    v = mem.compensate(0, g)
    c = comp.compress(v)  # n <= 1000: exact top-2 -> coordinates 0 and 4
    assert c.indices.tolist() == [0, 4]
    mem.update(0, v, comp.decompress(c))
    v2 = mem.compensate(0, g)
    sent = torch.tensor([True, False, False, False, True, False, False, False])
    expect_u = torch.where(sent, g, 1.5 * g)
    expect_v = torch.where(sent, g, g + 1.5 * g)
    assert torch.allclose(mem.u[0], expect_u) and torch.allclose(v2, expect_v)


# -- build -------------------------------------------------------------------------------------------
def test_build_errors():
    with pytest.raises(ValueError, match=r"'foo'.*allowed: dgc, fp16, lattice, none, powersgd, qsgd, randomk, redsync, topk"):
        build("foo")
    with pytest.raises(ValueError, match=r"cf .*>= 1.*0\.5"):
        build("topk", cf=0.5)
    for levels in (0, 128, 2.5):
        with pytest.raises(ValueError, match=r"levels .*\[1, 127\]"):
            build("qsgd", levels=levels)
    with pytest.raises(ValueError, match=r"powersgd.*lsgd\.compression\.powersgd"):
        build("powersgd")
    with pytest.raises(ValueError, match=r"'rank'.*'topk'.*allowed: cf"):
        build("topk", rank=2)
    with pytest.raises(ValueError, match=r"'cf'.*'qsgd'.*allowed: levels, seed, rank"):
        build("qsgd", cf=4)
    with pytest.raises(ValueError, match="sample_ratio"):
        build("dgc", sample_ratio=0.0)
    with pytest.raises(ValueError, match="dtype"):
        build("fp16", dtype="int8")
    with pytest.raises(ValueError, match="cf"):
        build("topk").compress(randn(10), cf=0.9)
    assert sorted(COMPRESSORS) == ["dgc", "fp16", "lattice", "none", "powersgd", "qsgd", "randomk", "redsync", "topk"]
    exchanges = {name: build(name).exchange for name in COMPRESSORS if name != "powersgd"}
    assert exchanges == {"none": "all_reduce", "fp16": "all_reduce", "randomk": "all_reduce", "topk": "all_gather",
                         "dgc": "all_gather", "redsync": "all_gather", "qsgd": "all_gather", "lattice": "lattice"}


def test_registry_entries():
    """Each compressor's entry carries its class, the dataclass of its ``algo`` keys, its label and the
    key that sets its strength; :func:`config_params` are the keys that go to :func:`build`."""
    from lsgd.compression.compressors import TopK, config_params
    from lsgd.compression.options import DGCOptions, PowerSGDOptions, SparsifierOptions
    from lsgd.compression.powersgd import PowerSGD

    topk = COMPRESSORS.entry("topk")
    assert (topk.obj, topk.config, topk.label, topk.extra) == (TopK, SparsifierOptions, "top-k", {"strength_key": "algo.cf"})
    assert COMPRESSORS.entry("none").config is None and COMPRESSORS.entry("none").label == "dense"
    assert COMPRESSORS["powersgd"] is PowerSGD and COMPRESSORS.entry("powersgd").config is PowerSGDOptions
    assert {e.name: e.extra["strength_key"] for e in COMPRESSORS.entries()} == {
        "none": None, "fp16": None, "topk": "algo.cf", "randomk": "algo.cf", "dgc": "algo.cf", "redsync": "algo.cf",
        "qsgd": "algo.levels", "lattice": "algo.bits", "powersgd": "algo.rank"}
    assert COMPRESSORS.entry("dgc").config is DGCOptions
    # DGC's momentum correction and clipping are the algorithm's (memory and hook), not build()'s
    assert sorted(config_params("dgc")) == ["cf", "sample_ratio", "seed", "warmup_epochs"]
    assert config_params("qsgd") == ("seed", "levels") and config_params("fp16") == ()


def test_exchange_world_of_one():
    comm = Communicator()
    x = [randn(3, 4), randn(7)]
    for name in ("none", "topk", "qsgd", "randomk"):
        comp = build(name)
        items = [comp.compress(t, key=i) for i, t in enumerate(x)]
        outs = exchange(comm, comp, items)
        for out, c in zip(outs, items):
            assert torch.equal(out, comp.decompress(c))
    assert exchange(comm, build("topk"), []) == []
    assert comm.stats.comm_bytes == 0
