"""Communication topologies of decentralized methods and their mixing matrices.

A topology is built identically on every rank from (name, number of nodes, weights, seed, degree):
no communication decides who talks to whom. Graphs come from networkx where it has them (cycle, 2-D
periodic grid, hypercube, complete graph, random regular graph); the exponential graphs, the
per-round matchings and the mixing weights are written here, following Bluefog's ``topology_util``
(the reference design, docs/papers.md#topologies).

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
``random_regular``: a random d-regular undirected graph, d = ``algo.degree`` (3 <= d < n, n d even):
nx.random_regular_graph(d, n, seed) (networkx's pairing-model sampler, Steger & Wormald 1999), drawn
once from the seed (the run's seed unless ``algo.seed`` is set), so every rank builds the same
graph, static over the run (with networkx's version: another networkx may draw another graph).
Random regular graphs with d >= 3 are connected with probability tending to 1 as n grows (and
expanders: their spectral gap stays bounded away from 0, unlike the ring's O(1/n^2)), but a small
one can come out disconnected (about 1 draw in 200 at n = 8, d = 3): then it is drawn again with
seed + 1, seed + 2, ... (the first connected draw of at most 100 is taken;
:func:`random_regular_graph`). d = 1 or 2 (a matching, a union of cycles: mostly disconnected) is
refused: use ``matching`` or ``ring``. Uniform weights 1/(d + 1) (metropolis gives the same on a
regular graph);
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

TOPOLOGIES = ("ring", "torus", "exponential", "one_peer_exponential", "hypercube", "complete", "matching",
              "random_regular")
WEIGHTS = ("uniform", "metropolis")
DYNAMIC = ("one_peer_exponential", "matching")
DIRECTED = ("exponential", "one_peer_exponential")
#: draws of :func:`random_regular_graph` (seed, seed + 1, ...) before it gives up on a connected graph
REGULAR_TRIES = 100


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


def check(name: str, n: int, weights: str = "uniform", degree: int = 4) -> None:
    """Validate a topology before any worker starts (``degree``: d of ``random_regular``, unused by
    the others).

    Raises:
        ValueError: unknown name or weights (names the allowed values), or n (and degree) unsuitable
            for it.
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
    if name == "random_regular":
        check_degree(n, degree)
    if weights == "metropolis" and name in DIRECTED:
        raise ValueError(f"algo.weights=metropolis needs an undirected graph; algo.topology={name} is directed: use uniform")


def check_degree(n: int, degree: int) -> None:
    """Raises ValueError unless a connected random ``degree``-regular graph on ``n`` nodes can be
    drawn: an integer 3 <= degree < n with n * degree even (networkx's conditions, and d >= 3 for
    connectivity)."""
    where = f"algo.topology=random_regular with algo.degree={degree!r} and {n} nodes"
    if isinstance(degree, bool) or not isinstance(degree, int):
        raise ValueError(f"{where}: algo.degree must be an integer")
    if degree < 3:
        raise ValueError(f"{where}: algo.degree must be >= 3 (a 1- or 2-regular graph is a matching or a union of "
                         "cycles, mostly disconnected; use algo.topology=matching or ring)")
    if degree >= n:
        raise ValueError(f"{where}: algo.degree must be < the number of nodes (algo.degree={n - 1} is the "
                         "complete graph)")
    if n * degree % 2:
        near = " or ".join(str(d) for d in (degree - 1, degree + 1) if 3 <= d < n)
        raise ValueError(f"{where}: nodes x algo.degree must be even (every edge has two ends); "
                         f"use algo.degree={near}")


@dataclass(frozen=True)
class Topology:
    """A topology over ``n`` nodes (see the module docstring). ``seed`` drives the matchings and the
    random regular graph; ``degree``: d of ``random_regular`` (unused by the other topologies).

    Raises (on construction):
        ValueError: as :func:`check`.
    """

    name: str
    n: int
    weights: str = "uniform"
    seed: int = 0
    degree: int = 4

    def __post_init__(self):
        check(self.name, self.n, self.weights, self.degree)

    def _key(self, round: int) -> tuple:
        """The cached functions' arguments for round ``round``: a static graph is round 0's, and the
        degree counts only for ``random_regular`` (the other graphs share one cache entry)."""
        return (self.name, self.n, self.seed, round if self.dynamic else 0,
                self.degree if self.name == "random_regular" else 0)

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
        return _graph(*self._key(round))

    def mixing_matrix(self, round: int = 0) -> np.ndarray:
        """The (n, n) float64 mixing matrix of round ``round`` (row i: the weights node i averages with)."""
        return _mixing(self.weights, *self._key(round)).copy()

    def in_neighbors(self, node: int, round: int = 0) -> dict[int, float]:
        """``{j: W[node, j]}`` for the nodes ``node`` receives from in round ``round``."""
        row = _mixing(self.weights, *self._key(round))[node]
        return {j: float(w) for j, w in enumerate(row) if j != node and w > 0}

    def out_neighbors(self, node: int, round: int = 0) -> list[int]:
        """The nodes that receive from ``node`` in round ``round`` (ascending)."""
        col = _mixing(self.weights, *self._key(round))[:, node]
        return [i for i, w in enumerate(col) if i != node and w > 0]

    def self_weight(self, node: int, round: int = 0) -> float:
        return float(_mixing(self.weights, *self._key(round))[node, node])

    def spectral_gap(self, round: int = 0) -> float:
        """``1 - |lambda_2(W)|`` of round ``round``'s mixing matrix (0 for a disconnected round)."""
        return spectral_gap(self.mixing_matrix(round))

    def describe(self) -> dict:
        """What a run's config records: name, nodes, weights, spectral gap (round 0), period (and
        the degree of ``random_regular``)."""
        out = {"name": self.name, "nodes": self.n, "weights": self.weights,
               "spectral_gap": self.spectral_gap(0), "period": self.period}
        if self.name == "random_regular":
            out["degree"] = self.degree
        return out


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


def random_regular_graph(n: int, degree: int, seed: int) -> nx.Graph:
    """The connected random ``degree``-regular graph on nodes 0 .. n-1 of ``seed``: the first
    connected one of ``nx.random_regular_graph(degree, n, seed=seed + k)`` for k = 0, 1, ...
    (:data:`REGULAR_TRIES` draws; the same on every rank).

    Raises:
        ValueError: as :func:`check_degree`, or no connected draw among the tries.
    """
    import networkx as nx

    check_degree(n, degree)
    for k in range(REGULAR_TRIES):
        g = nx.random_regular_graph(degree, n, seed=int(seed) + k)
        if nx.is_connected(g):
            return g
    raise ValueError(f"algo.topology=random_regular with algo.degree={degree} and {n} nodes: no connected graph "
                     f"in {REGULAR_TRIES} draws from seed {seed}; use a larger algo.degree")


@lru_cache(maxsize=256)
def _graph(name: str, n: int, seed: int, round: int, degree: int = 0) -> nx.DiGraph:
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
    elif name == "random_regular":
        g = random_regular_graph(n, degree, seed)
    elif name == "matching":
        g = nx.Graph()
        g.add_nodes_from(range(n))
        g.add_edges_from(random_matching(nx.complete_graph(n), round_rng(seed, round)))
    else:
        raise ValueError(f"unknown topology {name!r}; allowed: {', '.join(TOPOLOGIES)}")
    return nx.DiGraph(g)  # both directions of every undirected edge


@lru_cache(maxsize=256)
def _mixing(weights: str, name: str, n: int, seed: int, round: int, degree: int = 0) -> np.ndarray:
    g = _graph(name, n, seed, round, degree)
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
