"""Topologies and mixing matrices against closed forms (lsgd/comm/topology.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lsgd.comm.topology import TOPOLOGIES, Topology, check, spectral_gap, torus_shape

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
