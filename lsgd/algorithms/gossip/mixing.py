"""What the gossip methods share (``dpsgd``, ``decentlam``, ``sgp``): their topology and one round of
neighbour exchange (papers.md section 3).

A node sends one flat message (its model, or what the method mixes) to each out-neighbour of the
round's graph and receives one from each in-neighbour (:meth:`lsgd.comm.communicator.Communicator.exchange`:
point to point, counted per send, clocked as messages); the receiver combines them with the
topology's mixing weights, ``sum_j W[i, j] x_j`` (``lsgd.comm.topology``: uniform ``1/(degree+1)`` or
Metropolis-Hastings). The topology is built from ``(algo.topology, n, algo.weights, algo.seed)`` on
every rank alike, so nobody negotiates who talks to whom; ``config.yaml`` records it with its
spectral gap (:meth:`Gossip.describe`).

Models are moved as one flat vector of the parameters (and, with ``algo.average_buffers``, the
floating-point buffers: BatchNorm statistics mixed with the same weights; false keeps them local).
"""

from __future__ import annotations

import torch

from lsgd.algorithms.base import DRIFT_AGREEMENT_LAG, Algorithm, float_buffers
from lsgd.core.checks import choice
from lsgd.core.errors import ConfigError
from lsgd.comm.topology import Topology, check


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
    (:meth:`lsgd.comm.communicator.Handle.state_dict`). None for None."""
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


class Gossip(Algorithm):
    """Base of the gossip methods (not registered: it has no ``name``).

    Config keys: ``topology``, ``weights``, ``average_buffers`` (bool), ``seed``.
    """

    agreement_lag = DRIFT_AGREEMENT_LAG  # workers wait only for their neighbours (Algorithm.agreement_lag)

    @classmethod
    def validate_config(cls, algo: dict, world_size: int) -> None:
        try:
            check(algo.get("topology"), world_size, algo.get("weights", "uniform"))
        except ValueError as exc:
            raise ConfigError(f"{exc} (algo={algo.get('name')} with {world_size} workers)") from None
        choice(algo, "average_buffers", (True, False), "algo.")

    @classmethod
    def describe(cls, algo: dict, world_size: int) -> dict:
        topo = Topology(algo["topology"], world_size, algo.get("weights", "uniform"), int(algo.get("seed") or 0))
        return {"topology": topo.describe()}

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        self.average_buffers = bool(cfg.get("average_buffers", True))
        self.topology: Topology | None = None
        self.rounds = 0

    def setup(self, model, optimizer, ctx=None):
        out = super().setup(model, optimizer, ctx)
        seed = self.cfg.get("seed")
        self.seed = int(seed if seed is not None else self.ctx.seed)
        self.node = self.comm.rank
        self.topology = Topology(self.cfg["topology"], self.comm.world_size, self.cfg.get("weights", "uniform"), self.seed)
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
