"""What the gossip methods share (``dpsgd``, ``decentlam``, ``sgp``): their topology, their common
keys (:class:`GossipConfig`, which every gossip method's config extends) and one round of neighbour
exchange (docs/papers.md#decentralized-methods).

A node sends one flat message (its model, or what the method mixes) to each out-neighbour of the
round's graph and receives one from each in-neighbour (:meth:`lsgd.comm.communicator.Communicator.exchange`:
point to point, counted per send, clocked as messages); the receiver combines them with the
topology's mixing weights, ``sum_j W[i, j] x_j`` (``lsgd.comm.topology``: uniform ``1/(degree+1)`` or
Metropolis-Hastings). The topology is built from ``(algo.topology, n, algo.weights, algo.seed,
algo.degree)`` on every rank alike, so nobody negotiates who talks to whom; ``config.yaml`` records it with its
spectral gap (:meth:`Gossip.describe`).

Models are moved as one flat vector of the parameters (and, with ``algo.average_buffers``, the
floating-point buffers: BatchNorm statistics mixed with the same weights; false keeps them local).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lsgd.algorithms.base import DRIFT_AGREEMENT_LAG, AlgoConfig, Algorithm, float_buffers
from lsgd.comm.topology import TOPOLOGIES, WEIGHTS, Topology, check
from lsgd.core.errors import ConfigError
from lsgd.core.typed_config import option


def flat_of(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One flat copy of ``tensors`` (concatenated in order)."""
    return torch.cat([t.detach().reshape(-1) for t in tensors])


@torch.no_grad()
def write_flat(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Copy consecutive slices of ``flat`` back into ``tensors`` (cast to their dtype)."""
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t).to(t.dtype))
        offset += n


class Mix:
    """One round's neighbour exchange in flight: :meth:`Gossip.combine` waits for it."""

    def __init__(self, round: int, own: torch.Tensor, recvs: dict[int, torch.Tensor], handle):
        self.round, self.own, self.recvs, self.handle = round, own, recvs, handle


def save_mix(mix: Mix | None) -> dict | None:
    """A checkpoint's copy of an exchange in flight, moving no clock: its round, the message sent,
    what was received (the transfer is completed) and its end on the cluster clock
    (:meth:`lsgd.comm.handles.Handle.state_dict`). None for None."""
    if mix is None:
        return None
    if mix.handle is not None:
        mix.handle.complete_data()
    return {"round": mix.round, "own": mix.own.clone(), "recvs": {j: x.clone() for j, x in mix.recvs.items()},
            "handle": None if mix.handle is None else mix.handle.state_dict()}


def load_mix(state: dict | None, comm) -> Mix | None:
    """The exchange :func:`save_mix` saved, with a handle whose wait moves the clock to its end
    (:meth:`lsgd.comm.communicator.Communicator.resumed`)."""
    if state is None:
        return None
    handle = None if state["handle"] is None else comm.resumed(state["handle"])
    return Mix(state["round"], state["own"], dict(state["recvs"]), handle)


@dataclass
class GossipConfig(AlgoConfig):
    """The keys every gossip method has (module docstring); each method's config extends it."""

    topology: str = option("ring", choices=TOPOLOGIES, doc="G: the graph of who talks to whom (lsgd.comm.topology)",
                           symbol="")
    degree: int = option(4, at_least=3, doc="d of algo.topology=random_regular: each node's number of neighbours "
                         "(a random d-regular graph from networkx, drawn once from algo.seed; d < n, n d even); "
                         "unused by the other topologies")
    weights: str = option("uniform", choices=WEIGHTS, doc="the mixing weights W: uniform (1/(degree+1)) or "
                          "metropolis (Metropolis-Hastings)")
    average_buffers: bool = option(True, doc="BatchNorm buffers mixed with the parameters (false: kept local)")
    seed: int | None = option(None, doc="the topology's random matchings or random regular graph and the "
                              "method's own draws (null: the run's seed)")


class Gossip(Algorithm):
    """Base of the gossip methods (not registered: it has no ``name``); its keys: :class:`GossipConfig`."""

    Config = GossipConfig
    agreement_lag = DRIFT_AGREEMENT_LAG  # workers wait only for their neighbours (Algorithm.agreement_lag)

    @classmethod
    def validate_config(cls, algo: dict, world_size: int) -> None:
        super().validate_config(algo, world_size)
        config = cls.parse_config(algo)
        try:
            check(config.topology, world_size, config.weights, config.degree)
        except ValueError as exc:
            raise ConfigError(f"{exc} (algo={algo.get('name')} with {world_size} workers)") from None

    @classmethod
    def describe(cls, algo: dict, world_size: int) -> dict:
        config = cls.parse_config(algo)
        topo = Topology(config.topology, world_size, config.weights, int(config.seed or 0), config.degree)
        return {"topology": topo.describe()}

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        self.average_buffers = bool(self.config.average_buffers)
        self.topology: Topology | None = None
        self.rounds = 0

    def setup(self, model, optimizer, ctx=None):
        out = super().setup(model, optimizer, ctx)
        seed = self.config.seed
        self.seed = int(seed if seed is not None else self.ctx.seed)
        self.node = self.comm.rank
        self.topology = Topology(self.config.topology, self.comm.world_size, self.config.weights, self.seed,
                                 self.config.degree)
        return out

    def mixed_tensors(self) -> list[torch.Tensor]:
        """Parameters (and floating-point buffers with ``average_buffers``) in a fixed order."""
        tensors = [p.data for p in self.model.parameters()]
        return tensors + (float_buffers(self.model) if self.average_buffers else [])

    def post(self, message: torch.Tensor, round: int, async_op: bool = True, sends: dict | None = None) -> Mix:
        """Send ``message`` to every out-neighbour of round ``round`` (or ``sends``: ``{peer: tensor}``)
        and post the receives from every in-neighbour; one counted round."""
        outs = self.topology.out_neighbors(self.node, round)
        recvs = {j: torch.empty_like(message) for j in self.topology.in_neighbors(self.node, round)}
        sends = sends if sends is not None else {j: message for j in outs}
        handle = self.comm.exchange(sends, recvs, async_op=async_op)
        self.comm.round()
        self.rounds += 1
        return Mix(round, message, recvs, handle)

    def combine(self, mix: Mix) -> torch.Tensor:
        """Wait for ``mix`` and return ``sum_j W[i, j] x_j`` (float64 accumulation, message dtype)."""
        if mix.handle is not None:
            mix.handle.wait()
        weights = self.topology.in_neighbors(self.node, mix.round)
        out = mix.own.double() * self.topology.self_weight(self.node, mix.round)
        for j, x in mix.recvs.items():
            out += weights[j] * x.double()
        return out.to(mix.own.dtype)

    @property
    def models_in_sync(self) -> bool:
        return False
