"""Asynchronous Local-SGD's pieces without processes: the virtual-time plan
(lsgd.algorithms.asynchronous.plan) against hand-computed cases and invariants, DyLU step counts, and the
delayed Nesterov outer optimizer against its formula (docs/papers.md#asynchronous-local-sgd)."""

from __future__ import annotations

import heapq
import random

import pytest
import torch

from lsgd.algorithms.asynchronous.async_local_sgd import AsyncLocalSGD, DelayedNesterov
from lsgd.algorithms.asynchronous.plan import dylu_steps, plan
from lsgd.core.errors import ConfigError


# -- the plan ------------------------------------------------------------------------------------
def test_two_workers_step_times_1_and_3_finish_at_2_4_6_6_ties_by_worker_id():
    """Step times 1 s and 3 s, H = 2, free messages, T = 4: worker 0 finishes at 2, 4, 6, worker
    1 at 6 (after worker 0's third, the tie going to the lower id); 8 local steps = 2 workers x 4."""
    p = plan([1.0, 3.0], [2, 2], [0.0, 0.0], [0.0, 0.0], 4)
    assert [(a.worker, a.task, a.finish_s, a.apply_s) for a in p.arrivals] == [
        (0, 0, 2.0, 2.0), (0, 1, 4.0, 4.0), (0, 2, 6.0, 6.0), (1, 0, 6.0, 6.0)]
    # worker 1 pulled version 0 and three updates were applied since
    assert [a.staleness for a in p.arrivals] == [0, 0, 0, 3]
    assert [a.progress for a in p.arrivals] == [1, 2, 3, 4]
    w0, w1 = p.workers
    # worker 0's boundaries at t = 1..7: inside a task, the arrivals applied by then; at a task's
    # end, the arrivals before its own; at t = 7 all four are in: T, it stops
    assert w0.times == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert w0.progress == [0, 0, 1, 1, 2, 2, 4]
    assert w0.push == {2: 0, 4: 1, 6: 2}
    assert w1.times == [3.0, 6.0, 9.0]
    assert w1.progress == [1, 3, 4]
    assert w1.push == {2: 3}
    # schedule: floor(local steps of both workers done by t / 2), at most T
    assert w0.schedule == [0, 1, 2, 2, 3, 4, 4]
    assert w1.schedule == [2, 4, 4]


def test_the_server_sends_one_model_at_a_time():
    """Step 1 s, H = 1, 0.5 s per message each way: both pushes reach the server at 1.5; worker 1's
    waits until the model for worker 0 has left (2.0), and so on."""
    p = plan([1.0, 1.0], [1, 1], [0.5, 0.5], [0.5, 0.5], 2)
    assert [(a.worker, a.arrive_s, a.apply_s, a.staleness, a.progress) for a in p.arrivals] == [
        (0, 1.5, 1.5, 0, 0), (1, 1.5, 2.0, 1, 1), (0, 3.5, 3.5, 1, 1), (1, 4.0, 4.0, 1, 2)]
    assert p.workers[0].times == [1.0, 3.0, 5.0]   # restarts at 2.0 (1.5 + 0.5), then at 4.0
    assert p.workers[1].times == [1.0, 3.5, 5.5]   # restarts at 2.5, then at 4.5
    assert p.end_s == 4.0


def test_dylu_step_counts():
    assert dylu_steps(6, [1.0, 2.0, 3.0, 1.5], True) == [6, 3, 2, 4]
    assert dylu_steps(2, [1.0, 3.0], True) == [2, 1]          # floor(2/3) = 0 -> at least 1
    assert dylu_steps(50, [0.58, 0.75, 1.51, 3.33], True) == [50, 38, 19, 8]
    assert dylu_steps(6, [1.0, 2.0], False) == [6, 6]


def _first_arrival_of_each_record(p):
    first = {}
    for i, a in enumerate(p.arrivals):
        prev = p.arrivals[i - 1].progress if i else 0
        for m in range(prev + 1, a.progress + 1):
            first[m] = i
    return first


