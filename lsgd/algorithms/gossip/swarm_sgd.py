"""``swarm_sgd``: SwarmSGD, Nadiradze, Sabour, Davies, Li and Alistarh, "Asynchronous Decentralized
SGD with Quantized and Local Updates", NeurIPS 2021 (arXiv 1910.12308 v4; docs/papers.md#swarmsgd).

Every node (worker) runs in *interaction rounds*. In its round ``r`` a node takes ``H_{i,r}`` local
SGD steps (``algo.local_steps`` = H, fixed, or geometric with mean H: ``algo.local_steps_dist``),
then averages its model with its partner in round ``r``'s matching, if it has one; a node left out
of the matching goes straight on to its next round (it keeps computing). The matching is a random
maximal matching of the topology's edges (``algo.topology``; ``complete`` is the paper's uniform
choice of an edge) drawn from an RNG seeded by ``(algo.seed, r)``: every rank draws the same one, so
the two ends of an edge agree with no lock and no collective, and each node talks to one peer per
round whatever the number of nodes. Nodes do not step in lock-step: a node waits only for its own
partner (the cluster clock prices the wait: a message is received at ``max(ready, sender start +
cost)``), so a fast node runs ahead of slow nodes it is not paired with.

Averaging (docs/papers.md#swarmsgd, the paper's update rules):

* blocking (``algo.blocking=true``): both partners end with ``(Q(x_i) + Q(x_j)) / 2``;
* non-blocking (``algo.blocking=false``): at the end of round ``r`` the node snapshots ``s_i = x_i``
  and posts the exchange of snapshots, then takes its next round's local steps while the messages
  travel; at the end of round ``r + 1`` (or at the end of the run) it waits for them and sets
  ``x_i <- (Q(s_i) + Q(s_j)) / 2 + (x_i - s_i)``, re-adding the local progress made meanwhile
  (forgetting it is hivemind issue 216). The clock shows the overlap: the exchange runs alongside
  round ``r + 1``'s compute.

``Q`` is the identity (``algo.quantizer=none``: the network mean is kept exactly) or the lattice
quantizer (``algo.quantizer=lattice``, :mod:`lsgd.compression.lattice`: ``algo.bits`` per element,
side ``algo.side``, unbiased rounding), each side decoding the partner's codes against its own model
(blocking) or its own snapshot (non-blocking). The decode is checked by a checksum; then the partners
exchange one flag byte per tensor, and a tensor either side failed to decode is exchanged again at
full precision by both (so both still compute the same average). All three messages are counted;
``metrics()`` reports ``lattice_resent`` (tensors resent so far, this worker).

BatchNorm buffers (``algo.average_buffers``): true averages the floating-point buffers with the
partner at full precision, in the same message and with the same rule (non-blocking: with the re-add);
false keeps them local (each node's running statistics describe its own shard).

Progress (what logging, evaluation, checkpoints and stopping count): with fixed H the local step
count, the same on every node; with geometric H, ``H x`` completed rounds (the expected local steps),
so every node reaches each record at a round boundary and no exchange straddles a collective.
A checkpoint saves an exchange in flight (non-blocking) as it stands: the partner, the snapshot
sent (and its lattice points), what was received (the transfer is completed,
:meth:`lsgd.comm.handles.Handle.complete_data`) and the exchange's end on the cluster clock; it applies
nothing. The resumed run applies it where the uninterrupted run does, at the end of the next round,
so checkpoints change neither the trajectory nor the modeled time.

Pairing (``algo.pairing``):

* ``rounds`` (default): the interaction rounds above, the same matching for everyone's round r;
  a fast node paired with a slow one waits for it.
* ``virtual_time``: asynchronous execution. Who is free to pair, and when, is decided on the
  cluster clock: every rank simulates the same schedule (:mod:`lsgd.algorithms.gossip.virtual_pairing`)
  from every worker's modeled step time (``cluster.compute=profile``, ``cluster.speeds``) and the
  exchange's modeled cost; a node that has done its H local steps asks a random neighbour that is
  not engaged, which answers after its current step; fast nodes take more local steps than slow
  ones. Progress is the network's average local step count at the node's virtual time, the
  learning-rate schedule follows it, and records are made at each multiple a node crosses (the
  trainer's non-lockstep bookkeeping). The exchange of a boundary runs in :meth:`before_step`,
  after that boundary's records. Reproducible: the same seed gives the same schedule and metrics.
  Not with a non-blocking lattice exchange (its decode flags would need both ends at the same
  point of their schedules).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from lsgd.algorithms.gossip import virtual_pairing
from lsgd.algorithms.gossip.mixing import Gossip, GossipConfig
from lsgd.comm.topology import TOPOLOGIES, WEIGHTS, Topology, random_matching
from lsgd.compression.lattice import (
    BITS,
    CHECKSUM_BYTES,
    LatticeCode,
    LatticeQuantizer,
    point_dtype,
)
from lsgd.core.errors import ConfigError
from lsgd.core.labels import flatten, format_value, is_missing
from lsgd.core.seeding import derive_seed
from lsgd.core.typed_config import defaults, option

QUANTIZERS = ("none", "lattice")
STEP_DISTS = ("fixed", "geometric")
PAIRINGS = ("rounds", "virtual_time")


@lru_cache(maxsize=4096)
def round_partners(topology: Topology, seed: int, round: int) -> dict[int, int]:
    """``{node: partner}`` of round ``round``: a random maximal matching of the (undirected) edges
    of the topology's round-``round`` graph, from an RNG seeded by ``(seed, round)``; nodes left
    out are absent."""
    import networkx as nx  # here, not at import (lsgd.comm.topology says why)

    graph = nx.Graph(topology.graph(round).to_undirected())
    rng = np.random.default_rng(derive_seed("swarm_matching", int(seed), int(round)))
    partners = {}
    for i, j in random_matching(graph, rng):
        partners[i], partners[j] = j, i
    return partners


def round_length(h: int, dist: str, seed: int, node: int, round: int) -> int:
    """Local steps of ``node`` in round ``round``: ``h``, or a geometric draw with mean ``h``
    (support 1, 2, ...) from an RNG seeded by ``(seed, node, round)``."""
    if dist == "fixed" or h == 1:
        return h
    return int(np.random.default_rng(derive_seed("swarm_local_steps", int(seed), int(node), int(round))).geometric(1.0 / h))


class _Exchange:
    """One pairwise averaging in progress: the reference models, what was sent and received."""

    def __init__(self, partner: int, reference: list[torch.Tensor], handle=None, own=None, recv=None):
        self.partner = partner
        self.reference = reference   # x_i (blocking) or the snapshot s_i (non-blocking)
        self.handle = handle         # the message exchange in flight (non-blocking)
        self.own = own               # lattice: own lattice points (flat; float32 for float32 parameters, else float64)
        self.recv = recv             # the receive buffer (uint8 message, or the flat model)


@dataclass
class SwarmSGDConfig(GossipConfig):
    """``algo=swarm_sgd``'s keys: :class:`GossipConfig`'s, the rounds', the quantizer's and the pairing."""

    name: str = "swarm_sgd"
    topology: str = option("complete", choices=TOPOLOGIES, doc="G: the graph whose edges the matchings are drawn "
                           "from (complete: the paper's uniform choice of an edge)", symbol="")
    weights: str = option("uniform", choices=WEIGHTS, doc="recorded with the spectral gap; pairs average 1/2 each")
    average_buffers: bool = option(True, doc="BatchNorm buffers averaged with the partner (false: kept local)")
    seed: int | None = option(None, doc="the matchings, geometric step counts, lattice rounding and "
                              "algo.topology=random_regular's graph (null: the run's seed)")
    local_steps: int = option(1, at_least=1, doc="H: local steps per round", symbol="H")
    local_steps_dist: str = option("fixed", choices=STEP_DISTS, doc="fixed: H every round; geometric: mean H, "
                                   "drawn per node and round")
    blocking: bool = option(True, doc="false: the exchange overlaps the next round's steps; the local progress "
                            "is re-added", symbol=("blocking", "non-blocking"))
    quantizer: str = option("none", choices=QUANTIZERS, doc="Q: none (exact averages) or lattice "
                            "(lsgd.compression.lattice)", symbol="")
    bits: int = option(8, choices=BITS, doc="log2 q: lattice colours per element (quantizer=lattice)")
    side: float = option(1.0e-4, above=0, doc="s: the lattice side (safe radius q s / 2 in every coordinate; "
                         "quantizer=lattice)")
    pairing: str = option("rounds", choices=PAIRINGS, doc="rounds: lock-step matchings; virtual_time: asynchronous "
                          "(cluster.compute=profile and cluster.speeds decide who is free to pair; fast nodes "
                          "take more steps)", symbol={"rounds": "rounds", "virtual_time": "asynchronous"})


class SwarmSGD(Gossip):
    """SwarmSGD: local steps, then pairwise averaging with one random partner per round.

    See the module docstring.
    """

    name = "swarm_sgd"
    Config = SwarmSGDConfig
    label = "SwarmSGD"
    paper = "docs/papers.md#swarmsgd"
    defining_keys = ("algo.topology", "algo.local_steps")

    @classmethod
    def label_facts(cls, cfg) -> dict:
        """:meth:`Algorithm.label_facts`, with the quantizer written with its bits and, for the
        lattice, in every label (a defining key after the graph and H): ``"SwarmSGD, complete, H=1,
        8-bit lattice"``, so arms compared with an unquantized method never hide what SwarmSGD sends;
        ``algo.quantizer=none`` is written ``unquantized`` where the arms differ in it."""
        facts = super().label_facts(cfg)
        flat = flatten(cfg)
        quantizer = flat.get("algo.quantizer")
        if quantizer == "lattice":
            bits = flat.get("algo.bits")
            bits = defaults(cls.Config)["bits"] if is_missing(bits) else bits
            facts["values"]["algo.quantizer"] = f"{format_value(bits)}-bit lattice"
            facts["defining_keys"].append("algo.quantizer")
        elif quantizer == "none":
            facts["values"]["algo.quantizer"] = "unquantized"
        return facts

    @classmethod
    def validate_config(cls, algo: dict, world_size: int) -> None:
        super().validate_config(algo, world_size)
        config = cls.parse_config(algo)
        if config.pairing == "virtual_time" and not config.blocking and config.quantizer == "lattice":
            raise ConfigError("algo.pairing=virtual_time with algo.blocking=false takes algo.quantizer=none: a "
                              "non-blocking lattice exchange needs both ends at one point of their schedules to "
                              "agree on resends (use algo.blocking=true with the lattice)")

    @classmethod
    def validate_run(cls, cfg: dict, world_size: int) -> None:
        virtual_pairing.check_virtual_time_run(cfg)

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        self.local_steps = int(self.config.local_steps)
        self.dist = self.config.local_steps_dist
        self.blocking = bool(self.config.blocking)
        self.quantizer = (LatticeQuantizer(int(self.config.bits), float(self.config.side))
                          if self.config.quantizer == "lattice" else None)
        self.round = 0            # this node's current interaction round
        self.steps_in_round = 0   # local steps taken in it
        self.round_steps = self.local_steps
        self.resent = 0           # tensors resent at full precision (lattice decode outside the radius)
        self.pending: _Exchange | None = None
        self.virtual = self.config.pairing == "virtual_time"
        self.lockstep = not self.virtual
        self.plan: virtual_pairing.NodePlan | None = None

    def setup(self, model, optimizer, ctx=None):
        out = super().setup(model, optimizer, ctx)
        self.round_steps = round_length(self.local_steps, self.dist, self.seed, self.node, self.round)
        if self.virtual:
            self.plan = self._plan()[self.node]
        return out

    def _plan(self) -> list[virtual_pairing.NodePlan]:
        """Every node's asynchronous schedule (algo.pairing=virtual_time), identical on every rank."""
        step_s, total = self.ctx.worker_step_s, self.ctx.total_steps
        if step_s is None or total is None:
            raise ConfigError("algo.pairing=virtual_time needs cluster.compute=profile (modeled step times of "
                              "every worker) and a known run length")
        params, buffers = self._tensors()
        flags = 0
        if self.quantizer is None:
            nbytes = sum(t.numel() * t.element_size() for t in params + buffers)
        else:
            payload = sum(self.quantizer.payload_like(p).numel() * self.quantizer.payload_like(p).element_size()
                          for p in params)
            nbytes = payload + CHECKSUM_BYTES * len(params) + sum(b.numel() * b.element_size() for b in buffers)
            flags = len(params)

        def cost(i: int, j: int) -> float:
            c = float(self.comm.pair_cost(i, j, nbytes)[0])
            return c + (float(self.comm.pair_cost(i, j, flags)[0]) if flags else 0.0)

        return virtual_pairing.plan(
            self.topology, self.seed, lambda i, r: round_length(self.local_steps, self.dist, self.seed, i, r),
            step_s, cost, self.blocking, total)

    # -- the schedule ----------------------------------------------------------------------------
    def partner(self, round: int) -> int | None:
        """This node's partner in round ``round`` (None: left out of the matching)."""
        return round_partners(self.topology, self.seed, round).get(self.node)

    def progress(self, step: int) -> int:
        if self.virtual:
            return self.plan.progress[step - 1] if step > 0 else 0
        if self.dist == "fixed":
            return step
        return self.round * self.local_steps

    def schedule_position(self, step: int) -> int | None:
        return self.progress(step) if self.virtual else None

    def before_step(self, step: int) -> None:
        """Virtual-time pairing: this boundary's action (after its records): apply the exchange in
        flight, then exchange with the planned partner, or start a new round alone."""
        if self.virtual and step in self.plan.action:
            peer = self.plan.action[step]
            self._interact(None if peer == virtual_pairing.LEFT_OUT else peer)

    def after_step(self, step: int) -> None:
        if not self.virtual:
            self.steps_in_round += 1
            if self.steps_in_round >= self.round_steps:
                self._end_round()
        total = self.ctx.total_steps
        if self.pending is not None and total is not None and self.progress(step) >= total:
            self._complete(self.pending)  # the run ends: apply the exchange in flight

    def _interact(self, peer: int | None) -> None:
        """The end of this node's round: apply the exchange in flight, then exchange with ``peer``
        (blocking, or posted to overlap the next round), or none (left out)."""
        if self.pending is not None:
            self._complete(self.pending)
        if peer is not None:
            self.comm.round()
            exchange = self._start(peer)
            if self.blocking:
                self._complete(exchange)
            else:
                self.pending = exchange
        self.round += 1

    def _end_round(self) -> None:
        self._interact(self.partner(self.round))
        self.steps_in_round = 0
        self.round_steps = round_length(self.local_steps, self.dist, self.seed, self.node, self.round)

    # -- the exchange ------------------------------------------------------------------------------
    def _tensors(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(parameters, exchanged buffers) of the model, in a fixed order."""
        tensors = self.mixed_tensors()
        n = len(list(self.model.parameters()))
        return tensors[:n], tensors[n:]

    def _generator(self, round: int) -> torch.Generator:
        g = torch.Generator(device=self.comm.device)
        g.manual_seed(derive_seed("swarm_lattice", self.seed, self.node, round))
        return g

    def _start(self, peer: int) -> _Exchange:
        """Send this node's model (quantized) to ``peer`` and post the receive of ``peer``'s."""
        params, buffers = self._tensors()
        reference = [t.detach().clone() for t in params + buffers] if not self.blocking else params + buffers
        if self.quantizer is None:
            flat = torch.cat([t.reshape(-1) for t in reference])
            recv = torch.empty_like(flat)
            own = None
        else:
            gen = self._generator(self.round)
            codes, own = zip(*(self.quantizer.encode(p, gen, dtype=point_dtype(p)) for p in reference[: len(params)]))
            pieces = [c.payload.view(torch.uint8) for c in codes]
            pieces.append(torch.cat([c.checksum for c in codes]).view(torch.uint8))
            pieces += [b.detach().reshape(-1).view(torch.uint8) for b in reference[len(params):]]
            flat = torch.cat(pieces)
            recv = torch.empty_like(flat)
        # blocking: a synchronous exchange (its time is communication); non-blocking: in flight
        # while the next round computes
        handle = self.comm.sendrecv(flat, recv, peer, async_op=not self.blocking)
        return _Exchange(peer, reference, handle, list(own) if own is not None else None, recv)

    def _complete(self, ex: _Exchange) -> None:
        """Wait for ``ex``'s messages and average (blocking) or average and re-add (non-blocking)."""
        if ex.handle is not None:
            ex.handle.wait()
        if ex is self.pending:
            self.pending = None
        params, buffers = self._tensors()
        current = params + buffers
        if self.quantizer is None:
            mine = torch.cat([t.reshape(-1) for t in ex.reference]).double()
            averaged = (mine + ex.recv.double()) / 2
            values = _split(averaged, current)
        else:
            values = self._average_lattice(ex, len(params))
        with torch.no_grad():
            for t, avg, ref in zip(current, values, ex.reference):
                if self.blocking:
                    t.copy_(avg.view_as(t))
                else:  # x <- (Q(s_i) + Q(s_j)) / 2 + (x_now - s_i)
                    t.copy_((avg.view_as(t) + (t.double() - ref.double())).to(t.dtype))

    def _average_lattice(self, ex: _Exchange, n_params: int) -> list[torch.Tensor]:
        """Decode the partner's codes against the reference, exchange decode flags, resend the
        tensors either side failed at full precision; the averages, one per tensor (float32 for a
        float32 parameter decoded without a resend: the lattice points' fast path; else float64)."""
        quant = self.quantizer
        refs = ex.reference
        offset, codes = 0, []
        for p in refs[:n_params]:
            size = quant.payload_like(p).numel() * (2 if quant.bits == 16 else 1)
            codes.append(ex.recv[offset : offset + size])
            offset += size
        sums = ex.recv[offset : offset + CHECKSUM_BYTES * n_params].clone().view(torch.int64).view(n_params, 3)
        offset += CHECKSUM_BYTES * n_params
        decoded, flags = [], torch.zeros(n_params, dtype=torch.uint8, device=ex.recv.device)
        for t, (p, raw) in enumerate(zip(refs[:n_params], codes)):
            payload = raw.clone().view(torch.int16) if quant.bits == 16 else raw
            value, ok = quant.decode(LatticeCode(payload, sums[t], p.numel()), p, dtype=point_dtype(p))
            decoded.append(value)
            flags[t] = 0 if ok else 1
        theirs = torch.empty_like(flags)
        self.comm.sendrecv(flags, theirs, ex.partner)
        failed = [t for t in range(n_params) if flags[t] or theirs[t]]
        out = [(own + dec) / 2 for own, dec in zip(ex.own, decoded)]
        if failed:
            self.resent += len(failed)
            mine = torch.cat([refs[t].reshape(-1) for t in failed])
            full = torch.empty_like(mine)
            self.comm.sendrecv(mine, full, ex.partner)
            for t, piece in zip(failed, _split(full.double(), [refs[t] for t in failed])):
                out[t] = (refs[t].reshape(-1).double() + piece) / 2
        for b in refs[n_params:]:  # buffers travel at full precision after the codes
            n = b.numel() * b.element_size()
            theirs_b = ex.recv[offset : offset + n].clone().view(b.dtype)
            out.append((b.reshape(-1).double() + theirs_b.double()) / 2)
            offset += n
        return out

    # -- bookkeeping ------------------------------------------------------------------------------
    def metrics(self) -> dict:
        return {"lattice_resent": self.resent} if self.quantizer is not None else {}

    def state_dict(self) -> dict:
        pending = None
        if self.pending is not None:  # the exchange in flight, saved as it stands (module docstring)
            ex = self.pending
            ex.handle.complete_data()  # what the partner sent is in ex.recv; the clock waits where the run does
            pending = {"partner": ex.partner, "reference": [t.clone() for t in ex.reference],
                       "own": None if ex.own is None else [t.clone() for t in ex.own], "recv": ex.recv.clone(),
                       "handle": ex.handle.state_dict()}
        return {"round": self.round, "steps_in_round": self.steps_in_round, "resent": self.resent, "pending": pending}

    def load_state_dict(self, state: dict) -> None:
        self.round = state["round"]
        self.steps_in_round = state["steps_in_round"]
        self.resent = state["resent"]
        self.round_steps = round_length(self.local_steps, self.dist, self.seed, self.node, self.round)
        pending = state.get("pending")  # absent in checkpoints that completed it
        self.pending = None if pending is None else _Exchange(
            pending["partner"], list(pending["reference"]), self.comm.resumed(pending["handle"]),
            None if pending["own"] is None else list(pending["own"]), pending["recv"])


def _split(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """Consecutive flat slices of ``flat`` with the sizes of ``like``."""
    out, offset = [], 0
    for t in like:
        out.append(flat[offset : offset + t.numel()])
        offset += t.numel()
    return out


__all__ = ["SwarmSGD", "round_length", "round_partners"]
