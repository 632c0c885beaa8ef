"""``ad_psgd``: asynchronous decentralized parallel SGD, Lian, Zhang, Zhang and Liu, "Asynchronous
Decentralized Parallel Stochastic Gradient Descent", ICML 2018 (papers.md section 3).

Every worker computes its gradient at its model as it reads it; picks a random neighbour; the two
atomically replace their models by their average, ``x_i = x_j = (x_i + x_j) / 2``; then the worker
applies its gradient step to the averaged model: ``x_i <- x_i + d_i`` (``d_i`` the optimizer's step
computed at the model the gradient was taken at). To rule out deadlock (two workers each waiting to
average with the other) the paper splits the graph in two: *active* workers initiate averaging,
each with a random *passive* neighbour; only edges between
the two sides are used: the graph's two colours when it is bipartite (ring of even n, hypercube,
torus of even sides), else even- and odd-numbered workers. A passive worker averages with every active worker that picked it this
step, one after another in ascending order, so it may average several times or not at all, and its
gradient is then stale with respect to its averaged model, as in the paper.

Every rank computes every active worker's choice from ``(algo.seed, worker, step)``, so a passive
worker knows who will contact it without a message; the exchanges are blocking ``sendrecv`` pairs
(both sides compute the same average, so the network mean is kept). One round per step for a worker
that averaged. The topology must be static and its bipartite part (edges between even and odd
workers) connected, else a ConfigError before any worker starts.
"""

from __future__ import annotations

from functools import lru_cache

import networkx as nx
import numpy as np
import torch

from lsgd.algorithms.gossip import Gossip, flat_of, write_flat
from lsgd.errors import ConfigError
from lsgd.seeding import derive_seed
from lsgd.topology import DYNAMIC, Topology


@lru_cache(maxsize=64)
def sides(topology: Topology) -> dict[int, int]:
    """``{worker: 0 (active) or 1 (passive)}``: the graph's two colours when it is bipartite (ring
    of even n, hypercube, torus of even sides; worker 0 active), else even / odd workers."""
    graph = nx.Graph(topology.graph(0).to_undirected())
    if nx.is_connected(graph) and nx.is_bipartite(graph):
        colour = nx.bipartite.color(graph)
        return {i: colour[i] ^ colour[0] for i in range(topology.n)}
    return {i: i % 2 for i in range(topology.n)}


@lru_cache(maxsize=64)
def bipartite_neighbors(topology: Topology) -> dict[int, list[int]]:
    """``{worker: its neighbours on the other side}`` (:func:`sides`)."""
    graph = nx.Graph(topology.graph(0).to_undirected())
    side = sides(topology)
    return {i: sorted(j for j in graph.neighbors(i) if side[j] != side[i]) for i in range(topology.n)}


def check_bipartition(topology: Topology) -> None:
    """Raises ValueError unless every active worker has a passive neighbour and the bipartite graph
    is connected."""
    if topology.name in DYNAMIC:
        raise ValueError(f"algo.topology={topology.name} changes every round; ad_psgd needs a static topology")
    nbrs = bipartite_neighbors(topology)
    graph = nx.Graph([(i, j) for i, js in nbrs.items() for j in js])
    graph.add_nodes_from(range(topology.n))
    if not nx.is_connected(graph):
        raise ValueError(f"algo.topology={topology.name} with {topology.n} workers: the edges between active and "
                         "passive workers do not connect all workers; use ring, torus, hypercube or complete")


def step_partners(topology: Topology, seed: int, step: int) -> dict[int, int]:
    """``{active worker: the passive neighbour it averages with at step ``step``}``."""
    nbrs, side = bipartite_neighbors(topology), sides(topology)
    out = {}
    for a in (i for i in range(topology.n) if side[i] == 0):
        rng = np.random.default_rng(derive_seed("ad_psgd", int(seed), a, int(step)))
        out[a] = nbrs[a][int(rng.integers(len(nbrs[a])))]
    return out


class ADPSGD(Gossip):
    """AD-PSGD. Config keys: ``topology``, ``average_buffers``, ``seed``."""

    name = "ad_psgd"

    @classmethod
    def validate_config(cls, algo: dict, world_size: int) -> None:
        super().validate_config(algo, world_size)
        try:
            check_bipartition(Topology(algo["topology"], world_size, algo.get("weights", "uniform"), 0))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        self.step = 0

    def peers(self, step: int) -> list[int]:
        """Whom this worker averages with at ``step``, in order."""
        partners = step_partners(self.topology, self.seed, step)
        if self.node in partners:
            return [partners[self.node]]
        return sorted(a for a, p in partners.items() if p == self.node)

    def optimizer_step(self) -> None:
        tensors = self.mixed_tensors()
        before = flat_of(tensors)
        self.optimizer.step()
        delta = flat_of(tensors) - before
        x = before
        peers = self.peers(self.step)
        for peer in peers:
            theirs = torch.empty_like(x)
            self.comm.sendrecv(x, theirs, peer)
            x = ((x.double() + theirs.double()) / 2).to(x.dtype)
        if peers:
            self.comm.round()
            self.rounds += 1
        write_flat(x + delta, tensors)
        self.step += 1

    def state_dict(self) -> dict:
        return {"step": self.step, "rounds": self.rounds}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.rounds = state["step"], state["rounds"]