def _operation_keys(p, w, total):
    """Worker w's blocking operations in the order it performs them (async_plan's keys): the push
    of arrival i is (i, 0, 0), its pull (j, 0, 1, i) with j the last arrival of its group, a record
    at progress m (first arrival reaching m, 1, m)."""
    first = _first_arrival_of_each_record(p)
    ops, made = [], 0
    for k, prog in enumerate(p.workers[w].progress, start=1):
        ops += [(first[m], 1, m) for m in range(made + 1, prog + 1)]
        made = max(made, prog)
        if k in p.workers[w].push and prog < total:
            i = p.workers[w].push[k]
            ops += [(i, 0, 0), (p.arrivals[i].group_end, 0, 1, i)]
    return ops


def _server_keys(p):
    """The server's operations in the order serve steps and bookkeeping perform them: per serve
    step its push, at a group's last arrival the group's pulls, then the records it crossed."""
    first = _first_arrival_of_each_record(p)
    ops, made = [], 0
    for i, a in enumerate(p.arrivals):
        ops.append((i, 0, 0))
        if a.group_end == i:
            ops += [(i, 0, 1, k) for k in p.group(i)]
        ops += [(first[m], 1, m) for m in range(made + 1, a.progress + 1)]
        made = max(made, a.progress)
    return ops


def _random_plan(seed, grace=0.0):
    rng = random.Random(seed)
    n = rng.randint(1, 5)
    step_s = [rng.choice([0.5, 1.0, 1.3, 2.0, 3.7]) for _ in range(n)]
    hs = [rng.randint(1, 4) for _ in range(n)]
    cost = [rng.choice([0.0, 0.1, 0.7]) for _ in range(n)]
    total = rng.randint(1, 30)
    return plan(step_s, hs, cost, cost, total, grace), total, step_s


@pytest.mark.parametrize("grace", [0.0, 0.3, 1.0, 4.0])
@pytest.mark.parametrize("seed", range(6))
def test_random_plans_keep_every_rank_in_one_global_order(seed, grace):
    """Random speeds, step counts and costs, with and without a grace period: progress never
    decreases and ends at T on every worker; each applied arrival is pushed once by its worker at
    its finish boundary; and every rank's records, pushes and pulls come in the global order of
    the deadlock-freedom argument (async_plan)."""
    p, total, step_s = _random_plan(seed, grace)
    assert p.arrivals[-1].progress == total
    assert all(a.progress < total for a in p.arrivals[:-1])
    applies = [a.apply_s for a in p.arrivals]
    assert applies == sorted(applies)
    assert sorted(i for wp in p.workers for i in wp.push.values()) == list(range(len(p.arrivals)))
    for w, wp in enumerate(p.workers):
        assert wp.progress == sorted(wp.progress) and wp.progress[-1] == total
        assert all(x < total for x in wp.progress[:-1])
        assert wp.schedule == sorted(wp.schedule) and wp.schedule[-1] <= total
        for k, i in wp.push.items():
            assert p.arrivals[i].worker == w and wp.times[k - 1] == p.arrivals[i].finish_s
            if k < wp.steps:  # the next task starts when the model is back
                assert wp.times[k] == p.arrivals[i].restart_s + step_s[w]
        ops = _operation_keys(p, w, total)
        assert ops == sorted(ops)
        assert sum(1 for op in ops if op[1] == 1) == total  # every record, once
    server = _server_keys(p)
    assert server == sorted(server) and sum(1 for op in server if op[1] == 1) == total
    # groups: members within the window of the first, one per worker, pulls one after another
    for i, a in enumerate(p.arrivals):
        members = list(p.group(i))
        head = p.arrivals[members[0]]
        assert a.arrive_s <= head.apply_s + grace
        assert len({p.arrivals[k].worker for k in members}) == len(members)
        if i != a.group_end:
            assert a.progress == (p.arrivals[members[0] - 1].progress if members[0] else 0)
        if grace == 0:
            assert members == [i]
    ends = [p.arrivals[k].restart_s for k in range(len(p.arrivals))]
    assert p.server_end_s == max(ends)


