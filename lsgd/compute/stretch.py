"""The wall-clock stretch (``cluster.stretch``): each worker's modeled speed made real in wall time.

The clock makes a worker slow in ``modeled_time_s`` only; on this machine every worker computes
at the same speed. ``cluster.stretch=true`` (profile mode only: the target must be a modeled step
time) makes the speeds real in wall time for any method: each worker's local step (from the
step's start, its batch loaded, through forward, backward and the optimizer step, up to the
algorithm's ``after_step``, where local SGD, DiLoCo and SlowMo synchronize) lasts at least
``step_s[w] x time_scale`` wall seconds, ``step_s[w]`` = the profile's step time / speed of worker
w (``RunContext.worker_step_s``): the worker sleeps the rest (:func:`stretch_step`); a step whose
real compute is longer is not shortened. The time the step spent blocked in communication
(a DDP all-reduce in backward, a gossip exchange in ``after_backward``) does not count towards
the target: it is the step's communication, so a method that synchronizes every step runs at
``max_w(step_s[w] x time_scale) + its communication`` per step (the fast workers wait in the
next step's collective for the slow ones; measured: DDP on 2 gloo workers at speeds [1.0, 0.5],
0.05 s per step, took 0.103 s per step, the fast worker blocked 0.64 s over 12 steps), and a method that synchronizes every H steps at
about ``H x max_w(step_s[w] x time_scale) + its synchronization`` per round. One limit: the sleep
falls after the step's backward, so DDP's overlap of bucket all-reduces with the backward is
not stretched (its communication runs on the real, short backward). The sleep is emulated
compute: a worker's measured ``compute_time_s`` includes it; ``modeled_time_s`` and bytes do not
change (the clock is not touched). The same rule, with ``algo.time_scale``, stretches the workers
of ``algo=async_local_sgd algo.timing=real`` (:mod:`lsgd.algorithms.asynchronous.real_timing`), which stretches
its own steps: ``cluster.stretch=true`` with it is a ConfigError. A server rank (parameter server,
asynchronous Local-SGD's server) has no local step and is never stretched.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from lsgd.core.errors import ConfigError


def stretch_target_s(step_s: Sequence[float] | None, worker: int | None, time_scale: float) -> float | None:
    """Wall seconds a local step of worker ``worker`` lasts at least under the stretch (module
    docstring): ``step_s[worker] x time_scale`` (``step_s``: every worker's
    modeled seconds per step, :attr:`lsgd.algorithms.base.RunContext.worker_step_s`). None for a
    rank with no local step (``worker`` None: a server).

    Raises:
        ConfigError: ``step_s`` is None (not profile mode).
    """
    if worker is None:
        return None
    if step_s is None:
        raise ConfigError("the wall-clock stretch needs cluster.compute=profile (modeled step times of every worker)")
    return float(step_s[worker]) * float(time_scale)


def stretch_step(target_s: float, start: float, blocked_s: float = 0.0, sleep: Callable[[float], Any] = time.sleep) -> float:
    """Sleep the rest of a local step so that it lasts at least ``target_s`` wall seconds (module
    docstring). ``start``: the step's ``time.perf_counter()`` at its start;
    ``blocked_s``: seconds of it the worker was blocked in communication (not counted towards the
    target). Returns the seconds slept (0 when the step already took ``target_s`` or more).

    Shared by the trainer (``cluster.stretch``) and asynchronous Local-SGD's real timing
    (``algo.timing=real``).
    """
    rest = target_s - (time.perf_counter() - start - blocked_s)
    if rest <= 0:
        return 0.0
    sleep(rest)
    return rest
