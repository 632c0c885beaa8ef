"""The cluster clock: the model of time (``modeled_time_s``) of lsgd's communication.

:mod:`lsgd.comm.communicator` moves the data and reports events to this module (an operation issued, waited, a
message sent or received, its size, group and link); :mod:`lsgd.compute.model` holds the compute model.
No other file computes a cost.

The cluster clock
-----------------
Every worker carries a virtual clock in seconds (:class:`Clock`). The trainer advances it by each
step's compute time (from a FLOP profile of the target device, or measured; :mod:`lsgd.compute.model`),
and the communicator by communication, with these rules (``cost`` = alpha-beta cost below):

* a collective ends for all its participants at ``max_i(start_i) + cost`` (the starts are
  exchanged in an uncounted settlement: an all-gather of the participants' clocks, MAX taken
  locally; plain DDP sends no message for it: the exchange rides in the next step's first gradient
  bucket as a one-hot block whose SUM is the all-gather, exactly, :class:`lsgd.comm.communicator.CarriedSettlement`);
* collectives of one communicator run one after another on its *stream*: an operation starts at
  ``max(participants' issue times, end of the previous operation)``;
* an asynchronous operation (``async_op=True``) starts at its issue time and runs alongside the
  compute done before its :meth:`lsgd.comm.communicator.Handle.wait`, which moves the clock to ``max(now, end)``;
  DDP's buckets are asynchronous operations issued during backward (at the point of backward where
  the bucket is ready, :meth:`Clock.backward_point`), so only their exposed part adds to the step;
* *settling* an operation computes its end and moves no clock: only a wait
  (:meth:`lsgd.comm.communicator.Handle.wait`, or :meth:`lsgd.comm.communicator.Communicator.settle`, the wait of every
  collective issued so far) moves this worker's clock to the end.
  :meth:`lsgd.comm.communicator.Communicator.quiesce` (before evaluation, checkpoints and exit) settles and
  waits for nothing, so measurement never moves modeled time; a checkpoint saves an operation in
  flight with its end (:meth:`lsgd.comm.communicator.Handle.state_dict`) and the resumed run waits for it
  (:meth:`lsgd.comm.communicator.Communicator.resumed`) where the uninterrupted run does;
* a message (point to point) occupies ports (below): it starts at
  ``start = max(issue, sender's egress free)``, the send completes at ``start + cost``, and it is
  received at ``max(start, receive posted, receiver's ingress free) + cost`` (the receiver's clock
  then moves to ``max(now, that)`` when it waits); ``start`` travels with the message (an uncounted
  float64 message after the payload). *Receive posted* is rendezvous: gloo sends a message's data
  only once the receiver has announced its receive (MPI and NCCL do the same for large messages),
  so a server that posts its next incast after its broadcast has left sees the incast then, as
  measured on the emulated cluster (issue 23: a parameter server of 4 workers took 8 message
  times per step, the clock without this rule 5.2). The sender does not see a late receiver: its
  send completes at ``start + cost`` on its own clock.

Ports (LogGP)
-------------
Each worker has an egress and an ingress port per link kind (``inter``: its NIC; ``intra``: the
link inside a node of ``cluster.gpus_per_node`` > 1 workers), full duplex: sending and receiving
do not share a port. One NIC per worker (GPU) for the inter-node link: rail-optimised DGX-style
nodes give every GPU its own NIC; a NIC shared by several ranks of a node would need state shared
across processes, which the clock (one per process) does not have. ``network.ports`` (lanes,
integer >= 1, default 1) is how many messages one port carries at once; a message takes the
earliest-free lane. This is a conservative LogGP (Alexandrov, Ionescu, Schauser and Scheiman,
"LogGP: Incorporating Long Messages into the LogP Model", SPAA 1995) with gap ``g = alpha``, gap
per byte ``G = beta`` and overhead ``o = 0``: a message holds both its sender's egress and its
receiver's ingress for its whole cost ``alpha + n beta``, so

* the sends of one exchange serialize on the sender's egress, in a deterministic order: by
  ``(peer - rank) mod p`` (the shift order of pairwise exchanges, so that in a regular graph the
  ``j``-th message every worker sends is the ``j``-th every worker receives and nobody's ingress
  is a hot spot); ``k`` sends cost ``k (alpha + n beta)``;
* the receives serialize on the receiver's ingress, in order of the sender's start stamp, then
  peer rank (per clock entry), each in the order the worker completes its operations;
* the sender is not held back by a busy receiver (its send completes at ``start + cost``: the
  data waits at the receiver), and a paired exchange (both directions at once) costs
  ``alpha + n beta`` (full duplex);
* a collective keeps its formula and occupies its members' ports of its link: it starts at the
  max over its members of ``(issue, stream free, egress free, ingress free)`` (the members'
  earliest-free lanes, folded into the settlement's exchange) and holds those lanes of
  every member until its end;
* a parameter server's incast of ``N`` messages costs ``N (alpha + n beta)`` at its ingress, its
  broadcast the same at its egress.

So for operations that do not overlap, the clock's communication time equals the communicator's
tallies, ``NetworkModel.cost(model_alpha_terms, model_beta_bytes)``. Port free times are part of
the clock's state (:meth:`Clock.state_dict`).

When the ports are read and taken: a send takes its egress lane when it is issued; a receive takes
its ingress lane when its operation's end is first computed (its wait, or a checkpoint's
:meth:`lsgd.comm.communicator.Handle.state_dict`: the senders' stamps must have arrived); a collective reads
its members' ports when it is settled and holds them from then on. Each in this worker's program
order of those events: an approximation where an asynchronous collective stays unsettled while
later point-to-point messages of the same worker use the ports (they are not delayed by it).

The clock is a vector: entry 0 is the configured network; entries 1.. are *what-if* networks (the
inter-node link replaced by each of ``network.report_gbps``), advanced by the same events, so
the report's modeled times at other bandwidths stay right for overlapped and asynchronous runs.
(Methods whose event order depends on virtual time follow the order of entry 0.) The what-if link
at X Gbps is the shipped network preset of that bandwidth (``conf/network/*.yaml``: 1 Gbps 50 us,
10 Gbps 10 us, 100 Gbps 2 us): its bandwidth *and* its latency, so a 10 Gbps run's 1 Gbps entry is
the ``network=1gbps`` preset's time (:func:`what_if_latency_us`). A bandwidth without a preset keeps
the configured inter-node latency (``network.latency_us``). The intra-node link stays as configured.

Alpha-beta cost model
---------------------
``p`` workers, ``n`` payload bytes, ``alpha`` = latency (s), ``beta`` = 8 w / bandwidth (s/byte), where
``w`` = ``network.wire_overhead`` is the wire bytes per payload byte of the link's framing (1.0 by
default: ``bandwidth_gbps`` is payload goodput; TCP/IPv4 with timestamps over Ethernet at MTU 1500
puts 1448 payload bytes in a 1514-byte frame as a Linux qdisc meters it, ``w`` = 1514/1448 = 1.0456,
the value ``launcher.emulate=true`` selects: its ``tbf`` caps frames, :data:`WIRE_FACTOR`;
a real Ethernet port also sends an 8-byte preamble and a 12-byte gap per frame, 1538/1448 = 1.0622).
Sources: Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication Operations in
MPICH", IJHPCA 2005 (Sec. 4); Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for
clusters of workstations", JPDC 2009:

==============  ==============================================  ===================================
operation       modeled time                                     wire bytes this worker sends
==============  ==============================================  ===================================
all-reduce      2 (p-1) alpha + 2 (p-1)/p n beta   (ring)        2 (p-1)/p n
all-gather      (p-1) alpha + (p-1) n beta         (ring)        (p-1) n       (n = input bytes)
reduce-scatter  (p-1) alpha + (p-1)/p n beta       (ring)        (p-1)/p n     (n = input bytes)
broadcast       short (n < 12288 B or p < 8): binomial tree      short: n x (children in the tree)
                ceil(log2 p) (alpha + n beta); long: binomial    long: scatter share + (p-1)/p n
                scatter + ring all-gather
                (ceil(log2 p) + p - 1) alpha + 2 (p-1)/p n beta
p2p             alpha + n beta                                    n
==============  ==============================================  ===================================

A group whose ranks all sit on one node (``cluster.gpus_per_node``) is priced on the intra-node
link, any other on the inter-node link. Every cost has the form ``a * alpha + b * beta``; the
communicator also sums ``a`` (``model_alpha_terms``) and ``b`` (``model_beta_bytes``): the cost of
the operations on their own, without overlap or waiting. With ``p = 1`` every cost is zero.
Operations issued with ``count=False`` (metric reductions, evaluation, checkpoint barriers) are
executed but neither counted nor clocked: they are measurement, not training.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

#: The emulated link (``launcher.emulate=true``). TCP payload per Ethernet frame as tbf counts it (skb length: 14-byte Ethernet header, 20 IP,
#: 20 TCP + 12 timestamp option): 1448 payload bytes in 1514 at MTU 1500
MTU = 1500
FRAME_BYTES = MTU + 14
PAYLOAD_BYTES = MTU - 20 - 32
WIRE_FACTOR = FRAME_BYTES / PAYLOAD_BYTES

#: Messages shorter than this (bytes) are broadcast along a binomial tree (MPICH's
#: ``MPIR_CVAR_BCAST_SHORT_MSG_SIZE``; Thakur et al. 2005, Sec. 4.1), as are all messages on fewer
#: than :data:`BCAST_MIN_PROCS` ranks.
BCAST_SHORT_MSG_BYTES = 12288
BCAST_MIN_PROCS = 8

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "p2p")


@functools.lru_cache(maxsize=1)
def preset_latencies_us() -> dict[float, float]:
    """``{bandwidth_gbps: latency_us}`` of the inter-node links of the shipped network presets
    (``conf/network/*.yaml`` of the installed config package)."""
    import importlib.resources

    import yaml

    out: dict[float, float] = {}
    for entry in sorted((importlib.resources.files("lsgd.conf") / "network").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            preset = yaml.safe_load(entry.read_text()) or {}
            bw = float(preset["bandwidth_gbps"])
            if bw in out and out[bw] != float(preset["latency_us"]):
                raise ValueError(f"network presets disagree on the latency at {bw:g} Gbps")
            out[bw] = float(preset["latency_us"])
    return out


def what_if_latency_us(bandwidth_gbps: float, configured_latency_us: float) -> float:
    """Latency (us) of the clock's what-if inter-node link at ``bandwidth_gbps``: the network preset
    of that bandwidth (:func:`preset_latencies_us`: 1 Gbps 50 us, 10 Gbps 10 us, 100 Gbps 2 us) where
    one exists, else ``configured_latency_us`` (the run's ``network.latency_us``)."""
    return preset_latencies_us().get(float(bandwidth_gbps), float(configured_latency_us))


@dataclass
class NetworkModel:
    """Alpha-beta parameters of one link.

    Args:
        bandwidth_gbps: link bandwidth in gigabits per second (1e9 bits/s) of what the link meters
            (frames on a capped link, payload when ``wire_overhead`` is 1).
        latency_us: per-message latency alpha in microseconds.
        wire_overhead: wire bytes per payload byte (framing: protocol headers per segment), >= 1;
            multiplies beta. 1514/1448 for TCP/IPv4 with timestamps over Ethernet at MTU 1500
            (RFC 791, RFC 9293, RFC 7323's 12-byte timestamp option, the 14-byte Ethernet header).

    Raises:
        ValueError: ``wire_overhead`` < 1.
    """

    bandwidth_gbps: float = 10.0
    latency_us: float = 10.0
    wire_overhead: float = 1.0

    def __post_init__(self):
        if not self.wire_overhead >= 1.0:
            raise ValueError(f"wire_overhead must be >= 1 (wire bytes per payload byte), got {self.wire_overhead!r}")

    @property
    def alpha(self) -> float:
        """Latency in seconds."""
        return self.latency_us * 1e-6

    @property
    def beta(self) -> float:
        """Seconds per payload byte: ``8 wire_overhead / (bandwidth_gbps 1e9)``."""
        return 8.0 * self.wire_overhead / (self.bandwidth_gbps * 1e9)

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
        """Modeled seconds of MPICH's broadcast of ``nbytes`` (binomial tree, or scatter + all-gather)."""
        return self.cost(*cost_terms("broadcast", nbytes, p))

    def p2p(self, nbytes: int, p: int = 2) -> float:
        """Modeled seconds of one point-to-point message of ``nbytes``."""
        return self.cost(*cost_terms("p2p", nbytes, p))


def _check_kind(kind: str) -> None:
    if kind not in COLLECTIVES:
        raise ValueError(f"unknown collective {kind!r}; allowed: {', '.join(COLLECTIVES)}")


def _bcast_is_short(nbytes: float, p: int) -> bool:
    return nbytes < BCAST_SHORT_MSG_BYTES or p < BCAST_MIN_PROCS


def cost_terms(kind: str, nbytes: float, p: int) -> tuple[float, float]:
    """(latency terms ``a``, bandwidth bytes ``b``) of operation ``kind``: its cost is ``a alpha + b beta``.

    Raises:
        ValueError: unknown ``kind`` (allowed: all_reduce, all_gather, broadcast, p2p).
    """
    _check_kind(kind)
    if p <= 1:
        return 0.0, 0.0
    if kind == "all_reduce":
        return 2 * (p - 1), 2 * (p - 1) / p * nbytes
    if kind == "all_gather":
        return p - 1, (p - 1) * nbytes
    if kind == "reduce_scatter":
        return p - 1, (p - 1) / p * nbytes
    if kind == "broadcast":
        steps = math.ceil(math.log2(p))
        if _bcast_is_short(nbytes, p):
            return steps, steps * nbytes
        return steps + p - 1, 2 * (p - 1) / p * nbytes
    return 1, nbytes


def _binomial_children(vrank: int, p: int) -> list[int]:
    """Relative ranks that relative rank ``vrank`` sends to in MPICH's binomial tree rooted at 0."""
    top = 1 << max(0, math.ceil(math.log2(p)))
    low = (vrank & -vrank) if vrank else top
    out, mask = [], low >> 1
    while mask:
        if vrank + mask < p:
            out.append(vrank + mask)
        mask >>= 1
    return out


def wire_bytes(kind: str, nbytes: float, p: int, rank: int = 0, root: int = 0) -> float:
    """Bytes group rank ``rank`` sends on the wire for operation ``kind`` with payload ``nbytes``.

    Broadcast depends on the rank (``root`` sends the most); the others do not.

    Raises:
        ValueError: unknown ``kind`` (allowed: all_reduce, all_gather, broadcast, p2p).
    """
    _check_kind(kind)
    if p <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2 * (p - 1) / p * nbytes
    if kind == "all_gather":
        return (p - 1) * nbytes
    if kind == "reduce_scatter":
        return (p - 1) / p * nbytes
    if kind == "broadcast":
        vrank = (rank - root) % p
        children = _binomial_children(vrank, p)
        if _bcast_is_short(nbytes, p):
            return float(len(children) * nbytes)
        # binomial scatter: the subtree of child c holds ranks [c, min(c + (c - vrank), p)) ... of p chunks
        chunk = nbytes / p
        scatter = sum((min(c + (c - vrank), p) - c) * chunk for c in children)
        return scatter + (p - 1) * chunk
    return float(nbytes)


# --------------------------------------------------------------------------------------------
# the cluster: links and placement
# --------------------------------------------------------------------------------------------
@dataclass
class Network:
    """The cluster's links: ``inter`` between nodes, ``intra`` inside a node of ``gpus_per_node``
    workers (global ranks ``i * gpus_per_node ..`` form node ``i``), and the what-if inter-node
    bandwidths of the clock's extra entries (``report_gbps``).

    ``models(link)`` gives the K link models of the clock entries: the configured link first, then
    (inter-node only) the what-if link at each bandwidth, with the latency of that bandwidth's
    network preset (:func:`what_if_latency_us`; the configured latency where no preset has that
    bandwidth) and the inter-node link's ``wire_overhead`` (the framing is the protocol stack's, not
    the bandwidth's).
    """

    inter: NetworkModel = field(default_factory=NetworkModel)
    intra: NetworkModel | None = None
    gpus_per_node: int = 1
    report_gbps: tuple[float, ...] = ()
    ports: int = 1

    def __post_init__(self):
        if self.intra is None:
            self.intra = self.inter
        if isinstance(self.ports, bool) or int(self.ports) != self.ports or self.ports < 1:
            raise ValueError(f"network.ports must be an integer >= 1, got {self.ports!r}")
        self.ports = int(self.ports)
        self.report_gbps = tuple(float(b) for b in self.report_gbps)
        self._costs: dict[tuple, np.ndarray] = {}  # costs(), by its arguments (the links are fixed)

    @classmethod
    def from_config(cls, network: Mapping, gpus_per_node: int = 1) -> Network:
        """Build from the ``network`` config group (``bandwidth_gbps``, ``latency_us``: the inter-node
        link; ``intra_node``: ``{bandwidth_gbps, latency_us}``; ``report_gbps``: what-if list; ``ports``:
        lanes per port, default 1; ``wire_overhead``: wire bytes per payload byte of the inter-node
        link and its what-if links, default 1; ``intra_node.wire_overhead`` the same inside a node,
        default 1)."""
        inter = NetworkModel(float(network["bandwidth_gbps"]), float(network["latency_us"]),
                             float(network.get("wire_overhead") or 1.0))
        intra_cfg = network.get("intra_node") or None
        intra = NetworkModel(float(intra_cfg["bandwidth_gbps"]), float(intra_cfg["latency_us"]),
                             float(intra_cfg.get("wire_overhead") or 1.0)) if intra_cfg else None
        return cls(inter, intra, int(gpus_per_node or 1), tuple(network.get("report_gbps") or ()),
                   int(network.get("ports") or 1))

    @property
    def k(self) -> int:
        """Number of clock entries: 1 + len(report_gbps)."""
        return 1 + len(self.report_gbps)

    def node(self, global_rank: int) -> int:
        return global_rank // self.gpus_per_node

    def link(self, global_ranks: Sequence[int]) -> str:
        """'intra' when all ``global_ranks`` sit on one node, else 'inter'."""
        return "intra" if len({self.node(r) for r in global_ranks}) <= 1 else "inter"

    def models(self, link: str) -> list[NetworkModel]:
        if link == "intra":
            return [self.intra] * self.k
        return [self.inter] + [NetworkModel(b, what_if_latency_us(b, self.inter.latency_us), self.inter.wire_overhead)
                               for b in self.report_gbps]

    def costs(self, link: str, kind: str, nbytes: float, p: int) -> np.ndarray:
        """Seconds (shape ``[k]``, one per clock entry) of operation ``kind`` of ``nbytes`` on
        ``p`` workers on ``link`` (:func:`cost_terms`). Read-only: computed once per argument set
        (a step repeats the same operations; the links must not change after construction)."""
        key = (link, kind, nbytes, p)
        out = self._costs.get(key)
        if out is None:
            a, b = cost_terms(kind, nbytes, p)
            out = np.array([m.cost(a, b) for m in self.models(link)])
            out.setflags(write=False)
            if len(self._costs) < 4096:  # sizes that vary without end (compressed payloads) stay bounded
                self._costs[key] = out
        return out


# --------------------------------------------------------------------------------------------
# the clock
# --------------------------------------------------------------------------------------------
LINKS = ("inter", "intra")
DIRECTIONS = ("egress", "ingress")


class Ports:
    """One worker's ports: an egress and an ingress per link kind (:data:`LINKS`), each with
    ``lanes`` lanes (``network.ports``), as the free time of every lane, shape ``[lanes, k]``
    (seconds, one column per clock entry). Every entry is its own simulation: a lane is chosen per
    entry. See the module docstring (LogGP)."""

    def __init__(self, k: int = 1, lanes: int = 1):
        self.k, self.lanes = int(k), int(lanes)
        self.free = {(link, d): np.zeros((self.lanes, self.k)) for link in LINKS for d in DIRECTIONS}

    def free_at(self, link: str, direction: str) -> np.ndarray:
        """When the earliest-free lane of a port is free (shape ``[k]``, a new array)."""
        f = self.free[(link, direction)]
        return f[0].copy() if self.lanes == 1 else f.min(axis=0)

    def occupy(self, link: str, direction: str, ready: np.ndarray, cost: np.ndarray,
               entries: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """A message of ``cost`` seconds, ready at ``ready``, takes the earliest-free lane of a port:
        returns its ``(start, end)`` = ``(max(ready, lane free), start + cost)`` and holds the lane
        until ``end``. ``entries``: only these clock entries (``ready`` and ``cost`` then have their
        length)."""
        f = self.free[(link, direction)]
        cols = np.arange(self.k) if entries is None else np.asarray(entries)
        lane = f[:, cols].argmin(axis=0)
        start = np.maximum(ready, f[lane, cols])
        end = start + cost
        f[lane, cols] = end
        return start, end

    def hold(self, link: str, until: np.ndarray) -> None:
        """A collective: the earliest-free lane of both ports of ``link`` is busy until ``until``."""
        if self.lanes == 1:  # (the same values as below: lane 0 in every column)
            for d in DIRECTIONS:
                f = self.free[(link, d)][0]
                np.maximum(f, until, out=f)
            return
        cols = np.arange(self.k)
        for d in DIRECTIONS:
            f = self.free[(link, d)]
            lane = f.argmin(axis=0)
            f[lane, cols] = np.maximum(f[lane, cols], until)

    def state_dict(self) -> dict:
        return {"lanes": self.lanes, "free": {f"{link}/{d}": v.tolist() for (link, d), v in self.free.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.lanes = int(state["lanes"])
        self.free = {tuple(key.split("/")): np.asarray(v, dtype=np.float64) for key, v in state["free"].items()}
        self.k = next(iter(self.free.values())).shape[1]


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
    next step's first gradient bucket, whose all-reduce carries it, :class:`lsgd.comm.communicator.CarriedSettlement`) and applied at the next read, after that backward, by which time it has
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
