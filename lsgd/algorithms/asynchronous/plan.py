"""Asynchronous Local-SGD's schedule in virtual time: which worker's update the server applies
next, and every rank's progress at every point of the run.

Liu, Douillard et al. 2024, "Asynchronous Local-SGD Training for Language Modeling" (arXiv
2401.09135; docs/papers.md#asynchronous-local-sgd) simulate time deterministically: a worker's task lasts its
local steps times its seconds per step (+ communication), and the server applies the update with
the earliest virtual finish time next (ties broken by worker id). lsgd runs real processes but
decides this order on the cluster clock, so a run is reproducible: every rank computes the same
:func:`plan` from what all ranks know (every worker's modeled seconds per local step under
``cluster.compute=profile`` and ``cluster.speeds``, the local step counts, the modeled cost of one
message each way) and then follows its own part. No message decides anything.

The rules (times in modeled seconds; workers indexed 0..W-1 among the workers):

1. Worker ``w`` starts its task 0 at time 0 from the server's model (version 0). Its task takes
   ``H_w`` local steps of ``step_s[w]`` seconds each: its local step boundaries fall at
   ``start + j x step_s[w]`` (j = 1..H_w), the last one is the task's *finish* ``f``; the push of
   the pseudo-gradient reaches the server at ``a = f + push_s[w]`` (its *arrival*).
2. The server takes arrivals in order of ``(a, w)`` (virtual finish time, ties by worker id). It
   handles one at a time: it receives arrival ``i`` at
   ``r_i = max(e_i, r_{i-1} + pull_s[w_{i-1}])`` (it was busy sending the previous model back),
   ``e_i = max(f_i, e_{i-1}) + push_s[w_i]`` the push's end on the server's ingress port (pushes
   take the port one at a time, :mod:`lsgd.clock.ports`; ``e_i = a_i`` unless the previous push
   still held it),
   applies the outer step (no modeled time), and sends the new model back, which the worker has
   at ``r_i + pull_s[w]``: it starts its next task then, from the server's model after arrival
   ``i``. These are exactly the cluster clock's point-to-point rules (:mod:`lsgd.clock.worker_clock`), so the
   processes' clocks follow the plan.
3. Staleness of arrival ``i`` = the server's version now minus the version the worker started
   from: the outer steps the server took between the worker's pull and this push. Without FedBuff
   or dropping every arrival is one step, so it is the arrivals received in between; with
   ``max_staleness`` a dropped arrival (staleness above it) takes no step, and with FedBuff
   (``fedbuff`` = K) the server steps once per K kept arrivals, so neither counts as a version.
4. Progress (what records, evaluation, checkpoints and stopping count) after arrival ``i`` is
   ``min(T, floor(sum of H over arrivals 0..i / W))``: the local steps of the applied tasks, per
   worker, so a run of ``T`` progress steps spends the compute of ``W`` workers x ``T`` local
   steps on the server's model. The run ends with the first arrival whose progress reaches ``T``.
5. Grace period ``g = grace_s > 0`` (Liu et al. 2024's simulation; the DeepMind toy notebook's
   ``max_wait_time``, 0.5 simulated s there): arrivals are handled in *groups*. The server takes
   the next arrival ``i0`` in ``(a, w)`` order at ``r_i0 = max(a_i0, end of its last send)``; every
   further arrival with ``a <= r_i0 + g`` joins its group (in ``(a, w)`` order; those that reached
   the server while it was still sending join too; a worker is in a group at most once, as its
   next task starts after the group). The group's pushes are received back to back,
   ``r_k = max(e_k, r_{k-1})`` (``e_k`` as in rule 2: near-simultaneous pushes serialize on the
   server's ingress), each applied in turn with its own staleness (rule 3: the second
   member of a group is at least 1 stale, the first member's update being applied before it).
   Only then does the server send the model after the whole group to each member, in the group's
   order, one at a time on its egress port: member ``k`` has it at ``s_k = s_{k-1} + pull_s[w_k]`` (``s`` of
   the first member = ``r`` of the last + its pull cost) and restarts then. Only the group's last
   arrival advances progress: every other member's progress is the progress before the group
   (rule 4 applied to the last member counts the whole group's steps). The run ends with the first
   group whose last arrival's progress reaches ``T``; all its members are applied and pull.
   ``g = 0`` turns grouping off (every group is one arrival: rules 2-4 exactly, bit for bit; two
   arrivals at the very same time are then still handled one after the other).

   The server does *not* wait for the end of the window when nobody else arrives in it: the group
   closes at its last member, and the sends start at once (``r`` of the last member). This is the
   notebook's rule (its ``time_now`` moves to each joining worker's finish time and the idle
   workers restart at ``time_now`` as soon as the next finish falls outside the window; it never
   jumps to the window's end), so a grace period only batches near-simultaneous arrivals and
   never idles the cluster. It needs foresight a real server lacks (it would have to wait up to
   ``g`` to learn that nobody comes, or have workers announce their finish); in virtual time every
   rank knows the whole schedule, so the plan applies the notebook's rule as it is.

Each rank's progress at each point, and why no rank can block in a point-to-point operation
while its peer blocks in a collective (records, evaluations and checkpoints are collectives of
every rank, made at the progress multiples each rank crosses, in order: the trainer's
non-lockstep bookkeeping). Without a grace period every group is one arrival, so this is also the
argument for ``g = 0``:

* The server's progress after its ``i``-th serve step is arrival ``i``'s. A serve step receives
  arrival ``i``'s push and applies it; the serve step of a group's last arrival then sends the
  model to every member of the group. So the server makes the records a group crosses right after
  the group's pushes and pulls (a group's other members do not move progress: no records in
  between).
* A worker at a local step boundary at time ``t`` inside a task has the progress of the arrivals
  with ``r <= t`` (a prefix of the server's order: ``r`` is non-decreasing along it; a prefix
  ending inside a group has the progress before that group).
* A worker at the finish boundary of a task whose arrival is ``i`` has the progress of the
  arrivals *strictly before* ``i`` in the server's order (whatever their times), which is the
  progress before ``i``'s group; the trainer makes that boundary's records, then the
  algorithm's ``before_step`` pushes and pulls. Its next boundary (after ``s_i``, which is after
  ``r`` of the group's last arrival) counts the whole group.
* A worker whose task would arrive after the last applied group never pushes it: it stops at its
  first boundary whose progress reaches ``T`` (at the latest that task's finish boundary, whose
  "arrivals strictly before" are all applied ones). The workers of the last applied group take
  one more local step after their push and pull, and stop there.

Give every operation a key: the push of arrival ``i`` has key ``(i, 0, 0)``; the pull (model
back) of arrival ``i`` whose group ends with arrival ``j`` has key ``(j, 0, 1, i)``; a record at
progress count ``m`` has key ``(j, 1, m)`` with ``j`` the first arrival whose progress reaches
``m`` (always the last arrival of a group). Keys compare as tuples. The server performs all its
operations in increasing key order: a group's pushes ``(i0, 0, 0) .. (j, 0, 0)``, its pulls
``(j, 0, 1, i0) .. (j, 0, 1, j)``, its records ``(j, 1, m)``, then the next group's. So does every
worker. At a boundary at time ``t`` inside a task whose arrival is ``i`` it makes the records of
groups whose last arrival ``j`` has ``r_j <= t``; each such ``j < i``, since ``j >= i`` would give
``r_j >= r_i >= a_i >= f_i > t``; so their keys are below its next push ``(i, 0, 0)``. At its
finish boundary it makes exactly the records of arrivals before ``i`` (keys ``(j, 1, m)`` with
``j < i``; within ``i``'s group only the last arrival has records, and it is ``>= i``), then the
push ``(i, 0, 0)`` and the pull ``(J, 0, 1, i)``, ``J`` the last of its group, and afterwards only
records of groups ending at ``>= J`` (every record of an earlier arrival was at most the progress
before the group, made already), whose keys ``(>= J, 1, m)`` are above the pull's. Every rank takes
part in every record, and the server and worker ``w`` in every push and pull of ``w``. Hence each
rank's blocking operations are the subsequence, in one global order, of the operations it takes
part in; the smallest operation not yet complete has every participant waiting at it (each has
completed all smaller ones and computes only in between), so it completes: no deadlock, by
induction. (A member of a group waits in its pull while the server receives the other members'
pushes: those are smaller keys, each with a participant that is waiting at it.) Point-to-point
messages travel on one 2-rank process group per (server, worker) pair, so a worker's messages
never wait behind another worker's.

The cluster clock follows the plan: a push is received at ``max(server ready, a)`` and a send
starts when the previous one ended (:mod:`lsgd.clock.worker_clock`'s point-to-point rules), which are the
``r`` and ``s`` above; records are uncounted and move no clock.

The learning-rate schedule of a worker follows the network's average local step count at the
boundary's time (:attr:`WorkerPlan.schedule`): ``min(T, floor(G(t) / W))`` with ``G(t)`` the local
step boundaries of all workers at times ``<= t`` (one worker: its own step count, as in sync
DiLoCo).

Data (:attr:`WorkerPlan.data`, ``shard_policy``). ``worker`` (default): worker ``w`` reads its own
shard ``w``, its local step ``k`` the shard's batch ``k - 1``. ``least_visited`` (Liu et al. 2024's
simulation; the DeepMind toy notebook's ``sample_data``): there are W shards, and each new task
takes the least-visited shard, visits being the local steps of the tasks given to it so far (tasks
under way included, counted when they start, as the notebook's ``local_updates``), ties by shard
id (the notebook draws among the tied at random). Tasks are given out in the order they start: at
time 0 worker ``w`` gets shard ``w``; later, each group's members in the group's order. A task of
``H`` steps on a shard visited ``p`` times reads the shard's batches ``p .. p + H - 1``, so every
shard is read as one stream, each batch once, whichever workers read it (so shards are taken in
proportion to lag: a slow worker's shard is handed to faster workers). The learning-rate schedule
is per shard (warm-up + cosine of each shard's stream, as the notebook's schedule per data shard
of length T): after the step reading batch ``q`` of its shard, ``min(T, q + 1)``.

DyLU (dynamic local updates, Liu et al. 2024 section 3.3): worker ``w`` runs
``max(1, floor(v_w / max_w' v_w' x H))`` local steps per task, ``v`` its speed (1 / step_s):
:func:`dylu_steps`.

Why hand-written: the arrival order and the per-rank progress are the algorithm under study (the
DeepMind notebook and HALoS, utnslab/halos src/halos/simulation, use a heap of (virtual finish
time, worker id) too); the event queue is Python's ``heapq``.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

#: added before flooring the DyLU ratio, so that a speed ratio that is an exact fraction in
#: decimal (1/2 x 4 = 2) is not floored to one less by binary rounding
_DYLU_EPS = 1e-9

#: which shard a task reads (module docstring)
SHARD_POLICIES = ("worker", "least_visited")


@dataclass(frozen=True)
class Arrival:
    """One pseudo-gradient the server applies (in the server's order).

    Attributes:
        worker: the sending worker's index (0-based among the workers).
        task: the worker's task number (0-based).
        steps: local steps of the task (H_w).
        staleness: server versions (outer steps taken) between the worker's pull and this push
            (rule 3 of the module docstring).
        dropped: staler than ``max_staleness``: the server takes no step on it.
        finish_s: the task's last local step ends (s).
        arrive_s: the push reaches the server, ``finish_s + push_s`` (s).
        apply_s: the server receives and applies it, ``>= arrive_s`` (s).
        progress: the run's progress after applying it (progress steps, <= T); in a group of
            several arrivals (grace period) only the last one moves it, the others keep the
            progress before the group.
        group_start, group_end: indices of the first and last arrival of its group (rule 5 of
            the module docstring; both its own index without a grace period).
        restart_s: its worker has the server's model back and starts its next task (s).
    """

    worker: int
    task: int
    steps: int
    staleness: int
    finish_s: float
    arrive_s: float
    apply_s: float
    progress: int
    group_start: int
    group_end: int
    restart_s: float
    dropped: bool = False


@dataclass
class WorkerPlan:
    """One worker's part of the plan.

    Attributes:
        progress: ``progress[k - 1]`` = the run's progress at the boundary after this worker's local
            step ``k`` (non-decreasing; the last one = T: the worker stops after its last step).
        push: ``{k: i}`` after local step ``k`` (in ``before_step(k)``) the worker pushes the
            pseudo-gradient that is arrival ``i`` and pulls the server's model.
        times: ``times[k - 1]`` = the virtual time of the boundary after step ``k`` (s).
        schedule: ``schedule[k - 1]`` = the learning-rate schedule's position after step ``k``.
        data: ``data[k - 1]`` = ``(shard, batch)``: local step ``k`` reads batch ``batch`` (0-based,
            counted over epochs) of shard ``shard`` (module docstring, ``shard_policy``).
    """

    progress: list[int] = field(default_factory=list)
    push: dict[int, int] = field(default_factory=dict)
    times: list[float] = field(default_factory=list)
    schedule: list[int] = field(default_factory=list)
    data: list[tuple[int, int]] = field(default_factory=list)

    @property
    def steps(self) -> int:
        """Local steps this worker takes in the run."""
        return len(self.progress)


@dataclass
class Plan:
    """The whole schedule: the server's arrivals in order and every worker's part."""

    arrivals: list[Arrival]
    workers: list[WorkerPlan]

    @property
    def end_s(self) -> float:
        """Virtual time the last arrival is applied (s)."""
        return self.arrivals[-1].apply_s

    @property
    def server_end_s(self) -> float:
        """Virtual time the server's last send ends (s): the server's clock at the end."""
        return max(a.restart_s for a in self.arrivals)

    def group(self, i: int) -> range:
        """Indices of the arrivals in arrival ``i``'s group, in the server's order."""
        a = self.arrivals[i]
        return range(a.group_start, a.group_end + 1)


def dylu_steps(h: int, step_s: Sequence[float], dylu: bool) -> list[int]:
    """Local steps per task of every worker: ``h`` each, or with DyLU
    ``max(1, floor(v_w / max v x h))`` with ``v_w = 1 / step_s[w]`` (step_s in s per local step)."""
    if not dylu:
        return [int(h)] * len(step_s)
    fastest = min(step_s)
    return [max(1, math.floor(fastest / s * h + _DYLU_EPS)) for s in step_s]


def plan(step_s: Sequence[float], local_steps: Sequence[int], push_s: Sequence[float], pull_s: Sequence[float],
         total_steps: int, grace_s: float = 0.0, shard_policy: str = "worker",
         task_s: Callable[[int, int], float] | None = None, fedbuff: int | None = None,
         max_staleness: int | None = None) -> Plan:
    """The asynchronous Local-SGD schedule (module docstring).

    Args:
        step_s: modeled seconds per local step of each worker (> 0).
        local_steps: local steps per task of each worker (H_w >= 1).
        push_s, pull_s: modeled seconds of a worker's push (pseudo-gradient to the server) and pull
            (model back) message (>= 0).
        total_steps: T, the run's length in progress steps (>= 1).
        grace_s: the grace period g (s, finite, >= 0; 0: no grouping): rule 5 of the module
            docstring.
        shard_policy: ``worker`` (each worker its own shard) or ``least_visited`` (each new task
            the least-visited shard; module docstring).
        task_s: None (default): task ``k`` of worker ``w`` lasts ``H_w x step_s[w]``. Else
            ``task_s(w, k)`` is its duration in seconds (> 0; a stochastic delay model, e.g.
            :mod:`lsgd.algorithms.asynchronous.adsaga`), called for every task in increasing ``k`` per worker,
            and its ``H_w`` local step boundaries divide it evenly. The rules and the
            deadlock-freedom argument of the module docstring hold for any durations.
        fedbuff: K (the server steps once per K kept arrivals) or None (once per kept arrival);
            with ``max_staleness`` (None: keep all; an arrival staler than it is dropped) it
            decides the server versions that staleness counts (rule 3); the order and times of
            the arrivals do not depend on either.

    Raises:
        ValueError: lengths differ, a step time <= 0, a step count < 1, a cost < 0, T < 1, a
            grace period that is negative or not finite, or a task duration <= 0.
    """
    n = len(step_s)
    if n < 1 or not len(local_steps) == len(push_s) == len(pull_s) == n:
        raise ValueError(f"one step time, step count and cost per worker, got {n}, {len(local_steps)}, "
                         f"{len(push_s)}, {len(pull_s)}")
    if any(not s > 0 for s in step_s):
        raise ValueError(f"step times must be > 0, got {list(step_s)}")
    if any(int(h) < 1 for h in local_steps):
        raise ValueError(f"local steps must be >= 1, got {list(local_steps)}")
    if any(c < 0 for c in list(push_s) + list(pull_s)):
        raise ValueError("message costs must be >= 0")
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    grace_s = float(grace_s)
    if not (math.isfinite(grace_s) and grace_s >= 0):
        raise ValueError(f"grace_s must be a finite number >= 0, got {grace_s}")
    if shard_policy not in SHARD_POLICIES:
        raise ValueError(f"shard_policy must be one of {SHARD_POLICIES}, got {shard_policy!r}")
    step_s = [float(s) for s in step_s]
    hs = [int(h) for h in local_steps]
    # tasks[w]: [start, arrival index or None, shard, first batch of the shard] of each of w's
    # tasks, in order
    visits = [0] * n  # least_visited: local steps given to each shard so far

    def task(w: int, start: float) -> list:
        if shard_policy == "worker":
            return [start, None, w, None]
        shard = min(range(n), key=lambda s: (visits[s], s))
        first = visits[shard]
        visits[shard] += hs[w]
        return [start, None, shard, first]

    tasks: list[list[list]] = [[task(w, 0.0)] for w in range(n)]
    pulled = [0] * n  # server version each worker started its current task from
    version = 0  # outer steps the server has taken (rule 3)
    kept = 0  # arrivals not dropped (FedBuff: one step per fedbuff of them)
    heap = []
    durations: list[list[float]] = [[] for _ in range(n)]  # durations[w][k]: task k of worker w (s)

    def duration(w: int, k: int) -> float:
        while len(durations[w]) <= k:
            d = hs[w] * step_s[w] if task_s is None else float(task_s(w, len(durations[w])))
            if not d > 0:
                raise ValueError(f"task durations must be > 0, got {d} for worker {w}, task {len(durations[w])}")
            durations[w].append(d)
        return durations[w][k]

    def launch(w: int, start: float) -> None:
        finish = start + duration(w, len(tasks[w]) - 1)
        heapq.heappush(heap, (finish + float(push_s[w]), w, finish))

    for w in range(n):
        launch(w, 0.0)
    arrivals: list[Arrival] = []
    applied_steps = 0
    server_free = 0.0
    ingress_free = 0.0  # the server's ingress port (lsgd.clock.ports): one push at a time
    while True:
        group = [heapq.heappop(heap)]  # (arrive, worker, finish) in (a, w) order
        r = max(max(group[0][2], ingress_free) + float(push_s[group[0][1]]), server_free)
        if grace_s > 0:
            window = r + grace_s
            while heap and heap[0][0] <= window:
                group.append(heapq.heappop(heap))
        first, last = len(arrivals), len(arrivals) + len(group) - 1
        before_group = arrivals[-1].progress if arrivals else 0
        received = []
        for i, (arrive, w, finish) in enumerate(group, start=first):
            ingress_free = max(finish, ingress_free) + float(push_s[w])  # its push on the server's ingress
            r = max(ingress_free, r)  # pushes received back to back
            applied_steps += hs[w]
            progress = min(total_steps, applied_steps // n) if i == last else before_group
            staleness = version - pulled[w]
            dropped = max_staleness is not None and staleness > max_staleness
            if not dropped:
                kept += 1
                if fedbuff is None or kept % fedbuff == 0:
                    version += 1
            received.append((w, finish, arrive, r, staleness, progress, dropped))
        send = r  # the model after the whole group goes to each member in turn
        for i, (w, finish, arrive, apply, staleness, progress, dropped) in enumerate(received, start=first):
            send += float(pull_s[w])
            arrivals.append(Arrival(w, len(tasks[w]) - 1, hs[w], staleness, finish, arrive, apply, progress,
                                    first, last, send, dropped))
            tasks[w][-1][1] = i
            tasks[w].append(task(w, send))  # the next task (never pushed if the run ends now)
            pulled[w] = version
        server_free = send
        if arrivals[-1].progress >= total_steps:
            break
        for i in range(first, last + 1):
            launch(arrivals[i].worker, arrivals[i].restart_s)

    applied_at = [a.apply_s for a in arrivals]
    before = [0] + [a.progress for a in arrivals]  # before[i]: progress of the arrivals before i
    workers = []
    for w in range(n):
        wp = WorkerPlan()
        done = False
        for k_task, (start, index, shard, first) in enumerate(tasks[w]):
            per_step = step_s[w] if task_s is None else duration(w, k_task) / hs[w]
            for j in range(1, hs[w] + 1):
                t = start + j * per_step
                k = len(wp.progress) + 1
                wp.data.append((shard, k - 1 if first is None else first + j - 1))
                if j == hs[w] and index is not None:
                    p = before[index]
                    wp.push[k] = index
                elif j == hs[w]:
                    p = total_steps  # a task that never arrives: every applied arrival precedes it
                else:
                    p = before[bisect.bisect_right(applied_at, t)]
                wp.progress.append(p)
                wp.times.append(t)
                if p >= total_steps:
                    done = True
                    break
            if done:
                break
        workers.append(wp)
    # the schedule: the network's average local step count at each boundary's time
    ends = sorted(t for wp in workers for t in wp.times)
    for wp in workers:
        if shard_policy == "least_visited":  # per shard: the position of the shard's stream
            wp.schedule = [min(total_steps, q + 1) for _, q in wp.data]
        else:
            wp.schedule = [min(total_steps, bisect.bisect_right(ends, t) // n) for t in wp.times]
    return Plan(arrivals, workers)


__all__ = ["SHARD_POLICIES", "Arrival", "Plan", "WorkerPlan", "dylu_steps", "plan"]
