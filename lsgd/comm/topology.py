"""Communication topologies of decentralized methods and their mixing matrices.

A topology is built identically on every rank from (name, number of nodes, weights, seed): no
communication decides who talks to whom. Graphs come from networkx where it has them (cycle, 2-D
periodic grid, hypercube, complete graph); the exponential graphs, the per-round matchings and the
mixing weights are written here, following Bluefog's ``topology_util`` (the reference design,
docs/papers.md#topologies).

Conventions:

* ``mixing_matrix(t)[i, j]`` is the weight node ``i`` gives to node ``j``'s model in round ``t``:
  ``x_i <- sum_j W[i, j] x_j``. Rows sum to 1 (every node averages); for the undirected graphs and
  the circulant directed ones the columns do too (doubly stochastic, the network mean is kept).
* ``in_neighbors(i, t)``: ``{j: W[i, j]}`` for ``j != i`` (whom node ``i`` receives from) and
  ``out_neighbors(i, t)`` the nodes that receive from ``i``.
* Weights: ``uniform``: ``1 / (in-degree + 1)`` for self and each in-neighbour; ``metropolis``
  (Metropolis-Hastings, undirected graphs): ``W[i, j] = 1 / max(deg_i + 1, deg_j + 1)`` on edges and
  ``W[i, i] = 1 - sum_j W[i, j]``.
* Spectral gap: ``1 - |lambda_2(W)|`` (second largest eigenvalue modulus) of one round's matrix;
  it governs how fast gossip mixes. A matching round is disconnected (gap 0); the one-peer
  exponential graph averages exactly after log2 n rounds when n is a power of two (Ying et al.
  2021), see :meth:`Topology.period`.

Topologies (``algo.topology``):

``ring``: nx.cycle_graph (1/3 self, 1/3 each side with uniform weights, n >= 3);
``torus``: nx.grid_2d_graph(r, c, periodic=True), r x c = n with r <= c as close as possible
(r, c >= 3; 4 neighbours);
``exponential``: static directed graph, node i sends to i + 2^k mod n for k = 0 .. ceil(log2 n) - 1;
``one_peer_exponential``: at round t node i sends to i + 2^(t mod ceil(log2 n)) mod n, weights 1/2;
``hypercube``: nx.hypercube_graph(log2 n), n a power of two, nodes numbered by their bit vectors;
``complete``: nx.complete_graph;
``matching``: a random perfect matching per round (an odd node out idles), weights 1/2, drawn
from (seed, round), so every rank draws the same one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # networkx is imported where a graph is built: its 0.15 s of import are spared
    import networkx as nx  # every process of a run without a topology (lsgd.algorithms imports this module)

TOPOLOGIES = ("ring", "torus", "exponential", "one_peer_exponential", "hypercube", "complete", "matching")
WEIGHTS = ("uniform", "metropolis")
DYNAMIC = ("one_peer_exponential", "matching")
DIRECTED = ("exponential", "one_peer_exponential")


def _log2_ceil(n: int) -> int:
    return max(1, math.ceil(math.log2(n)))


def torus_shape(n: int) -> tuple[int, int]:
    """(rows, cols) of the 2-D torus with n nodes: rows <= cols, both >= 3, rows as close to
    sqrt(n) as possible.

    Raises:
        ValueError: n has no such factorization (e.g. a prime, or n < 9).
    """
    for r in range(math.isqrt(n), 2, -1):
        if n % r == 0 and n // r >= 3:
            return r, n // r
    raise ValueError(f"algo.topology=torus needs n = rows x cols with rows, cols >= 3; n={n} has none")


def check(name: str, n: int, weights: str = "uniform") -> None:
    """Validate a topology before any worker starts.

    Raises:
        ValueError: unknown name or weights (names the allowed values), or n unsuitable for it.
    """
    if name not in TOPOLOGIES:
        raise ValueError(f"algo.topology={name!r} is not allowed; allowed: {', '.join(TOPOLOGIES)}")
    if weights not in WEIGHTS:
        raise ValueError(f"algo.weights={weights!r} is not allowed; allowed: {', '.join(WEIGHTS)}")
    if n < 2:
        raise ValueError(f"algo.topology={name} needs at least 2 nodes, got {n}")
    if name == "ring" and n < 3:
        raise ValueError("algo.topology=ring needs at least 3 nodes; use complete for 2")
    if name == "torus":
        torus_shape(n)
    if name == "hypercube" and n & (n - 1):
        raise ValueError(f"algo.topology=hypercube needs a power of two nodes, got {n}")
    if weights == "metropolis" and name in DIRECTED:
        raise ValueError(f"algo.weights=metropolis needs an undirected graph; algo.topology={name} is directed: use uniform")


@dataclass(frozen=True)
class Topology:
    """A topology over ``n`` nodes (see the module docstring). ``seed`` drives the matchings.

    Raises (on construction):
        ValueError: as :func:`check`.
    """

    name: str
    n: int
    weights: str = "uniform"
    seed: int = 0

    def __post_init__(self):
        check(self.name, self.n, self.weights)

    @property
    def dynamic(self) -> bool:
        """True when the graph changes from round to round."""
        return self.name in DYNAMIC

    @property
    def period(self) -> int:
        """Rounds after which a deterministic dynamic graph repeats (1 for static graphs;
        ceil(log2 n) for the one-peer exponential graph; 0 for random matchings)."""
        if self.name == "one_peer_exponential":
            return _log2_ceil(self.n)
        return 0 if self.name == "matching" else 1

    def graph(self, round: int = 0) -> nx.DiGraph:
        """Round ``round``'s graph: an edge ``i -> j`` means node i sends to node j (undirected
        graphs have both directions). Nodes are 0 .. n-1."""
        return _graph(self.name, self.n, self.seed, round if self.dynamic else 0)

    def mixing_matrix(self, round: int = 0) -> np.ndarray:
        """The (n, n) float64 mixing matrix of round ``round`` (row i: the weights node i averages with)."""
        return _mixing(self.name, self.n, self.weights, self.seed, round if self.dynamic else 0).copy()

    def in_neighbors(self, node: int, round: int = 0) -> dict[int, float]:
        """``{j: W[node, j]}`` for the nodes ``node`` receives from in round ``round``."""
        row = _mixing(self.name, self.n, self.weights, self.seed, round if self.dynamic else 0)[node]
        return {j: float(w) for j, w in enumerate(row) if j != node and w > 0}

    def out_neighbors(self, node: int, round: int = 0) -> list[int]:
        """The nodes that receive from ``node`` in round ``round`` (ascending)."""
        col = _mixing(self.name, self.n, self.weights, self.seed, round if self.dynamic else 0)[:, node]
        return [i for i, w in enumerate(col) if i != node and w > 0]

    def self_weight(self, node: int, round: int = 0) -> float:
        return float(_mixing(self.name, self.n, self.weights, self.seed, round if self.dynamic else 0)[node, node])

    def spectral_gap(self, round: int = 0) -> float:
        """``1 - |lambda_2(W)|`` of round ``round``'s mixing matrix (0 for a disconnected round)."""
        return spectral_gap(self.mixing_matrix(round))

    def describe(self) -> dict:
        """What a run's config records: name, nodes, weights, spectral gap (round 0), period."""
        return {"name": self.name, "nodes": self.n, "weights": self.weights,
                "spectral_gap": self.spectral_gap(0), "period": self.period}


