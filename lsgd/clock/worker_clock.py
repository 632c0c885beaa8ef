"""The cluster clock: the model of time (``modeled_time_s``) of lsgd's communication: one worker's
virtual clock (:class:`Clock`) and the stream a communicator's collectives run on (:func:`stream_end`).

:mod:`lsgd.comm` moves the data and reports events to the clock (an operation issued, waited, a
message sent or received, its size, group and link); :mod:`lsgd.clock.network` prices them, on the
ports of :mod:`lsgd.clock.ports`; :mod:`lsgd.compute` holds the compute model. No other file
computes a cost.

The cluster clock
-----------------
Every worker carries a virtual clock in seconds (:class:`Clock`). The trainer advances it by each
step's compute time (from a FLOP profile of the target device, or measured; :mod:`lsgd.compute.model`),
and the communicator by communication, with these rules (``cost`` = the alpha-beta cost of
:mod:`lsgd.clock.network`, each message ``alpha + 2 o`` with LogGP's per-message overhead ``o`` =
``network.overhead_us``):

* a collective ends for all its participants at ``max_i(start_i) + cost`` (the starts are
  exchanged in an uncounted settlement: an all-gather of the participants' clocks, MAX taken
  locally; plain DDP sends no message for it: the exchange rides in the next step's first gradient
  bucket as a one-hot block whose SUM is the all-gather, exactly, :class:`lsgd.comm.settlement.CarriedSettlement`);
* collectives of one communicator run one after another on its *stream*: an operation starts at
  ``max(participants' issue times, end of the previous operation)``;
* an asynchronous operation (``async_op=True``) starts at its issue time and runs alongside the
  compute done before its :meth:`lsgd.comm.handles.Handle.wait`, which moves the clock to ``max(now, end)``;
  DDP's buckets are asynchronous operations issued during backward (at the point of backward where
  the bucket is ready, :meth:`Clock.backward_point`), so only their exposed part adds to the step;
* *settling* an operation computes its end and moves no clock: only a wait
  (:meth:`lsgd.comm.handles.Handle.wait`, or :meth:`lsgd.comm.communicator.Communicator.settle`, the wait of every
  collective issued so far) moves this worker's clock to the end.
  :meth:`lsgd.comm.communicator.Communicator.quiesce` (before evaluation, checkpoints and exit) settles and
  waits for nothing, so measurement never moves modeled time; a checkpoint saves an operation in
  flight with its end (:meth:`lsgd.comm.handles.Handle.state_dict`) and the resumed run waits for it
  (:meth:`lsgd.comm.communicator.Communicator.resumed`) where the uninterrupted run does;
* a message (point to point) occupies ports (:mod:`lsgd.clock.ports`): it starts at
  ``start = max(issue, sender's egress free)``, the send completes at ``start + cost``, and it is
  received at ``max(start, receive posted, receiver's ingress free) + cost`` (the receiver's clock
  then moves to ``max(now, that)`` when it waits); ``start`` travels with the message (an uncounted
  float64 message after the payload). *Receive posted* is rendezvous: gloo sends a message's data
  only once the receiver has announced its receive (MPI and NCCL do the same for large messages),
  so a server that posts its next incast after its broadcast has left sees the incast then, as
  measured on the emulated cluster (issue 23: a parameter server of 4 workers took 8 message
  times per step, the clock without this rule 5.2). The sender does not see a late receiver: its
  send completes at ``start + cost`` on its own clock.

The clock is a vector: entry 0 is the configured network; entries 1.. are *what-if* networks (the
inter-node link replaced by each of ``network.report_gbps``), advanced by the same events, so
the report's modeled times at other bandwidths stay right for overlapped and asynchronous runs.
(Methods whose event order depends on virtual time follow the order of entry 0.) The what-if link
at X Gbps is the shipped network preset of that bandwidth (``conf/network/*.yaml``: 1 Gbps 50 us,
10 Gbps 10 us, 100 Gbps 2 us): its bandwidth *and* its latency, so a 10 Gbps run's 1 Gbps entry is
the ``network=1gbps`` preset's time (:func:`lsgd.clock.network.what_if_latency_us`). A bandwidth without a preset keeps
the configured inter-node latency (``network.latency_us``). The intra-node link stays as configured.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from lsgd.clock.ports import Ports


class Clock:
    """One worker's virtual clock, in seconds, for ``k`` networks at once (entry 0: the configured one).

    ``now`` is a float64 array of shape ``[k]``. Compute advances every entry equally; the
    communicator advances entries by their own network's costs.

    Settling a collective's clock needs the participants' start times (an uncounted all-gather,
    MAX taken locally; a shared-memory board where the ranks share a host, :mod:`lsgd.comm.shared_memory`);
    the communicator issues it asynchronously and :meth:`defer` s its effect, which is
    applied, in order, the next time the clock is *read* (:attr:`now`, :attr:`ports`,
    :meth:`backward_point`, :meth:`state_dict`). Advancing the clock does not read it: while a
    settlement is queued, :meth:`compute` and :meth:`backward` queue behind it and are applied in
    program order by the same read, with the same float64 operations, so every value read is
    exactly that of an eager clock. The exchange therefore stays off the step's critical path: in a
    DDP step it is an all-gather issued after backward (``algo.carry_settlement=true``: made by the
    next step's first gradient bucket, whose all-reduce carries it, :class:`lsgd.comm.settlement.CarriedSettlement`) and applied at the next read, after that backward, by which time it has
    arrived. A read before a carrier took it (a record, an evaluation, a checkpoint) makes the
    all-gather there: the same values, on every rank at the same point.
    """

    def __init__(self, k: int = 1, lanes: int = 1):
        self.k = int(k)
        self._now = np.zeros(self.k)
        self._ports = Ports(self.k, lanes)
        self._deferred: list[Callable[[], None]] = []
        self.compute_s = 0.0          # modeled compute seconds so far
        self._bwd_start = np.zeros(self.k)
        self._bwd_s = 0.0

    @property
    def now(self) -> np.ndarray:
        """The clock (shape ``[k]``), after every deferred settlement."""
        self.resolve()
        return self._now

    @now.setter
    def now(self, value: np.ndarray) -> None:
        self.resolve()
        self._now = np.asarray(value, dtype=np.float64)

    def defer(self, apply: Callable[[], None]) -> None:
        """Queue a settlement (it calls :meth:`_advance_to`) to run before the next read."""
        self._deferred.append(apply)

    def resolve(self) -> None:
        """Apply the queued settlements (and the advances queued behind them), oldest first."""
        while self._deferred:
            self._deferred.pop(0)()

    def _advance_to(self, t: np.ndarray) -> None:
        np.maximum(self._now, t, out=self._now)

    def _add(self, seconds: float) -> None:
        self._now += seconds

    def _start_backward(self, seconds: float) -> None:
        self._bwd_start = self._now.copy()
        self._bwd_s = float(seconds)
        self._now += seconds

    def compute(self, seconds: float) -> None:
        """Advance by ``seconds`` of compute (queued behind a pending settlement, if any: see the
        class docstring)."""
        self.compute_s += seconds
        if self._deferred:
            self._deferred.append(functools.partial(self._add, seconds))
        else:
            self._add(seconds)

    def backward(self, seconds: float) -> None:
        """Advance by a backward pass of ``seconds``, remembering its window for
        :meth:`backward_point` (asynchronous operations issued during backward); queued behind a
        pending settlement like :meth:`compute`."""
        self.compute_s += seconds
        if self._deferred:
            self._deferred.append(functools.partial(self._start_backward, seconds))
        else:
            self._start_backward(seconds)

    def backward_point(self, fraction: float) -> np.ndarray:
        """The time at ``fraction`` (0..1) of the last backward pass."""
        self.resolve()
        return self._bwd_start + float(fraction) * self._bwd_s

    def wait_until(self, t: np.ndarray) -> None:
        """Move to ``max(now, t)`` entrywise (waiting for communication or for others)."""
        self.resolve()
        self._advance_to(t)

    @property
    def ports(self) -> Ports:
        """This worker's ports (:class:`Ports`), after every deferred settlement."""
        self.resolve()
        return self._ports

    def set_lanes(self, lanes: int) -> None:
        """Give the ports ``lanes`` lanes (``network.ports``); all free at time 0."""
        if int(lanes) != self._ports.lanes:
            self._ports = Ports(self.k, lanes)

    @property
    def time_s(self) -> float:
        """Entry 0: the modeled time on the configured cluster."""
        return float(self.now[0])

    def state_dict(self) -> dict:
        return {"now": self.now.tolist(), "compute_s": self.compute_s, "ports": self.ports.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self._deferred.clear()
        self._now = np.asarray(state["now"], dtype=np.float64)
        self.k = self._now.shape[0]
        self.compute_s = float(state["compute_s"])
        if "ports" in state:  # checkpoints written before ports: all free
            self._ports.load_state_dict(state["ports"])
        else:
            self._ports = Ports(self.k, self._ports.lanes)


def stream_end(stream_free: np.ndarray, issue: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """End (shape ``[k]``, seconds) of a collective on a communicator's stream: it starts at
    ``max(issue, stream_free)`` (``issue``: the max over its participants, from the settlement's
    exchange) and lasts ``cost``; the stream is free again at the end."""
    return np.maximum(issue, stream_free) + cost