def _plan_before_grace_periods(step_s, hs, push_s, pull_s, total):
    """The arrival rules as they were before grace periods (rules 1-4 of async_plan, one arrival
    at a time): (worker, task, staleness, finish, arrive, apply, progress, restart) per arrival.
    With the server's ingress port (issue 22, LogGP): a push occupies it for its whole cost, so it
    is received at max(finish, end of the previous push) + push, not at finish + push, when the
    previous push (of a slower link: push_s differ by worker) still held the port."""
    n, heap, out = len(step_s), [], []
    tasks, pulled, applied, free, ingress = [0] * n, [0] * n, 0, 0.0, 0.0
    for w in range(n):
        heapq.heappush(heap, (0.0 + hs[w] * step_s[w] + push_s[w], w, 0.0 + hs[w] * step_s[w]))
    while True:
        arrive, w, finish = heapq.heappop(heap)
        ingress = max(finish, ingress) + push_s[w]
        apply = max(ingress, free)
        applied += hs[w]
        progress = min(total, applied // n)
        i = len(out)
        back = apply + pull_s[w]
        out.append((w, tasks[w], i - pulled[w], finish, arrive, apply, progress, back))
        free, pulled[w] = back, i + 1
        tasks[w] += 1
        if progress >= total:
            return out
        f = back + hs[w] * step_s[w]
        heapq.heappush(heap, (f + push_s[w], w, f))


@pytest.mark.parametrize("seed", range(40))
def test_a_zero_grace_period_is_the_plan_without_one_exactly(seed):
    """grace 0 (the default) handles one arrival at a time: the same arrivals, times, staleness and
    progress, bit for bit, as the rules before grace periods, on random plans (ties included)."""
    rng = random.Random(1000 + seed)
    n = rng.randint(1, 6)
    step_s = [rng.choice([0.25, 0.5, 1.0, 1.3, 2.0, 3.7]) for _ in range(n)]
    hs = [rng.randint(1, 5) for _ in range(n)]
    cost = [rng.choice([0.0, 0.1, 0.25, 0.7]) for _ in range(n)]
    total = rng.randint(1, 40)
    p = plan(step_s, hs, cost, cost, total)
    assert p == plan(step_s, hs, cost, cost, total, 0.0)
    got = [(a.worker, a.task, a.staleness, a.finish_s, a.arrive_s, a.apply_s, a.progress, a.restart_s)
           for a in p.arrivals]
    assert got == _plan_before_grace_periods(step_s, hs, cost, cost, total)
    assert all(a.group_start == a.group_end == i for i, a in enumerate(p.arrivals))


def test_grace_period_groups_arrivals_within_the_window_hand_computed():
    """Step times 1, 1.2, 2 s, H = 1, 0.1 s per message each way, grace 0.5 s, T = 2 (3 workers).
    Group 1: worker 0 arrives at 1.1 (window to 1.6), worker 1 at 1.3 joins, worker 2 at 2.1 does
    not; the model goes to worker 0 at 1.4 and to worker 1 at 1.5. Group 2: worker 2 at 2.1
    (window 2.6), worker 0 at 2.5 joins, worker 1 at 2.8 does not. Group 3: worker 1 alone at 2.8:
    it has the model at 2.9, not after the window (3.3 + 0.1): the server does not wait. Group 4:
    worker 0 at 3.8, worker 1 at 4.2; 7 local steps / 3 workers reach T = 2."""
    p = plan([1.0, 1.2, 2.0], [1, 1, 1], [0.1] * 3, [0.1] * 3, 2, grace_s=0.5)
    got = [(a.worker, a.staleness, a.apply_s, a.restart_s, a.progress, a.group_start, a.group_end) for a in p.arrivals]
    expected = [(0, 0, 1.1, 1.4, 0, 0, 1), (1, 1, 1.3, 1.5, 0, 0, 1),
                (2, 2, 2.1, 2.6, 0, 2, 3), (0, 1, 2.5, 2.7, 1, 2, 3),
                (1, 2, 2.8, 2.9, 1, 4, 4),
                (0, 1, 3.8, 4.3, 1, 5, 6), (1, 1, 4.2, 4.4, 2, 5, 6)]
    assert [g[:2] + g[4:] for g in got] == [e[:2] + e[4:] for e in expected]
    assert [g[2:4] for g in got] == [pytest.approx(e[2:4], abs=1e-12) for e in expected]
    w0, w1, w2 = p.workers
    # progress at a finish boundary: the arrivals before its group; the last task never arrives
    assert w0.progress == [0, 0, 1, 2] and w0.push == {1: 0, 2: 3, 3: 5}
    assert w0.times == pytest.approx([1.0, 2.4, 3.7, 5.3])
    assert w1.progress == [0, 1, 1, 2] and w1.push == {1: 1, 2: 4, 3: 6}
    assert w1.times == pytest.approx([1.2, 2.7, 4.1, 5.6])
    assert w2.progress == [0, 2] and w2.push == {1: 2}
    assert w2.times == pytest.approx([2.0, 4.6])
    assert p.server_end_s == pytest.approx(4.4)
    # without the grace period worker 0 is served alone and restarts at 1.1 + 0.1
    assert plan([1.0, 1.2, 2.0], [1, 1, 1], [0.1] * 3, [0.1] * 3, 2).arrivals[0].restart_s == pytest.approx(1.2)


def test_grace_period_two_workers_inside_and_outside_the_window():
    """Step times 1 and 1.4 s, H = 2, free messages, T = 2. Grace 1 s: worker 0 arrives at 2,
    worker 1 at 2.8 joins (both restart at 2.8, worker 1 one update stale). Grace 0.5 s: 2.8 is
    outside the window, worker 0 is served alone at 2 and restarts at once."""
    inside = plan([1.0, 1.4], [2, 2], [0.0, 0.0], [0.0, 0.0], 2, grace_s=1.0)
    a = inside.arrivals
    assert [(x.worker, x.staleness, x.progress, x.group_start, x.group_end) for x in a[:2]] == [
        (0, 0, 0, 0, 1), (1, 1, 2, 0, 1)]
    assert [x.restart_s for x in a[:2]] == pytest.approx([2.8, 2.8])
    assert len(a) == 2  # 4 local steps / 2 workers = T: the run ends with the group
    assert inside.workers[0].times == pytest.approx([1.0, 2.0, 3.8])  # one step after its pull
    assert inside.workers[0].progress == [0, 0, 2]
    outside = plan([1.0, 1.4], [2, 2], [0.0, 0.0], [0.0, 0.0], 2, grace_s=0.5)
    b = outside.arrivals
    assert [(x.worker, x.apply_s, x.restart_s, x.group_start, x.group_end) for x in b[:2]] == [
        (0, 2.0, 2.0, 0, 0), (1, 2.8, 2.8, 1, 1)]
    assert b[0].progress == 1


def test_least_visited_shards_hand_computed():
    """The first plan above (step times 1 and 3 s, H = 2, free messages, T = 4) with
    shard_policy=least_visited: worker 0 takes shard 0, worker 1 shard 1 at time 0 (2 steps each);
    at 2 worker 0 takes shard 0 again (tie 2 = 2, lower id), batches 2-3; at 4 shard 1 (2 < 4), its
    batches 2-3, so worker 0 reads on where worker 1 stopped; at 6 shard 0 (4 = 4), batches 4-5;
    worker 1, last, shard 1 from batch 4. The schedule is the shard's position (at most T). Arrivals
    and times are those of shard_policy=worker."""
    p = plan([1.0, 3.0], [2, 2], [0.0, 0.0], [0.0, 0.0], 4, shard_policy="least_visited")
    w0, w1 = p.workers
    assert w0.data == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (0, 4)]
    assert w0.schedule == [1, 2, 3, 4, 3, 4, 4]
    assert w1.data == [(1, 0), (1, 1), (1, 4)]
    assert w1.schedule == [1, 2, 4]
    q = plan([1.0, 3.0], [2, 2], [0.0, 0.0], [0.0, 0.0], 4)
    assert p.arrivals == q.arrivals and [w.times for w in p.workers] == [w.times for w in q.workers]
    assert q.workers[0].data == [(0, k) for k in range(7)] and q.workers[1].data == [(1, 0), (1, 1), (1, 2)]


