"""Asynchronous AD-PSGD's virtual-time schedule (lsgd.algorithms.gossip.ad_psgd.virtual_plan, algo.pairing=
virtual_time): hand-computed cases, and the properties any schedule must have, checked by an
independent executor of every rank's operations (records and averagings)."""

from __future__ import annotations

import bisect
import itertools

import pytest

from lsgd.algorithms.gossip.ad_psgd import bipartite_neighbors, sides, virtual_plan
from lsgd.comm.topology import Topology


def test_equal_speeds_free_exchanges_hand_computed():
    """Two workers (0 active, 1 passive), 1 s steps, free exchanges, 3 steps: the active worker's
    request at k s reaches the passive one as its own step k ends; both apply step k at k s, so
    G(k) = 2k and the progress after step k is k. The request at 3 s (= t_end) never runs."""
    plans = virtual_plan(Topology("complete", 2), 0, [1.0, 1.0], lambda a, p: 0.0, 3)
    for node, peer in zip(plans, (1, 0)):
        assert node.times == [1.0, 2.0, 3.0]
        assert node.progress == [1, 2, 3]
        assert node.exchanges == {1: [(peer, 1.0)], 2: [(peer, 2.0)]}


def test_a_slow_passive_worker_answers_during_its_step_and_never_holds_the_active_one_up():
    """Active 0 steps in 1 s, passive 1 in 3 s, an averaging costs 0.5 s, 2 steps. Active: gradient
    done at 1 -> averaged at 1.5, next at 2.5 -> 3.0, then 4.0 -> 4.5 (it never waits for 1's
    compute). Passive: its step 1 (0..3) takes both requests of 1 and 2.5 (the second completes at
    3.0 = its compute end: it applies its gradient at 3); its step 2 (3..6) the one of 4.0. Ends
    1.5, 3, 3, 4.5 -> t_end = 4.5 (G = 4 = n x total). Levels: the averaging at 4.0 comes after
    G(3) = 3 -> floor(3/2) = 1 on both ends; so progress: active [0, 1, 2], passive [1, 2]."""
    plans = virtual_plan(Topology("complete", 2), 0, [1.0, 3.0], lambda a, p: 0.5, 2)
    active, passive = plans
    assert active.times == [1.5, 3.0, 4.5] and passive.times == [3.0, 6.0]
    assert active.exchanges == {1: [(1, 1.0)], 2: [(1, 2.5)], 3: [(1, 4.0)]}
    assert passive.exchanges == {1: [(0, 1.0), (0, 2.5)], 2: [(0, 4.0)]}
    assert active.progress == [0, 1, 2] and passive.progress == [1, 2]


def test_a_passive_worker_whose_ports_are_never_idle_still_steps():
    """Actives 0 and 2 share passive 1 (complete graph of 3: even / odd), 1 s steps, an averaging
    costs 1.5 s, 2 steps: requests come faster than the passive's port can serve them. At 1 both
    actives ask; 0's runs 1 -> 2.5 in the passive's step 1, 2's can start only at 2.5, after the
    passive's compute (0..1): its gradient goes first, step 1 ends at 2.5 and 2's averaging (2.5 ->
    4.0) is in its step 2 (compute 2.5..3.5). 0 asks again at 3.5 and starts at 4.0, after step 2's
    compute: step 2 ends at 4.0, the averaging (4.0 -> 5.5) is in step 3. 2 asks at 5.0; its
    averaging could start only at 5.5 = t_end (G = 6 = n x total at 2.5, 2.5, 4.0, 4.0, 5.5, 5.5),
    after the passive's last step: it does not run, and 2 stops at the end (5.5). Before the rule
    that a gradient goes before a queued averaging, the passive's step 1 never ended and the plan
    never returned."""
    active0, passive, active2 = virtual_plan(Topology("complete", 3), 0, [1.0] * 3, lambda a, p: 1.5, 2)
    assert active0.times == [2.5, 5.5] and passive.times == [2.5, 4.0, 5.5] and active2.times == [4.0, 5.5]
    assert active0.exchanges == {1: [(1, 1.0)], 2: [(1, 3.5)]} and active2.exchanges == {1: [(1, 1.0)]}
    assert passive.exchanges == {1: [(0, 1.0)], 2: [(2, 1.0)], 3: [(0, 3.5)]}
    assert active0.progress == [0, 2] and passive.progress == [0, 0, 2] and active2.progress == [1, 2]


