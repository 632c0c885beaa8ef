"""Topologies and mixing matrices against closed forms (lsgd/comm/topology.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lsgd.comm.topology import REGULAR_TRIES, TOPOLOGIES, Topology, check, spectral_gap, torus_shape

CASES = [(name, n, weights) for name in TOPOLOGIES for n in (4, 8, 9, 12, 16) for weights in ("uniform", "metropolis")]


def valid(name, n, weights):
    try:
        check(name, n, weights)
        return True
    except ValueError:
        return False


@pytest.mark.parametrize("name, n, weights", [c for c in CASES if valid(*c)])
def test_every_mixing_matrix_is_doubly_stochastic(name, n, weights):
    topo = Topology(name, n, weights, seed=3)
    for t in range(5):
        w = topo.mixing_matrix(t)
        assert (w >= 0).all()
        np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)  # every node averages
        np.testing.assert_allclose(w.sum(axis=0), 1.0, atol=1e-12)  # the network mean is kept
        for i in range(n):  # neighbour views agree with the matrix
            assert topo.in_neighbors(i, t) == {j: w[i, j] for j in range(n) if j != i and w[i, j] > 0}
            assert topo.out_neighbors(i, t) == [j for j in range(n) if j != i and w[j, i] > 0]


@pytest.mark.parametrize("n", [4, 9, 16])
def test_metropolis_weights_are_symmetric_with_degree_counting_self(n):
    topo = Topology("torus" if n != 4 else "ring", n, "metropolis")
    w = topo.mixing_matrix()
    np.testing.assert_allclose(w, w.T)
    g = topo.graph()
    for i, j in g.edges():
        assert w[i, j] == pytest.approx(1 / max(g.in_degree(i) + 1, g.in_degree(j) + 1))


@pytest.mark.parametrize("n", [2, 4, 8, 16, 32])
def test_one_peer_exponential_graph_averages_exactly_after_log2_n_rounds(n):
    topo = Topology("one_peer_exponential", n)
    rounds = int(math.log2(n))
    assert topo.period == rounds
    x = np.random.default_rng(0).normal(size=(n, 5))
    y = x.copy()
    for t in range(rounds):
        if t == rounds - 1 and n > 2:  # one round short: not yet the mean
            assert not np.allclose(y, x.mean(axis=0))
        y = topo.mixing_matrix(t) @ y
    np.testing.assert_allclose(y, np.broadcast_to(x.mean(axis=0), y.shape), atol=1e-12)
    assert all(len(topo.out_neighbors(i, t)) == 1 for i in range(n) for t in range(rounds))  # one peer


@pytest.mark.parametrize("n", [3, 4, 5, 8, 16, 31])
def test_ring_spectral_gap_equals_its_closed_form(n):
    # W = (I + A) / 3 on the cycle: eigenvalues (1 + 2 cos(2 pi k / n)) / 3, k = 0 .. n-1
    closed = 1 - max(abs(1 + 2 * math.cos(2 * math.pi * k / n)) / 3 for k in range(1, n))
    assert Topology("ring", n).spectral_gap() == pytest.approx(closed, abs=1e-12)
    np.testing.assert_allclose(np.diag(Topology("ring", n).mixing_matrix()), 1 / 3)


@pytest.mark.parametrize("d", [1, 2, 3, 4])
def test_hypercube_and_complete_gaps(d):
    # hypercube (I + A)/(d + 1): eigenvalues (1 + d - 2m)/(d + 1) -> gap 2/(d + 1); complete: W = J/n -> gap 1
    assert Topology("hypercube", 2 ** d).spectral_gap() == pytest.approx(2 / (d + 1))
    assert Topology("complete", 2 ** d + 1).spectral_gap() == pytest.approx(1.0)


def test_exponential_graph_neighbours():
    topo = Topology("exponential", 8)
    assert topo.out_neighbors(0) == [1, 2, 4]
    assert topo.in_neighbors(0) == {4: 0.25, 6: 0.25, 7: 0.25}
    assert topo.self_weight(0) == 0.25


@pytest.mark.parametrize("n", [8, 9])
def test_matching_is_the_same_on_every_rank_and_changes_by_round(n):
    a, b = Topology("matching", n, seed=7), Topology("matching", n, seed=7)
    assert all(sorted(a.graph(t).edges()) == sorted(b.graph(t).edges()) for t in range(10))  # (seed, round) decide
    draws = {tuple(sorted(a.graph(t).edges())) for t in range(10)}
    assert len(draws) > 1
    for t in range(10):
        paired = [i for i in range(n) if a.out_neighbors(i, t)]
        assert all(len(a.out_neighbors(i, t)) <= 1 for i in range(n))
        assert len(paired) == n - n % 2  # everyone paired; an odd node out idles
        assert a.spectral_gap(t) == pytest.approx(0.0, abs=1e-12)  # one round is disconnected
    assert sorted(Topology("matching", n, seed=8).graph(0).edges()) != sorted(a.graph(0).edges()) or n < 4


def test_torus_shape_and_errors():
    assert torus_shape(16) == (4, 4) and torus_shape(12) == (3, 4) and torus_shape(9) == (3, 3)
    with pytest.raises(ValueError, match="n = rows x cols"):
        torus_shape(7)
    with pytest.raises(ValueError, match="allowed: ring, torus, exponential"):
        Topology("star", 4)
    with pytest.raises(ValueError, match="allowed: uniform, metropolis"):
        Topology("ring", 4, "max_degree")
    with pytest.raises(ValueError, match="power of two"):
        Topology("hypercube", 12)
    with pytest.raises(ValueError, match="directed"):
        Topology("exponential", 8, "metropolis")
    assert spectral_gap(np.eye(3)) == 0.0


def edge_set(topo):
    return {frozenset(e) for e in topo.graph().edges()}


@pytest.mark.parametrize("d", [3, 4, 8])
def test_random_regular_graph_is_connected_d_regular_and_drawn_from_the_seed(d):
    import networkx as nx

    topo = Topology("random_regular", 64, seed=5, degree=d)
    g = topo.graph()
    assert sorted(g.nodes) == list(range(64))
    assert all(g.in_degree(i) == d and g.out_degree(i) == d for i in range(64))  # d-regular
    assert all(g.has_edge(j, i) for i, j in g.edges())  # undirected: both directions
    assert nx.is_connected(g.to_undirected())
    assert len(edge_set(topo)) == 64 * d // 2
    # static, and the same on every rank for the same seed: another Topology object, any round
    assert topo.period == 1 and not topo.dynamic
    assert edge_set(Topology("random_regular", 64, seed=5, degree=d)) == edge_set(topo)
    assert sorted(topo.graph(7).edges()) == sorted(g.edges())
    assert edge_set(Topology("random_regular", 64, seed=6, degree=d)) != edge_set(topo)  # another seed, another graph
    # networkx's draw of the seed (connected here, so not redrawn)
    assert edge_set(topo) == {frozenset(e) for e in nx.random_regular_graph(d, 64, seed=5).edges()}


def test_a_disconnected_random_regular_draw_is_redrawn_from_the_next_seed():
    import networkx as nx

    # small 3-regular graphs are disconnected about once in 200 draws: find a seed that draws one
    seed = next(s for s in range(5000) if not nx.is_connected(nx.random_regular_graph(3, 8, seed=s)))
    k = next(k for k in range(1, REGULAR_TRIES) if nx.is_connected(nx.random_regular_graph(3, 8, seed=seed + k)))
    topo = Topology("random_regular", 8, seed=seed, degree=3)
    assert nx.is_connected(topo.graph().to_undirected())
    assert edge_set(topo) == {frozenset(e) for e in nx.random_regular_graph(3, 8, seed=seed + k).edges()}
    assert topo.spectral_gap() > 0


@pytest.mark.parametrize("d", [3, 4, 6])
def test_random_regular_mixing_is_symmetric_uniform_and_its_gap_beats_the_ring(d):
    n = 64
    topo = Topology("random_regular", n, seed=1, degree=d)
    w = topo.mixing_matrix()
    adjacency = np.zeros((n, n))
    for i, j in topo.graph().edges():
        adjacency[i, j] = 1.0
    # W = (I + A) / (d + 1): 1/(d + 1) for self and each neighbour, symmetric and doubly stochastic
    np.testing.assert_allclose(w, (np.eye(n) + adjacency) / (d + 1), atol=1e-15)
    np.testing.assert_allclose(w, w.T)
    np.testing.assert_allclose(w.sum(axis=0), 1.0, atol=1e-12)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
    assert all(topo.self_weight(i) == pytest.approx(1 / (d + 1)) for i in range(n))
    # on a regular graph Metropolis-Hastings gives the same weights
    np.testing.assert_allclose(Topology("random_regular", n, "metropolis", seed=1, degree=d).mixing_matrix(), w)
    # closed form: eigenvalues (1 + lambda_k(A)) / (d + 1); lambda_1(A) = d, the rest in [-d, d)
    lam = np.sort(np.linalg.eigvalsh(adjacency))[::-1]
    assert lam[0] == pytest.approx(d)
    closed = 1 - max(abs(1 + x) for x in lam[1:]) / (d + 1)
    gap = topo.spectral_gap()
    assert gap == pytest.approx(closed, abs=1e-9)
    assert 0 < gap < 1
    assert gap > Topology("ring", n).spectral_gap()
    described = topo.describe()
    assert described["degree"] == d and described["spectral_gap"] == pytest.approx(gap)
    assert "degree" not in Topology("ring", n).describe()


def test_bad_random_regular_degrees_are_refused_naming_the_keys():
    check("random_regular", 10, degree=3)
    check("random_regular", 4, degree=3)  # K4
    check("ring", 9, degree=3)  # the degree counts only for random_regular
    Topology("ring", 9, degree=3)
    for n, d, why in [(9, 3, "must be even"), (4, 4, "must be < the number of nodes"), (8, 9, "must be < the number"),
                      (8, 2, "must be >= 3"), (8, 0, "must be >= 3"), (8, 4.0, "must be an integer"),
                      (8, True, "must be an integer")]:
        with pytest.raises(ValueError, match=why) as info:
            Topology("random_regular", n, degree=d)
        assert "algo.topology=random_regular" in str(info.value) and "algo.degree" in str(info.value)


def test_a_gossip_method_refuses_a_bad_degree_before_any_worker_starts():
    from lsgd.algorithms.gossip.dpsgd import DPSGD
    from lsgd.core.errors import ConfigError

    algo = {"name": "dpsgd", "topology": "random_regular", "seed": 0}
    DPSGD.validate_config(algo, 16)  # degree 4 by default
    DPSGD.validate_config({**algo, "degree": 15}, 16)
    with pytest.raises(ConfigError, match="algo.degree"):
        DPSGD.validate_config({**algo, "degree": 3}, 9)
    with pytest.raises(ConfigError, match="algo.degree"):
        DPSGD.validate_config({**algo, "degree": 16}, 16)
    with pytest.raises(ConfigError, match="algo.degree"):
        DPSGD.validate_config({**algo, "degree": 2}, 16)
    assert DPSGD.describe({**algo, "degree": 6}, 16)["topology"]["degree"] == 6