@pytest.mark.parametrize("grace", [0.0, 1.0])
@pytest.mark.parametrize("seed", range(8))
def test_least_visited_reads_every_batch_once_and_keeps_shards_balanced(seed, grace):
    """Random plans: shard_policy=worker is the default plan exactly (own shard, batch = step);
    least_visited changes only the data and the schedule: no (shard, batch) is read twice, the
    steps given to the shards differ by at most the largest H (each task took the least-visited
    one), and the schedule is the shard's position."""
    rng = random.Random(500 + seed)
    n = rng.randint(1, 5)
    step_s = [rng.choice([0.5, 1.0, 1.3, 2.0, 3.7]) for _ in range(n)]
    hs = [rng.randint(1, 4) for _ in range(n)]
    cost = [rng.choice([0.0, 0.1, 0.7]) for _ in range(n)]
    total = rng.randint(1, 30)
    base = plan(step_s, hs, cost, cost, total, grace)
    assert plan(step_s, hs, cost, cost, total, grace, "worker") == base
    assert all(wp.data == [(w, k) for k in range(wp.steps)] for w, wp in enumerate(base.workers))
    p = plan(step_s, hs, cost, cost, total, grace, "least_visited")
    assert p.arrivals == base.arrivals
    assert [(w.progress, w.push, w.times) for w in p.workers] == [(w.progress, w.push, w.times) for w in base.workers]
    read = [d for wp in p.workers for d in wp.data]
    assert len(read) == len(set(read)) and all(0 <= s < n for s, _ in read)
    given = [0] * n
    for w, wp in enumerate(p.workers):
        for t in range(0, wp.steps, hs[w]):  # each task's first step names its shard and start
            shard, first = wp.data[t]
            assert wp.data[t:t + hs[w]] == [(shard, first + j) for j in range(len(wp.data[t:t + hs[w]]))]
            given[shard] = max(given[shard], first + hs[w])
        assert wp.schedule == [min(total, q + 1) for _, q in wp.data]
    assert max(given) - min(given) <= max(hs)
    with pytest.raises(ValueError, match="shard_policy"):
        plan(step_s, hs, cost, cost, total, grace, "random")


