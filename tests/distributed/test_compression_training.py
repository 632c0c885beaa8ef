"""4-rank gloo runs of every compression algorithm on tiny data: the loss falls and the counted
bytes are lower than DDP's by the analytic factor of each compressor."""

from __future__ import annotations

import math

import torch
from gloo import run_gloo
from torch import nn

from lsgd.algorithms import build_algorithm
from lsgd.comm.communicator import Communicator

STEPS = 40
SIZES = None  # parameter sizes of the model, filled on first use


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))


def data(rank: int):
    g = torch.Generator().manual_seed(7)
    teacher = torch.randn(20, 4, generator=g)
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(STEPS, 32, 20, generator=g)
    return x, (x @ teacher).argmax(-1)


def train(cfg: dict, rank: int, steps_per_epoch: int = 10):
    model = make_model()
    comm = Communicator()
    algo = build_algorithm(cfg, comm)
    algo.steps_per_epoch, algo.batch_size = steps_per_epoch, 32
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    net = algo.setup(model, opt)
    xs, ys = data(rank)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(xs[step]), ys[step])
        loss.backward()
        algo.after_backward(step)
        opt.step()
        algo.after_step(step + 1)
        losses.append(loss.item())
    return losses, comm.stats.comm_bytes, algo, model


def sparse_bytes(sizes, cf, p):
    """Payload of exact top-k per tensor: k float32 values + k int32 indices, or the dense 4 n when
    all-gathering them from p workers would put at least a ring all-reduce's bytes on a link:
    (p-1) 8k >= 2 (p-1)/p 4n (lsgd.compression.exchange.dense_is_cheaper)."""
    return sum(4 * n if (p - 1) * 8 * math.ceil(n / cf) >= 2 * (p - 1) / p * 4 * n else 8 * math.ceil(n / cf)
               for n in sizes)


def _worker(rank, world):
    sizes = [p.numel() for p in make_model().parameters()]
    dense = sum(4 * n for n in sizes)
    _, ddp_bytes, _, _ = train({"name": "ddp", "bucket_cap_mb": 25}, rank)
    assert ddp_bytes == STEPS * dense

    def check_learns(name, losses):
        start, end = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        assert end < 0.7 * start, f"{name}: loss did not fall ({start:.3f} -> {end:.3f})"

    base = {"name": "compressed", "error_feedback": True, "bucket_cap_mb": 25, "seed": 0, "momentum_correction": True,
            "sample_ratio": 0.5, "warmup_epochs": 0, "levels": 127}
    expected = {  # compressor, cf -> exact bytes per step (None: bounded instead)
        ("topk", 10): sparse_bytes(sizes, 10, world),
        ("randomk", 10): sum(4 * math.ceil(n / 10) for n in sizes),
        ("fp16", 1): dense // 2,
        ("qsgd", 1): None,
        ("dgc", 10): None,
        ("redsync", 10): None,
    }
    for (compressor, cf), per_step in expected.items():
        losses, nbytes, _, _ = train({**base, "compressor": compressor, "cf": cf}, rank)
        check_learns(compressor, losses)
        if per_step is not None:
            assert nbytes == STEPS * per_step, (compressor, nbytes, STEPS * per_step)
        elif compressor == "qsgd":  # int8 levels + one float32 norm per tensor, exchanged by all-gather
            assert ddp_bytes / nbytes > 3, (compressor, ddp_bytes / nbytes)
        else:  # threshold sparsifiers: variable k, about cf/2 fewer bytes than dense (values + indices)
            assert ddp_bytes / nbytes > 2, (compressor, ddp_bytes / nbytes)

    # PowerSGD through torch's hook (start after 2 steps): far fewer bytes than dense
    losses, nbytes, algo, _ = train({**base, "compressor": "powersgd", "rank": 1, "start_iter": 2,
                                      "warm_start": True, "min_compression_rate": 2.0}, rank)
    check_learns("powersgd", losses)
    assert ddp_bytes / nbytes > 4

    # GraVAC over top-k with a low epsilon: compressed payloads are sent, bytes drop accordingly
    gravac = {"name": "gravac", "compressor": "topk", "epsilon": 0.05, "cf_min": 10, "cf_max": 100, "window": 10,
              "omega": 0.01, "policy": "geometric", "ratio": 2.0, "scale_start": 2.0, "ewma": 0.5,
              "error_feedback": True, "throughput_time": "measured", "seed": 0}
    losses, nbytes, algo, _ = train(gravac, rank)
    check_learns("gravac", losses)
    rows = algo.pop_step_rows()
    assert len(rows) == STEPS and [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["sent"] in ("candidate", "min", "dense") for r in rows)
    gradient_bytes = nbytes - STEPS * 48  # minus the six float64 decision values all-reduced per step
    assert ddp_bytes / gradient_bytes > 4
    assert abs(gradient_bytes - sum(dense / r["cf"] for r in rows)) < 1e-6 * gradient_bytes

    # Accordion over top-k: bytes follow the per-step low/high decisions it reports
    acc = {"name": "accordion", "compressor": "topk", "cf_low": 1 / 0.99, "cf_high": 10, "switch_period": 1,
           "eta": 0.5, "error_feedback": True, "bucket_cap_mb": 25, "seed": 0}
    losses, nbytes, algo, _ = train(acc, rank, steps_per_epoch=10)
    check_learns("accordion", losses)
    rows = algo.pop_step_rows()
    assert rows[0]["low_fraction"] == 1.0  # the first period is forced low
    assert rows[0]["cf"] == 1.0  # 99% kept travels dense (values + indices would be 2x dense)
    assert abs(nbytes - sum(dense / r["cf"] for r in rows)) < 1e-6 * nbytes

    # Accordion over torch's PowerSGD (rank 2 low / rank 1 high), one bucket per layer
    acc_p = {**acc, "compressor": "powersgd", "rank_low": 2, "rank_high": 1, "bucket_cap_mb": 0.001,
             "start_iter": 2, "warm_start": True, "min_compression_rate": 1.0}
    losses, nbytes, algo, _ = train(acc_p, rank, steps_per_epoch=10)
    check_learns("accordion-powersgd", losses)
    rows = algo.pop_step_rows()
    assert rows[0]["low_fraction"] == 1.0
    assert nbytes < ddp_bytes / 2
    assert algo.powersgd_high.sent_bytes > 0, "no bucket ever used the high-compression (rank 1) state"


def test_every_compression_algorithm_learns_and_sends_fewer_bytes():
    run_gloo(_worker, 4)
