"""The stop agreement (lsgd.preemption.PreemptionWatch.agreed) on real gloo ranks: read ``lag`` calls
after it was issued, it lets a rank run ``lag`` steps ahead of the slowest before it waits (periodic
methods: lag = H, so it adds no coupling between their synchronizations), and every rank still
stops at the same call."""

from __future__ import annotations

import json
import signal
import time

import pytest
import torch
import torch.distributed as dist
from gloo import run_gloo

from lsgd.preemption import Interrupted, PreemptionWatch

DELAY_S = 1.0  # rank 1 starts this much later than rank 0


class _Gloo:
    """The accounting communicator's all_reduce, as the watch calls it (uncounted, async)."""

    def all_reduce(self, tensor, op=None, count=True, async_op=False):
        assert count is False and async_op
        return dist.all_reduce(tensor, op=op, async_op=True)


def _ahead_then_stop(rank, world_size, lag, out):
    cpu = torch.device("cpu")
    comm = _Gloo()
    with PreemptionWatch("off", interrupts=True) as watch:
        watch.lag = lag
        if rank == 1:
            time.sleep(DELAY_S)
        t0 = time.monotonic()
        for _ in range(lag):  # issue only: no wait for the late rank
            assert watch.agreed(comm, cpu) is None
        ahead = time.monotonic() - t0
        assert watch.agreed(comm, cpu) is None  # reads the first agreement: needs every rank's issue
        waited = time.monotonic() - t0
        # a signal on rank 1 only, before its next call: every rank stops at the same call, lag later
        calls = 0
        while True:
            if rank == 1 and calls == 0:
                watch.signal = signal.SIGINT  # what the handler records
            stop = watch.agreed(comm, cpu)
            calls += 1
            if stop is not None:
                break
            assert calls <= lag + 1
        assert type(stop) is Interrupted and stop.signum == signal.SIGINT
        watch.drain()
    stops = [None] * world_size
    dist.all_gather_object(stops, calls)
    if rank == 0:
        (out / "r.json").write_text(json.dumps([ahead, waited, stops]))


@pytest.mark.parametrize("lag", [1, 4])
def test_a_rank_runs_lag_calls_ahead_then_waits_and_all_stop_together(lag, tmp_path):
    run_gloo(_ahead_then_stop, 2, lag, tmp_path)
    ahead, waited, stops = json.loads((tmp_path / "r.json").read_text())
    assert ahead < DELAY_S / 2, ahead          # lag calls issued without waiting for rank 1
    assert waited > DELAY_S * 0.8, waited      # the (lag + 1)th reads rank 1's first issue: it waited
    # the signal went into the agreement issued at call 1 of the loop, read lag calls later
    assert stops == [lag + 1, lag + 1], stops


def test_only_methods_whose_workers_drift_apart_read_it_late():
    """16 steps for the methods whose workers run on between synchronizations (periodic averaging,
    background anchor, neighbours only); 1 for those that all-reduce (or serve) every step, which the
    agreement cannot couple more and which a signal should stop at once."""
    from lsgd.algorithms import ALGORITHMS
    from lsgd.algorithms.base import DRIFT_AGREEMENT_LAG

    drift = {"local_sgd", "post_local_sgd", "slowmo", "diloco", "overlap_local_sgd",
             "dpsgd", "swarm_sgd", "sgp", "decentlam", "lead", "ad_psgd"}
    assert DRIFT_AGREEMENT_LAG == 16 and drift <= set(ALGORITHMS)
    for name, cls in ALGORITHMS.items():
        assert cls.agreement_lag == (16 if name in drift else 1), name
