"""SwarmSGD's schedule: the per-round matchings and local step counts every rank computes alone."""

import networkx as nx
import numpy as np
import pytest

from lsgd.algorithms.gossip.swarm_sgd import round_length, round_partners
from lsgd.comm.topology import Topology


@pytest.mark.parametrize("name,n", [("ring", 8), ("torus", 9), ("hypercube", 8), ("complete", 5), ("exponential", 8)])
def test_partners_form_a_maximal_matching_of_the_topology(name, n):
    topo = Topology(name, n, "uniform", seed=3)
    edges = {frozenset(e) for e in nx.Graph(topo.graph(0).to_undirected()).edges()}
    seen = set()
    for r in range(50):
        partners = round_partners(topo, 3, r)
        assert all(partners[partners[i]] == i != partners[i] for i in partners)  # symmetric, no self-pairs
        pairs = {frozenset((i, j)) for i, j in partners.items()}
        assert pairs <= edges
        free = set(range(n)) - set(partners)
        assert not any(frozenset((a, b)) in edges for a in free for b in free if a < b)  # maximal
        seen |= pairs
    assert seen == edges  # every edge is drawn sooner or later


def test_partners_depend_on_seed_and_round_only():
    topo = Topology("ring", 10, "uniform", seed=0)
    again = Topology("ring", 10, "uniform", seed=0)
    assert [round_partners(topo, 1, r) for r in range(20)] == [round_partners(again, 1, r) for r in range(20)]
    assert [round_partners(topo, 1, r) for r in range(20)] != [round_partners(topo, 2, r) for r in range(20)]


def test_geometric_round_lengths_have_mean_h():
    h, draws = 4, 4000
    lengths = np.array([round_length(h, "geometric", 0, node, r) for node in range(4) for r in range(draws // 4)])
    assert lengths.min() >= 1
    # Geometric(p = 1/h) on 1, 2, ...: mean h, variance (1 - p) / p^2; 5 standard errors
    assert abs(lengths.mean() - h) < 5 * np.sqrt((1 - 1 / h) * h * h / draws)
    assert round_length(h, "geometric", 0, 1, 7) == round_length(h, "geometric", 0, 1, 7)
    assert {round_length(h, "fixed", 0, n, r) for n in range(4) for r in range(10)} == {h}
