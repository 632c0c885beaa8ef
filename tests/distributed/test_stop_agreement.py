"""The stop agreement (lsgd.training.preemption.PreemptionWatch.agreed) on real gloo ranks: issued every
``lag``-th call and read ``lag`` calls after it was issued, it lets a rank run ``lag`` steps ahead of
the slowest before it waits (drifting methods: no coupling between their synchronizations), every
rank still stops at the same call, over the agreement's own all-reduce or the shared-memory board
(lsgd.comm.shared_memory: every rank on one host), and a step's own exchange can carry it (DDP: the clock's
settlement, lsgd.comm.communicator.Communicator.settle's codes)."""

from __future__ import annotations

import json
import signal
import time

import pytest
import torch
import torch.distributed as dist
from gloo import run_gloo

from lsgd.comm.shared_memory import Board
from lsgd.training.preemption import AGREEMENTS_IN_FLIGHT, Interrupted, PreemptionWatch

DELAY_S = 1.0  # rank 1 starts this much later than rank 0


class _Gloo:
    """The accounting communicator's all_reduce, as the watch calls it (uncounted, async), and its
    shared-memory board (:meth:`lsgd.comm.communicator.Communicator.board`), or none (``board=False``: the
    agreement's own all-reduce)."""

    def __init__(self, board: bool):
        self._board = Board.create() if board else None
        assert (self._board is not None) == board  # the ranks share this host's /dev/shm

    def board(self):
        return self._board

    def all_reduce(self, tensor, op=None, count=True, async_op=False):
        assert self._board is None, "the board carries the agreement: nothing to send"
        assert count is False and async_op
        return dist.all_reduce(tensor, op=op, async_op=True)


def _ahead_then_stop(rank, world_size, lag, board, out):
    cpu = torch.device("cpu")
    comm = _Gloo(board)
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
            assert calls <= lag + watch.period
        assert type(stop) is Interrupted and stop.signum == signal.SIGINT
        watch.drain()
    stops = [None] * world_size
    dist.all_gather_object(stops, [calls, watch.period])
    if rank == 0:
        (out / "r.json").write_text(json.dumps([ahead, waited, stops]))


@pytest.mark.serial
@pytest.mark.parametrize("board", [False, True], ids=["all_reduce", "board"])
@pytest.mark.parametrize("lag", [1, 4, 16])
def test_a_rank_runs_lag_calls_ahead_then_waits_and_all_stop_together(lag, board, tmp_path):
    run_gloo(_ahead_then_stop, 2, lag, board, tmp_path)
    ahead, waited, stops = json.loads((tmp_path / "r.json").read_text())
    assert ahead < DELAY_S / 2, ahead          # lag calls issued without waiting for rank 1
    assert waited > DELAY_S * 0.8, waited      # the (lag + 1)th reads rank 1's first issue: it waited
    # calls 0, period, 2 period, ... issue (period = lag // AGREEMENTS_IN_FLIGHT, at least 1); the signal
    # (before the loop's call 1, overall call lag + 1) goes into the issue at overall call
    # lag + period, read lag calls later: the loop's call lag + period
    period = max(1, lag // AGREEMENTS_IN_FLIGHT)
    assert stops == [[lag + period, period]] * 2, stops


class _NoSend:
    def all_reduce(self, *args, **kwargs):
        raise AssertionError("the agreement was carried: nothing to send")


def test_an_answer_carried_by_the_steps_exchange_is_read_and_nothing_is_sent():
    watch = PreemptionWatch("off", interrupts=True)
    watch.carried(0)
    assert watch.agreed(_NoSend(), torch.device("cpu")) is None
    watch.signal = signal.SIGINT
    assert watch.code() == 100 + signal.SIGINT  # kind 1 (interrupt) * 100 + the signal
    watch.carried(200 + signal.SIGTERM)  # another rank was preempted: preemption wins the MAX
    stop = watch.agreed(_NoSend(), torch.device("cpu"))
    assert stop.status == "preempted" and stop.signum == signal.SIGTERM


def _codes_in_settlement(rank, world_size, out):
    """Two ranks, clocks 1 s apart, one counted asynchronous all-reduce each, settled with codes."""
    from lsgd.clock.network import NetworkModel
    from lsgd.clock.worker_clock import Clock
    from lsgd.comm.communicator import Communicator

    clock = Clock()
    comm = Communicator(NetworkModel(bandwidth_gbps=8e-9, latency_us=0.0), clock=clock)  # beta = 1 s/byte
    clock.compute(1.0 + rank)  # issue at 1 s (rank 0) and 2 s (rank 1)
    comm.all_reduce(torch.zeros(2), async_op=True)  # 8 bytes: ring on 2 ranks costs n beta = 8 s
    got = []
    assert comm.settle([10 * rank + 3, 7 - rank], got.append)
    assert got == []  # delivered with the settlement, at the next clock read
    now = clock.time_s
    assert not comm.settle([1], got.append)  # nothing left to settle: no exchange, no codes
    (out / f"r{rank}.json").write_text(json.dumps([now, got]))


def test_codes_travel_in_the_clock_settlement_and_arrive_with_it(tmp_path):
    run_gloo(_codes_in_settlement, 2, tmp_path)
    for rank in range(2):
        now, got = json.loads((tmp_path / f"r{rank}.json").read_text())
        assert now == pytest.approx(2.0 + 8.0, rel=1e-12)  # the later issue (rank 1's) + the all-reduce's cost
        assert got == [[13, 7]]  # MAX of (3, 7) and (13, 6)


def test_only_methods_whose_workers_drift_apart_read_it_late():
    """16 steps for the methods whose workers run on between synchronizations (periodic averaging,
    background anchor, neighbours only); 1 for those that all-reduce (or serve) every step, which the
    agreement cannot couple more and which a signal should stop at once."""
    from lsgd.algorithms import ALGORITHMS
    from lsgd.algorithms.base import DRIFT_AGREEMENT_LAG

    drift = {"local_sgd", "post_local_sgd", "slowmo", "diloco", "streaming_diloco", "sparseloco", "overlap_local_sgd",
             "dpsgd", "swarm_sgd", "sgp", "decentlam", "lead", "ad_psgd"}
    assert DRIFT_AGREEMENT_LAG == 16 and drift <= set(ALGORITHMS)
    for name, cls in ALGORITHMS.items():
        assert cls.agreement_lag == (16 if name in drift else 1), name
