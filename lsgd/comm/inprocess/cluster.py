"""Run a function as ``n`` workers of one in-process cluster: ``run(n, fn, *args)`` calls
``fn(rank, n, *args)`` in ``n`` threads that the :class:`~lsgd.comm.inprocess.scheduler.Scheduler`
runs one at a time, each inside its own torch.distributed default group of the
``"lsgd_inprocess"`` backend (:mod:`lsgd.comm.inprocess.backend`), and returns their results.

A worker that raises stops the others (each gets :class:`~lsgd.comm.inprocess.scheduler.Aborted`
at its next wait) and :func:`run` raises :class:`WorkerFailed` naming the rank, its traceback
attached as the cause.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta

import torch
import torch.distributed as dist

from lsgd.comm.inprocess import world
from lsgd.comm.inprocess.backend import BACKEND, Fabric, register
from lsgd.comm.inprocess.scheduler import Aborted, Scheduler, _RandomState


class WorkerFailed(RuntimeError):
    """A worker of an in-process cluster raised; ``rank`` is the first that did, ``__cause__`` its
    exception (with its traceback)."""

    def __init__(self, rank: int, exc: BaseException):
        super().__init__(f"in-process worker {rank} failed: {type(exc).__name__}: {exc}")
        self.rank = rank


@contextlib.contextmanager
def _thread_isolation() -> Iterator[None]:
    """torch's C++ registry of group names kept per thread (every worker names its default group
    alike), as torch's own multi-threaded tests set it."""
    set_mode = getattr(torch._C._distributed_c10d, "_set_thread_isolation_mode", None)
    if set_mode is not None:
        set_mode(True)
    try:
        yield
    finally:
        if set_mode is not None:
            set_mode(False)


def run(n: int, fn: Callable, *args, cuda: bool = False, timeout_s: float = 1800.0,
        join_poll_s: float | None = None) -> list:
    """``[fn(0, n, *args), ..., fn(n - 1, n, *args)]``, the workers of one in-process cluster.

    Every worker starts with the random state the calling thread has now, joins its default group
    (``dist.init_process_group("lsgd_inprocess", rank=r, world_size=n)``) before ``fn`` and leaves
    it after. ``cuda``: the workers draw from CUDA's generator too (saved and restored per worker).
    The calling thread's random state, torch's default dtype and thread count are the same after
    as before. ``join_poll_s``: the calling
    thread waits for the workers in slices of this many seconds (the main thread then runs its
    signal handlers between them; None: one wait).

    Raises:
        WorkerFailed: a worker raised (the first that did; the others were stopped).
    """
    register()
    scheduler = Scheduler(n, cuda=cuda)
    fabric = Fabric(scheduler)
    start_state = _RandomState(cuda)
    excepthook = sys.excepthook
    # process-wide torch settings a worker's trainer sets for itself (the same value on every
    # worker of a run, as each process of a multi-process run sets its own): restored after
    settings = (torch.get_default_dtype(), torch.get_num_threads())
    results: list = [None] * n

    def body(rank: int) -> None:
        with world.acting_as(rank, fabric):
            try:
                scheduler.start(rank)
                scheduler.adopt(rank, start_state.copy())
                dist.init_process_group(BACKEND, store=dist.HashStore(), rank=rank, world_size=n,
                                        timeout=timedelta(seconds=timeout_s))
                sys.excepthook = excepthook  # torch wraps it per call ("[rank<r>]: " lines), n times over
                try:
                    results[rank] = fn(rank, n, *args)
                finally:
                    dist.destroy_process_group()
            except BaseException as exc:  # noqa: BLE001 (the first failure is the run's)
                scheduler.finish(rank, exc)
                return
            scheduler.finish(rank)

    try:
        with world.installed() as installed, _thread_isolation():
            threads = [threading.Thread(target=body, args=(r,), name=f"lsgd-worker-{r}", daemon=True) for r in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(join_poll_s)
            installed.forget(fabric)
    finally:
        start_state.restore()
        torch.set_default_dtype(settings[0])
        torch.set_num_threads(settings[1])
    if scheduler.failure is not None:
        rank, exc = scheduler.failure
        if not isinstance(exc, Aborted):
            raise WorkerFailed(rank, exc) from exc
    return results
