"""exchange() of compressed payloads on real 2- and 4-rank gloo groups against single-process references.

Every rank compresses its own data (seeded by rank); the reference recomputes all ranks' payloads
locally and averages their decompressions. Byte counts are checked against the analytic padded sizes.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from gloo import run_gloo

from lsgd.comm.communicator import Communicator
from lsgd.compression import Compressed, build, exchange
from lsgd.compression.exchange import dense_is_cheaper

SHAPES = [(5, 7), (13,), (3000,), (3, 4, 2)]
STEP = 3
CASES = [
    ("none", {}),
    ("fp16", {}),
    ("randomk", {"cf": 10, "seed": 7}),
    ("topk", {"cf": 10}),
    ("dgc", {"cf": 20, "seed": 3}),  # a seed whose samples select unequal counts on ranks 0, 1 (and 2, 3)
    ("redsync", {"cf": 10}),
    ("qsgd", {"levels": 16, "seed": 7}),
]


def data(rank: int, key: int, shape) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + key)
    x = torch.randn(*shape, generator=g)
    return x * torch.rand(*shape, generator=g).pow(4) * 10  # spread magnitudes: dgc/redsync counts vary


def payloads(name: str, params: dict, rank: int) -> list[Compressed]:
    extra = {"rank": rank} if name == "qsgd" else {}
    comp = build(name, **params, **extra)
    return [comp.compress(data(rank, key, shape), step=STEP, key=key) for key, shape in enumerate(SHAPES)]


def expected_bytes(comp, per_rank: list[list[Compressed]], rank: int) -> int:
    """Analytic bytes this rank hands to the collectives (docs of lsgd.compression.exchange)."""
    mine = per_rank[rank]
    if comp.exchange == "all_reduce":
        return sum(c.values.numel() * c.values.element_size() for c in mine)
    m, p = len(mine), len(per_rank)
    sizes = 0 if comp.fixed_size else 8 * m  # topk / qsgd: sizes known, not exchanged
    scales = 4 * m if mine[0].scale is not None else 0
    if comp.sparse and mine[0].send_indices:  # float32 values + int32 indices; the wire-cost rule
        return sizes + payload_bytes(per_rank, rank, p) + scales
    longest = max(sum(c.values.numel() for c in items) for items in per_rank)
    per_element = mine[0].values.element_size()
    return sizes + longest * per_element + scales


def _worker(rank, world):
    for name, params in CASES:
        comm = Communicator()
        comp = build(name, **params)  # qsgd: rank from torch.distributed
        mine = [comp.compress(data(rank, key, shape), step=STEP, key=key) for key, shape in enumerate(SHAPES)]
        per_rank = [payloads(name, params, r) for r in range(world)]
        # this rank's payloads are the ones the reference recomputes for it
        for a, b in zip(mine, per_rank[rank]):
            assert torch.equal(a.values, b.values), name
        outs = exchange(comm, comp, mine)
        for i, out in enumerate(outs):
            ref = sum(comp.decompress(items[i]) for items in per_rank) / world
            assert out.shape == SHAPES[i] and out.dtype == torch.float32
            tol = {"rtol": 2e-3, "atol": 2e-3} if name == "fp16" else {"rtol": 1e-5, "atol": 1e-6}
            assert torch.allclose(out, ref, **tol), (name, i, (out - ref).abs().max())
        assert comm.stats.comm_bytes == expected_bytes(comp, per_rank, rank), (name, comm.stats.comm_bytes)
        if comp.fixed_size:  # no padding, no size exchange: exactly the payload bytes
            assert comm.stats.comm_bytes == sum(c.nbytes for c in mine), name
        if name in ("dgc", "redsync"):
            counts = [sum(c.values.numel() for c in items) for items in per_rank]
            assert len(set(counts)) > 1, (name, counts)  # the unequal-size path was exercised

    # randomk: the indices are the same on every rank (gathered raw, uncounted)
    comp = build("randomk", cf=10, seed=7)
    c = comp.compress(data(rank, 2, (3000,)), step=STEP, key=2)
    got = [torch.empty_like(c.indices) for _ in range(world)]
    dist.all_gather(got, c.indices)
    assert all(torch.equal(g, c.indices) for g in got)

    _crafted_unequal(rank, world)
    _dense_fallback(rank, world)


def _crafted_unequal(rank, world):
    """Hand-made payloads of unequal sizes (exchanged with ``uniform=False``): item 0 has k = rank
    (k = 0 on rank 0), item 1 has 3 - rank elements (none on rank 3), item 2 is empty everywhere;
    then a call where every item is empty everywhere."""
    comp = build("topk", cf=10)

    def item(r, n, k, key):
        idx = torch.arange(k, dtype=torch.int32) * 2 + r % 2
        vals = torch.arange(1, k + 1, dtype=torch.float32) * (r + 1) + key
        return Compressed(vals, idx, torch.Size([n]), torch.float32)

    def items(r):
        return [item(r, 20, r, 0), item(r, 9, max(0, 3 - r), 1), item(r, 6, 0, 2)]

    comm = Communicator()
    outs = exchange(comm, comp, items(rank), uniform=False)
    for i, out in enumerate(outs):
        ref = sum(comp.decompress(items(r)[i]) for r in range(world)) / world
        assert torch.allclose(out, ref), (i, out, ref)
    expected = 8 * 3 + payload_bytes([items(r) for r in range(world)], rank, world)
    assert comm.stats.comm_bytes == expected

    comm = Communicator()
    empty = [item(rank, 4, 0, 0), item(rank, 5, 0, 1)]
    outs = exchange(comm, comp, empty, uniform=False)
    assert all(torch.equal(o, torch.zeros(n)) for o, n in zip(outs, (4, 5)))
    assert comm.stats.comm_bytes == 8 * 2  # only the counts travel
    assert exchange(comm, comp, []) == [] and comm.stats.comm_bytes == 16
    # the same payloads through dgc (variable size: sizes exchanged by default)
    comm = Communicator()
    dgc = build("dgc", cf=10)
    outs = exchange(comm, dgc, items(rank))
    for i, out in enumerate(outs):
        assert torch.allclose(out, sum(dgc.decompress(items(r)[i]) for r in range(world)) / world)
    assert comm.stats.comm_bytes == expected


def travels_dense(k_max: int, numel: int, p: int) -> bool:
    """Closed form of the wire-cost rule for float32 values with int32 indices: all-gathering
    k_max * 8 bytes from p workers puts (p-1) k_max 8 bytes on a link, a ring all-reduce of the
    dense tensor 2 (p-1)/p numel 4 (Patarasuk and Yuan 2009)."""
    return (p - 1) * k_max * 8 >= 2 * (p - 1) / p * numel * 4


def payload_bytes(per_rank, rank, p):
    """Bytes rank ``rank`` hands to collectives for float32 sparse items (indices sent), sizes
    exchanged separately: dense items all-reduce numel * 4; sparse ones share one all-gather
    buffer of the longest sparse payload over the ranks (values and indices, 8 bytes a value)."""
    m = len(per_rank[0])
    k_max = [max(per_rank[r][i].values.numel() for r in range(p)) for i in range(m)]
    dense = [travels_dense(k_max[i], per_rank[0][i].numel, p) for i in range(m)]
    longest = max(sum(per_rank[r][i].values.numel() for i in range(m) if not dense[i]) for r in range(p))
    return sum(4 * per_rank[rank][i].numel for i in range(m) if dense[i]) + 8 * longest


def test_wire_cost_rule_closed_form():
    # 32 workers, top-k at CF 10 (10% of the values + int32 indices = 20% of the dense bytes):
    # the all-gather would put 31 * 0.2 n on a link against 2 * 31/32 n for the dense all-reduce
    n = 1000
    assert travels_dense(100, n, 32) and not travels_dense(100, n, 4)
    c = Compressed(torch.zeros(100), torch.zeros(100, dtype=torch.int32), torch.Size([n]), torch.float32)
    assert dense_is_cheaper(c, 100, 32) and not dense_is_cheaper(c, 100, 4)
    # at 2 workers the rule is "sparse payload >= dense size"
    assert dense_is_cheaper(c, 500, 2) and not dense_is_cheaper(c, 499, 2)


def _dense_fallback(rank, world):
    """Items whose sparse payload would be at least the dense size travel dense (all-reduce of the
    decompressed tensor): the same mean, and never more bytes than the dense tensor."""
    topk = build("topk", cf=1 / 0.99)  # Accordion's low level: 99% kept, 8 bytes per kept element
    per_rank = [[topk.compress(data(r, key, shape), step=STEP, key=key) for key, shape in enumerate(SHAPES)]
                for r in range(world)]
    comm = Communicator()
    outs = exchange(comm, topk, per_rank[rank])
    for i, out in enumerate(outs):
        ref = sum(topk.decompress(items[i]) for items in per_rank) / world
        assert torch.allclose(out, ref, rtol=1e-5, atol=1e-6), i
    dense = sum(4 * torch.Size(s).numel() for s in SHAPES)
    assert comm.stats.comm_bytes == dense  # not 2x dense: no indices travel

    # mixed levels in one call (Accordion: per layer): 99% kept travels dense, 10% kept sparse
    cfs = [1 / 0.99, 10, 1 / 0.99, 10]
    mixed = [[topk.compress(data(r, key, shape), step=STEP, key=key, cf=cf)
              for key, (shape, cf) in enumerate(zip(SHAPES, cfs))] for r in range(world)]
    comm = Communicator()
    outs = exchange(comm, topk, mixed[rank])
    for i, out in enumerate(outs):
        ref = sum(topk.decompress(items[i]) for items in mixed) / world
        assert torch.allclose(out, ref, rtol=1e-5, atol=1e-6), i
    want = sum(4 * c.numel if cf < 2 else c.nbytes for c, cf in zip(mixed[rank], cfs))
    assert comm.stats.comm_bytes == want

    # variable counts: the largest count over the workers decides, so all ranks agree even when
    # only some of them would cross the threshold on their own
    def items(r):
        n = 8
        k0 = min(n, 2 * r)  # 0, 2, 4, 6: sparse with 2 ranks, dense with 4 (largest count 6)
        k1 = 1
        return [Compressed(torch.arange(1.0, k0 + 1) * (r + 1), torch.arange(k0, dtype=torch.int32), torch.Size([n]),
                           torch.float32),
                Compressed(torch.tensor([float(r + 1)]), torch.tensor([r % 3], dtype=torch.int32), torch.Size([3]),
                           torch.float32)]

    comm = Communicator()
    dgc = build("dgc", cf=10)
    outs = exchange(comm, dgc, items(rank))
    for i, out in enumerate(outs):
        assert torch.allclose(out, sum(dgc.decompress(items(r)[i]) for r in range(world)) / world), i
    assert comm.stats.comm_bytes == 8 * 2 + payload_bytes([items(r) for r in range(world)], rank, world)


@pytest.mark.parametrize("world", [2, 4])
def test_exchange_matches_single_process_mean(world):
    run_gloo(_worker, world)
