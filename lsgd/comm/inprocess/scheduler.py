"""The in-process cluster's scheduler: ``n`` logical workers, one thread each, of which exactly one
runs at a time.

A worker holds the *baton* while it computes. It gives the baton away only where it would wait in a
real cluster: at a collective whose peers have not all arrived, at a receive whose message has not
been sent, at a ``wait()`` on an operation in flight (:meth:`Scheduler.block`). The baton then goes
to the next worker in rank order (``r + 1, r + 2, ...``, cyclically) that can go on: one that has
not blocked, or whose blocking condition now holds. Every decision is a function of what the
workers did before it, never of the operating system's thread scheduling or of the machine's load,
so a run repeats bit for bit.

Each worker has its own random state: the process's global generators (torch's CPU generator, and
CUDA's where used, numpy's and Python's ``random``) are saved when a worker gives the baton away
and restored when it gets it back, so a worker's draws are those it would make alone in its own
process, whatever the other workers drew in between.

Why our own code: torch's multi-threaded process group (``torch.testing._internal``) is a private
testing API whose threads run concurrently and interleave as the OS schedules them, with no
point-to-point; Python's ``asyncio`` or greenlets would need every blocking call in torch's C++
(DDP's reducer waiting on a hook's future) to be a coroutine. Threads that pass one baton keep torch's
C++ unchanged and the order fixed.
"""

from __future__ import annotations

import ctypes
import random
import threading
from collections.abc import Callable

import numpy as np
import torch


class Aborted(BaseException):
    """Raised in a worker's thread when another worker failed (the run stops) or when every
    worker waits for another (a deadlock). A BaseException, as ``SystemExit``: ``except Exception``
    in the worker's code does not swallow the stop."""


class Deadlock(RuntimeError):
    """Every live worker waits for an operation that no worker can complete."""


def _numpy_raw() -> Callable[[], bytes]:
    """A reader of the raw bytes of numpy's global MT19937 state (624 words and the position: a
    0.3 us copy, where ``np.random.get_state()`` takes about 40 us); None where numpy's global
    generator does not expose them."""
    try:
        address = np.random.mtrand._rand._bit_generator.ctypes.state_address
    except AttributeError:  # pragma: no cover - another numpy layout
        return None
    return lambda: ctypes.string_at(address, 624 * 4 + 4)


_NUMPY_RAW = _numpy_raw()


class _RandomState:
    """The global generators' state of one worker (:class:`Scheduler`'s save and restore).

    torch's (and CUDA's) and Python's ``random`` are copied at every save. numpy's legacy global
    generator is copied only when it changed since the worker got the baton, and set only when
    it is not already the worker's: its full state costs about 40 us each way, its raw bytes 0.3 us
    to compare (a change that only consumes the cached second Gaussian of ``np.random.standard_normal``
    leaves the bytes alone and goes unseen)."""

    __slots__ = ("torch", "cuda", "numpy", "numpy_raw", "python")

    def __init__(self, cuda: bool):
        self.torch = self.cuda = self.python = None
        self.numpy = np.random.get_state()
        self.numpy_raw = _NUMPY_RAW() if _NUMPY_RAW is not None else None
        self.save(cuda)

    def save(self, cuda: bool) -> None:
        self.torch = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state() if cuda else None
        self.python = random.getstate()
        raw = _NUMPY_RAW() if _NUMPY_RAW is not None else None
        if raw is None or raw != self.numpy_raw:
            self.numpy, self.numpy_raw = np.random.get_state(), raw

    def restore(self) -> None:
        torch.set_rng_state(self.torch)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda)
        if _NUMPY_RAW is None or _NUMPY_RAW() != self.numpy_raw:
            np.random.set_state(self.numpy)
        random.setstate(self.python)

    def copy(self) -> _RandomState:
        twin = object.__new__(_RandomState)
        twin.torch, twin.cuda, twin.python = self.torch.clone(), self.cuda, self.python
        twin.numpy, twin.numpy_raw = self.numpy, self.numpy_raw
        return twin


