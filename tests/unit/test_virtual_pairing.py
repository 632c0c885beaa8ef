"""Asynchronous SwarmSGD's virtual-time schedule (lsgd.algorithms.gossip.virtual_pairing): hand-computed
cases and the invariants any schedule must keep."""

from __future__ import annotations

import bisect
import itertools

import networkx as nx
import pytest

from lsgd.algorithms.gossip.swarm_sgd import round_length
from lsgd.algorithms.gossip.virtual_pairing import LEFT_OUT, plan
from lsgd.comm.topology import Topology


def fixed(h):
    return lambda i, r: h


def exchanges(plans):
    """{(i, k): (j, x)}: node i exchanges with j after its step k at virtual time x."""
    return {(i, k): (j, p.times[k - 1]) for i, p in enumerate(plans) for k, j in p.action.items() if j != LEFT_OUT}


def test_two_nodes_of_different_speeds_hand_computed():
    """Node 0 steps in 1 s, node 1 in 2 s, H = 1, free exchanges, 3 steps. Node 0 asks node 1 at
    t = 1, 3, 5; node 1 answers after its steps, at t = 2, 4, 6 (x = max(ready)); both resume at x.
    G(2) = 2, G(4) = 4 finished steps, so progress 1, 2, then 3 at t_end = 6 (G = 6 = n x total)."""
    plans = plan(Topology("complete", 2), 0, fixed(1), [1.0, 2.0], lambda i, j: 0.0, True, 3)
    for p, partner in zip(plans, (1, 0)):
        assert p.times == [2.0, 4.0, 6.0]
        assert p.progress == [1, 2, 3]
        assert p.action == {1: partner, 2: partner, 3: partner}  # the last one lies past the end: never run


@pytest.mark.parametrize("blocking", [True, False])
def test_equal_speeds_pair_up_like_matchings_and_progress_is_the_local_step(blocking):
    """Equal speeds, fixed H = 2, complete graph on 4 nodes: every round is a perfect matching, no one
    waits, so the boundary after step k is at k t + (exchanges so far) c when blocking and k t when
    not (the message lands within the next round: c < H t), and progress = k."""
    t, c, h, total = 0.01, 0.003, 2, 12
    plans = plan(Topology("complete", 4), 5, fixed(h), [t] * 4, lambda i, j: c, blocking, total)
    for p in plans:
        assert p.steps == total
        assert p.progress == list(range(1, total + 1))
        assert sorted(p.action) == list(range(h, total + 1, h))
        for k in range(1, total + 1):
            before = (k - 1) // h if blocking else 0
            assert p.times[k - 1] == pytest.approx(k * t + before * c, rel=1e-12)
    for k in range(h, total + 1, h):  # each round: a perfect matching
        partners = {i: p.action[k] for i, p in enumerate(plans)}
        assert all(partners[partners[i]] == i != partners[i] for i in partners)


@pytest.mark.parametrize("topology,n", [("ring", 8), ("complete", 6), ("torus", 9), ("exponential", 8)])
@pytest.mark.parametrize("blocking", [True, False])
def test_invariants_under_heterogeneous_speeds(topology, n, blocking):
    """Both ends of every exchange agree on it and on its time, partners are neighbours, each node's
    exchanges are in time order, progress is non-decreasing and reaches the total exactly at the end,
    and about n x total local steps are taken in all."""
    topo = Topology(topology, n, "uniform", 1)
    speeds = [1.0 / (1 + (i % 3)) for i in range(n)]  # speeds 1, 1/2, 1/3
    total, h = 40, 3
    steps = lambda i, r: round_length(h, "geometric", 11, i, r)
    plans = plan(topo, 11, steps, [0.01 / v for v in speeds], lambda i, j: 0.002 + 0.001 * (i + j), blocking, total)
    edges = {frozenset(e) for e in nx.Graph(topo.graph(0).to_undirected()).edges()}
    ex = exchanges(plans)
    by_pair = {}
    for (i, k), (j, x) in ex.items():
        assert frozenset((i, j)) in edges
        by_pair.setdefault(frozenset((i, j)), []).append((x, i))
    for pair, events in by_pair.items():  # every exchange is seen by both ends, at one time
        a, b = sorted(pair)
        assert sorted(x for x, i in events if i == a) == sorted(x for x, i in events if i == b)
    for p in plans:
        assert all(a <= b for a, b in zip(p.progress, p.progress[1:]))
        assert p.progress[-1] == total and all(v < total for v in p.progress[:-1])
        xs = [p.times[k - 1] for k in sorted(p.action)]
        assert xs == sorted(xs)
    assert n * total <= sum(p.steps for p in plans) <= n * total + 2 * n


def test_fast_nodes_take_more_steps_and_pair_with_each_other():
    """Complete graph, nodes 0-3 four times faster than nodes 4-7: the fast ones take about four
    times the steps, and most of their exchanges are among themselves."""
    speeds = [1.0] * 4 + [0.25] * 4
    plans = plan(Topology("complete", 8), 2, fixed(2), [0.01 / v for v in speeds], lambda i, j: 1e-4, True, 200)
    fast = sum(p.steps for p in plans[:4]) / 4
    slow = sum(p.steps for p in plans[4:]) / 4
    assert fast / slow > 3
    ex = exchanges(plans)
    among_fast = sum(1 for (i, _), (j, _) in ex.items() if i < 4 and j < 4)
    assert among_fast / sum(1 for (i, _) in ex if i < 4) > 0.6


def test_progress_is_the_network_average_step_count_at_the_node_time():
    """floor(G(t) / n): recomputed here from every node's step end times in a run without waits
    (free exchanges; nodes 0 and 1 three times as fast as 2 and 3, so every boundary falls on a
    grid where a partner ends its round at the same instant; binary-exact times)."""
    step_s = [0.25, 0.25, 0.75, 0.75]
    plans = plan(Topology("complete", 4), 0, fixed(1), step_s, lambda i, j: 0.0, True, 30)
    ends = sorted(itertools.chain.from_iterable(p.times for p in plans))
    for p in plans:
        for k, (x, v) in enumerate(zip(p.times, p.progress), start=1):
            if v < 30:
                assert v == bisect.bisect_right(ends, x) // 4


def test_the_schedule_depends_on_the_seed_only():
    args = (fixed(2), [0.01, 0.02, 0.015, 0.03, 0.01, 0.02], lambda i, j: 0.001, True, 50)
    a = plan(Topology("complete", 6), 3, *args)
    b = plan(Topology("complete", 6), 3, *args)
    c = plan(Topology("complete", 6), 4, *args)
    assert [(p.action, p.progress) for p in a] == [(p.action, p.progress) for p in b]
    assert [p.action for p in a] != [p.action for p in c]


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="step times"):
        plan(Topology("complete", 2), 0, fixed(1), [0.01, 0.0], lambda i, j: 0.0, True, 3)
    with pytest.raises(ValueError, match="topology"):
        plan(Topology("complete", 3), 0, fixed(1), [0.01, 0.01], lambda i, j: 0.0, True, 3)
