"""The lattice quantizer as a gradient compressor (``compressor=lattice``): its exchange on real gloo
groups against a single-process reference, the caught decode and full-precision resend, the bytes in
closed form, and algo=compressed through the trainer."""

from __future__ import annotations

import math

import torch
from gloo import run_gloo
from trainer_runs import records, run

from lsgd.comm.communicator import Communicator
from lsgd.compression import build
from lsgd.compression.exchange import exchange

SHAPES = [(40, 30), (257,), (3, 3, 3)]
BITS, SIDE, SEED, STEP = 8, 1e-3, 5, 3


def tensors(rank: int, far: bool = False) -> list[torch.Tensor]:
    """Close across ranks: a common base + noise of 0.02 (the safe radius is 2^8 x 1e-3 / 2 = 0.128);
    ``far``: rank 1's second tensor moved by 1.0, outside every other rank's radius."""
    base = torch.Generator().manual_seed(0)
    noise = torch.Generator().manual_seed(100 + rank)
    out = [torch.randn(*s, generator=base) + 0.02 * torch.randn(*s, generator=noise) for s in SHAPES]
    if far and rank == 1:
        out[1] = out[1] + 1.0
    return out


def _worker(rank, world, far, out_dir):
    comm = Communicator()
    comp = build("lattice", bits=BITS, side=SIDE, seed=SEED)
    items = [comp.compress(t, step=STEP, key=k) for k, t in enumerate(tensors(rank, far))]
    got = exchange(comm, comp, items)
    torch.save({"got": got, "bytes": comm.stats.comm_bytes, "resent": comp.resent}, out_dir / f"rank{rank}.pt")


def reference(world, far):
    """The mean of every rank's lattice point (the quantizer is the component tested on its own in
    tests/unit/test_lattice.py); items some rank cannot decode: the mean of the tensors themselves."""
    points, raw = [], []
    for r in range(world):
        comp = build("lattice", bits=BITS, side=SIDE, seed=SEED, rank=r)
        points.append([comp.compress(t, step=STEP, key=k).point for k, t in enumerate(tensors(r, far))])
        raw.append(tensors(r, far))
    means = [sum(points[r][i] for r in range(world)) / world for i in range(len(SHAPES))]
    exact = [sum(raw[r][i].reshape(-1).double() for r in range(world)) / world for i in range(len(SHAPES))]
    return means, exact


def check(tmp_path, world, far):
    run_gloo(_worker, world, far, tmp_path)
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    means, exact = reference(world, far)
    codes = sum(math.ceil(BITS * math.prod(s) / 8) + 24 for s in SHAPES)
    flags = len(SHAPES)
    for g in got:
        for i, s in enumerate(SHAPES):
            want = exact[i] if (far and i == 1) else means[i]
            torch.testing.assert_close(g["got"][i].reshape(-1).double(), want.to(torch.float32).double(), atol=1e-6, rtol=0)
            assert (g["got"][i].reshape(-1).double() - exact[i]).abs().max() <= SIDE  # within one side of the true mean
        resent_bytes = 257 * 4 if far else 0
        assert g["bytes"] == codes + flags + resent_bytes
        assert g["resent"] == (1 if far else 0)
    for g in got[1:]:  # every rank holds the same average
        for a, b in zip(g["got"], got[0]["got"]):
            assert torch.equal(a, b)


def test_lattice_exchange_averages_the_lattice_points(tmp_path):
    check(tmp_path, 4, far=False)


def test_a_decode_outside_the_radius_is_caught_and_averaged_at_full_precision(tmp_path):
    check(tmp_path, 4, far=True)


def test_compressed_lattice_trains_through_the_trainer(tmp_path):
    """algo=compressed with the lattice on 2 ranks: replicas stay identical (every rank computes the
    same average) and the records carry lattice_resent."""
    recs = [r for r in records(run(tmp_path, ["algo=compressed", "algo.compressor=lattice", "algo.side=1e-3",
                                              "max_steps=6"], world=2)) if "kind" not in r]
    assert recs[-1]["step"] == 6 and "lattice_resent" in recs[-1]
    models = [torch.load(tmp_path / "run" / f"rank{r}.pt") for r in range(2)]
    for a, b in zip(models[0]["params"], models[1]["params"]):
        assert torch.equal(a, b)
