"""Alpha-beta cost model, byte counts and schedules against closed forms."""

from __future__ import annotations

import math

import pytest
import torch

from lsgd.comm import Communicator, NetworkModel, tensor_bytes, wire_bytes
from lsgd.optim import lr_factor_fn


def test_ring_formulas():
    net = NetworkModel(bandwidth_gbps=10, latency_us=5)
    n, p = 4_000_000, 4
    alpha, beta = 5e-6, 8 / 10e9
    assert net.all_reduce(n, p) == pytest.approx(2 * 3 * alpha + 2 * 3 / 4 * n * beta)
    assert net.all_gather(n, p) == pytest.approx(3 * alpha + 3 * n * beta)
    assert net.broadcast(n, p) == pytest.approx(3 * alpha + n * beta)
    assert net.all_reduce(n, 1) == 0.0
    # 100 MB all-reduced on 1 Gbps between 2 workers: the payload crosses the link once: 0.8 s
    assert NetworkModel(1, 0).all_reduce(100_000_000, 2) == pytest.approx(0.8)


def test_wire_bytes():
    assert wire_bytes("all_reduce", 1000, 4) == 1500
    assert wire_bytes("all_gather", 1000, 4) == 3000
    assert wire_bytes("broadcast", 1000, 4) == 750
    assert wire_bytes("all_reduce", 1000, 1) == 0
    with pytest.raises(ValueError, match="allowed"):
        wire_bytes("scatter", 1, 2)


def test_world_of_one_counts_nothing():
    comm = Communicator()
    t = torch.ones(10)
    comm.average_([t])
    comm.all_reduce(t)
    assert comm.stats.comm_bytes == 0 and torch.equal(t, torch.ones(10))
    assert tensor_bytes([torch.zeros(3, dtype=torch.float64), torch.zeros(5, dtype=torch.float16)]) == 3 * 8 + 5 * 2


def test_record_accumulates_and_overlapped_time_is_not_step_time():
    comm = Communicator(NetworkModel(10, 10))
    comm.record("all_reduce", 100, 0.5, overlapped=True)
    assert comm.stats.comm_time_s == 0.5 and comm.pop_step_time() == 0.0


def test_schedules_closed_form():
    step = lr_factor_fn({"name": "step", "milestones": [1, 3], "gamma": 0.1}, steps_per_epoch=10, total_steps=50)
    assert [step(s) for s in (0, 9, 10, 29, 30, 49)] == pytest.approx([1, 1, 0.1, 0.1, 0.01, 0.01])
    cos = lr_factor_fn({"name": "cosine", "warmup_epochs": 1, "warmup_start_factor": 0.0, "min_factor": 0.0}, 10, 110)
    assert cos(0) == 0 and cos(5) == pytest.approx(0.5) and cos(10) == pytest.approx(1.0)
    assert cos(60) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert cos(110) == pytest.approx(0.0, abs=1e-12)
