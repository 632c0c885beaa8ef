"""The per-step fast paths of the trainer and the stop agreement (lsgd.training.trainer._plan_step,
PreemptionWatch.agreed's schedule) decide the same things as the definitions they replace:

* the stop agreement issues at every ``period``-th call and reads each issue ``lag`` calls later
  (the closed form of its docstring), whatever ``lag``, also after ``lag`` changes;
* the bookkeeping's "no record before" bound (``Trainer._next_point``) is exactly the first count
  at which ``Trainer._record_points`` (the records' definition) finds a record;
* a constant schedule stepped by its counters leaves LambdaLR's state and the rates as its own
  ``step()`` does.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from lsgd.training.optim import build_scheduler
from lsgd.training.preemption import AGREEMENTS_IN_FLIGHT, PreemptionWatch
from lsgd.training.trainer import Trainer


class _Handle:
    def __init__(self, log, call):
        self.log, self.call = log, call

    def wait(self):
        self.log.append(("read", self.call))


class _Comm:
    """Records the calls at which the watch issues an all-reduce and waits for one."""

    def __init__(self, watch):
        self.watch, self.log = watch, []

    def board(self):
        return None  # no shared-memory board: the agreement's own all-reduce

    def all_reduce(self, tensor, op=None, count=True, async_op=False):
        assert count is False and async_op
        call = self.watch._calls - 1  # the call under way
        self.log.append(("issue", call))
        return _Handle(self.log, call)


def _expected(lag: int, calls: range) -> list[tuple[str, int]]:
    """The docstring's schedule: issue at calls 0, period, 2 period, ...; issue c read at c + lag
    (a call reads before it issues)."""
    period = max(1, lag // AGREEMENTS_IN_FLIGHT)
    out = []
    for c in calls:
        if c - lag >= 0 and (c - lag) % period == 0:
            out.append(("read", c - lag))
        if c % period == 0:
            out.append(("issue", c))
    return out


@pytest.mark.parametrize("lag", [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33])
def test_the_agreement_issues_and_reads_at_the_closed_form_calls(lag):
    watch = PreemptionWatch("off", interrupts=True)
    watch.lag = lag
    comm = _Comm(watch)
    for _ in range(120):
        assert watch.agreed(comm, torch.device("cpu")) is None
    assert comm.log == _expected(lag, range(120))
    watch.drain()


def test_a_new_lag_takes_effect_at_the_next_call():
    watch = PreemptionWatch("off", interrupts=True)
    comm = _Comm(watch)
    for _ in range(5):  # lag 1: issue every call, read it at the next
        watch.agreed(comm, torch.device("cpu"))
    watch.drain()
    comm.log.clear()
    watch.lag = 16  # period 4 from call 5 on: issues at 8, 12, ... (multiples of the period)
    for _ in range(40):
        watch.agreed(comm, torch.device("cpu"))
    assert comm.log == [e for e in _expected(16, range(45)) if e[1] >= 5]


def test_an_inactive_watch_sends_nothing():
    watch = PreemptionWatch("off")
    watch.lag = 16
    comm = _Comm(watch)
    for _ in range(40):
        assert watch.agreed(comm, torch.device("cpu")) is None
    assert comm.log == []


def _bare_trainer(log_every, eval_every, checkpoint_every, total, eval_unit="step", steps_per_epoch=7):
    t = Trainer.__new__(Trainer)
    t.cfg = {"log_every": log_every, "eval_every": eval_every, "checkpoint_every": checkpoint_every,
             "eval_unit": eval_unit}
    t.steps_per_epoch, t.total_steps, t._quiet = steps_per_epoch, total, (0, 0)
    return t


@pytest.mark.parametrize("periods", [(5, 0, 0, 23), (4, 6, 9, 40), (50, 10**9, 0, 30), (3, 1, 2, 11, "epoch")])
def test_the_quiet_bound_is_the_first_count_with_a_record(periods):
    t = _bare_trainer(*periods)
    total = t.total_steps
    for before in range(total + 3):
        for step in range(before + 1, total + 6):
            quiet = step < t._next_point(before)
            assert quiet == (not t._record_points(before, step)), (before, step)


def test_a_constant_schedule_moves_as_lambdalr_steps():
    def make():
        p = torch.nn.Parameter(torch.ones(3))
        opt = torch.optim.SGD([p], lr=0.05, momentum=0.9)
        return opt, build_scheduler(opt, {"name": "constant"}, 10, 100)

    (opt_a, ref), (opt_b, fast) = make(), make()
    t = Trainer.__new__(Trainer)
    t.scheduler, t._constant_lr = fast, True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LambdaLR's "step() before optimizer.step()" (no optimizer step here)
        for _ in range(37):
            ref.step()
            t._schedule_step()
    assert fast.state_dict() == ref.state_dict()
    assert [g["lr"] for g in opt_b.param_groups] == [g["lr"] for g in opt_a.param_groups] == [0.05]
