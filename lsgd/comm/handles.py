"""What a communication returns while it is in flight: a :class:`Handle` (wait for it; its end on
the clock; what a checkpoint saves of it), a receive posted ahead of its exchange
(:class:`PostedRecv`), an operation that needed no communication (:class:`Done`) and several
handles waited as one (:class:`Many`).

A handle belongs to the :class:`lsgd.comm.communicator.Communicator` that issued it: its wait hands
the accounting (measured time, the clock) back to it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from lsgd.comm.communicator import Communicator


class Handle:
    """An operation in flight: :meth:`wait` completes it (data and clock) and returns its result.

    Every participant must wait on (or :meth:`Communicator.quiesce`) every counted asynchronous
    collective, in issue order: settling the clock is itself an (uncounted) collective.

    :meth:`complete_data` finishes the transfer (and the result) without the accounting, so a
    checkpoint can save what was received while the clock waits where the algorithm waits;
    :meth:`state_dict` is the operation's end on this worker's clock, which a resumed run's
    :meth:`Communicator.resumed` handle waits for.
    """

    def __init__(self, comm: Communicator, works=(), finish: Callable[[], object] | None = None, t0: float | None = None):
        self.comm = comm
        self.works = list(works)
        self.finish = finish
        self.t0 = time.perf_counter() if t0 is None else t0
        self.done = False
        self.result = None
        # clock: collectives settle through the communicator's stream, messages on their own
        self.issue: np.ndarray | Callable[[], np.ndarray] | None = None
        self.cost: np.ndarray | None = None
        # point-to-point messages: ("send", end, None, link, peer) or ("recv", cost, stamp buf, link, peer)
        self.messages: list[tuple[str, np.ndarray, torch.Tensor | None, str, int]] = []
        self.message_end: np.ndarray | None = None  # the messages' end, once settled (Communicator._settle_messages)
        self.overlapped: bool | None = False  # None: neither timed nor clocked (count=False)
        self.deferred = False                 # clocked at the next settle(), not at wait()
        self.works_done = False
        self.data_done = False                # transfer and result complete (complete_data)
        self.t_done: float | None = None      # perf_counter when the transfer was complete
        self.end: np.ndarray | None = None    # collective: its end on the stream, once settled
        self.restored: np.ndarray | None = None  # a resumed handle: the end to wait for (Communicator.resumed)
        self.trace = None                     # lsgd.comm.p2p_trace: this exchange's record (LSGD_TRACE_P2P)

    def wait_works(self) -> None:
        """Block until the transfer itself is done, without the accounting (clock, measured time):
        safe from another thread (a server waiting for whichever worker's message comes first).
        :meth:`wait` then completes the accounting on its caller's thread without waiting on the
        works again (gloo's receive work cannot be waited twice)."""
        if not self.works_done:
            with self.comm._s.blocked.region():  # a no-op on a background thread (lsgd.comm.blocked_time)
                if self.trace is not None:
                    self.trace.join()  # the trace's threads wait for the works
                else:
                    for w in self.works:
                        w.wait()
            self.works_done = True

    def complete_data(self):
        """Finish the transfer and compute the result (``finish``), without the accounting: the
        clock and the measured time wait for :meth:`wait`. Returns the result."""
        if not self.data_done:
            self.wait_works()
            self.t_done = time.perf_counter()
            if self.finish is not None:
                self.result = self.finish()
            self.data_done = True
        return self.result

    def wait(self):
        if self.done:
            return self.result
        self.complete_data()
        self.comm._complete(self)
        self.done = True
        if self.trace is not None:
            self.trace.write(self.comm.global_ranks[self.comm.rank], self.issue, self.message_end)
        return self.result

    def end_time(self) -> np.ndarray | None:
        """When this operation ends on this worker's clock (shape ``[k]``), without moving the
        clock; None when it moves no clock (uncounted, no clock, world of one). Completes the
        transfer (a message's end needs its sender's start, which travels with it) and settles a
        collective not yet settled (an uncounted collective: every participant calls it at the
        same point, as for :meth:`Communicator.quiesce`)."""
        if self.restored is not None:
            return self.restored.copy()
        clock = self.comm.clock
        if clock is None or self.overlapped is None:
            return None
        self.complete_data()
        ends = []
        if self.cost is not None:
            self.comm._settle_ends_through(self)
            clock.resolve()
            if self.end is not None:
                ends.append(self.end)
        if self.messages:
            ends.append(self.comm._settle_messages(self))
        return np.maximum.reduce(ends) if ends else None

    def state_dict(self) -> dict:
        """What a resumed run needs of this operation in flight: its end on this worker's clock
        (:meth:`end_time`); the data it moved is the algorithm's to save (after
        :meth:`complete_data`). Restore with :meth:`Communicator.resumed`."""
        end = None if self.done else self.end_time()
        return {"end": None if end is None else end.tolist()}

    def is_completed(self) -> bool:
        return self.done


class PostedRecv:
    """A receive posted ahead of the exchange that consumes it (:meth:`Communicator.post_recv`).

    ``tensor`` is the receive buffer, ``peer`` the sending group rank; ``works`` the transport
    receives already posted (the payload, then its clock stamp), None where the exchange posts them
    itself (NCCL, an empty tensor). Consumed once, by the :meth:`Communicator.exchange` that names
    it in its ``recvs``."""

    __slots__ = ("tensor", "peer", "count", "works", "stamp", "used")

    def __init__(self, tensor: torch.Tensor, peer: int, count: bool):
        self.tensor, self.peer, self.count = tensor, peer, count
        self.works: list | None = None
        self.stamp: torch.Tensor | None = None
        self.used = False

    def numel(self) -> int:
        return self.tensor.numel()


class Done(Handle):
    """An operation that needed no communication (world of one, empty payload)."""

    def __init__(self, comm, result=None):
        super().__init__(comm)
        self.done, self.result = True, result


class Many(Handle):
    """Several handles waited as one (an average over several dtypes)."""

    def __init__(self, comm, handles):
        super().__init__(comm)
        self.handles = handles

    def complete_data(self):
        for h in self.handles:
            h.complete_data()
        self.data_done = True

    def wait(self):
        for h in self.handles:
            h.wait()
        self.done = True

    def end_time(self) -> np.ndarray | None:
        ends = [e for e in (h.end_time() for h in self.handles) if e is not None]
        return np.maximum.reduce(ends) if ends else None
