"""Adasum (docs/papers.md#adasum) on real gloo groups of 2, 3, 4, 5, 6 and 8 ranks against the
single-process tree reference and closed forms (Horovod's test oracles: orthogonal -> sum, parallel
-> mean, tiny and widely spread scales stay finite, relative error below 100 eps of the dtype); the
hierarchical reduction (Horovod's AdasumGpuAllreduceOp pattern) against Adasum of node means, its
bytes per collective and its price on the intra- and inter-node links of the cluster clock."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from gloo import run_gloo
from torch import nn

from lsgd.algorithms.adasum import adasum as A
from lsgd.algorithms.adasum.adasum import (
    Adasum,
    adasum_pair,
    adasum_reduce_,
    adasum_reduce_hierarchical_,
    adasum_tree_reference,
    node_groups,
)
from lsgd.clock.network import Network, NetworkModel, cost_terms
from lsgd.clock.worker_clock import Clock
from lsgd.comm.communicator import Communicator

F32, F16, BF16, F64 = torch.float32, torch.float16, torch.bfloat16, torch.float64


def eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref.double()).norm() / ref.double().norm())


def assert_rel(x: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype | None = None, what: str = "") -> None:
    dtype = dtype or x.dtype
    assert torch.isfinite(x).all(), what
    err = rel_err(x, ref)
    assert err <= 100 * eps(dtype), f"{what}: relative error {err:.3g} > 100 eps({dtype})"


def randn(seed: int, shape, dtype=F32) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def rand_scales(seed: int, p: int, lo: float, hi: float) -> list[float]:
    """p positive scales 2**u, u uniform in [lo, hi]."""
    u = torch.rand(p, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return [2.0 ** float(lo + (hi - lo) * v) for v in u]


# -- the pairwise operator (single process) ----------------------------------------------------
def closed_form(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = a.double(), b.double()
    ab, aa, bb = (a * b).sum(), (a * a).sum(), (b * b).sum()
    thr = 2.2250738585072014e-308**0.5
    ca = 1 - ab / (2 * aa) if aa >= thr else 1.0
    cb = 1 - ab / (2 * bb) if bb >= thr else 1.0
    return ca * a + cb * b


@pytest.mark.parametrize("dtype", [F32, F64, F16, BF16])
def test_pair_matches_closed_form(dtype):
    a, b = randn(1, (4, 5), dtype), randn(2, (4, 5), dtype)
    out = adasum_pair(a, b)
    assert out.dtype == dtype and out.shape == (4, 5)
    assert_rel(out, closed_form(a, b), dtype)


def test_pair_orthogonal_gives_sum_and_parallel_gives_mean():
    a = torch.zeros(10)
    b = torch.zeros(10)
    a[:5], b[5:] = randn(3, 5), randn(4, 5) * 1e6
    assert_rel(adasum_pair(a, b), a + b)
    u = randn(5, 33)
    for sa, sb in [(1.0, 3.0), (1e-10, 1e10), (2.0**-60, 2.0**60), (7.0, 7.0)]:
        assert_rel(adasum_pair(sa * u, sb * u), (sa + sb) / 2 * u.double())
    # identical inputs: exactly that input
    assert torch.equal(adasum_pair(u, u), u)


def test_pair_tiny_norm_has_coefficient_one():
    b = randn(6, 8, F64)
    a = randn(7, 8, F64) * 1e-160  # |a|^2 ~ 1e-320 < sqrt(DBL_MIN): ca = 1
    want = a + (1 - (a * b).sum() / (2 * (b * b).sum())) * b
    torch.testing.assert_close(adasum_pair(a, b), want, rtol=1e-15, atol=0)
    assert torch.equal(adasum_pair(torch.zeros(8), randn(8, 8)), randn(8, 8))  # zero input: the other
    assert torch.equal(adasum_pair(torch.zeros(3), torch.zeros(3)), torch.zeros(3))
    # float32 inputs whose squared norm underflows in float32 but not in float64
    t = torch.full((16,), 2.0**-125)
    assert float((t * t).sum()) == 0.0
    assert_rel(adasum_pair(t, 3 * t), 2 * t.double())


def test_pair_errors():
    with pytest.raises(ValueError):
        adasum_pair(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError):
        adasum_pair(torch.zeros(3), torch.zeros(3, dtype=F64))
    with pytest.raises(TypeError):
        adasum_pair(torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError):
        adasum_tree_reference([])


def test_tree_reference_order():
    g = [[randn(10 + r, 6)] for r in range(6)]
    P = adasum_pair
    assert torch.equal(adasum_tree_reference(g[:4])[0], P(P(g[0][0], g[1][0]), P(g[2][0], g[3][0])))
    # p = 3: fold rank 2 into rank 0 first, then the tree over ranks 0, 1
    assert torch.equal(adasum_tree_reference(g[:3])[0], P(P(g[0][0], g[2][0]), g[1][0]))
    # p = 6: fold 4 -> 0 and 5 -> 1
    want = P(P(P(g[0][0], g[4][0]), P(g[1][0], g[5][0])), P(g[2][0], g[3][0]))
    assert torch.equal(adasum_tree_reference(g)[0], want)
    assert torch.equal(adasum_tree_reference(g[:1])[0], g[0][0])


@pytest.mark.parametrize("dtype", [F32, F16])
def test_cpu_and_vectorized_kernels_agree(monkeypatch, dtype):
    """The chunked CPU dot-product kernel (chunks smaller than tensors, tensors smaller than
    chunks) and the vectorized (CUDA) kernel give the same per-tensor sums and combination."""
    monkeypatch.setattr(A, "_CHUNK", 16)
    numels = [1, 40, 3, 17, 64, 5]
    layout = A._Layout(numels)
    lo, hi = 7, 130
    segs = layout.segments(lo, hi)
    assert sum(e - s for _, s, e in segs) == hi - lo and segs[0][1] == lo and segs[-1][2] == hi
    a, b = randn(1, hi - lo, dtype), randn(2, hi - lo, dtype)
    d_cpu = A._partial_dots(a, b, segs, lo, len(numels), vectorized=False).view(3, -1)
    d_vec = A._partial_dots(a, b, segs, lo, len(numels), vectorized=True).view(3, -1)
    torch.testing.assert_close(d_cpu, d_vec, rtol=1e-14, atol=0)
    for t, s, e in segs:
        x, y = a[s - lo : e - lo].double(), b[s - lo : e - lo].double()
        torch.testing.assert_close(d_cpu[:, t], torch.stack([x @ y, x @ x, y @ y]), rtol=1e-14, atol=0)
    assert float(d_cpu[:, 0].abs().sum()) == 0.0  # tensor 0 lies outside [lo, hi)
    ca, cb = A._coefficients(d_cpu[0], d_cpu[1], d_cpu[2])
    x1, x2 = a.clone(), a.clone()
    A._combine_(x1, b, ca, cb, segs, lo, vectorized=False)
    A._combine_(x2, b, ca, cb, segs, lo, vectorized=True)
    for t, s, e in segs:
        want = adasum_pair(a[s - lo : e - lo], b[s - lo : e - lo])
        assert_rel(x1[s - lo : e - lo], want, dtype)
        assert_rel(x2[s - lo : e - lo], want, dtype)
    # a region that ends in padding past the last tensor (a hierarchical shard): padding is ignored
    lo, hi = 100, layout.n + 11
    segs = layout.segments(lo, hi)
    assert segs[-1][2] == layout.n
    a, b = randn(3, hi - lo, dtype), randn(4, hi - lo, dtype)
    d_cpu = A._partial_dots(a, b, segs, lo, len(numels), vectorized=False)
    d_vec = A._partial_dots(a, b, segs, lo, len(numels), vectorized=True)
    cut = layout.n - lo
    want = A._partial_dots(a[:cut], b[:cut], segs, lo, len(numels), vectorized=False)
    torch.testing.assert_close(d_cpu, want, rtol=1e-14, atol=0)
    torch.testing.assert_close(d_vec, want, rtol=1e-14, atol=0)
    d = d_cpu.view(3, -1)
    ca, cb = A._coefficients(d[0], d[1], d[2])
    for vectorized in (False, True):
        x = a.clone()
        A._combine_(x, b, ca, cb, segs, lo, vectorized=vectorized)
        assert torch.equal(x[cut:], a[cut:])
        for t, s, e in segs:
            assert_rel(x[s - lo : e - lo], adasum_pair(a[s - lo : e - lo], b[s - lo : e - lo]), dtype)


def test_cpu_kernels_mix_short_and_long_pieces():
    """With the shipped chunk size: BatchNorm-sized pieces (gathered) between conv-sized ones
    (chunked, one longer than a chunk) give per-tensor float64 dot products equal to torch.dot
    of the float64 pieces, and the combination of adasum_pair, in any region."""
    numels = [64, 9408, 64, 64, (1 << 16) + 37, 256, 3, 4096, 4095]
    layout = A._Layout(numels)
    for lo, hi in ((0, layout.n), (100, layout.n - 50), (9000, 9500)):
        segs = layout.segments(lo, hi)
        a, b = randn(5, hi - lo), randn(6, hi - lo)
        d = A._partial_dots(a, b, segs, lo, len(numels), vectorized=False).view(3, -1)
        for t, s, e in segs:
            x, y = a[s - lo : e - lo].double(), b[s - lo : e - lo].double()
            torch.testing.assert_close(d[:, t], torch.stack([x @ y, x @ x, y @ y]), rtol=1e-13, atol=0)
        inside = {t for t, _, _ in segs}
        assert all(float(d[:, t].abs().sum()) == 0.0 for t in range(len(numels)) if t not in inside)
        ca, cb = A._coefficients(d[0], d[1], d[2])
        x = a.clone()
        A._combine_(x, b, ca, cb, segs, lo, vectorized=False)
        for t, s, e in segs:
            assert_rel(x[s - lo : e - lo], adasum_pair(a[s - lo : e - lo], b[s - lo : e - lo]), F32)


def test_reduce_without_process_group_is_a_no_op():
    t = randn(1, 5)
    adasum_reduce_([t.clone()])
    adasum_reduce_([])
    with pytest.raises(TypeError):
        adasum_reduce_([torch.zeros(2, dtype=torch.int32)])
    with pytest.raises(ValueError):
        adasum_reduce_([torch.zeros(2), torch.zeros(2, device="meta")])


# -- the distributed reduction --------------------------------------------------------------------
def inputs(seed: int, p: int, sizes, dtype=F32) -> list[list[torch.Tensor]]:
    return [[randn(seed * 1000 + 10 * r + i, s, dtype) for i, s in enumerate(sizes)] for r in range(p)]


def expected_p2p_bytes(rank: int, p: int, n: int, b: int, num_tensors: int) -> int:
    """Per-rank bytes of vector halving / distance doubling, written out from the description:
    at level k the pair splits its region of m elements into floor(m/2) (lower rank keeps) and the
    rest; halving sends the other half, the all-gather sends the kept half back; 3 * num_tensors
    float64 per dot-product exchange, k + 1 exchanges at level k; folding sends n elements each way."""
    q = 2 ** int(math.log2(p))
    L = int(math.log2(q))
    if rank >= q:
        return n * b
    sent, m = 0, n
    for k in range(L):
        first, second = m // 2, m - m // 2
        lower = (rank >> k) % 2 == 0
        keep, give = (first, second) if lower else (second, first)
        sent += give * b  # halving
        sent += keep * b  # the matching all-gather step
        sent += (k + 1) * 3 * num_tensors * 8
        m = keep
    if rank + q < p:
        sent += n * b
    return sent


def check_same_on_all_ranks(tensors: list[torch.Tensor], p: int) -> None:
    flat = torch.cat([t.detach().reshape(-1).double() for t in tensors])
    out = [torch.empty_like(flat) for _ in range(p)]
    dist.all_gather(out, flat)
    for o in out:
        assert torch.equal(o, flat), "ranks differ"


def reduce_checks(rank: int, p: int) -> None:
    pow2 = p & (p - 1) == 0

    def run(per_rank, comm=None):
        mine = [t.clone() for t in per_rank[rank]]
        adasum_reduce_(mine, comm)
        check_same_on_all_ranks(mine, p)
        return mine

    # random tensors: sizes 1, odd, not divisible by p, a 2-D one; several in one call
    sizes = [1, 7, 2 * p + 1, (3, 5), 37, 128]
    per = inputs(1, p, sizes)
    for got, want in zip(run(per), adasum_tree_reference(per)):
        assert got.shape == want.shape
        assert_rel(got, want, what=f"random p={p}")
    # a single element alone (most ranks hold empty regions)
    per = inputs(2, p, [1])
    assert_rel(run(per)[0], adasum_tree_reference(per)[0], what="one element")

    # orthogonal inputs (disjoint supports, scales spread to sqrt(max float32)) -> their sum
    scales = rand_scales(3, p, -63, 63)
    n = 4 * p + 3
    per = []
    for r in range(p):
        x = torch.zeros(n)
        x[r::p] = randn(30 + r, len(range(r, n, p))) * scales[r]
        y = torch.zeros(2 * p + 1)
        y[r] = scales[r]
        per.append([x, y])
    got = run(per)
    assert_rel(got[0], sum(t[0].double() for t in per), what="orthogonal")
    assert_rel(got[1], sum(t[1].double() for t in per), what="orthogonal basis")
    assert_rel(got[0], adasum_tree_reference(per)[0], what="orthogonal ref")

    # parallel inputs with random positive scales -> mean (power of two); identical -> themselves
    u = randn(4, 45)
    for lo, hi in [(-3, 3), (-60, 60)]:
        scales = rand_scales(5 + hi, p, lo, hi)
        per = [[u * s] for s in scales]
        got = run(per)[0]
        assert_rel(got, adasum_tree_reference(per)[0], what="parallel ref")
        if pow2:
            assert_rel(got, sum(t[0].double() for t in per) / p, what=f"parallel mean {lo},{hi}")
    per = [[u.clone(), randn(6, 9)] for _ in range(p)]
    got = run(per)
    assert torch.equal(got[0], u) and torch.equal(got[1], per[0][1])

    # near the smallest normal float32: squared norms underflow in float32, not in float64
    tiny = 2.0**-125
    per = [[(torch.rand(19, generator=torch.Generator().manual_seed(40 + r)) + 1)
            * torch.sign(randn(50 + r, 19)) * tiny] for r in range(p)]
    assert float((per[0][0] * per[0][0]).sum()) == 0.0
    got = run(per)[0]
    assert got.abs().max() > 0
    assert_rel(got, adasum_tree_reference(per)[0], what="tiny")
    v = torch.ones(16) * tiny
    scales = rand_scales(7, p, 0, 2)
    got = run([[v * s] for s in scales])[0]
    if pow2:
        assert_rel(got, v.double() * sum(scales) / p, what="tiny parallel mean")
    per = []
    for r in range(p):
        x = torch.zeros(p, 3)
        x[r] = tiny * (r + 1)
        per.append([x])
    got = run(per)[0]
    assert_rel(got, sum(t[0].double() for t in per), what="tiny orthogonal sum")

    # widely spread scales on random directions
    scales = rand_scales(8, p, -63, 63)
    per = [[randn(60 + r, 23) * scales[r], randn(70 + r, 4) / scales[r]] for r in range(p)]
    for got, want in zip(run(per), adasum_tree_reference(per)):
        assert_rel(got, want, what="spread scales")

    # float16, bfloat16, float64 and a mixed-dtype call
    for dtype in (F16, BF16, F64):
        per = inputs(9, p, [1, 5, 2 * p + 1, 40], dtype)
        for got, want in zip(run(per), adasum_tree_reference(per)):
            assert got.dtype == dtype
            assert_rel(got, want, dtype, what=str(dtype))
    per = [[randn(90 + r, 11, F32), randn(91 + r, 6, F16), randn(92 + r, 3, F32)] for r in range(p)]
    for got, want in zip(run(per), adasum_tree_reference(per)):
        assert_rel(got, want, what="mixed dtypes")

    # byte accounting: one odd-sized float32 buffer of 3 tensors
    sizes = [5, 8, 20]
    n = sum(sizes)
    comm = Communicator()
    run(inputs(11, p, sizes), comm=comm)
    assert comm.stats.comm_bytes == expected_p2p_bytes(rank, p, n, 4, len(sizes))
    counts = [None] * p
    dist.all_gather_object(counts, comm.stats.comm_bytes)
    q = 2 ** int(math.log2(p))
    L = int(math.log2(q))
    dots = L * (L + 1) // 2 * 3 * len(sizes) * 8
    # closed form: summed over the q tree ranks the halving + all-gather traffic is 2 (q-1) n b
    tree = sum(counts[:q]) - q * dots - (p - q) * n * 4
    assert tree == 2 * (q - 1) * n * 4


@pytest.mark.parametrize("world", [2, 3, 4, 5, 6, 8])
def test_reduce_matches_tree_reference(world):
    run_gloo(reduce_checks, world)


def fold_wait_checks(rank: int, p: int) -> None:
    """World 3: rank 2 is folded into rank 0; its last exchange only receives the result. That wait
    is communication: measured in comm_time_s and clocked at the sender's start + the p2p cost."""
    net = Network(NetworkModel(1.0, 50.0))
    clock = Clock(net.k)
    comm = Communicator(net, clock=clock)
    sizes = [5, 8, 20]
    nbytes = sum(sizes) * 4
    mine = [t.clone() for t in inputs(13, p, sizes)[rank]]
    if rank == 0:
        clock.compute(1.0)  # rank 0 is 1 s late (modeled) ...
        time.sleep(0.3)     # ... and 0.3 s late (measured)
    adasum_reduce_(mine, comm)
    after = comm.gather_values([clock.time_s, comm.stats.comm_time_s])
    if rank == 2:
        # rank 0's last operation is the send of the result (send-only: its clock ends at that
        # send's start + cost); rank 2 receives it at max(ready, rank 0's send start + cost)
        send_start = after[0, 0] - net.inter.p2p(nbytes)
        assert send_start >= 1.0
        assert clock.time_s >= send_start + net.inter.p2p(nbytes) - 1e-12
        assert clock.time_s == pytest.approx(after[0, 0], rel=1e-12)
        assert comm.stats.comm_time_s >= 0.2  # the measured wait for the late rank 0
        assert comm.stats.comm_bytes == nbytes  # it sent its tensors, nothing else


