"""The accounting communicator: the only caller of torch.distributed collectives in lsgd.

Every collective an algorithm issues goes through :class:`Communicator`, which

* counts ``comm_bytes``: payload bytes this worker hands to the collective
  (``numel * element_size`` of its input; what papers report as "floats sent x 4"),
* counts ``wire_bytes``: bytes this worker puts on the wire under the standard (ring) algorithm
  of the collective,
* counts ``comm_rounds`` when the algorithm marks a synchronization (:meth:`Communicator.round`),
* measures ``comm_time_s`` (wall-clock seconds inside the collective, or in flight for async
  DDP buckets),
* adds the alpha-beta cost of the collective on the configured network to ``modeled_comm_s``.

Alpha-beta (latency-bandwidth) cost model, ring algorithms, ``p`` workers, ``n`` payload bytes,
``alpha`` = latency (s), ``beta`` = 8 / bandwidth_bits_per_s (s/byte). Source: Thakur, Rabenseifner
and Gropp, "Optimization of Collective Communication Operations in MPICH", IJHPCA 2005 (Sec. 4),
and Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
JPDC 2009:

=============  ====================================  ==========================
collective     modeled time                          wire bytes per worker
=============  ====================================  ==========================
all-reduce     2 (p-1) alpha + 2 (p-1)/p n beta      2 (p-1)/p n
all-gather     (p-1) alpha + (p-1) n beta            (p-1) n      (n = input bytes)
broadcast      (p-1) alpha + n beta   (pipelined)    (p-1)/p n    (chain: p-1 senders of n)
p2p            alpha + n beta                        n            (one point-to-point send)
=============  ====================================  ==========================

Every modeled cost has the form ``a * alpha + b * beta``; the communicator also accumulates the
latency terms ``a`` (``model_alpha_terms``) and the bandwidth bytes ``b`` (``model_beta_bytes``), so
the modeled communication time on any other network is ``a * alpha' + b * beta'``
(:meth:`NetworkModel.cost`, used by ``lsgd report`` for the 1 and 10 Gbps columns).

With ``p = 1`` every cost is zero. Collectives issued with ``count=False`` (metric reductions,
evaluation, checkpoint barriers) are executed but not counted: they are measurement, not training.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist


@dataclass
class NetworkModel:
    """Alpha-beta network parameters.

    Args:
        bandwidth_gbps: link bandwidth in gigabits per second (1e9 bits/s).
        latency_us: per-message latency alpha in microseconds.
    """

    bandwidth_gbps: float = 10.0
    latency_us: float = 10.0

    @property
    def alpha(self) -> float:
        """Latency in seconds."""
        return self.latency_us * 1e-6

    @property
    def beta(self) -> float:
        """Seconds per byte."""
        return 8.0 / (self.bandwidth_gbps * 1e9)

    def cost(self, alpha_terms: float, beta_bytes: float) -> float:
        """Seconds of ``alpha_terms`` latencies plus ``beta_bytes`` bytes at this bandwidth."""
        return alpha_terms * self.alpha + beta_bytes * self.beta

    def all_reduce(self, nbytes: int, p: int) -> float:
        """Modeled seconds of a ring all-reduce of ``nbytes`` payload bytes over ``p`` workers."""
        return self.cost(*cost_terms("all_reduce", nbytes, p))

    def all_gather(self, nbytes: int, p: int) -> float:
        """Modeled seconds of a ring all-gather where each worker contributes ``nbytes``."""
        return self.cost(*cost_terms("all_gather", nbytes, p))

    def broadcast(self, nbytes: int, p: int) -> float:
        """Modeled seconds of a pipelined chain broadcast of ``nbytes``."""
        return self.cost(*cost_terms("broadcast", nbytes, p))

    def p2p(self, nbytes: int, p: int) -> float:
        """Modeled seconds of one point-to-point send of ``nbytes`` (``p`` >= 2 workers)."""
        return self.cost(*cost_terms("p2p", nbytes, p))


def cost_terms(kind: str, nbytes: int, p: int) -> tuple[float, float]:
    """(latency terms, bandwidth bytes) of collective ``kind``: its cost is ``a alpha + b beta``.

    Raises:
        ValueError: unknown ``kind`` (allowed: all_reduce, all_gather, broadcast, p2p).
    """
    if kind not in COLLECTIVES:
        raise ValueError(f"unknown collective {kind!r}; allowed: {', '.join(COLLECTIVES)}")
    if p <= 1:
        return 0.0, 0.0
    if kind == "all_reduce":
        return 2 * (p - 1), 2 * (p - 1) / p * nbytes
    if kind == "all_gather":
        return p - 1, (p - 1) * nbytes
    if kind == "broadcast":
        return p - 1, nbytes
    return 1, nbytes


COLLECTIVES = ("all_reduce", "all_gather", "broadcast", "p2p")


def wire_bytes(kind: str, nbytes: int, p: int) -> float:
    """Bytes one worker sends on the wire for collective ``kind`` with payload ``nbytes``.

    Raises:
        ValueError: unknown ``kind`` (allowed: all_reduce, all_gather, broadcast, p2p).
    """
    if kind not in COLLECTIVES:
        raise ValueError(f"unknown collective {kind!r}; allowed: {', '.join(COLLECTIVES)}")
    if p <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2 * (p - 1) / p * nbytes
    if kind == "all_gather":
        return (p - 1) * nbytes
    if kind == "broadcast":
        return (p - 1) / p * nbytes
    return float(nbytes)


@dataclass
class CommStats:
    """Cumulative per-worker communication counters (units: bytes, count, seconds)."""

    comm_bytes: int = 0
    wire_bytes: float = 0.0
    comm_rounds: int = 0
    comm_time_s: float = 0.0
    modeled_comm_s: float = 0.0
    model_alpha_terms: float = 0.0
    model_beta_bytes: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def tensor_bytes(tensors: torch.Tensor | Sequence[torch.Tensor]) -> int:
    """Payload size in bytes: sum of ``numel * element_size`` over ``tensors``."""
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    return sum(t.numel() * t.element_size() for t in tensors)


def _coalesced(tensors: Sequence[torch.Tensor]):
    """Yield (tensors of one dtype, their concatenation as one flat buffer), in first-seen order."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for group in by_dtype.values():
        yield group, torch.cat([t.detach().reshape(-1) for t in group])


