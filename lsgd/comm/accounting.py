"""What a communicator counts and measures: payload bytes, wire bytes, rounds, the alpha-beta terms of
each operation (:class:`CommStats`, :func:`tensor_bytes`), the most wire bytes of one step
(``peak_step_bytes``, :meth:`Accounting.end_step`), measured communication seconds, and the
wall time training threads spent blocked in communication (:mod:`lsgd.comm.blocked_time`).

:class:`Accounting` is the communicator's part that keeps them (a base of
:class:`lsgd.comm.communicator.Communicator`); the costs come from :mod:`lsgd.clock.network`
(:func:`lsgd.clock.network.cost_terms`, :func:`lsgd.clock.network.wire_bytes`). Thread-safe: DDP and
PowerSGD hooks complete on gloo's threads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from lsgd.clock.network import cost_terms, wire_bytes

if TYPE_CHECKING:
    from lsgd.comm.communicator import _Shared


def tensor_bytes(tensors: torch.Tensor | Sequence[torch.Tensor]) -> int:
    """Payload size in bytes: sum of ``numel * element_size`` over ``tensors``."""
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass
class CommStats:
    """Cumulative per-worker communication counters (units: bytes, count, seconds)."""

    comm_bytes: int = 0
    wire_bytes: float = 0.0
    comm_rounds: int = 0
    comm_time_s: float = 0.0
    model_alpha_terms: float = 0.0
    model_beta_bytes: float = 0.0
    #: the most wire bytes this worker sent in one step (not cumulative: a maximum over its steps so
    #: far, :meth:`Accounting.end_step`)
    peak_step_bytes: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


class Accounting:
    """The counters and measured time of a :class:`lsgd.comm.communicator.Communicator` (shared
    with its subgroups): what each operation counts (:meth:`count`), measured communication seconds
    and time blocked in communication."""

    # provided by the Communicator
    _s: _Shared
    _rank: int
    link: str
    world_size: int

    def count(self, kind: str, nbytes: float, p: int | None = None, root: int = 0) -> np.ndarray:
        """Count one operation of ``kind`` with ``nbytes`` payload on ``p`` workers (default: this
        group's size); returns its cost on each clock entry (seconds, shape ``[k]``). Thread-safe."""
        p = self.world_size if p is None else p
        a, b = cost_terms(kind, nbytes, p)
        with self._s.lock:
            s = self._s.stats
            s.comm_bytes += int(nbytes)
            s.wire_bytes += wire_bytes(kind, nbytes, p, self._rank, root)
            s.model_alpha_terms += a
            s.model_beta_bytes += b
        return self._s.network.costs(self.link, kind, nbytes, p)

    def add_time(self, seconds: float, overlapped: bool = False) -> None:
        """Add measured communication seconds (``comm_time_s``: time in flight); ``overlapped`` time
        (in flight during compute) stays out of :meth:`pop_step_time`. The trainer's measured
        compute subtracts :meth:`blocked_s` instead (time waited, not time in flight). Thread-safe."""
        with self._s.lock:
            self._s.stats.comm_time_s += seconds
            if not overlapped:
                self._s.step_comm_time_s += seconds

    def record(self, kind: str, nbytes: float, seconds: float, overlapped: bool = False) -> None:
        """Count an operation torch issued itself and its measured seconds (no clock; see
        :meth:`issued` for operations that should advance the clock)."""
        self.count(kind, nbytes)
        self.add_time(seconds, overlapped)

    def end_step(self) -> None:
        """A step is over (a worker's local step or a server's serve step, called once by the
        trainer after the step's ``after_step``): the wire bytes counted since the previous call
        are this step's, and ``peak_step_bytes`` keeps the largest such count. Bytes counted
        before the first step (an algorithm's setup) fall into the first step; an algorithm's
        ``before_step`` falls into the step it begins. Thread-safe."""
        with self._s.lock:
            s = self._s.stats
            sent = s.wire_bytes - self._s.step_start_wire
            if sent > s.peak_step_bytes:
                s.peak_step_bytes = sent
            self._s.step_start_wire = s.wire_bytes

    def round(self, n: int = 1) -> None:
        """Mark ``n`` synchronization rounds (the algorithm decides what a round is)."""
        with self._s.lock:
            self._s.stats.comm_rounds += n

    def pop_step_time(self) -> float:
        """Measured communication seconds not overlapped with compute since the previous call."""
        with self._s.lock:
            t, self._s.step_comm_time_s = self._s.step_comm_time_s, 0.0
        return t

    # -- blocked time (lsgd.comm.blocked_time): what measured compute leaves out ---------------------------
    def blocked_s(self) -> float:
        """Cumulative wall seconds this worker's training threads spent blocked in communication
        (waits on handles, synchronous operations, clock settlements, barriers, and what
        :meth:`add_blocked` was given); shared with subgroups. A step's measured compute is its
        wall time minus the difference of two reads around it (:class:`lsgd.comm.blocked_time.BlockedTime`)."""
        return self._s.blocked.seconds()

    def blocking(self):
        """Context manager: the block is time blocked in communication (a wait outside the
        communicator, e.g. on a torch future a comm hook chains)."""
        return self._s.blocked.region()

    def add_blocked(self, seconds: float) -> None:
        """Add ``seconds`` of blocking measured elsewhere (DDP's end of backward waiting for its buckets)."""
        self._s.blocked.add(seconds)

    def background_thread(self) -> None:
        """Mark the calling thread as waiting beside training (a server's receive thread): its
        waits are not blocked time."""
        self._s.blocked.background()
