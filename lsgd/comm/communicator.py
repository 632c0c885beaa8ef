"""The accounting communicator: the only caller of torch.distributed communication in lsgd
(process-group setup aside).

Every collective, point-to-point message and subgroup operation of an algorithm goes through
:class:`Communicator`, which

* counts ``comm_bytes``: payload bytes this worker hands to a collective or sends point to point
  (``numel * element_size``; what papers report as "floats sent x 4"),
* counts ``wire_bytes``: bytes this worker puts on the wire under the standard algorithm of the
  collective (:func:`lsgd.clock.network.wire_bytes`),
* keeps ``peak_step_bytes``: the most wire bytes this worker sent in one step (the trainer marks
  the end of each step, :meth:`Communicator.end_step`),
* counts ``comm_rounds`` when the algorithm marks a synchronization (:meth:`Communicator.round`),
* measures ``comm_time_s`` (wall-clock seconds this process spent in communication),
* reports the operation to this worker's :class:`lsgd.clock.worker_clock.Clock` (the *cluster clock*,
  ``modeled_time_s``), which prices it on the configured cluster.

The model of time lives in :mod:`lsgd.clock` (the clock's rules: :mod:`lsgd.clock.worker_clock`; the
cost table: :mod:`lsgd.clock.network`; ports: :mod:`lsgd.clock.ports`); the communicator reports to it
what happened (issued, waited, sent, received, sizes, group, link). Every
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

The communicator, by concern
----------------------------
:class:`Communicator` (this module: its group, subgroups, the state it shares with them,
checkpointing) is made of one part per concern, each a base class in its own module:

* :mod:`lsgd.comm.accounting`: the counters (:class:`lsgd.comm.accounting.CommStats`), measured
  and blocked time (:class:`lsgd.comm.accounting.Accounting`);
* :mod:`lsgd.comm.collectives`: all-reduce, averaging, broadcast, all-gather, reduce-scatter,
  barrier, metrics, and collectives torch issues itself (:class:`lsgd.comm.collectives.Collectives`);
* :mod:`lsgd.comm.point_to_point`: messages between ranks: the neighbour exchange, paired
  exchanges, receives posted ahead (:class:`lsgd.comm.point_to_point.PointToPoint`);
* :mod:`lsgd.comm.settlement`: the clock's settlement of collectives: their ends on the group's
  stream, the exchange of the issue times (an all-gather, the shared-memory board, or carried in
  a SUM all-reduce), quiesce and resumed operations
  (:class:`lsgd.comm.settlement.ClockSettlement`, :class:`lsgd.comm.settlement.CarriedSettlement`);
* :mod:`lsgd.comm.handles`: what an operation in flight returns (:class:`lsgd.comm.handles.Handle`,
  :class:`lsgd.comm.handles.PostedRecv`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist

from lsgd.clock.network import Network, NetworkModel
from lsgd.clock.worker_clock import Clock
from lsgd.comm.accounting import Accounting, CommStats
from lsgd.comm.blocked_time import BlockedTime
from lsgd.comm.collectives import Collectives
from lsgd.comm.handles import Handle
from lsgd.comm.point_to_point import PointToPoint
from lsgd.comm.process_group import initialized
from lsgd.comm.settlement import CarriedSettlement, ClockSettlement
from lsgd.comm.shared_memory import Board


class _Shared:
    """State shared by a communicator and its subgroups: counters, clock, lock, network."""

    def __init__(self, network: Network, clock: Clock | None, device: torch.device):
        self.network = network
        self.clock = clock
        self.device = device
        self.stats = CommStats()
        self.step_start_wire = 0.0  # stats.wire_bytes when the current step began (Accounting.end_step)
        self.lock = threading.Lock()
        self.step_comm_time_s = 0.0
        self.blocked = BlockedTime()  # wall time training threads spent waiting for communication
        self.warm: set = set()
        self.local = threading.local()  # .issue_at: set inside Communicator.overlap()
        self.comms: list[Communicator] = []  # this one and its subgroups, in creation order


class Communicator(Accounting, Collectives, PointToPoint, ClockSettlement):
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
        if initialized() and (group is None or dist.get_rank(group) >= 0):
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
        group = dist.new_group(members) if initialized() else None
        if self.global_ranks[self._rank] not in members:
            return None
        sub = Communicator(group=group, _shared=self._s, link=link or self._s.network.link(members))
        if not initialized():
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

    # -- checkpointing -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        state = {"stats": self.stats.as_dict(), "stream_free": self._stream_free.tolist()}
        if self.clock is not None:
            state["clock"] = self.clock.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if "stats" not in state:  # checkpoints written before the cluster clock
            self.stats = CommStats(**{k: v for k, v in state.items() if k in CommStats.__dataclass_fields__})
            self._s.step_start_wire = self.stats.wire_bytes
            return
        self.stats = CommStats(**state["stats"])  # peak_step_bytes: 0 from checkpoints written before it
        self._s.step_start_wire = self.stats.wire_bytes  # checkpoints are made between steps
        self._carried = None
        self._stream_free = np.asarray(state["stream_free"], dtype=np.float64)
        if self.clock is not None and "clock" in state:
            self.clock.load_state_dict(state["clock"])
