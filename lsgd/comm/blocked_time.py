"""Wall time a worker spends blocked in communication: what ``cluster.compute=measured`` and the
``compute_time_s`` metric take out of a measured step.

A step's wall time on this machine is compute plus the time the training threads spent in
communication: issuing a collective or posting messages, a wait on a handle
(:meth:`lsgd.comm.handles.Handle.wait_works`; a synchronous collective or exchange waits on its own), the
clock's settling all-reduce, a barrier, a comm hook issuing its all-reduce or waiting for its chain,
the end of backward waiting for DDP's last buckets (:class:`lsgd.algorithms.averaging.ddp.BackwardWait`).
Each is a *region* (:meth:`BlockedTime.region`); :class:`BlockedTime` is a cumulative counter of
the wall seconds during which at least one region was open on a training thread (the union of
the regions' intervals, so a region nested in another, or open on two threads at once, such as
the main thread inside ``loss.backward()`` and autograd's device thread inside a comm hook,
counts once). A caller reads :meth:`BlockedTime.seconds` before and after a window; the
difference is the window's communication, the rest is compute.

Threads that wait *beside* training (a server's thread that waits for whichever worker's push
comes first, gloo's callback threads) are not training threads: a thread marks itself with
:meth:`BlockedTime.background` and its regions count nothing. gloo's callback threads never open
regions (DDP's all-reduce runs there while backward continues: that is overlap, not blocking).

Units: seconds of ``time.perf_counter``. Thread-safe.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator


class BlockedTime:
    """Cumulative wall seconds during which some training thread was blocked in communication."""

    def __init__(self):
        self._lock = threading.Lock()
        self._local = threading.local()  # .depth: regions open on this thread; .background
        self._open = 0                   # threads with a region open
        self._since = 0.0                # perf_counter when the first of them opened it
        self._total = 0.0

    @contextlib.contextmanager
    def region(self) -> Iterator[None]:
        """The block is time blocked in communication (nested regions and regions open on
        several threads at once count their union; no-op on a :meth:`background` thread)."""
        local = self._local
        depth = getattr(local, "depth", 0)
        if depth or getattr(local, "background", False):
            local.depth = depth + 1
            try:
                yield
            finally:
                local.depth -= 1
            return
        local.depth = 1
        with self._lock:
            if self._open == 0:
                self._since = time.perf_counter()
            self._open += 1
        try:
            yield
        finally:
            local.depth = 0
            with self._lock:
                self._open -= 1
                if self._open == 0:
                    self._total += time.perf_counter() - self._since

    def background(self) -> None:
        """Mark the calling thread as waiting beside training: its regions count nothing."""
        self._local.background = True

    def add(self, seconds: float) -> None:
        """Add ``seconds`` (>= 0) measured elsewhere (e.g. DDP's end of backward waiting for its
        buckets, timed from autograd's final callback to the buckets' completion).

        Raises:
            ValueError: a negative ``seconds``.
        """
        if seconds < 0:
            raise ValueError(f"blocked seconds must be >= 0, got {seconds!r}")
        with self._lock:
            self._total += float(seconds)

    def seconds(self) -> float:
        """Blocked seconds so far (regions still open count up to now)."""
        with self._lock:
            open_s = time.perf_counter() - self._since if self._open else 0.0
            return self._total + open_s
