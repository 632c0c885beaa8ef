"""The network model of the cluster clock: what a collective or a message costs on a link, the bytes
each worker puts on the wire, and the links themselves (:class:`NetworkModel`; :class:`Network`: the
inter- and intra-node links, placement, the clock's what-if links), with the emulated link's framing
(:data:`WIRE_FACTOR`). The clock (:mod:`lsgd.clock.worker_clock`) and the ports
(:mod:`lsgd.clock.ports`) take every cost from here.

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
link, any other on the inter-node link. Every cost has the form ``a * (alpha + 2 o) + b * beta``
(``o`` below; 0 by default, so ``a * alpha + b * beta``); the communicator also sums ``a``
(``model_alpha_terms``) and ``b`` (``model_beta_bytes``): the cost of the operations on their own,
without overlap or waiting. With ``p = 1`` every cost is zero.

Per-message overhead (LogGP's o)
--------------------------------
``o`` = ``network.overhead_us``: the CPU time a host spends on each message it sends and on each
message it receives, apart from the link (the software stack: gloo, Python, the kernel's sockets,
the scheduler). LogP (Culler, Karp, Patterson, Sahay, Schauser, Santos, Subramonian and von Eicken,
"LogP: Towards a Realistic Model of Parallel Computation", PPoPP 1993) charges a message ``o`` at
its sender, the latency ``L`` on the way and ``o`` at its receiver: ``L + 2 o`` end to end; LogGP
(Alexandrov, Ionescu, Schauser and Scheiman, SPAA 1995) adds ``G`` per byte for long messages:
``o + L + (n - 1) G + o``. Each latency term ``a`` of the table above is one message step on the
critical path (a send and its receive), so the overhead enters as one more term per message beside
alpha: a step costs ``alpha + 2 o``, and

==============  ==================================================================
operation       modeled time with o
==============  ==================================================================
all-reduce      2 (p-1) (alpha + 2 o) + 2 (p-1)/p n beta     (ring: 2 (p-1) steps)
all-gather      (p-1) (alpha + 2 o) + (p-1) n beta
reduce-scatter  (p-1) (alpha + 2 o) + (p-1)/p n beta
broadcast       short: ceil(log2 p) (alpha + 2 o + n beta); long:
                (ceil(log2 p) + p - 1) (alpha + 2 o) + 2 (p-1)/p n beta
p2p             alpha + 2 o + n beta
==============  ==================================================================

So ``model_alpha_terms`` counts the messages on the critical path, each paying ``alpha + 2 o``. The
what-if links keep the configured ``o`` (it is the host's, not the link's bandwidth); the intra-node
link takes ``network.intra_node.overhead_us`` where set, else ``network.overhead_us``. ``lsgd
calibrate --network`` measures it on this host (:mod:`lsgd.comm.calibration`).
Operations issued with ``count=False`` (metric reductions, evaluation, checkpoint barriers) are
executed but neither counted nor clocked: they are measurement, not training.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
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
        overhead_us: LogGP's per-message overhead o in microseconds (>= 0, default 0): host CPU time
            per message at its sender and again at its receiver, so every latency term costs
            ``alpha + 2 o`` (module docstring).

    Raises:
        ValueError: ``wire_overhead`` < 1 or ``overhead_us`` < 0.
    """

    bandwidth_gbps: float = 10.0
    latency_us: float = 10.0
    wire_overhead: float = 1.0
    overhead_us: float = 0.0

    def __post_init__(self):
        if not self.wire_overhead >= 1.0:
            raise ValueError(f"wire_overhead must be >= 1 (wire bytes per payload byte), got {self.wire_overhead!r}")
        if not (self.overhead_us >= 0.0 and math.isfinite(self.overhead_us)):
            raise ValueError(f"overhead_us must be a finite number >= 0 (LogGP's o, us per message), got {self.overhead_us!r}")

    @property
    def alpha(self) -> float:
        """Latency in seconds."""
        return self.latency_us * 1e-6

    @property
    def overhead(self) -> float:
        """LogGP's o in seconds: host time per message at the sender, and again at the receiver."""
        return self.overhead_us * 1e-6

    @property
    def message_s(self) -> float:
        """Seconds of one latency term: ``alpha + 2 o`` (a message's send overhead, its latency and
        its receive overhead; exactly ``alpha`` when ``o`` is 0)."""
        return self.alpha + 2.0 * self.overhead

    @property
    def beta(self) -> float:
        """Seconds per payload byte: ``8 wire_overhead / (bandwidth_gbps 1e9)``."""
        return 8.0 * self.wire_overhead / (self.bandwidth_gbps * 1e9)

    def cost(self, alpha_terms: float, beta_bytes: float) -> float:
        """Seconds of ``alpha_terms`` messages (each ``alpha + 2 o``: :attr:`message_s`) plus
        ``beta_bytes`` bytes at this bandwidth."""
        return alpha_terms * self.message_s + beta_bytes * self.beta

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
    """(latency terms ``a``, bandwidth bytes ``b``) of operation ``kind``: its cost is
    ``a (alpha + 2 o) + b beta`` (:meth:`NetworkModel.cost`). ``a`` is the number of message steps
    on the operation's critical path (each a send and its receive: LogGP's ``o`` at both ends,
    Alexandrov et al. 1995): ring all-reduce ``2 (p-1)``, all-gather and reduce-scatter ``p - 1``,
    binomial broadcast ``ceil(log2 p)`` (long: ``+ p - 1`` for its ring all-gather), a message 1.

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
    bandwidth) and the inter-node link's ``wire_overhead`` and ``overhead_us`` (the framing is the
    protocol stack's and the per-message overhead the host's, not the bandwidth's).
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
        default 1; ``overhead_us``: LogGP's per-message overhead o of every link, default 0;
        ``intra_node.overhead_us`` the intra-node link's instead, where set). ``overhead_us`` must be
        a number here: ``measured`` is resolved before (:func:`lsgd.config.validation.resolve_overhead`)."""
        overhead = float(network.get("overhead_us") or 0.0)
        inter = NetworkModel(float(network["bandwidth_gbps"]), float(network["latency_us"]),
                             float(network.get("wire_overhead") or 1.0), overhead)
        intra_cfg = network.get("intra_node") or None
        intra_o = intra_cfg.get("overhead_us") if intra_cfg else None
        intra = NetworkModel(float(intra_cfg["bandwidth_gbps"]), float(intra_cfg["latency_us"]),
                             float(intra_cfg.get("wire_overhead") or 1.0),
                             overhead if intra_o is None else float(intra_o)) if intra_cfg else None
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
        return [self.inter] + [NetworkModel(b, what_if_latency_us(b, self.inter.latency_us), self.inter.wire_overhead,
                                            self.inter.overhead_us)
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