def spectral_gap(w: np.ndarray) -> float:
    """``1 - |lambda_2|`` of a stochastic matrix (eigenvalue moduli sorted descending)."""
    moduli = np.sort(np.abs(np.linalg.eigvals(w)))[::-1]
    return float(max(0.0, 1.0 - moduli[1])) if len(moduli) > 1 else 1.0


def random_matching(graph: nx.Graph, rng: np.random.Generator) -> list[tuple[int, int]]:
    """A random maximal matching of ``graph``'s edges: edges in a random order, each taken when
    both ends are still free. Pairs ``(i, j)`` with ``i < j``, sorted."""
    edges = sorted({(min(a, b), max(a, b)) for a, b in graph.edges() if a != b})
    taken: set[int] = set()
    pairs = []
    for k in rng.permutation(len(edges)):
        i, j = edges[k]
        if i not in taken and j not in taken:
            taken.update((i, j))
            pairs.append((i, j))
    return sorted(pairs)


def round_rng(seed: int, round: int) -> np.random.Generator:
    """The generator every rank uses for round ``round``'s random choices (same on every rank)."""
    return np.random.default_rng([int(seed), int(round), 0x6C736764])  # 'lsgd'


@lru_cache(maxsize=256)
def _graph(name: str, n: int, seed: int, round: int) -> nx.DiGraph:
    import networkx as nx

    if name == "ring":
        g = nx.cycle_graph(n)
    elif name == "torus":
        r, c = torus_shape(n)
        g = nx.convert_node_labels_to_integers(nx.grid_2d_graph(r, c, periodic=True), ordering="sorted")
    elif name == "hypercube":
        # nodes are bit tuples; sorted order numbers them by their binary value
        g = nx.convert_node_labels_to_integers(nx.hypercube_graph(int(math.log2(n))), ordering="sorted")
    elif name == "complete":
        g = nx.complete_graph(n)
    elif name == "exponential":
        g = nx.DiGraph()
        g.add_nodes_from(range(n))
        g.add_edges_from((i, (i + 2 ** k) % n) for i in range(n) for k in range(_log2_ceil(n)) if (i + 2 ** k) % n != i)
        return g
    elif name == "one_peer_exponential":
        shift = 2 ** (round % _log2_ceil(n)) % n
        g = nx.DiGraph()
        g.add_nodes_from(range(n))
        g.add_edges_from((i, (i + shift) % n) for i in range(n) if shift)
        return g
    elif name == "matching":
        g = nx.Graph()
        g.add_nodes_from(range(n))
        g.add_edges_from(random_matching(nx.complete_graph(n), round_rng(seed, round)))
    else:
        raise ValueError(f"unknown topology {name!r}; allowed: {', '.join(TOPOLOGIES)}")
    return nx.DiGraph(g)  # both directions of every undirected edge


@lru_cache(maxsize=256)
def _mixing(name: str, n: int, weights: str, seed: int, round: int) -> np.ndarray:
    g = _graph(name, n, seed, round)
    w = np.zeros((n, n))
    if weights == "metropolis":
        deg = {v: g.in_degree(v) for v in g.nodes}
        for i, j in g.edges():
            w[j, i] = 1.0 / max(deg[i] + 1, deg[j] + 1)
        w[np.diag_indices(n)] = 1.0 - w.sum(axis=1)
    else:
        for j in range(n):
            senders = list(g.predecessors(j))
            share = 1.0 / (len(senders) + 1)
            w[j, j] = share
            for i in senders:
                w[j, i] = share
    w.setflags(write=False)
    return w