def ops(plans, every=1):
    """Every rank's operations in its program order: in local step k its averagings (by their
    identity: time, active, passive), then the records it crosses at the boundary after k."""
    out = []
    for i, node in enumerate(plans):
        seq, prev = [], 0
        for k in range(1, node.steps + 1):
            for peer, x in node.exchanges.get(k, []):
                seq.append(("avg", x, frozenset((i, peer))))
            seq += [("rec", p) for p in range(prev + 1, node.progress[k - 1] + 1) if p % every == 0 or p == node.progress[-1]]
            prev = node.progress[k - 1]
        out.append(seq)
    return out


def execute(plans, every=1):
    """Run every rank's operations as blocking ones (a record needs every rank, an averaging its two
    ends); returns the global order, or fails on a deadlock."""
    seqs = [list(reversed(s)) for s in ops(plans, every)]
    order = []
    while any(seqs):
        heads = {i: s[-1] for i, s in enumerate(seqs) if s}
        done = False
        for i, op in heads.items():
            parties = range(len(seqs)) if op[0] == "rec" else op[2]
            if all(heads.get(j) == op for j in parties):
                for j in parties:
                    seqs[j].pop()
                order.append(op)
                done = True
                break
        assert done, f"deadlock: heads {heads}"
    return order


@pytest.mark.parametrize("topology,n", [("ring", 4), ("ring", 8), ("complete", 6), ("torus", 16), ("hypercube", 8)])
@pytest.mark.parametrize("cost", [0.0, 0.003, 0.05])
def test_invariants_under_heterogeneous_speeds(topology, n, cost):
    """Speeds 1, 1/2, 1/3, 1/4, ... (mod 5), averagings free, cheap, or dearer than a step (a
    passive's ports then never idle): every averaging is seen by both ends at one time, between
    an active worker and a passive neighbour, an active worker averages at most once a step, its
    gradient is applied at s + c, s = max(x, the passive's ports free) (it never waits for compute,
    only for the passive's port: one averaging at a time there, lsgd.clock.ports); progress is
    non-decreasing, below floor(G(t)/n) at each boundary, and reaches the total at each worker's
    last step only; and every rank's records and averagings, run as blocking operations, complete
    (no deadlock) with every record."""
    topo = Topology(topology, n, "uniform", 1)
    speeds = [1.0 / (1 + i % 5) for i in range(n)]
    step_s = [0.01 / v for v in speeds]
    total = 30
    plans = virtual_plan(topo, 3, step_s, lambda a, p: cost, total)
    side, nbrs = sides(topo), bipartite_neighbors(topo)
    # the passive's ports, replayed independently: its averagings in (x, active) order, back to back
    done_at = {}
    for p_, node in enumerate(plans):
        if side[p_] == 1:
            free = 0.0
            for x, a in sorted((x, a) for exs in node.exchanges.values() for a, x in exs):
                free = max(x, free) + cost
                done_at[(a, x)] = free
    seen = {}
    for i, node in enumerate(plans):
        for k, exs in node.exchanges.items():
            assert 1 <= k <= node.steps
            if side[i] == 0:
                assert len(exs) == 1
                peer, x = exs[0]
                assert x == pytest.approx((node.times[k - 2] if k > 1 else 0.0) + step_s[i], abs=1e-12)
                assert node.times[k - 1] == pytest.approx(done_at[(i, x)], abs=1e-12)
                assert node.times[k - 1] >= x + cost - 1e-12
            else:  # a passive worker's averagings start by its compute's end (a queued one waits a step)
                step_start = node.times[k - 2] if k > 1 else 0.0
                assert all(done_at[(a, x)] - cost <= step_start + step_s[i] + 1e-12 for a, x in exs)
            xs = [x for _, x in exs]
            assert xs == sorted(xs)
            for peer, x in exs:
                assert peer in nbrs[i] and side[peer] != side[i]
                seen.setdefault((x, frozenset((i, peer))), []).append(i)
    assert all(sorted(v) == sorted(k[1]) for k, v in seen.items())  # both ends, once each
    ends = sorted(itertools.chain.from_iterable(p.times for p in plans))
    t_end = ends[n * total - 1]
    for node in plans:
        assert all(a <= b for a, b in zip(node.progress, node.progress[1:]))
        assert node.progress[-1] == total and all(v < total for v in node.progress[:-1])
        assert node.times[-1] >= t_end and (node.steps == 1 or node.times[-2] < t_end)
        for t, v in zip(node.times[:-1], node.progress[:-1]):
            assert v <= bisect.bisect_right(ends, t) // n
    order = execute(plans)
    assert [op[1] for op in order if op[0] == "rec"] == list(range(1, total + 1))