def test_grace_period_must_be_finite_and_not_negative():
    for bad in (-0.1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="grace_s"):
            plan([1.0], [1], [0.0], [0.0], 1, grace_s=bad)


# -- delayed Nesterov ------------------------------------------------------------------------------
G = [0.5, -1.0, 2.0, 0.25, -0.75, 1.5, 0.1]


def _run_dn(n, c, lr=0.7, beta=0.9):
    x = torch.tensor([1.0], dtype=torch.float64)
    opt = DelayedNesterov([x], lr, beta, n, c)
    out = []
    for g in G:
        x.grad = torch.tensor([g], dtype=torch.float64)
        opt.step()
        out.append(x.item())
    return out


@pytest.mark.parametrize("c", [0.0, 0.3])
def test_delayed_nesterov_follows_the_formula(c):
    """N = 3 on a scripted sequence, against docs/papers.md#asynchronous-local-sgd's rule written out by hand."""
    n, lr, beta = 3, 0.7, 0.9
    theta, m, delta, expected = 1.0, 0.0, 0.0, []
    for t, g in enumerate(G):
        delta += g
        if (t + 1) % n == 0:
            m = beta * m + delta / n
            theta -= lr * ((1 - c * n + c) * beta * m + g / n)
            delta = 0.0
        else:
            theta -= lr * (c * beta * m + g / n)
        expected.append(theta)
    assert _run_dn(n, c) == pytest.approx(expected, rel=1e-12, abs=1e-12)
    if c == 0.0:  # between momentum updates: plain SGD at lr / N
        assert expected[0] == pytest.approx(1.0 - lr * G[0] / n)


def test_delayed_nesterov_with_buffer_1_is_nesterov_per_arrival():
    x = torch.tensor([1.0], dtype=torch.float64)
    sgd = torch.optim.SGD([x], lr=0.7, momentum=0.9, nesterov=True)
    ref = []
    for g in G:
        x.grad = torch.tensor([g], dtype=torch.float64)
        sgd.step()
        ref.append(x.item())
    assert _run_dn(1, 0.0) == pytest.approx(ref, rel=1e-12, abs=1e-12)
    assert _run_dn(1, 0.5) == pytest.approx(ref, rel=1e-12, abs=1e-12)  # c cancels for N = 1