class Scheduler:
    """The baton of ``n`` workers (see the module).

    A worker's thread calls :meth:`start` first (it returns when the worker first holds the
    baton), :meth:`block` wherever it waits, and :meth:`finish` when its function returned or
    raised. Worker 0 holds the baton first.

    Args:
        n: the number of workers.
        cuda: whether the workers draw from CUDA's generator too (its state is saved and restored).
    """

    def __init__(self, n: int, cuda: bool = False):
        if n < 1:
            raise ValueError(f"in-process cluster: n must be >= 1, got {n}")
        self.n = n
        self.cuda = cuda
        self._lock = threading.Lock()
        self._gates = [threading.Semaphore(0) for _ in range(n)]
        self._waiting: list[Callable[[], bool] | None] = [None] * n
        self._live = [True] * n
        self.holder: int | None = None
        self.failure: tuple[int, BaseException] | None = None  # the first worker that failed
        self.switches = 0  # baton hand-offs (a measure of the simulation's overhead)
        self._local = threading.local()
        self._random: list[_RandomState | None] = [None] * n

    # --- the worker's side -----------------------------------------------------------------
    def current(self) -> int | None:
        """The worker whose thread calls this (None outside the workers' threads)."""
        return getattr(self._local, "rank", None)

    def start(self, rank: int) -> None:
        """Called first in worker ``rank``'s thread: wait for the baton (worker 0 gets it first)."""
        self._local.rank = rank
        if rank == 0:
            with self._lock:
                if self.holder is None:
                    self.holder = 0
                    self._gates[0].release()
        self._gates[rank].acquire()
        self._check()

    def adopt(self, rank: int, state: _RandomState) -> None:
        """Worker ``rank`` (holding the baton) starts from ``state``'s random state."""
        state.restore()
        self._random[rank] = state

    def block(self, rank: int, ready: Callable[[], bool]) -> None:
        """Give the baton away until ``ready()`` holds (returns at once when it holds now).

        ``ready`` is called by whichever worker hands the baton on, so it must only read state
        (a flag of an operation), never compute.

        Raises:
            Aborted: another worker failed, or every worker waits (a deadlock).
        """
        if ready():
            return
        self._give(rank, ready)

    def pause(self, rank: int) -> None:
        """Let the other workers that can run go first, once round (a worker polling the state of
        an operation: it would spin forever holding the baton)."""
        self._give(rank, None)

    def _give(self, rank: int, ready: Callable[[], bool] | None) -> None:
        state = self._random[rank]
        if state is None:
            state = self._random[rank] = _RandomState(self.cuda)
        else:
            state.save(self.cuda)
        with self._lock:
            self._waiting[rank] = ready
            self._hand_off(rank)
        self._gates[rank].acquire()
        self._waiting[rank] = None
        self._check()
        state.restore()

    def finish(self, rank: int, exc: BaseException | None = None) -> None:
        """Worker ``rank`` ended (``exc``: with that error); the baton moves on, or, after an error,
        every other worker stops with :class:`Aborted`."""
        with self._lock:
            self._live[rank] = False
            if exc is not None and not isinstance(exc, Aborted) and self.failure is None:
                self.failure = (rank, exc)
                for gate in self._gates:
                    gate.release()
                return
            if self.failure is None and any(self._live):
                self._hand_off(rank)

    # --- the baton -------------------------------------------------------------------------
    def _hand_off(self, rank: int) -> None:
        """Give the baton to the next worker after ``rank`` (cyclically, ``rank`` itself last)
        that can run; with none, a deadlock stops every worker. Called under the lock."""
        n = self.n
        for k in range(1, n + 1):
            q = (rank + k) % n
            if not self._live[q]:
                continue
            ready = self._waiting[q]
            if ready is None or ready():
                self.holder = q
                self.switches += 1
                self._gates[q].release()
                return
        waiting = [q for q in range(n) if self._live[q]]
        self.failure = (rank, Deadlock(f"in-process cluster: workers {waiting} all wait, and none of the "
                                       "operations they wait for can complete"))
        for gate in self._gates:
            gate.release()

    def _check(self) -> None:
        if self.failure is not None:
            raise Aborted(f"worker {self.failure[0]} stopped the run: {self.failure[1]!r}")