def test_fast_workers_take_more_steps_and_the_run_lasts_the_step_budget():
    """Ring of 4, speeds 1, 1, 1, 1/4 (the slow one passive), 10 ms steps, 100 average steps: the
    fast workers take about 4x the slow one's steps, and the run ends when n x 100 steps are done,
    at about 4 x 100 x 10 ms / 3.25 (total speed), not at the slow worker's 100 x 40 ms."""
    step_s = [0.01, 0.01, 0.01, 0.04]
    plans = virtual_plan(Topology("ring", 4), 0, step_s, lambda a, p: 1e-4, 100)
    steps = [p.steps for p in plans]
    assert all(3.5 < s / steps[3] < 4.5 for s in steps[:3])
    end = max(p.times[-1] for p in plans)
    assert 4 * 100 * 0.01 / 3.25 <= end <= 4 * 100 * 0.01 / 3.25 * 1.05 + 0.04


def test_the_schedule_depends_on_the_seed_only():
    args = ([0.01, 0.02, 0.015, 0.03, 0.01, 0.02], lambda a, p: 0.001, 40)
    a = virtual_plan(Topology("complete", 6), 3, *args)
    b = virtual_plan(Topology("complete", 6), 3, *args)
    c = virtual_plan(Topology("complete", 6), 4, *args)
    assert [(p.exchanges, p.progress, p.times) for p in a] == [(p.exchanges, p.progress, p.times) for p in b]
    assert [p.exchanges for p in a] != [p.exchanges for p in c]


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="step times"):
        virtual_plan(Topology("complete", 2), 0, [0.01, 0.0], lambda a, p: 0.0, 3)
    with pytest.raises(ValueError, match="topology"):
        virtual_plan(Topology("complete", 4), 0, [0.01, 0.01], lambda a, p: 0.0, 3)