def test_delayed_nesterov_state_round_trips():
    x = torch.tensor([1.0, 2.0])
    opt = DelayedNesterov([x], 0.5, 0.9, 2)
    x.grad = torch.tensor([1.0, -1.0])
    opt.step()
    state = opt.state_dict()
    y = x.clone()
    other = DelayedNesterov([y], 0.5, 0.9, 2)
    other.load_state_dict(state)
    for opt_, p in ((opt, x), (other, y)):
        p.grad = torch.tensor([0.5, 0.5])
        opt_.step()
    assert torch.equal(x, y) and other.t == 2


# -- config ------------------------------------------------------------------------------------------
def _algo(**kw):
    return {"name": "async_local_sgd", "timing": "virtual", "local_steps": 4, "dylu": False,
            "outer_optimizer": "delayed_nesterov", "outer_lr": 0.7, "outer_momentum": 0.9, "dn_buffer": 2,
            "dn_c": 0.0, "staleness_exponent": 0.0, "max_staleness": None, **kw}


@pytest.mark.parametrize("key,value,match", [
    ("outer_optimizer", "adam", "algo.outer_optimizer='adam' is not allowed; allowed: sgd, nesterov, delayed_nesterov"),
    ("timing", "wall", "algo.timing='wall' is not allowed; allowed: virtual, real"),
    ("dn_buffer", 0, "algo.dn_buffer must be an integer >= 1"),
    ("outer_momentum", 1.0, "algo.outer_momentum must be a number >= 0 and < 1"),
    ("max_staleness", -1, "algo.max_staleness must be an integer or null >= 0"),
    ("local_steps", 0, "algo.local_steps must be an integer >= 1"),
    ("dylu", "yes", "algo.dylu must be true or false, got 'yes'"),
    ("grace_period_s", -0.5, "algo.grace_period_s must be a number >= 0"),
    ("grace_period_s", "0.5s", "algo.grace_period_s must be a number, got '0.5s'"),
    ("grace_period_s", float("inf"), "algo.grace_period_s must be a finite number >= 0"),
    ("shard_policy", "random", "algo.shard_policy='random' is not allowed; allowed: worker, least_visited"),
])
def test_config_errors_name_the_key_and_the_allowed_values(key, value, match):
    with pytest.raises(ConfigError, match=match):
        AsyncLocalSGD.validate_config(_algo(**{key: value}), 3)


def test_config_needs_two_processes_and_the_profile_clock():
    AsyncLocalSGD.validate_config(_algo(), 2)
    with pytest.raises(ConfigError, match="at least 2 processes"):
        AsyncLocalSGD.validate_config(_algo(), 1)
    with pytest.raises(ConfigError, match="cluster.compute=profile"):
        AsyncLocalSGD.validate_run({"algo": _algo(), "cluster": {"compute": "measured"}}, 3)


def _one_step_plan(**kw):
    """Step times 1 s and 3 s, H = 1, free messages, T = 4 (8 arrivals). In (finish, worker) order:
    worker 0 at 1, 2, 3, worker 1 at 3, worker 0 at 4, 5, 6, worker 1 at 6."""
    p = plan([1.0, 3.0], [1, 1], [0.0, 0.0], [0.0, 0.0], 4, **kw)
    assert [(a.worker, a.apply_s) for a in p.arrivals] == [(0, 1.0), (0, 2.0), (0, 3.0), (1, 3.0), (0, 4.0), (0, 5.0),
                                                           (0, 6.0), (1, 6.0)]
    return p


