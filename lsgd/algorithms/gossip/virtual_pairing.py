"""Asynchronous SwarmSGD's schedule: who pairs with whom, and when, in virtual time.

SwarmSGD (Nadiradze et al. 2021, docs/papers.md#swarmsgd) is asynchronous: a node interacts when it has
done its local steps, with a neighbour that is free, and never waits for the rest of the network.
On real processes "free first" is a race; lsgd decides it on the cluster clock instead, so a run is
reproducible: every rank simulates the same schedule (:func:`plan`) from what all ranks know (the
seed, the topology, every worker's modeled seconds per local step under ``cluster.compute=profile``
and ``cluster.speeds``, and the modeled cost of one exchange) and then only follows its own part.
No message decides anything: the two ends of an exchange agree because they run the same plan.

The rules (one event per finished local step, processed in virtual-time order, ties by node id):

1. A node that has finished the ``H_{i,r}`` local steps of its round (``round_length``) is *free*.
   It picks, uniformly at random (an RNG seeded by ``(seed, node, round)``), one of its neighbours
   in the topology's round graph that is not already engaged (waiting for a partner, asked by
   another node, or finished with the run), preferring those that finish their own round at the
   same instant, and asks it. With no such neighbour it is left out: it starts its next round at
   once (it keeps computing). With equal speeds and a fixed H every round is thus a random maximal
   matching and no node waits.
2. An asked node finishes the local step it is in (a node is never interrupted mid-step), then
   the two exchange. The asking node waits for that (less than one of the partner's steps); both
   start a new round afterwards (``H`` local steps since their last interaction, as in the paper).
3. The exchange happens at ``x = max(ready_i, ready_j)``. Blocking: both resume at ``x + c``
   (``c`` = the modeled cost of the exchange on the pair's link). Non-blocking: both resume at
   ``x`` and the message arrives at ``x + c``; the node applies it at its next interaction (rule 1
   or 2: it is then ready at ``max(now, x + c)``) or at the end of the run.

Progress (what records, evaluation, checkpoints and stopping count): nodes take different
numbers of local steps, so a node's progress after a step is the network's average step count at
the virtual time the node is at: ``floor(G(t) / n)`` with ``G(t)`` the local steps all nodes
have finished by ``t`` (clipped to the run's total). For a step after which the node exchanges,
``t`` is the exchange time ``x`` (both ends see the same ``t``); otherwise the step's end. Because
records follow virtual time and every rank makes each record before the exchanges that come after
it (``Trainer.bookkeeping`` makes records before ``before_step`` runs the exchange), no rank can
wait in an exchange for a partner that waits in a record's collective: the schedule is deadlock
free by construction. The run ends, on each node, at its first step whose progress reaches the
total; an exchange planned after that never starts on either end.

What the plan does not foresee: a lattice decode outside the safe radius resends tensors at full
precision, and a checkpoint completes a non-blocking exchange early; both cost time the clock
counts but the plan (already fixed) does not, so the clock and the plan can drift apart slightly.
The pairing stays what the plan says, on every rank.

Why hand-written: the pairing rule and its virtual-time order are the algorithm being studied
(no library schedules decentralized exchanges by simulated availability); the event queue is
Python's ``heapq``.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from lsgd.core.seeding import derive_seed
from lsgd.comm.topology import Topology

LEFT_OUT = -1



def check_plan_inputs(topology: Topology, step_s: Sequence[float], total_steps: float, members: str = "nodes") -> None:
    """The inputs every virtual-time schedule shares (SwarmSGD's :func:`plan`, AD-PSGD's
    ``virtual_plan``): one step time per member of ``topology``, each > 0 seconds, and a run of at
    least one progress step.

    Raises:
        ValueError: a step time <= 0, a topology of another size, or total_steps < 1.
    """
    n = len(step_s)
    if n != topology.n:
        raise ValueError(f"{n} step times for a topology of {topology.n} {members}")
    if any(not t > 0 for t in step_s):
        raise ValueError(f"step times must be > 0, got {list(step_s)}")
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")


def check_virtual_time_run(cfg: dict, otherwise: str = "") -> None:
    """``algo.pairing=virtual_time`` simulates the schedule from modeled step times, so it needs
    ``cluster.compute=profile`` (an algorithm's ``validate_run``, before any worker starts).

    Args:
        cfg: the run's config; ``cfg["algo"]["pairing"]`` the pairing it runs (the caller fills in
            its algorithm's default where the key is absent).
        otherwise: the other setting that takes any compute model, named in the error (e.g.
            ``"algo.pairing=lockstep, AD-PSGD's lock-step variant"``).

    Raises:
        ConfigError: naming ``cluster.compute`` and the value it needs.
    """
    from lsgd.core.errors import ConfigError

    if (cfg.get("algo") or {}).get("pairing") == "virtual_time":
        compute = (cfg.get("cluster") or {}).get("compute", "profile")
        if compute != "profile":
            raise ConfigError(f"algo.pairing=virtual_time needs cluster.compute=profile (the schedule is "
                              f"simulated from modeled step times); got cluster.compute={compute!r}"
                              + (f"; or set {otherwise}" if otherwise else ""))

@dataclass
class NodePlan:
    """One node's part of the schedule.

    Attributes:
        progress: ``progress[k - 1]`` = the run's progress after this node's local step ``k``
            (ints, non-decreasing, the last one = the total): the node stops after its last one.
        action: ``{k: partner}`` after local step ``k`` the node exchanges with ``partner``, or
            is left out of round ``r`` (``LEFT_OUT``); steps not in it continue the round.
        times: ``times[k - 1]`` = the virtual time (s) of the boundary after step ``k`` (the
            exchange time ``x`` where there is one), for diagnostics and tests.
    """

    progress: list[int] = field(default_factory=list)
    action: dict[int, int] = field(default_factory=dict)
    times: list[float] = field(default_factory=list)

    @property
    def steps(self) -> int:
        """Local steps this node takes in the run."""
        return len(self.progress)


def plan(topology: Topology, seed: int, round_steps: Callable[[int, int], int], step_s: Sequence[float],
         cost_s: Callable[[int, int], float], blocking: bool, total_steps: int) -> list[NodePlan]:
    """The asynchronous SwarmSGD schedule of every node (module docstring).

    Args:
        topology: the nodes' graph (its round-``r`` graph for a node in its round ``r``).
        seed: the run's matching seed.
        round_steps: ``(node, round) -> H_{i,r}``, local steps of a node's round (>= 1).
        step_s: modeled compute seconds per local step of each node (length n, > 0).
        cost_s: ``(i, j) -> c``, modeled seconds of one exchange between i and j (>= 0).
        blocking: whether the exchange blocks (True) or overlaps the next round (False).
        total_steps: the run's length in progress units (average local steps per node, >= 1).

    Returns:
        One :class:`NodePlan` per node.

    Raises:
        ValueError: a step time <= 0, a topology of another size, or total_steps < 1.
    """
    check_plan_inputs(topology, step_s, total_steps, "nodes")
    n = len(step_s)
    plans = [NodePlan() for _ in range(n)]
    rounds = [0] * n
    left = [round_steps(i, 0) for i in range(n)]
    arrival: list[float | None] = [None] * n   # non-blocking: when the pending exchange's message lands
    asked: dict[int, int] = {}                 # asked node -> the node waiting for it
    waiting: dict[int, float] = {}             # waiting node -> its ready time
    done = [False] * n
    ends: list[float] = []                     # every finished local step's end time, ascending
    t_end: float | None = None                 # when G reaches n x total
    import networkx as nx  # here, not at import (lsgd.comm.topology says why)

    adjacency: dict[int, list[list[int]]] = {}  # round key -> sorted neighbours of every node
    heap = [(float(step_s[i]), i) for i in range(n)]
    heapq.heapify(heap)

    def neighbours(i: int) -> list[int]:
        r = rounds[i]
        key = r % topology.period if topology.period else r
        if key not in adjacency:
            graph = nx.Graph(topology.graph(r).to_undirected())
            adjacency[key] = [sorted(graph.neighbors(j)) for j in range(n)]
        return adjacency[key][i]

    def ready(i: int, t: float) -> float:
        """The node at ``t`` after applying its pending non-blocking exchange."""
        if arrival[i] is not None:
            t, arrival[i] = max(t, arrival[i]), None
        return t

    def new_round(i: int) -> None:
        rounds[i] += 1
        left[i] = round_steps(i, rounds[i])

    next_end = [float(step_s[i]) for i in range(n)]  # when each computing node's current step ends

    def resume(i: int, t: float) -> None:
        next_end[i] = t + float(step_s[i])
        heapq.heappush(heap, (next_end[i], i))

    def mark(i: int) -> None:
        if t_end is not None and plans[i].times and plans[i].times[-1] >= t_end:
            done[i] = True

    while not all(done):
        if not heap:  # every node not done is waiting: cannot happen (an asked node computes)
            raise RuntimeError("virtual pairing: no event left before every node finished")
        t, i = heapq.heappop(heap)
        if done[i]:
            continue
        ends.append(t)
        if t_end is None and len(ends) >= n * total_steps:
            t_end = t
            for j in range(n):
                mark(j)
        node = plans[i]
        node.progress.append(0)  # filled in at the end from the times
        k = len(node.progress)
        left[i] -= 1
        if i in asked:  # rule 2: serve the node that asked, now that this step is done
            a = asked.pop(i)
            ready_a = waiting.pop(a)
            x = max(ready_a, ready(i, t))
            node.times.append(x)
            node.action[k] = a
            plans[a].times.append(x)
            plans[a].action[len(plans[a].progress)] = i
            c = float(cost_s(min(a, i), max(a, i)))
            for m in (a, i):
                new_round(m)
                if blocking:
                    resume(m, x + c)
                else:
                    arrival[m] = x + c
                    resume(m, x)
                mark(m)
            continue
        node.times.append(t)
        mark(i)
        if done[i]:
            continue
        if left[i] > 0:
            resume(i, t)
            continue
        # rule 1: free
        engaged = set(asked) | set(waiting)
        free = [j for j in neighbours(i) if j not in engaged and not done[j]]
        # a neighbour that ends its round at this very instant is free too: prefer those (equal
        # speeds then pair up like a matching, with no one waiting)
        now_free = [j for j in free if next_end[j] == t and left[j] == 1]
        free = now_free or free
        t_ready = ready(i, t)
        if free:
            rng = np.random.default_rng(derive_seed("swarm_async_partner", int(seed), i, rounds[i]))
            j = free[int(rng.integers(len(free)))]
            asked[j] = i
            waiting[i] = t_ready
            node.times.pop()  # this boundary's time is the exchange's, set when j serves the request
        else:
            node.action[k] = LEFT_OUT
            new_round(i)
            resume(i, t_ready)

    # progress from the boundary times: floor(G(t) / n), clipped; G counts ends <= t
    for node in plans:
        node.progress = [min(total_steps, bisect.bisect_right(ends, x) // n) if x < (t_end or float("inf")) else total_steps
                         for x in node.times]
        for a, b in zip(node.progress, node.progress[1:]):
            assert a <= b, "virtual pairing: progress must not decrease"
    return plans


__all__ = ["LEFT_OUT", "NodePlan", "plan"]