def test_the_option_is_checked_before_any_worker_starts():
    """The asynchronous pairing (the default: also when the key is absent) needs the modeled step
    times of cluster.compute=profile; under cluster.compute=measured the error names that key and
    the lock-step variant, which takes any compute model."""
    from lsgd.algorithms.gossip.ad_psgd import ADPSGD
    from lsgd.core.errors import ConfigError

    algo = {"name": "ad_psgd", "topology": "ring", "weights": "uniform", "average_buffers": True, "seed": 0}
    ADPSGD.validate_config({**algo, "pairing": "virtual_time"}, 4)
    ADPSGD.validate_config({**algo, "pairing": "lockstep"}, 4)
    assert ADPSGD.parse_config(algo).pairing == "virtual_time"  # absent: asynchronous, as published
    with pytest.raises(ConfigError, match="algo.pairing"):
        ADPSGD.validate_config({**algo, "pairing": "rounds"}, 4)
    for given in ({**algo, "pairing": "virtual_time"}, algo):
        with pytest.raises(ConfigError, match=r"cluster.compute=profile.*algo.pairing=lockstep"):
            ADPSGD.validate_run({"algo": given, "cluster": {"compute": "measured"}}, 4)
    ADPSGD.validate_run({"algo": algo, "cluster": {"compute": "profile"}}, 4)
    ADPSGD.validate_run({"algo": {**algo, "pairing": "lockstep"}, "cluster": {"compute": "measured"}}, 4)


def test_algo_ad_psgd_composes_to_the_asynchronous_algorithm():
    """Issue 41: ``algo=ad_psgd`` is the paper's asynchronous algorithm (algo.pairing=virtual_time)
    under the default compute model (cluster.compute=profile, nothing to set), labelled
    "asynchronous"; the lock-step form is a variant by name (``algo.pairing=lockstep``,
    ``variant=ad_psgd_lockstep``), labelled "lock-step"; ``cluster.compute=measured`` is refused
    before any worker starts, naming the keys to set."""
    from lsgd.algorithms.gossip.ad_psgd import ADPSGD
    from lsgd.config.validation import compose_config
    from lsgd.core.errors import ConfigError
    from lsgd.core.labels import config_label

    cfg = compose_config(["algo=ad_psgd", "launcher.nproc_per_node=4"])
    assert cfg["algo"]["pairing"] == "virtual_time" and cfg["cluster"]["compute"] == "profile"
    assert config_label(cfg, ADPSGD.label_facts(cfg)) == "AD-PSGD, ring, asynchronous"
    for over in (["algo=ad_psgd", "algo.pairing=lockstep"], ["experiment=swarm_fmnist", "variant=ad_psgd_lockstep"]):
        lock = compose_config([*over, "launcher.nproc_per_node=4"])
        assert lock["algo"]["pairing"] == "lockstep"
        assert config_label(lock, ADPSGD.label_facts(lock)) == "AD-PSGD, ring, lock-step"
    assert compose_config(["experiment=swarm_fmnist", "variant=ad_psgd_async"])["algo"]["pairing"] == "virtual_time"
    with pytest.raises(ConfigError, match=r"cluster.compute=profile.*algo.pairing=lockstep"):
        compose_config(["algo=ad_psgd", "cluster.compute=measured", "launcher.nproc_per_node=4"])
    compose_config(["algo=ad_psgd", "algo.pairing=lockstep", "cluster.compute=measured", "launcher.nproc_per_node=4"])


@pytest.mark.parametrize("n, d", [(16, 4), (64, 3), (64, 4)])
def test_a_random_regular_graph_is_split_by_a_local_max_cut(n, d):
    """Even / odd workers of a random regular graph leave about one worker in 2^d without a neighbour
    on the other side; the local max cut gives every worker at least half its neighbours across."""
    from lsgd.algorithms.gossip.ad_psgd import ADPSGD, check_bipartition

    topo = Topology("random_regular", n, seed=0, degree=d)
    side, nbrs = sides(topo), bipartite_neighbors(topo)
    assert side[0] == 0 and set(side.values()) == {0, 1}
    graph = topo.graph()
    for i in range(n):
        assert 2 * len(nbrs[i]) >= d
        assert nbrs[i] == sorted(j for j in graph.successors(i) if side[j] != side[i])
    check_bipartition(topo)
    algo = {"name": "ad_psgd", "topology": "random_regular", "degree": d, "seed": 0}
    ADPSGD.validate_config(algo, n)
    ADPSGD.validate_run({"algo": {**algo, "seed": None}, "seed": 0}, n)  # the run's seed: the same graph