def test_staleness_counts_server_versions_not_arrivals():
    """issue 22 item 6, by hand on _one_step_plan's schedule (v: the server's version = outer steps).

    Every arrival a step: worker 1 pulled v0 and 3 steps came before its arrival at 3 (staleness
    3), then pulled v4; its arrival at 6 finds v7: 3. Worker 0's arrival at 4 pulled v3 and finds
    v4 (worker 1's step in between): 1.

    FedBuff K = 2 (a step per 2 arrivals: v = kept // 2 before each): worker 1 at 3 pulled v0, finds
    3 // 2 = v1: 1 (it was 3 arrivals); pulled v2, at 6 finds 7 // 2 = v3: 1 (3 arrivals). Worker 0 at
    4 pulled 3 // 2 = v1 and finds 4 // 2 = v2: 1.

    max_staleness = 0 (arrivals staler than 0 dropped, no step): worker 1 at 3 finds v3: staleness 3,
    dropped; worker 0 at 4 pulled v3 and finds v3 (the drop took no step): 0, kept (counting arrivals
    it would be 1, dropped); worker 1 pulled v3 at 3, at 6 finds v6: 3, dropped. 6 steps in all."""
    plain = _one_step_plan()
    assert [a.staleness for a in plain.arrivals] == [0, 0, 0, 3, 1, 0, 0, 3]
    assert not any(a.dropped for a in plain.arrivals)
    fedbuff = _one_step_plan(fedbuff=2)
    assert [a.staleness for a in fedbuff.arrivals] == [0, 0, 0, 1, 1, 0, 0, 1]
    # the same as FLSim's count from arrival indices without drops: q // K - p // K
    assert [a.staleness for a in fedbuff.arrivals] == [q // 2 - (q - s) // 2
                                                       for q, s in enumerate(a.staleness for a in plain.arrivals)]
    drop = _one_step_plan(max_staleness=0)
    assert [a.staleness for a in drop.arrivals] == [0, 0, 0, 3, 0, 0, 0, 3]
    assert [a.dropped for a in drop.arrivals] == [False, False, False, True, False, False, False, True]
    # FedBuff and dropping together, K = 2, max_staleness = 0: worker 1 at 3 finds v1 (3 arrivals kept):
    # 1, dropped; worker 0 at 4 pulled v1 (3 kept), finds v1: 0, kept (4 kept: v2); at 5 pulled v2:
    # 0 (5 kept); at 6 pulled v2: 0 (6 kept: v3); worker 1 pulled v1 at 3, at 6 finds v3: 2, dropped.
    both = _one_step_plan(fedbuff=2, max_staleness=0)
    assert [a.staleness for a in both.arrivals] == [0, 0, 0, 1, 0, 0, 0, 2]
    assert [a.dropped for a in both.arrivals] == [False, False, False, True, False, False, False, True]
    # the schedule itself does not depend on either
    for p in (fedbuff, drop, both):
        assert [(a.worker, a.apply_s, a.progress, a.restart_s) for a in p.arrivals] == [
            (a.worker, a.apply_s, a.progress, a.restart_s) for a in plain.arrivals]


def test_the_server_drops_and_steps_as_planned():
    """The server's apply on the plan's staleness drops exactly the planned arrivals and takes the
    planned number of steps (max_staleness = 0 on _one_step_plan: 6 steps, arrivals 3 and 7 dropped)."""
    p = _one_step_plan(max_staleness=0)
    algo = _server(max_staleness=0)
    for i, a in enumerate(p.arrivals):
        algo.apply(torch.tensor([1.0, 1.0, 1.0]), a.staleness, index=i)
        algo.served = i + 1
    assert algo.dropped == 2 and algo.server_updates() == 6
    assert [t.tolist() for t in algo.params] == [[-5.0, -4.0], [-3.0]]  # 6 SGD steps of 1 at lr 1


# -- the server's outer step with the staleness baselines ---------------------------------------------
def _server(**kw):
    algo = AsyncLocalSGD(_algo(outer_optimizer="sgd", outer_lr=1.0, **kw), comm=None)
    algo.params = [torch.tensor([1.0, 2.0]), torch.tensor([3.0])]
    algo.outer = algo._outer_optimizer()
    return algo


def test_polynomial_staleness_discount_scales_the_pseudo_gradient():
    """a = 0.5, staleness 3: g / (1 + 3)^0.5 = g / 2, applied with SGD at lr 1."""
    algo = _server(staleness_exponent=0.5)
    algo.apply(torch.tensor([2.0, -4.0, 1.0]), 3)
    assert [p.tolist() for p in algo.params] == [[0.0, 4.0], [2.5]]
    algo.apply(torch.tensor([2.0, -4.0, 1.0]), 0)  # fresh: undiscounted
    assert [p.tolist() for p in algo.params] == [[-2.0, 8.0], [1.5]]