def test_receive_only_wait_is_communication():
    run_gloo(fold_wait_checks, 3)


# -- the hierarchical reduction ---------------------------------------------------------------------
def count_log():
    """Record every counted operation (kind, payload bytes, link, cost on entry 0) of every
    communicator of this process (the worker processes are spawned: the patch stays there)."""
    log = []
    original = Communicator.count

    def count(self, kind, nbytes, p=None, root=0):
        cost = original(self, kind, nbytes, p, root)
        log.append((kind, int(nbytes), self.link, float(cost[0])))
        return cost

    Communicator.count = count
    return log


def node_means(per, local_size: int):
    nodes = len(per) // local_size
    return [[sum(per[j * local_size + lr][i] for lr in range(local_size)) / local_size
             for i in range(len(per[0]))] for j in range(nodes)]


def expected_hierarchical(node: int, nodes: int, local_size: int, n: int, b: int, num_tensors: int) -> dict:
    """Per-rank payload bytes by kind of the Horovod-pattern hierarchy, from the analytic sizes:
    reduce-scatter of the padded buffer N, Adasum over the nodes on the shard s = N / p_l, one
    all-reduce of the 3 T float64 dots per level (and at the fold) inside the node, all-gather of
    the shard."""
    s = -(-n // local_size)
    big = s * local_size
    q = 2 ** int(math.log2(nodes))
    L = int(math.log2(q))
    dot_reductions = 0 if node >= q else L + (node + q < nodes)
    out = {"p2p": expected_p2p_bytes(node, nodes, s, b, num_tensors)}
    if local_size > 1:
        out["reduce_scatter"] = big * b
        out["all_gather"] = s * b
        out["all_reduce"] = dot_reductions * 3 * num_tensors * 8
    return {k: v for k, v in out.items() if v}


HIERARCHIES = {4: [2, 1, 4], 6: [3, 2]}


def hierarchical_checks(rank: int, p: int) -> None:
    log = count_log()
    for local_size in HIERARCHIES[p]:
        nodes = p // local_size
        comm = Communicator()
        local, cross = node_groups(comm, local_size)
        assert (local.world_size, cross.world_size) == (local_size, nodes)
        assert (local.rank, cross.rank) == (rank % local_size, rank // local_size)
        assert local.link == "intra" and cross.link == "inter"
        # sizes that the node size does not divide, a 2-D tensor, tensors smaller than the node
        for sizes in ([7, 1, 13, 2, (3, 5)], [1], [2, 40]):
            per = inputs(12, p, sizes)
            mine = [t.clone() for t in per[rank]]
            log.clear()
            stats0 = comm.stats.as_dict()
            adasum_reduce_hierarchical_(mine, local, cross)
            check_same_on_all_ranks(mine, p)
            for got, want in zip(mine, adasum_tree_reference(node_means(per, local_size))):
                assert got.shape == want.shape
                assert_rel(got, want, what=f"hierarchical {nodes} x {local_size} {sizes}")
            # bytes by kind, and the links they travel on
            n = sum(math.prod(s) if isinstance(s, tuple) else s for s in sizes)
            got_bytes = {}
            for kind, nbytes, link, _ in log:
                got_bytes[kind] = got_bytes.get(kind, 0) + nbytes
                assert link == ("inter" if kind == "p2p" else "intra"), (kind, link)
            want_bytes = expected_hierarchical(rank // local_size, nodes, local_size, n, 4, len(sizes))
            assert got_bytes == want_bytes, (local_size, sizes)
            assert comm.stats.comm_bytes - stats0["comm_bytes"] == sum(want_bytes.values())
            # wire bytes: (p_l-1)/p_l N each for the reduce-scatter and the all-gather
            s = -(-n // local_size)
            wire = 2 * (local_size - 1) * s * 4 + want_bytes.get("p2p", 0)
            wire += 2 * (local_size - 1) / local_size * want_bytes.get("all_reduce", 0)
            assert comm.stats.wire_bytes - stats0["wire_bytes"] == pytest.approx(wire, rel=1e-12)
        # other dtypes and a mixed-dtype call (one buffer per dtype)
        per = [[randn(80 + r, 11, F64), randn(81 + r, 5, F16), randn(82 + r, 3, F64)] for r in range(p)]
        mine = [t.clone() for t in per[rank]]
        adasum_reduce_hierarchical_(mine, local, cross)
        check_same_on_all_ranks(mine, p)
        for got, want in zip(mine, adasum_tree_reference(node_means(per, local_size))):
            assert_rel(got, want, what="hierarchical dtypes")
        # the training algorithm with hierarchical=true: gradients become Adasum of node means
        lin = nn.Linear(8, 1, bias=False)
        algo = Adasum({"name": "adasum", "target": "gradient", "hierarchical": True, "local_size": local_size},
                      Communicator())
        algo.setup(lin, torch.optim.SGD(lin.parameters(), lr=0.1))
        xs = [randn(300 + r, (1, 8)) for r in range(p)]
        lin(xs[rank]).sum().backward()
        algo.after_backward(0)
        want = adasum_tree_reference(node_means([[x] for x in xs], local_size))[0]
        assert_rel(lin.weight.grad, want, what="hierarchical training")
    with pytest.raises(ValueError):
        node_groups(Communicator(), 5)


@pytest.mark.parametrize("world", [4, 6])
def test_hierarchical_is_adasum_of_node_means(world):
    run_gloo(hierarchical_checks, world)


def intra_link_checks(rank: int, p: int) -> None:
    """2 nodes x 2 on a slow inter-node link and a fast intra-node link: the clock advances by the
    closed-form costs, the node's collectives priced on the intra link, the messages on the inter."""
    log = count_log()
    inter, intra = NetworkModel(1.0, 50.0), NetworkModel(1000.0, 1.0)
    net = Network(inter=inter, intra=intra, gpus_per_node=2)
    clock = Clock(net.k)
    comm = Communicator(net, clock=clock)
    local, cross = node_groups(comm, 2)
    assert local.network is intra and cross.network is inter
    sizes = [16, 24]  # n = 40 floats: shard 20, halves 10 on both sides (symmetric: no waiting)
    n, T = sum(sizes) * 4, len(sizes)
    mine = [t.clone() for t in inputs(14, p, sizes)[rank]]
    t0 = clock.time_s
    adasum_reduce_hierarchical_(mine, local, cross)
    want_intra = (intra.cost(*cost_terms("reduce_scatter", n, 2))
                  + intra.cost(*cost_terms("all_reduce", 3 * T * 8, 2))
                  + intra.cost(*cost_terms("all_gather", n // 2, 2)))
    want_inter = 2 * inter.p2p(n // 4) + inter.p2p(3 * T * 8)
    got_intra = sum(c for _, _, link, c in log if link == "intra")
    got_inter = sum(c for _, _, link, c in log if link == "inter")
    assert got_intra == pytest.approx(want_intra, rel=1e-12)
    assert got_inter == pytest.approx(want_inter, rel=1e-12)
    assert clock.time_s - t0 == pytest.approx(want_intra + want_inter, rel=1e-12)
    # the node's collectives priced on the inter-node link would cost about 50x more (latency-bound)
    as_inter = sum(inter.cost(*cost_terms(kind, nb, 2))
                   for kind, nb in [("reduce_scatter", n), ("all_reduce", 3 * T * 8), ("all_gather", n // 2)])
    assert want_intra < as_inter / 40
    assert np.allclose(comm.gather_values([clock.time_s])[:, 0], clock.time_s, rtol=0, atol=1e-15)


def test_hierarchical_intra_node_link_on_the_clock():
    run_gloo(intra_link_checks, 4)


def test_expected_bytes_formula_power_of_two():
    """The test's byte formula reduces to 2 (q-1)/q n b + dot traffic when q divides n."""
    for q, n in [(2, 10), (4, 12), (8, 64)]:
        L = int(math.log2(q))
        for r in range(q):
            assert expected_p2p_bytes(r, q, n, 4, 2) == 2 * (q - 1) * n * 4 // q + L * (L + 1) // 2 * 48


# -- training -------------------------------------------------------------------------------------
def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train_adasum(target: str, data_seed, steps: int, comm: Communicator):
    model = make_model()
    opt = sgd(model)
    algo = Adasum({"name": "adasum", "target": target}, comm)
    net = algo.setup(model, opt)
    for step in range(steps):
        x, y = batch(data_seed(step))
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        algo.after_backward(step)
        opt.step()
        algo.after_step(step + 1)
    assert algo.models_in_sync and algo.state_dict() == {}
    return model


def plain_loop(data_seed, steps: int):
    model = make_model()
    opt = sgd(model)
    for step in range(steps):
        x, y = batch(data_seed(step))
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def test_delta_one_worker_equals_plain_optimizer():
    steps = 4
    got = train_adasum("delta", lambda s: s, steps, Communicator())
    want = plain_loop(lambda s: s, steps)
    for a, b in zip(got.parameters(), want.parameters()):
        assert torch.equal(a, b)


def test_config_errors():
    from lsgd.core.errors import ConfigError

    with pytest.raises(ConfigError):
        Adasum({"name": "adasum", "target": "weights"}, Communicator())


def linear_grad(x: torch.Tensor) -> torch.Tensor:
    """Gradient of sum(w . x) for a bias-free linear layer: x itself."""
    return x.clone()


def training_checks(rank: int, p: int) -> None:
    steps = 3
    # target=delta, identical data on both workers == the single-worker run
    comm = Communicator()
    got = train_adasum("delta", lambda s: s, steps, comm)
    want = plain_loop(lambda s: s, steps)
    for a, b in zip(got.parameters(), want.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    assert comm.stats.comm_rounds == steps
    nbytes = sum(q.numel() for q in got.parameters()) * 4
    assert comm.stats.comm_bytes == steps * expected_p2p_bytes(rank, p, nbytes // 4, 4, 4)

    # target=delta, different data: x = x_old + Adasum(delta_0, delta_1), simulated in-process
    model = train_adasum("delta", lambda s: 100 * s + rank, steps, Communicator())
    sims = [make_model() for _ in range(p)]
    opts = [sgd(m) for m in sims]
    for step in range(steps):
        old = [q.detach().clone() for q in sims[0].parameters()]
        deltas = []
        for r, (m, o) in enumerate(zip(sims, opts)):
            x, y = batch(100 * step + r)
            o.zero_grad()
            F.cross_entropy(m(x), y).backward()
            o.step()
            deltas.append([q.detach() - x0 for q, x0 in zip(m.parameters(), old)])
        new = [x0 + d for x0, d in zip(old, adasum_tree_reference(deltas))]
        for m in sims:
            with torch.no_grad():
                for q, v in zip(m.parameters(), new):
                    q.copy_(v)
    for a, b in zip(model.parameters(), sims[0].parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)

    # target=gradient on a bias-free linear layer: the gradient of sum(w . x) is x
    for case in ("orthogonal", "identical", "random"):
        lin = nn.Linear(8, 1, bias=False)
        algo = Adasum({"name": "adasum", "target": "gradient"}, Communicator())
        algo.setup(lin, torch.optim.SGD(lin.parameters(), lr=0.1))
        xs = []
        for r in range(p):
            x = randn(200 + r if case != "identical" else 200, (1, 8))
            if case == "orthogonal":
                x = x * (torch.arange(8) % p == r)
            xs.append(x)
        lin(xs[rank]).sum().backward()
        assert torch.equal(lin.weight.grad, xs[rank])
        algo.after_backward(0)
        want = adasum_tree_reference([[x] for x in xs])[0]
        assert_rel(lin.weight.grad, want, what=case)
        if case == "orthogonal":
            assert_rel(lin.weight.grad, sum(xs), what="orthogonal sum")
        if case == "identical":
            assert torch.equal(lin.weight.grad, xs[0])

    # BatchNorm buffers are averaged every step
    bn = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4))
    comm = Communicator()
    algo = Adasum({"name": "adasum", "target": "gradient"}, comm)
    opt = torch.optim.SGD(bn.parameters(), lr=0.1)
    algo.setup(bn, opt)
    x, _ = batch(rank)
    bn(x).sum().backward()
    algo.after_backward(0)
    opt.step()
    algo.after_step(1)
    check_same_on_all_ranks(list(bn.parameters()) + [b for b in bn.buffers() if b.is_floating_point()], p)


def test_training_two_workers():
    run_gloo(training_checks, 2)
