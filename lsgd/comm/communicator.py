"""The accounting communicator: the only caller of torch.distributed communication in lsgd
(process-group setup aside).

Every collective, point-to-point message and subgroup operation of an algorithm goes through
:class:`Communicator`, which

* counts ``comm_bytes``: payload bytes this worker hands to a collective or sends point to point
  (``numel * element_size``; what papers report as "floats sent x 4"),
* counts ``wire_bytes``: bytes this worker puts on the wire under the standard algorithm of the
  collective (:func:`lsgd.clock.network.wire_bytes`),
* counts ``comm_rounds`` when the algorithm marks a synchronization (:meth:`Communicator.round`),
* measures ``comm_time_s`` (wall-clock seconds this process spent in communication),
* reports the operation to this worker's :class:`lsgd.clock.network.Clock` (the *cluster clock*,
  ``modeled_time_s``), which prices it on the configured cluster.

The model of time (the clock's rules, the cost table, ports) lives in :mod:`lsgd.clock.network`; this
module reports to it what happened (issued, waited, sent, received, sizes, group, link). Every
cost has the form ``a * alpha + b * beta`` (:func:`lsgd.clock.network.cost_terms`); the communicator also
sums ``a`` (``model_alpha_terms``) and ``b`` (``model_beta_bytes``): the cost of the operations on
their own, without overlap or waiting. Operations issued with ``count=False`` (metric reductions,
evaluation, checkpoint barriers) are executed but neither counted nor clocked: they are
measurement, not training.

Backends: works on gloo and NCCL alike: point-to-point uses neither tags nor any-source receives;
on NCCL the sends and receives of one exchange go in one ``batch_isend_irecv``; on gloo receives are
posted before sends (neither blocks; gloo sends a message's data only once its receive is announced,
:meth:`Communicator.exchange`). Counters are thread-safe (DDP and PowerSGD
hooks complete on gloo's threads). Clock buffers live on the communicator's ``device``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.distributed as dist

from lsgd.comm import p2p_trace
from lsgd.comm.blocked_time import BlockedTime
from lsgd.comm.shared_memory import GATHER, SETTLE, Board

# the model of time lives in lsgd.clock.network; its public names stay importable from here
from lsgd.clock.network import (  # noqa: F401
    BCAST_MIN_PROCS,
    BCAST_SHORT_MSG_BYTES,
    COLLECTIVES,
    Clock,
    Network,
    NetworkModel,
    cost_terms,
    preset_latencies_us,
    stream_end,
    what_if_latency_us,
    wire_bytes,
)


def tensor_bytes(tensors: torch.Tensor | Sequence[torch.Tensor]) -> int:
    """Payload size in bytes: sum of ``numel * element_size`` over ``tensors``."""
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    return sum(t.numel() * t.element_size() for t in tensors)



# --------------------------------------------------------------------------------------------
# counters
# --------------------------------------------------------------------------------------------
@dataclass
class CommStats:
    """Cumulative per-worker communication counters (units: bytes, count, seconds)."""

    comm_bytes: int = 0
    wire_bytes: float = 0.0
    comm_rounds: int = 0
    comm_time_s: float = 0.0
    model_alpha_terms: float = 0.0
    model_beta_bytes: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


class _Shared:
    """State shared by a communicator and its subgroups: counters, clock, lock, network."""

    def __init__(self, network: Network, clock: Clock | None, device: torch.device):
        self.network = network
        self.clock = clock
        self.device = device
        self.stats = CommStats()
        self.lock = threading.Lock()
        self.step_comm_time_s = 0.0
        self.blocked = BlockedTime()  # wall time training threads spent waiting for communication
        self.warm: set = set()
        self.local = threading.local()  # .issue_at: set inside Communicator.overlap()
        self.comms: list[Communicator] = []  # this one and its subgroups, in creation order


# --------------------------------------------------------------------------------------------
# handles
# --------------------------------------------------------------------------------------------
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


class _Done(Handle):
    """An operation that needed no communication (world of one, empty payload)."""

    def __init__(self, comm, result=None):
        super().__init__(comm)
        self.done, self.result = True, result


# --------------------------------------------------------------------------------------------
# the clock settlement carried in a SUM all-reduce (DDP's gradient bucket)
# --------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def chunk_type(dtype: torch.dtype) -> np.dtype:
    """The unsigned integer type whose pieces of a float64 :func:`split_float64` sends in a
    tensor of ``dtype``: the widest of 32, 16 and 8 bits not above its significand digits (float64
    53: uint32; float32 24: uint16; float16 11 and bfloat16 8: uint8), so every piece is exactly
    representable in ``dtype``.

    Raises:
        ValueError: ``dtype`` is not a real floating-point type.
    """
    if not dtype.is_floating_point or dtype.is_complex:
        raise ValueError(f"a carried settlement needs a real floating-point tensor, got {dtype}")
    digits = 1 - int(round(math.log2(torch.finfo(dtype).eps)))
    return np.dtype(next(f"uint{w}" for w in (32, 16, 8) if w <= digits))


def split_float64(values: np.ndarray, chunk: np.dtype) -> np.ndarray:
    """The bytes of each float64 of ``values`` (shape ``[m]``) as ``c = 8 / chunk.itemsize``
    unsigned integers of type ``chunk`` (:func:`chunk_type`), in memory order: shape ``[m, c]``
    (a view). :func:`join_float64` inverts it exactly.

    Why exact through a SUM all-reduce in a floating type whose significand has at least
    ``8 * chunk.itemsize`` digits: every piece is an integer below ``2**(8 * itemsize)``, so it
    converts to that type and back without rounding; a slot that one rank writes and every other
    rank fills with +0.0 sums to the piece itself, in any order and association (``c + 0.0 == c``
    and ``0.0 + 0.0 == +0.0`` exactly in IEEE 754 arithmetic). The bit pattern is split, not the
    value, so there is no condition on the magnitude: zeros of both signs, subnormals, infinities
    and NaNs come back bit for bit (a ``hi + mid + lo`` split of the value into three float32
    would lose bits below float32's subnormal range, |x| < 2**-97, and overflow above its largest
    float). The ranks share a byte order (one architecture)."""
    values = np.ascontiguousarray(values, dtype=np.float64)
    return values.view(chunk).reshape(values.size, -1)


def join_float64(chunks: np.ndarray, chunk: np.dtype) -> np.ndarray:
    """Inverse of :func:`split_float64`: pieces ``[..., c]`` (integers representable in
    ``chunk``, any numeric type) -> float64 ``[...]``.

    Raises:
        ValueError: a piece is not an integer in ``chunk``'s range (the carrier changed it).
    """
    with np.errstate(invalid="ignore"):  # a negative, fractional, huge or NaN piece changes: caught below
        ints = np.ascontiguousarray(chunks).astype(chunk)
    if not (ints == chunks).all():
        raise ValueError("a carried settlement arrived changed: its pieces are not integers of its chunk type")
    return ints.view(np.float64).reshape(ints.shape[:-1])


class CarriedSettlement:
    """One clock settlement's exchange (the payload every rank contributes: issue times and port
    free times, then the codes, float64 ``[m]``), made by whichever comes first:

    * :meth:`write` (:meth:`block`) + :meth:`ride`: it travels inside a SUM all-reduce the step makes anyway (DDP's
      gradient bucket; :meth:`lsgd.comm.communicator.Communicator.take_carried`): rank ``r`` writes its payload's
      pieces (:func:`split_float64`) into slot ``r`` of a ``[p, m, c]`` block and +0.0 elsewhere,
      so the SUM is exactly the all-gather of the payloads;
    * :meth:`gathered` before it was shipped: the explicit exchange, an uncounted all-gather (what
      an uncarried settlement does at once).

    Every rank of the group must take the same path at the same point (lockstep: the same
    settlements, carriers and clock reads on every rank)."""

    __slots__ = ("comm", "payload", "_gathered", "_carrier", "_chunk")

    #: exchanges made since the process started, explicit (all-gather) and carried (a test's
    #: witness of which path ran)
    explicit = 0
    carried = 0

    def __init__(self, comm: Communicator, payload: np.ndarray):
        self.comm = comm
        self.payload = payload
        self._gathered: np.ndarray | None = None
        self._carrier: tuple[torch.Tensor, object] | None = None
        self._chunk = np.dtype(np.uint16)

    @property
    def shipped(self) -> bool:
        return self._carrier is not None

    @property
    def exchanged(self) -> bool:
        return self._gathered is not None or self._carrier is not None

    def block(self, dtype: torch.dtype) -> torch.Tensor:
        """This rank's contribution, flat, ``p * m * c`` elements of ``dtype`` (see the class)."""
        self._chunk = chunk_type(dtype)
        block = np.zeros((self.comm.world_size, self.payload.size * 8 // self._chunk.itemsize))
        block[self.comm.rank] = split_float64(self.payload, self._chunk).reshape(-1)
        return torch.from_numpy(block.reshape(-1)).to(dtype)

    def write(self, tail: torch.Tensor) -> None:
        """Put :meth:`block` into ``tail`` (``p * m * c`` elements of its dtype), before the
        all-reduce that carries it is issued (on CPU through a numpy view: two numpy operations,
        no temporary tensor)."""
        if tail.device.type == "cpu" and tail.dtype != torch.bfloat16:  # numpy has no bfloat16
            self._chunk = chunk_type(tail.dtype)
            view = tail.numpy()
            view.fill(0)
            c = self.payload.size * 8 // self._chunk.itemsize
            view[self.comm.rank * c : (self.comm.rank + 1) * c] = self.payload.view(self._chunk)
        else:
            tail.copy_(self.block(tail.dtype))

    def ride(self, tail: torch.Tensor, future) -> None:
        """The block (:meth:`write`) travels as ``tail`` of the tensor whose SUM all-reduce
        ``future`` completes."""
        self._carrier = (tail, future)
        CarriedSettlement.carried += 1

    def gathered(self) -> np.ndarray:
        """Every rank's payload, ``[p, m]`` float64 (the all-gather): from the carrier (waiting for
        it if needed), else by the explicit all-gather now.

        Read while an exception is handled (a failing rank writing its summary), it starts no
        collective its peers are not in and waits for no carrier that has not completed or that
        failed: this rank's own values, ``[1, m]`` (a lower bound of the settlement)."""
        if self._gathered is None:
            comm = self.comm
            failing = sys.exc_info()[0] is not None
            if self._carrier is not None:
                tail, future = self._carrier
                if failing and not future.done():
                    return self.payload[None, :]
                try:
                    with comm._s.blocked.region():
                        future.wait()  # done by now on gloo; on CUDA it also orders this stream after NCCL's
                except Exception:
                    if failing:
                        return self.payload[None, :]
                    raise
                summed = tail.numpy() if tail.device.type == "cpu" and tail.dtype != torch.bfloat16 else \
                    tail.detach().to("cpu", torch.float64).numpy()
                self._gathered = join_float64(summed.reshape(comm.world_size, self.payload.size, -1), self._chunk)
            elif failing:
                return self.payload[None, :]
            else:
                CarriedSettlement.explicit += 1
                self._gathered = comm._all_gather_payload(self.payload)
        return self._gathered


# --------------------------------------------------------------------------------------------
# the communicator
# --------------------------------------------------------------------------------------------
def _by_dtype(tensors: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``tensors`` grouped by dtype, in first-seen order."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    return list(by_dtype.values())


def _coalesced(tensors: Sequence[torch.Tensor]):
    """Yield (tensors of one dtype, their concatenation as one flat buffer), in first-seen order."""
    for group in _by_dtype(tensors):
        yield group, torch.cat([t.detach().reshape(-1) for t in group])


@torch.no_grad()
def copy_back(flat: torch.Tensor, group: Sequence[torch.Tensor]) -> None:
    """Copy consecutive slices of the 1-D ``flat`` into the tensors of ``group`` (the inverse of
    concatenating their flattened views)."""
    offset = 0
    for t in group:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


# newer torch names them *_single (its *_tensor names warn of deprecation); older torch has only *_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or getattr(dist, "reduce_scatter_tensor", None)
_ALL_GATHER_INTO = getattr(dist, "all_gather_single", None) or getattr(dist, "all_gather_into_tensor", None)


def _initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


class Communicator:
    """Counts, clocks and carries out every communication of one worker in one process group.

    Args:
        network: a :class:`Network` (links, placement, what-if bandwidths) or a single
            :class:`NetworkModel` used for every link. Default: 10 Gbps, 10 us.
        group: the process group (None: the default group). Without an initialized
            torch.distributed the communicator is a world of one (everything is the identity and
            costs nothing).
        clock: this worker's :class:`Clock`; None: no clock is kept (no clock exchanges either).
        device: where clock buffers live (the tensors' device: ``cuda`` for NCCL).
    """

    def __init__(self, network: Network | NetworkModel | None = None, group=None, clock: Clock | None = None,
                 device: torch.device | str = "cpu", *, _shared: _Shared | None = None, link: str | None = None):
        if _shared is None:
            if not isinstance(network, Network):
                network = Network(network or NetworkModel())
            if clock is not None and clock.k != network.k:
                raise ValueError(f"clock has {clock.k} entries, the network {network.k} (1 + len(report_gbps))")
            _shared = _Shared(network, clock, torch.device(device))
        self._s = _shared
        self.group = group
        if _initialized() and (group is None or dist.get_rank(group) >= 0):
            self.global_ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
            self._rank = dist.get_rank(group)
        else:
            self.global_ranks, self._rank = [0], 0
        self.link = link or self._s.network.link(self.global_ranks)
        self._models = self._s.network.models(self.link)
        if _shared.clock is not None:
            _shared.clock.set_lanes(_shared.network.ports)
        self._stream_free = np.zeros(self._s.network.k)
        self._pending: list[Handle] = []  # collectives issued, clock not yet settled (FIFO)
        #: a per-step agreement that an algorithm may carry in its clock settlement (:meth:`settle`'s
        #: ``codes``): an object with ``code() -> int`` (this rank's, >= 0) and ``carried(code)``
        #: (their MAX over the group, on every rank at the same point); the trainer puts its stop
        #: agreement (:class:`lsgd.training.preemption.PreemptionWatch`) here; None: nothing to carry
        self.carry = None
        #: the last settlement made with ``carried=True`` while its exchange is still to be made
        #: (:meth:`take_carried`, :class:`CarriedSettlement`)
        self._carried: CarriedSettlement | None = None
        self._board: Board | None | bool = False  # False: not made yet (board())
        self._s.comms.append(self)

    # -- world -------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return len(self.global_ranks)

    @property
    def rank(self) -> int:
        """This worker's rank in the group."""
        return self._rank

    @property
    def network(self) -> NetworkModel:
        """The link model (configured network) this group's collectives are priced on."""
        return self._models[0]

    @property
    def network_config(self) -> Network:
        """The cluster's links and placement (shared with subgroups)."""
        return self._s.network

    @property
    def stats(self) -> CommStats:
        return self._s.stats

    @stats.setter
    def stats(self, value: CommStats) -> None:
        self._s.stats = value

    @property
    def clock(self) -> Clock | None:
        return self._s.clock

    @property
    def device(self) -> torch.device:
        return self._s.device

    def global_rank(self, rank: int) -> int:
        """Global rank of group rank ``rank``."""
        return self.global_ranks[rank]

    # -- subgroups ---------------------------------------------------------------------------
    def subgroup(self, ranks: Sequence[int], link: str | None = None) -> Communicator | None:
        """A communicator over ``ranks`` (ranks of this group), sharing this one's counters and clock.

        Every rank of the *default* group must call it, with the same ``ranks``, in the same order
        as every other group creation (torch's rule for ``new_group``). Returns None on ranks
        outside ``ranks``.

        Args:
            ranks: group ranks of the members, in order (their rank in the subgroup).
            link: 'intra' or 'inter' to force the link it is priced on; None: 'intra' when all
                members sit on one node (``cluster.gpus_per_node``), else 'inter'.

        Raises:
            ValueError: a rank outside this group, repeated ranks, or an unknown link.
        """
        ranks = [int(r) for r in ranks]
        if len(set(ranks)) != len(ranks) or any(not 0 <= r < self.world_size for r in ranks):
            raise ValueError(f"subgroup ranks {ranks} must be distinct ranks of a group of {self.world_size}")
        if link not in (None, "intra", "inter"):
            raise ValueError(f"link={link!r} is unknown; allowed: intra, inter")
        members = [self.global_ranks[r] for r in ranks]
        group = dist.new_group(members) if _initialized() else None
        if self.global_ranks[self._rank] not in members:
            return None
        sub = Communicator(group=group, _shared=self._s, link=link or self._s.network.link(members))
        if not _initialized():
            sub.global_ranks, sub._rank = members, 0
        return sub

    def partition(self, blocks: Sequence[Sequence[int]], link: str | None = None) -> Communicator | None:
        """Create one subgroup per block of ``blocks`` (all ranks call it identically); return this
        rank's (None if it is in none). E.g. nodes: ``[[0, 1], [2, 3]]``."""
        mine = None
        for block in blocks:
            sub = self.subgroup(block, link)
            if sub is not None:
                mine = sub
        return mine

    # -- accounting --------------------------------------------------------------------------
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

    # -- the clock -----------------------------------------------------------------------------
    def _now(self) -> np.ndarray:
        clock = self._s.clock
        return clock.now.copy() if clock is not None else np.zeros(self._s.network.k)

    def issued(self, kind: str, nbytes: float, *, issue_at: np.ndarray | Callable[[], np.ndarray] | None = None,
               overlapped: bool = True) -> Handle:
        """Count and clock a collective that torch issued itself (a DDP comm hook's all-reduce).

        The returned handle carries no work: the clock is settled by :meth:`settle` (or a later
        handle's wait), once per step, on the main thread, by every rank in the same order.

        Args:
            issue_at: the clock time the operation was issued (an array, or a callable evaluated at
                settle time, e.g. ``lambda: clock.backward_point(f)`` for a bucket ready at
                fraction ``f`` of backward); None: the enclosing :meth:`overlap`'s, else now.
        """
        handle = Handle(self)
        handle.cost = self.count(kind, nbytes)
        handle.overlapped = overlapped
        if issue_at is None:
            issue_at = getattr(self._s.local, "issue_at", None)
        handle.issue = issue_at if issue_at is not None else self._now()
        if self._s.clock is not None and self.world_size > 1:
            with self._s.lock:
                self._pending.append(handle)
        return handle

    def settle(self, codes: Sequence[int] = (), on_codes: Callable[[list[int]], None] | None = None,
               carried: bool = False) -> bool:
        """Wait for every collective issued so far on the clock: settle them (their issue times'
        MAX over the group: one uncounted all-gather, the MAX taken locally; through the group's
        shared-memory board where it has one, :meth:`board`) and move the clock to
        the end of the last (the group's stream). Every rank of the group must call it at the same
        point.

        ``codes`` (integers in [0, 2**53), as many on every rank) travel in the same exchange:
        their MAX over the group is handed to ``on_codes`` when the settlement applies (the next
        clock read, :class:`lsgd.clock.network.Clock`), so a per-step agreement (the stop agreement,
        :attr:`carry`) costs no message of its own. Returns whether they were sent (False: nothing
        to settle, so no exchange).

        ``carried``: the exchange is not issued here; it waits (:meth:`take_carried`) for a SUM
        all-reduce the algorithm makes anyway before the next clock read (DDP's next gradient
        bucket), and is made explicitly (the all-gather) only where the clock is read before one
        took it (records, evaluation, checkpoints, :meth:`quiesce`). The values are the same
        either way (:class:`CarriedSettlement`); the ranks must then read the clock at the same
        points (lockstep: every rank makes the same records at the same step)."""
        sent = self._settle_ends(codes, on_codes, carried)
        clock = self._s.clock
        if clock is not None:
            clock.defer(lambda: clock._advance_to(self._stream_free))
        return sent

    def _settle_ends(self, codes: Sequence[int] = (), on_codes: Callable[[list[int]], None] | None = None,
                     carried: bool = False) -> bool:
        """Compute the end of every collective issued so far, moving no clock; True when some were
        (and ``codes`` went with them, :meth:`settle`)."""
        with self._s.lock:
            last = self._pending[-1] if self._pending else None
        if last is None:
            return False
        self._settle_ends_through(last, codes, on_codes, carried)
        return True

    def _settle_ends_through(self, handle: Handle, codes: Sequence[int] = (),
                             on_codes: Callable[[list[int]], None] | None = None, carried: bool = False) -> None:
        """Compute the ends of the collectives issued up to ``handle`` (FIFO), moving no clock;
        ``codes``, ``carried``: see :meth:`settle`."""
        with self._s.lock:
            if handle not in self._pending:
                return
            i = self._pending.index(handle)
            batch, self._pending = self._pending[: i + 1], self._pending[i + 1 :]
        clock = self._s.clock
        # a collective also waits for this member's ports (lsgd.clock.network, Ports): their earliest-free
        # lanes, read after every earlier settlement, travel in the same exchange
        ports = clock.ports
        busy = np.maximum(ports.free_at(self.link, "egress"), ports.free_at(self.link, "ingress"))
        issues = np.stack([np.maximum(h.issue() if callable(h.issue) else h.issue, busy) for h in batch])
        if self.world_size == 1:
            self._apply_settled(batch, issues)
            if on_codes is not None:
                on_codes([int(c) for c in codes])
            return
        # the codes after the issue times, as float64 (exact below 2**53). Gathered, then the MAX
        # taken here (exact: the same values as a MAX all-reduce): a gloo all-gather of a few
        # elements takes (p - 1) messages per rank, a ring all-reduce up to 2 (p - 1) per element
        # up to 2 p elements (4 ranks, 7 float64: 1.8 ms against 2.5 ms on this 2-core host)
        payload = np.concatenate([issues.reshape(-1), np.asarray(codes, dtype=np.float64)])
        board = None if carried else self.board()
        if carried:
            exchange = self._carried = CarriedSettlement(self, payload)
            gathered = exchange.gathered
        elif board is not None and board.fits(payload.size):  # (the same size on every rank)
            n = board.post(SETTLE, payload)

            def gathered():
                with self._s.blocked.region():
                    return board.gather(SETTLE, n, payload.size, own=payload)
        else:
            buf = torch.from_numpy(payload).to(self.device)
            out = torch.empty(self.world_size * buf.numel(), dtype=buf.dtype, device=buf.device)
            work = _ALL_GATHER_INTO(out, buf, group=self.group, async_op=True)

            def gathered():
                with self._s.blocked.region():
                    work.wait()
                return out.cpu().numpy().reshape(self.world_size, -1)

        def apply():
            out = gathered().max(axis=0)
            if carried and self._carried is exchange:
                self._carried = None
            self._apply_settled(batch, out[: issues.size].reshape(issues.shape))
            if on_codes is not None:
                on_codes([int(c) for c in out[issues.size :]])

        clock.defer(apply)

    def board(self) -> Board | None:
        """The group's shared-memory board (:class:`lsgd.comm.shared_memory.Board`: the settlement's, the stop
        agreement's and the records' figures' all-gather without a message, where the group's
        ranks share one host's
        ``/dev/shm``), made at the first call; None where it cannot be (another host,
        ``LSGD_BOARD=0``, a world of one). The first call is collective: every rank of the group
        makes it at the same point (the first settlement or stop agreement, in lockstep)."""
        if self._board is False:
            self._board = Board.create(self.group, device=self.device) if self.world_size > 1 and _initialized() else None
        return self._board

    def take_carried(self) -> CarriedSettlement | None:
        """The settlement made with ``carried=True`` (:meth:`settle`) whose exchange is still to be
        made, for the caller to ship in a SUM all-reduce (:meth:`CarriedSettlement.block`,
        :meth:`CarriedSettlement.ride`); None when there is none. Every rank gets the same answer
        at the same point of a lockstep method."""
        carried = self._carried
        return carried if carried is not None and not carried.exchanged else None

    def flush_carried(self) -> None:
        """Make the exchange of a carried settlement not yet shipped (the explicit all-gather;
        every rank calls it at the same point: :meth:`quiesce`)."""
        if self._carried is not None:
            self._carried.gathered()

    def _all_gather_payload(self, payload: np.ndarray) -> np.ndarray:
        """Uncounted, blocking all-gather of one float64 vector per rank: ``[p, len(payload)]``."""
        buf = torch.from_numpy(payload).to(self.device)
        out = torch.empty(self.world_size * buf.numel(), dtype=buf.dtype, device=buf.device)
        with self._s.blocked.region():
            _ALL_GATHER_INTO(out, buf, group=self.group)
        return out.cpu().numpy().reshape(self.world_size, -1)

    def _apply_settled(self, batch: list[Handle], issues: np.ndarray) -> None:
        """Run the settled operations through this group's stream: their ends (no clock moves)."""
        ports = self._s.clock._ports  # inside Clock.resolve: not through the resolving property
        for h, issue in zip(batch, issues):
            self._stream_free = stream_end(self._stream_free, issue, h.cost)
            h.end = self._stream_free.copy()
            ports.hold(self.link, h.end)

    @contextlib.contextmanager
    def overlap(self, issue_at: np.ndarray | Callable[[], np.ndarray] | None) -> Iterator[None]:
        """Within the block, counted collectives are clocked as asynchronous operations issued at
        ``issue_at`` (see :meth:`issued`), although the data moves synchronously: a DDP comm hook
        that exchanges a bucket in place (compression) is priced as on a cluster, where the exchange
        overlaps the rest of backward. Settle with :meth:`settle` after backward."""
        local = self._s.local
        previous = getattr(local, "issue_at", None)
        local.issue_at = issue_at
        try:
            yield
        finally:
            local.issue_at = previous

    def _complete(self, handle: Handle) -> None:
        """Clock and measured time of a finished handle: the wait moves the clock to its end."""
        if handle.overlapped is not None:
            done = handle.t_done if handle.t_done is not None else time.perf_counter()
            self.add_time(done - handle.t0, overlapped=handle.overlapped)
        clock = self._s.clock
        if clock is None:
            return
        if handle.restored is not None:
            clock.wait_until(handle.restored)
            return
        if handle.cost is not None and not handle.deferred:
            self._settle_ends_through(handle)
            # in order after the settlement that computes the end (Clock.defer)
            clock.defer(lambda: handle.end is not None and clock._advance_to(handle.end))
        if handle.messages:
            clock.wait_until(self._settle_messages(handle))

    def _collective(self, kind: str, nbytes: int, op: Callable[[], object], async_op: bool, count: bool,
                    finish: Callable[[], object] | None = None, root: int = 0) -> Handle:
        """Run ``op`` (a torch.distributed call with ``async_op=True``) as a counted, clocked operation."""
        t0 = time.perf_counter()
        with self._s.blocked.region():  # issuing is communication too (lsgd.comm.blocked_time)
            work = op()
        handle = Handle(self, [work] if work is not None else [], finish, t0)
        if count:
            deferred = getattr(self._s.local, "issue_at", None)
            # measured time: an async caller computes while it is in flight; a synchronous call
            # (also inside overlap(), whose data moves synchronously) is communication time
            handle.overlapped = async_op
            handle.deferred = deferred is not None
            handle.cost = self.count(kind, nbytes, root=root)
            handle.issue = deferred if deferred is not None else self._now()
            if self._s.clock is not None and self.world_size > 1:
                with self._s.lock:
                    self._pending.append(handle)
        else:
            handle.overlapped = None  # neither timed nor clocked
        if not async_op:
            handle.wait()
        return handle

    # -- collectives ---------------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op=None, count: bool = True, async_op: bool = False):
        """In-place all-reduce (default SUM) of ``tensor``.

        Returns ``tensor``, or a :class:`Handle` (whose ``wait()`` returns ``tensor``) with ``async_op``.
        """
        if self.world_size == 1:
            return _Done(self, tensor) if async_op else tensor
        red = op if op is not None else dist.ReduceOp.SUM
        h = self._collective(
            "all_reduce", tensor_bytes(tensor),
            lambda: dist.all_reduce(tensor, op=red, group=self.group, async_op=True), async_op, count, lambda: tensor,
        )
        return h if async_op else tensor

    def average_(self, tensors: Sequence[torch.Tensor], count: bool = True, async_op: bool = False):
        """Replace each tensor by its mean over the group, in place, one all-reduce per dtype.

        The tensors are flattened into one contiguous buffer per dtype (a coalesced collective, as
        torch's model averagers do), so a round of parameter averaging costs one all-reduce of the
        model size. Integer tensors are averaged with floor division. With ``async_op`` returns a
        :class:`Handle`; the tensors hold the average only after its ``wait()``.
        """
        if self.world_size == 1 or not tensors:
            return _Done(self) if async_op else None
        p = self.world_size
        handles = []
        for group, flat in _coalesced(tensors):
            def finish(group=group, flat=flat):
                if flat.is_floating_point() or flat.is_complex():
                    flat.div_(p)
                else:
                    flat.floor_divide_(p)
                copy_back(flat, group)

            # issued without waiting (one all-reduce per dtype in flight together), but a
            # synchronous average_ is communication time, not time in flight during compute
            handle = self._collective(
                "all_reduce", tensor_bytes(flat),
                lambda flat=flat: dist.all_reduce(flat, group=self.group, async_op=True), True, count, finish,
            )
            if handle.overlapped is not None:
                handle.overlapped = bool(async_op)
            handles.append(handle)
        if not async_op:
            for h in handles:
                h.wait()
            return None
        return handles[0] if len(handles) == 1 else _Many(self, handles)

    def broadcast_(self, tensors: Sequence[torch.Tensor], src: int = 0, count: bool = True) -> None:
        """Broadcast ``tensors`` from group rank ``src`` in place, one coalesced broadcast per dtype."""
        if self.world_size == 1:
            return
        pg = self.group if self.group is not None else dist.distributed_c10d._get_default_group()
        for group in _by_dtype(tensors):
            nbytes = tensor_bytes(group)
            # torch's C++ coalesced broadcast (DDP's buffer broadcast): it flattens, broadcasts from
            # group rank src and copies back in place, with no Python step per tensor; synchronous.
            # A buffer of the group's size makes it one broadcast, as counted.
            self._collective(
                "broadcast", nbytes, lambda group=group, size=max(nbytes, 1): dist._broadcast_coalesced(pg, group, size, src),
                False, count, root=src,
            )

    def all_gather(self, tensor: torch.Tensor, count: bool = True, async_op: bool = False):
        """All-gather equally shaped tensors; returns the list ordered by group rank (or a Handle)."""
        p = self.world_size
        if p == 1:
            return _Done(self, [tensor]) if async_op else [tensor]
        out = [torch.empty_like(tensor) for _ in range(p)]
        h = self._collective(
            "all_gather", tensor_bytes(tensor),
            lambda: dist.all_gather(out, tensor, group=self.group, async_op=True), async_op, count, lambda: out,
        )
        return h if async_op else out

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, count: bool = True, async_op: bool = False):
        """SUM reduce-scatter: ``output`` (``input.numel() / p`` elements) receives this rank's
        slice of the sum of ``input`` over the group. Counted with ``n`` = ``input`` bytes.
        Returns ``output`` (or a Handle)."""
        return self._into("reduce_scatter", _REDUCE_SCATTER, output, input, count, async_op)

    def all_gather_into(self, output: torch.Tensor, input: torch.Tensor, count: bool = True, async_op: bool = False):
        """All-gather into one tensor: ``output`` (``p * input.numel()`` elements) holds every rank's
        ``input`` in group-rank order. Returns ``output`` (or a Handle)."""
        return self._into("all_gather", _ALL_GATHER_INTO, output, input, count, async_op)

    def _into(self, kind: str, fn, output: torch.Tensor, input: torch.Tensor, count: bool, async_op: bool):
        if self.world_size == 1:
            output.copy_(input.reshape(output.shape))
            return _Done(self, output) if async_op else output
        h = self._collective(kind, tensor_bytes(input), lambda: fn(output, input, group=self.group, async_op=True),
                             async_op, count, lambda: output)
        return h if async_op else output

    def barrier(self) -> None:
        """Uncounted barrier (checkpointing, shutdown)."""
        if self.world_size > 1:
            with self._s.blocked.region():
                dist.barrier(group=self.group)

    def gather_values(self, values: Sequence[float]) -> np.ndarray:
        """Uncounted all-gather of one float64 vector per rank: an array ``[world, len(values)]``
        (metrics of every worker at a record point); through the group's shared-memory board where
        it has one (:meth:`board`: no message, the same values)."""
        if self.world_size > 1 and (board := self.board()) is not None and board.fits(len(values)):
            mine = np.asarray(values, dtype=np.float64).reshape(-1)
            n = board.post(GATHER, mine)
            with self._s.blocked.region():
                return board.gather(GATHER, n, mine.size, own=mine)
        vec = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        if self.world_size == 1:
            return vec.cpu().numpy()[None, :]
        return torch.stack(self.all_gather(vec, count=False)).cpu().numpy()

    # -- point to point ------------------------------------------------------------------------
    def _warm_up(self) -> None:
        # NCCL: a batched P2P call that is the first operation on a group must involve every rank
        # of the group (torch's rule); one uncounted 1-element all-reduce per group first.
        if self._batched and id(self.group) not in self._s.warm:
            dist.all_reduce(torch.zeros(1, device=self.device), group=self.group)
            self._s.warm.add(id(self.group))

    @property
    def _batched(self) -> bool:
        return _initialized() and dist.get_backend(self.group) != "gloo"

    def post_recv(self, tensor: torch.Tensor, peer: int, count: bool = True) -> PostedRecv:
        """Post the transport receive of ``tensor`` from group rank ``peer`` now, ahead of the
        :meth:`exchange` (or :meth:`sendrecv`) that consumes it: pass the returned
        :class:`PostedRecv` in that call's ``recvs`` in place of the tensor, with the same
        ``count``. Nothing is counted, timed or clocked here: the exchange that consumes it is
        clocked and timed as if it had posted the receive itself (the receive is posted at the
        exchange's issue on the cluster clock), so counts and modeled time do not depend on it.

        Why: gloo sends a message's data only once its receive is announced (:meth:`exchange`), so
        a receive posted late costs a round trip on the critical path; posted early, the
        announcement has arrived when the peer sends (measured with Adasum: 4 gloo ranks on 2
        cores, 1M floats, 13-15 ms -> 9-11 ms for the message pattern alone).

        Every receive from one peer must be posted (here or by an exchange) in the order that peer
        sends (point-to-point matches messages between a pair in order), and ``tensor`` must not be
        touched until the exchange completes. On NCCL nothing is posted here (an exchange is one
        ``batch_isend_irecv``); the exchange posts the receive as usual.

        Raises:
            ValueError: a peer outside the group or equal to this rank.
        """
        peer = int(peer)
        if not 0 <= peer < self.world_size or peer == self._rank:
            raise ValueError(f"peer {peer} must be another rank of this group of {self.world_size}")
        posted = PostedRecv(tensor, peer, count)
        if tensor.numel() and not self._batched:
            src = self.global_ranks[peer]
            with self._s.blocked.region():  # posting is communication too (lsgd.comm.blocked_time)
                posted.works = [dist.irecv(tensor, src, group=self.group)]
                if count and self._s.clock is not None:
                    posted.stamp = torch.empty(self._s.network.k, dtype=torch.float64, device=self.device)
                    posted.works.append(dist.irecv(posted.stamp, src, group=self.group))
        return posted

    def exchange(self, sends: Mapping[int, torch.Tensor] | None = None,
                 recvs: Mapping[int, torch.Tensor | PostedRecv] | None = None,
                 count: bool = True, async_op: bool = False):
        """Neighbour exchange: send ``sends[peer]`` to and receive into ``recvs[peer]`` from group
        ranks, all at once (the gossip primitive). Empty tensors are skipped.

        Both ends must post matching calls (same sizes, and, between one pair, the same order of
        messages). Counted as one ``p2p`` per non-empty send. Clock: each send completes at
        ``start + cost``, ``start = max(issue, egress free)``, the sends taking this worker's egress
        one after another in the order ``(peer - rank) mod p``; each receive at
        ``max(sender's start, receive posted, ingress free) + cost`` (:mod:`lsgd.clock.network`, Ports), the sender's start
        travelling as an uncounted float64 message after the payload.

        A receive may be a :class:`PostedRecv` (:meth:`post_recv`) posted earlier with the same
        ``count``: its transport receive is already under way and is waited here; it is clocked
        and timed as a receive posted by this call.

        Returns None, or a :class:`Handle` with ``async_op`` (the received tensors are valid after
        its ``wait()``).

        Raises:
            ValueError: a peer outside the group or equal to this rank; a :class:`PostedRecv` from
                another peer, with another ``count``, or already consumed.
        """
        sends = {int(k): v for k, v in (sends or {}).items() if v is not None and v.numel()}
        recvs = {int(k): v for k, v in (recvs or {}).items() if v is not None and v.numel()}
        for peer in list(sends) + list(recvs):
            if not 0 <= peer < self.world_size or peer == self._rank:
                raise ValueError(f"peer {peer} must be another rank of this group of {self.world_size}")
        for peer, t in recvs.items():
            if isinstance(t, PostedRecv) and (t.peer != peer or t.count != count or t.used):
                raise ValueError(f"a posted receive from {t.peer} (count={t.count}, used={t.used}) cannot be "
                                 f"consumed as a receive from {peer} with count={count}")
        if not sends and not recvs:
            return _Done(self) if async_op else None
        clock = self._s.clock if count else None
        t0 = time.perf_counter()
        handle = Handle(self, t0=t0)
        # measured time: an asynchronous caller computes while the messages travel
        handle.overlapped = bool(async_op) if count else None
        handle.issue = self._now()
        send_ops, recv_ops = [], []
        p = self.world_size
        # the egress takes the sends one after another, in the shift order of pairwise exchanges
        for peer in sorted(sends, key=lambda q: (q - self._rank) % p):
            t = sends[peer]
            dst = self.global_ranks[peer]
            send_ops.append((dist.isend, t, dst))
            if count:
                cost = self._p2p_cost(peer, tensor_bytes(t))
            if clock is not None:
                link = self._pair_link(self._rank, peer)
                start, end = clock.ports.occupy(link, "egress", handle.issue, cost)
                send_ops.append((dist.isend, torch.from_numpy(start).to(self.device), dst))
                handle.messages.append(("send", end, None, link, peer))
        posted_works = []
        for peer, t in recvs.items():
            if isinstance(t, PostedRecv):
                t.used = True
                if t.works is not None:
                    posted_works += t.works
                    if clock is not None:
                        handle.messages.append(("recv", self._p2p_link_cost(peer, tensor_bytes(t.tensor)), t.stamp,
                                                self._pair_link(self._rank, peer), peer))
                    continue
                t = t.tensor
            src = self.global_ranks[peer]
            recv_ops.append((dist.irecv, t, src))
            if clock is not None:
                buf = torch.empty(self._s.network.k, dtype=torch.float64, device=self.device)
                recv_ops.append((dist.irecv, buf, src))
                handle.messages.append(("recv", self._p2p_link_cost(peer, tensor_bytes(t)), buf,
                                        self._pair_link(self._rank, peer), peer))
        trace = p2p_trace.tracer() if count and not self._batched else None
        if trace is not None:
            handle.trace = trace.start([self.global_ranks[q] for q in sorted({*sends, *recvs})],
                                       [tensor_bytes(t) for t in sends.values()], t0)
        with self._s.blocked.region():  # posting is communication too (lsgd.comm.blocked_time)
            if self._batched:
                self._warm_up()
                handle.works = dist.batch_isend_irecv([dist.P2POp(f, t, r, self.group) for f, t, r in recv_ops + send_ops])
            else:
                # receives first: gloo's tcp transport sends a message's data only after the receiver
                # has announced the receive (a small notification on the same connection); posted after
                # the sends, that notification queues behind this rank's own outgoing data on a slow
                # link, and both ends wait. Measured on the emulated cluster (4 ranks, 0.86 MB to
                # each ring neighbour at 50 Mbit/s): 3.5 message times with sends first, 2.3 with
                # receives first, 2 by the clock (issue 23)
                posted = [f(t, r, group=self.group) for f, t, r in recv_ops + send_ops]
                handle.works = posted_works + posted
                if handle.trace is not None:  # receives posted ahead (post_recv) are not traced
                    handle.trace.watch(posted, _trace_labels(recv_ops + send_ops))
        if not async_op:
            handle.wait()
            return None
        return handle

    def sendrecv(self, send: torch.Tensor | None, recv: torch.Tensor | None, peer: int, count: bool = True,
                 async_op: bool = False):
        """Paired exchange with one peer: send ``send`` and receive ``recv`` at the same time
        (either may be None or empty). See :meth:`exchange`."""
        return self.exchange({peer: send} if send is not None else {}, {peer: recv} if recv is not None else {},
                             count=count, async_op=async_op)

    def isend(self, tensor: torch.Tensor, dst: int, count: bool = True) -> Handle:
        """Non-blocking send to group rank ``dst``; the peer posts :meth:`irecv`."""
        return self.exchange({dst: tensor}, None, count=count, async_op=True)

    def irecv(self, tensor: torch.Tensor, src: int, count: bool = True) -> Handle:
        """Non-blocking receive from group rank ``src`` into ``tensor``."""
        return self.exchange(None, {src: tensor}, count=count, async_op=True)

    def pair_cost(self, i: int, j: int, nbytes: float) -> np.ndarray:
        """Modeled seconds (shape ``[k]``, one per clock entry) of one message of ``nbytes``
        between group ranks ``i`` and ``j`` on their link (a paired exchange costs the same: both
        directions travel at once); nothing is counted."""
        return self._s.network.costs(self._pair_link(i, j), "p2p", nbytes, 2)

    def _pair_link(self, i: int, j: int) -> str:
        return self._s.network.link([self.global_ranks[i], self.global_ranks[j]])

    def _settle_messages(self, handle: Handle) -> np.ndarray:
        """The end (shape ``[k]``) of ``handle``'s messages, computed once (its transfer complete:
        the senders' stamps are in), moving no clock: a send ends where its egress lane let it
        (:meth:`exchange`); the receives take this worker's ingress in order of the senders'
        stamps, then peer rank, each clock entry on its own (:meth:`lsgd.clock.network.Ports.occupy`), each
        no earlier than this worker posted it (rendezvous)."""
        if handle.message_end is None:
            handle.complete_data()
            ports = self._s.clock.ports
            ends = [end for d, end, _, _, _ in handle.messages if d == "send"]
            recvs = [(buf.cpu().numpy(), cost, link, peer)
                     for d, cost, buf, link, peer in handle.messages if d == "recv"]
            if recvs:
                k = self._s.network.k
                end = np.zeros(k)
                for e in range(k):
                    for stamp, cost, link, _ in sorted(recvs, key=lambda m: (m[0][e], m[3])):
                        # rendezvous: the data moves once the receive is posted (gloo announces each
                        # receive to the sender; MPI's and NCCL's large messages wait for it too)
                        ready = np.maximum(stamp[e : e + 1], handle.issue[e : e + 1])
                        _, done = ports.occupy(link, "ingress", ready, cost[e : e + 1], entries=[e])
                        end[e] = max(end[e], done[0])
                ends.append(end)
            handle.message_end = np.maximum.reduce(ends)
        return handle.message_end

    def _p2p_link_cost(self, peer: int, nbytes: int) -> np.ndarray:
        return self.pair_cost(self._rank, peer, nbytes)

    def _p2p_cost(self, peer: int, nbytes: int) -> np.ndarray:
        """Count one p2p send of ``nbytes`` to ``peer``; its cost on the pair's link."""
        self.count("p2p", nbytes, p=2)
        return self._p2p_link_cost(peer, nbytes)

    def quiesce(self) -> None:
        """Settle every collective issued on this communicator and its subgroups, in their
        creation order (a global order, so ranks in several subgroups cannot deadlock): compute
        their ends, moving no clock (measurement never moves modeled time; the algorithm's own
        waits do); a carried settlement still waiting for its carrier makes its exchange here
        (:meth:`flush_carried`). Before evaluation, checkpoint and exit; every rank calls it at the
        same point."""
        for comm in self._s.comms:
            comm.flush_carried()
            comm._settle_ends()

    def resumed(self, state: dict | None) -> Handle:
        """A handle for an operation that was in flight at a checkpoint (its
        :meth:`Handle.state_dict`): its data is the algorithm's (restored with the checkpoint), and
        its :meth:`Handle.wait` moves the clock to the saved end, as the uninterrupted run's wait
        does. Nothing is counted again (the counters were saved)."""
        handle = Handle(self)
        handle.overlapped = None  # no measured time
        handle.data_done = handle.works_done = True
        end = None if state is None else state.get("end")
        if end is not None:
            handle.restored = np.asarray(end, dtype=np.float64)
        else:
            handle.done = True
        return handle

    # -- checkpointing -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        state = {"stats": self.stats.as_dict(), "stream_free": self._stream_free.tolist()}
        if self.clock is not None:
            state["clock"] = self.clock.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if "stats" not in state:  # checkpoints written before the cluster clock
            self.stats = CommStats(**{k: v for k, v in state.items() if k in CommStats.__dataclass_fields__})
            return
        self.stats = CommStats(**state["stats"])
        self._carried = None
        self._stream_free = np.asarray(state["stream_free"], dtype=np.float64)
        if self.clock is not None and "clock" in state:
            self.clock.load_state_dict(state["clock"])


def _trace_labels(ops) -> list[tuple[str, int]]:
    """``(kind, peer)`` of each posted op for :mod:`lsgd.comm.p2p_trace`: the payload, then (with a
    clock) the start stamp (float64, ``[k]``), per peer."""
    out, seen = [], set()
    for f, _t, r in ops:
        kind = "recv" if f is dist.irecv else "send"
        if (kind, r) in seen:
            kind += "_stamp"
        seen.add((kind, r))
        out.append((kind, r))
    return out


class _Many(Handle):
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