def test_updates_staler_than_max_staleness_are_dropped():
    algo = _server(max_staleness=2)
    algo.apply(torch.tensor([1.0, 1.0, 1.0]), 3)
    assert [p.tolist() for p in algo.params] == [[1.0, 2.0], [3.0]] and algo.dropped == 1
    algo.apply(torch.tensor([1.0, 1.0, 1.0]), 2)
    assert [p.tolist() for p in algo.params] == [[0.0, 1.0], [2.0]] and algo.dropped == 1


def test_polynomial_discount_is_normalised_at_staleness_avg():
    """FLSim's PolynomialStalenessWeight: raw(s) / raw(avg) = ((1 + avg) / (1 + s))^a; a = 1, avg = 1,
    staleness 3: weight 2 / 4 = 1/2; staleness 1: weight 1."""
    algo = _server(staleness_exponent=1.0, staleness_avg=1.0)
    algo.apply(torch.tensor([2.0, -4.0, 1.0]), 3)
    assert [p.tolist() for p in algo.params] == [[0.0, 4.0], [2.5]]
    algo.apply(torch.tensor([2.0, -4.0, 1.0]), 1)
    assert [p.tolist() for p in algo.params] == [[-2.0, 8.0], [1.5]]


def test_fedbuff_steps_on_the_mean_of_every_k_arrivals():
    """K = 2, SGD at lr 1: the first arrival only fills the buffer; the second steps on (g0 + g1) / 2."""
    algo = _server(fedbuff=2)
    algo.apply(torch.tensor([2.0, 0.0, 4.0]), 0, index=0)
    assert [p.tolist() for p in algo.params] == [[1.0, 2.0], [3.0]]
    algo.apply(torch.tensor([0.0, 2.0, -2.0]), 1, index=1)
    assert [p.tolist() for p in algo.params] == [[0.0, 1.0], [2.0]]
    assert algo.buffer is None and algo.buffered == 2


def test_fedbuff_staleness_counts_server_steps():
    """K = 2, a = 1. The staleness passed is in server steps (the plan's): arrival 4 whose worker
    pulled when 1 arrival had been applied (server version 1 // 2 = 0) finds version 4 // 2 = 2: 2
    steps stale, weight 1 / 3. Arrival 5 whose worker pulled after arrival 3 (version 4 // 2 = 2)
    finds 5 // 2 = 2: 0 steps, weight 1. The step is on (g4 / 3 + g5) / 2 = (1 + 1) / 2 = 1 per
    coordinate."""
    algo = _server(fedbuff=2, staleness_exponent=1.0)
    algo.buffered = 4  # arrivals 0..3 already applied
    algo.apply(torch.tensor([3.0, 3.0, 3.0]), 2, index=4)
    algo.apply(torch.tensor([1.0, 1.0, 1.0]), 0, index=5)
    assert [p.tolist() for p in algo.params] == [[0.0, 1.0], [2.0]]


def test_fedbuff_config_errors():
    with pytest.raises(ConfigError, match="algo.fedbuff must be an integer or null >= 1"):
        AsyncLocalSGD.validate_config(_algo(fedbuff=0), 3)
    with pytest.raises(ConfigError, match="algo.staleness_avg"):
        AsyncLocalSGD.validate_config(_algo(staleness_avg=-1.0), 3)


def test_server_updates_count_outer_steps():
    """``server_updates`` (records' x axis): one per applied arrival, dropped ones excluded; with
    FedBuff K one per K buffered arrivals (the buffer's partial fill is no update yet)."""
    algo = _server(max_staleness=1)
    for i, staleness in enumerate([0, 2, 1]):  # the second is dropped
        algo.apply(torch.tensor([1.0, 1.0, 1.0]), staleness, index=i)
        algo.served = i + 1  # serve_step's count
    assert algo.server_updates() == 2 and algo.dropped == 1
    buffered = _server(fedbuff=2)
    counts = []
    for i in range(5):
        buffered.apply(torch.tensor([1.0, 1.0, 1.0]), 0, index=i)
        buffered.served = i + 1
        counts.append(buffered.server_updates())
    assert counts == [0, 1, 1, 2, 2]