@torch.no_grad()
def _copy_back(flat: torch.Tensor, group: Sequence[torch.Tensor]) -> None:
    """Copy consecutive slices of ``flat`` into the tensors of ``group``."""
    offset = 0
    for t in group:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


class Communicator:
    """Counts and times every collective of one worker.

    Args:
        network: the alpha-beta model used for ``modeled_comm_s``.
        group: the process group (None: the default group). When torch.distributed is not
            initialized the communicator acts as a world of one (every collective is the identity
            and costs nothing).
    """

    def __init__(self, network: NetworkModel | None = None, group=None):
        self.network = network or NetworkModel()
        self.group = group
        self.stats = CommStats()
        self.step_comm_time_s = 0.0  # comm seconds since the trainer last called pop_step_time()

    # -- world -----------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.group) if dist.is_available() and dist.is_initialized() else 1

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group) if dist.is_available() and dist.is_initialized() else 0

    # -- accounting ---------------------------------------------------------------------------
    def record(self, kind: str, nbytes: int, seconds: float, overlapped: bool = False) -> None:
        """Account one collective of ``kind`` with ``nbytes`` payload that took ``seconds``.

        Used directly by DDP's comm hook (whose all-reduce torch issues itself). ``overlapped``
        collectives (in flight during backward) add to ``comm_time_s`` but not to the step's
        communication time that the trainer subtracts from the step to get compute time.
        """
        p = self.world_size
        self.stats.comm_bytes += int(nbytes)
        self.stats.wire_bytes += wire_bytes(kind, nbytes, p)
        self.stats.comm_time_s += seconds
        if not overlapped:
            self.step_comm_time_s += seconds
        a, b = cost_terms(kind, nbytes, p)
        self.stats.modeled_comm_s += self.network.cost(a, b)
        self.stats.model_alpha_terms += a
        self.stats.model_beta_bytes += b

    def round(self, n: int = 1) -> None:
        """Mark ``n`` synchronization rounds (the algorithm decides what a round is)."""
        self.stats.comm_rounds += n

    def pop_step_time(self) -> float:
        """Seconds spent in communication since the previous call (used to split step time)."""
        t, self.step_comm_time_s = self.step_comm_time_s, 0.0
        return t

    # -- collectives --------------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op=None, count: bool = True) -> torch.Tensor:
        """In-place all-reduce (default SUM) of ``tensor``; returns it."""
        if self.world_size == 1:
            return tensor
        t0 = time.perf_counter()
        dist.all_reduce(tensor, op=op if op is not None else dist.ReduceOp.SUM, group=self.group)
        if count:
            self.record("all_reduce", tensor_bytes(tensor), time.perf_counter() - t0)
        return tensor

    def average_(self, tensors: Sequence[torch.Tensor], count: bool = True) -> None:
        """Replace each tensor by its mean over workers, in place, in one all-reduce per dtype.

        The tensors are flattened into one contiguous buffer per dtype (a coalesced collective, as
        torch's model averagers do), so a round of parameter averaging costs one all-reduce of the
        model size. Integer tensors are averaged with floor division.
        """
        if self.world_size == 1:
            return
        for group, flat in _coalesced(tensors):
            self.all_reduce(flat, count=count)
            if flat.is_floating_point() or flat.is_complex():
                flat.div_(self.world_size)
            else:
                flat.floor_divide_(self.world_size)
            _copy_back(flat, group)

    def broadcast_(self, tensors: Sequence[torch.Tensor], src: int = 0, count: bool = True) -> None:
        """Broadcast ``tensors`` from rank ``src`` in place, one coalesced broadcast per dtype."""
        if self.world_size == 1:
            return
        for group, flat in _coalesced(tensors):
            t0 = time.perf_counter()
            dist.broadcast(flat, src=src, group=self.group)
            if count:
                self.record("broadcast", tensor_bytes(flat), time.perf_counter() - t0)
            _copy_back(flat, group)

    def all_gather(self, tensor: torch.Tensor, count: bool = True) -> list[torch.Tensor]:
        """All-gather equally shaped tensors; returns the list ordered by rank."""
        p = self.world_size
        if p == 1:
            return [tensor]
        out = [torch.empty_like(tensor) for _ in range(p)]
        t0 = time.perf_counter()
        dist.all_gather(out, tensor, group=self.group)
        if count:
            self.record("all_gather", tensor_bytes(tensor), time.perf_counter() - t0)
        return out

    def barrier(self) -> None:
        """Uncounted barrier (checkpointing, shutdown)."""
        if self.world_size > 1:
            dist.barrier(group=self.group)

    # -- checkpointing ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return self.stats.as_dict()

    def load_state_dict(self, state: dict) -> None:
        self.stats = CommStats(**state)
