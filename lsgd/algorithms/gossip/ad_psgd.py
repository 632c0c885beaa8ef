"""``ad_psgd``: asynchronous decentralized parallel SGD, Lian, Zhang, Zhang and Liu, "Asynchronous
Decentralized Parallel Stochastic Gradient Descent", ICML 2018 (docs/papers.md#ad-psgd).

Every worker computes its gradient at its model as it reads it; picks a random neighbour; the two
atomically replace their models by their average, ``x_i = x_j = (x_i + x_j) / 2``; then the worker
applies its gradient step to the averaged model: ``x_i <- x_i + d_i`` (``d_i`` the optimizer's step
computed at the model the gradient was taken at). To rule out deadlock (two workers each waiting to
average with the other) the paper splits the graph in two: *active* workers initiate averaging,
each with a random *passive* neighbour; only edges between
the two sides are used: the graph's two colours when it is bipartite (ring of even n, hypercube,
torus of even sides), else even- and odd-numbered workers; for ``random_regular`` (whose numbering
means nothing, so that even / odd would leave a worker without a neighbour on the other side about
once in 2^d) even / odd improved by local search to a locally maximal cut (:func:`sides`), so every
worker has at least half its neighbours on the other side. A passive worker averages with every
active worker that picked it this step, one after another in ascending order, so it may average
several times or not at all, and its gradient is then stale with respect to its averaged model, as
in the paper.

Every rank computes every active worker's choice from ``(algo.seed, worker, step)``, so a passive
worker knows who will contact it without a message; the exchanges are blocking ``sendrecv`` pairs
(both sides compute the same average, so the network mean is kept). One round per step for a worker
that averaged. The topology must be static and its bipartite part (edges between the active and
passive workers) connected, else a ConfigError before any worker starts.

Pairing (``algo.pairing``):

* ``virtual_time`` (the default, ``algo=ad_psgd``): asynchronous execution, as published (Lian et
  al. 2018, Algorithm 1): every worker loops *gradient -> average with one neighbour -> apply the
  gradient* at its own speed and never waits for a straggler. As with SwarmSGD's
  ``pairing=virtual_time`` (:mod:`lsgd.algorithms.gossip.virtual_pairing`), who averages with whom
  and when is decided on the cluster clock: every rank simulates the same schedule
  (:func:`virtual_plan`) from the seed, the topology, every worker's modeled seconds per step and
  the modeled cost of one averaging, then follows its own part. The step times are those of
  ``cluster.compute=profile``, the primary config's default (the roofline of the model on
  ``cluster.device``, or ``cluster.step_time_s``), divided by ``cluster.speeds``; nothing has to be
  set for it. A run that asks for ``cluster.compute=measured`` (command line or experiment) is a
  ConfigError before any worker starts, naming ``cluster.compute=profile`` and
  ``algo.pairing=lockstep`` (an algorithm's preset does not override an explicit compute model).
* ``lockstep``: the lock-step variant (not the paper's execution; labelled "lock-step" in
  reports, ``variant=ad_psgd_lockstep``), for comparisons that want it: the pairing rule above,
  every worker's step ``t`` with every other's step ``t``; a fast worker waits in each exchange for
  a slow partner, so the slowest worker sets the pace. Any ``cluster.compute``.

Rules of ``virtual_time``:

  1. Worker ``i``'s gradient takes ``step_s[i]`` (the profile's step time / its speed) from the
     model it read when the step began.
  2. An active worker whose gradient is done at ``x`` picks a passive neighbour at random (an RNG
     seeded by ``(seed, worker, its step)``) and sends it its model; the two average, and the
     active worker has the average at ``x + c`` (``c`` = the modeled cost of one message of the
     model on the pair's link, both directions at once), applies its gradient and starts its next
     step then. It never waits for the passive worker's compute. The passive worker's ports
     (:mod:`lsgd.clock.ports`) carry one averaging at a time (``network.ports`` lanes): a request
     reaching it while an earlier averaging holds them starts when that one ends (``s =
     max(x, ports free)``), and the active worker has the average at ``s + c``.
  3. The passive side answers when the request reaches it, whatever it is doing (in the paper a
     separate thread does the atomic averaging; its compute is not interrupted): its reply is
     stamped ``x`` on the cluster clock, and it applies its own gradient, taken at the model it
     read before the averagings, once its compute is done and the averagings that reached it during
     the step are complete: at ``max(its compute end, s + c)``. A passive worker may average any
     number of times in one step (each with the model the previous one left), or none. An averaging
     that can start only after its compute is done (``s`` after it: its ports were busy) falls
     in its next step: the gradient is applied first, when the averaging in progress ends, as a fair
     lock on the model would order them; so a passive worker whose ports are never idle (requests
     arriving faster than ``c`` apart) still takes its steps.
  4. In the processes, every averaging of a worker's step runs in that step's
     :meth:`ADPSGD.optimizer_step`, after its backward pass and before its gradient is applied
     (the same code as lock-step), in virtual-time order (ties by the active worker's id).

  Progress (records, evaluation, checkpoints, stopping, the learning-rate schedule): the network's
  average local step count, as in SwarmSGD's virtual time: ``floor(G(t) / n)`` at a worker's step
  boundary ``t``, ``G(t)`` the local steps all workers have applied by ``t``; the run ends on each
  worker at its first step applied at or after ``t_end`` (when ``G`` reaches ``n x total``), and only
  the averagings requested before ``t_end`` run. Because a passive worker averages in the middle of
  its step (rule 3) while records are made between steps, the progress at a boundary may be lowered
  below ``floor(G(t) / n)`` (never raised) so that both ends of every averaging have made the same
  records before it: the plan gives each averaging a *record level* no higher than either end's
  progress when its step began, non-decreasing along each worker's averagings and the same for all
  averagings of one step (the largest such levels), and sets each boundary's progress to the level
  of the averagings of the step that follows it. The records, evaluations and checkpoints then
  form one order on every rank, with no deadlock; a record may be made up to about one step of the
  slowest worker late. Each worker reads its own shard at its local step count (fast workers go
  through theirs more often). A checkpoint falls between steps, where no averaging is in flight,
  and the schedule is recomputed from the config on resume: resuming is exact.
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch

from lsgd.algorithms.gossip.mixing import Gossip, GossipConfig, flat_of, write_flat
from lsgd.algorithms.gossip.virtual_pairing import check_plan_inputs, check_virtual_time_run
from lsgd.comm.topology import DYNAMIC, TOPOLOGIES, WEIGHTS, Topology
from lsgd.core.errors import ConfigError
from lsgd.core.seeding import derive_seed
from lsgd.core.typed_config import option

PAIRINGS = ("lockstep", "virtual_time")


@lru_cache(maxsize=64)
def sides(topology: Topology) -> dict[int, int]:
    """``{worker: 0 (active) or 1 (passive)}``: the graph's two colours when it is bipartite (ring
    of even n, hypercube, torus of even sides; worker 0 active), else even / odd workers; for
    ``random_regular``, even / odd then improved to a locally maximal cut (:func:`local_max_cut`,
    worker 0 active)."""
    import networkx as nx  # here, not at import (lsgd.comm.topology says why)

    graph = nx.Graph(topology.graph(0).to_undirected())
    if nx.is_connected(graph) and nx.is_bipartite(graph):
        colour = nx.bipartite.color(graph)
        return {i: colour[i] ^ colour[0] for i in range(topology.n)}
    side = {i: i % 2 for i in range(topology.n)}
    if topology.name == "random_regular":
        side = local_max_cut(graph, side)
        side = {i: side[i] ^ side[0] for i in range(topology.n)}
    return side


def local_max_cut(graph, side: dict[int, int]) -> dict[int, int]:
    """``side`` improved by local search: sweep the workers in ascending order, moving one to the
    other side while more of its neighbours are on its own side than across, until a sweep moves
    none (each move adds edges to the cut, so it ends). Deterministic; afterwards every worker has
    at least half its neighbours on the other side."""
    side = dict(side)
    moved = True
    while moved:
        moved = False
        for i in sorted(graph.nodes):
            same = sum(side[j] == side[i] for j in graph.neighbors(i))
            if 2 * same > graph.degree(i):
                side[i] ^= 1
                moved = True
    return side


@lru_cache(maxsize=64)
def bipartite_neighbors(topology: Topology) -> dict[int, list[int]]:
    """``{worker: its neighbours on the other side}`` (:func:`sides`)."""
    import networkx as nx  # here, not at import (lsgd.comm.topology says why)

    graph = nx.Graph(topology.graph(0).to_undirected())
    side = sides(topology)
    return {i: sorted(j for j in graph.neighbors(i) if side[j] != side[i]) for i in range(topology.n)}


def check_bipartition(topology: Topology) -> None:
    """Raises ValueError unless every active worker has a passive neighbour and the bipartite graph
    is connected."""
    if topology.name in DYNAMIC:
        raise ValueError(f"algo.topology={topology.name} changes every round; ad_psgd needs a static topology")
    nbrs = bipartite_neighbors(topology)
    import networkx as nx  # here, not at import (lsgd.comm.topology says why)

    graph = nx.Graph([(i, j) for i, js in nbrs.items() for j in js])
    graph.add_nodes_from(range(topology.n))
    if not nx.is_connected(graph):
        hint = (f" (random_regular: another algo.seed, seed {topology.seed} drew this graph, or a larger algo.degree, "
                f"now {topology.degree})" if topology.name == "random_regular" else "")
        raise ValueError(f"algo.topology={topology.name} with {topology.n} workers: the edges between active and "
                         f"passive workers do not connect all workers; use ring, torus, hypercube or complete{hint}")


def step_partners(topology: Topology, seed: int, step: int) -> dict[int, int]:
    """``{active worker: the passive neighbour it averages with at step ``step``}``."""
    nbrs, side = bipartite_neighbors(topology), sides(topology)
    out = {}
    for a in (i for i in range(topology.n) if side[i] == 0):
        rng = np.random.default_rng(derive_seed("ad_psgd", int(seed), a, int(step)))
        out[a] = nbrs[a][int(rng.integers(len(nbrs[a])))]
    return out


# -- asynchronous execution in virtual time (algo.pairing=virtual_time) ---------------------------
@dataclass
class VirtualNode:
    """One worker's part of the asynchronous schedule (:func:`virtual_plan`).

    Attributes:
        progress: ``progress[k - 1]`` = the run's progress after this worker's local step ``k``
            (ints, non-decreasing, the last one = the total: the worker stops after it).
        exchanges: ``{k: [(peer, x), ...]}``: the averagings this worker takes part in during its
            local step ``k`` (after the gradient, before it is applied), in virtual-time order;
            ``x`` the time the active worker's request is sent. An active worker has at most one
            per step (its own), a passive one any number (the requests that reached it).
        times: ``times[k - 1]`` = when step ``k``'s gradient is applied (s, virtual time).
    """

    progress: list[int] = field(default_factory=list)
    exchanges: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    times: list[float] = field(default_factory=list)

    @property
    def steps(self) -> int:
        """Local steps this worker takes in the run."""
        return len(self.progress)


def virtual_plan(topology: Topology, seed: int, step_s: Sequence[float], cost_s: Callable[[int, int], float],
                 total_steps: int, lanes: int = 1) -> list[VirtualNode]:
    """The asynchronous AD-PSGD schedule of every worker (module docstring, ``pairing=virtual_time``):
    an event simulation in virtual-time order (ties: active workers' requests before passive
    workers' step ends, then by worker id), then the record levels (a fixpoint of min-propagation).
    Hand-written like :func:`lsgd.algorithms.gossip.virtual_pairing.plan`: the schedule is the algorithm
    being studied; the event queue is Python's ``heapq``.

    Args:
        topology: the workers' static graph (its active/passive split: :func:`sides`).
        seed: the run's seed for the active workers' choices of neighbour.
        step_s: modeled compute seconds per local step of each worker (> 0).
        cost_s: ``(active, passive) -> c``: modeled seconds of one averaging (both models travel at once).
        total_steps: the run's length in progress units (average local steps per worker, >= 1).
        lanes: ``network.ports``: averagings one passive worker's ports carry at once (rule 2).

    Returns:
        One :class:`VirtualNode` per worker.

    Raises:
        ValueError: a step time <= 0, a topology of another size, or total_steps < 1.
    """
    check_plan_inputs(topology, step_s, total_steps, "workers")
    n = len(step_s)
    side, nbrs = sides(topology), bipartite_neighbors(topology)
    target = n * total_steps
    times: list[list[float]] = [[] for _ in range(n)]          # gradient applied, per local step
    events: list[tuple[float, int, int, int, int, float]] = []  # (x, active, its step, passive, its step, s)
    bound = [float(step_s[i]) for i in range(n)]                # passive: when its current step ends (so far)
    computed = list(bound)                                      # passive: when its current step's gradient is done
    heap = [(float(step_s[i]), side[i], i, 1) for i in range(n)]  # (time, 0 active / 1 passive, worker, step)
    ports = [[0.0] * int(lanes) for _ in range(n)]            # passive: when each lane of its ports is free
    heapq.heapify(heap)
    smallest: list[float] = []                                  # max-heap (negated) of the n x total smallest ends

    def ended(i: int, t: float) -> None:
        times[i].append(t)
        heapq.heappush(smallest, -t)
        if len(smallest) > target:
            heapq.heappop(smallest)

    def finished() -> bool:
        if len(smallest) < target:
            return False
        t_end = -smallest[0]
        return heap[0][0] > t_end and all(ts and ts[-1] >= t_end for ts in times)

    while not finished():
        t, role, i, k = heapq.heappop(heap)
        if role == 0:  # an active worker's gradient is done: it averages with a random passive neighbour
            rng = np.random.default_rng(derive_seed("ad_psgd_async", int(seed), i, k))
            p = nbrs[i][int(rng.integers(len(nbrs[i])))]
            c = float(cost_s(i, p))
            lane = min(range(len(ports[p])), key=lambda q: (ports[p][q], q))  # its earliest-free lane
            start = max(t, ports[p][lane])                    # the passive's ports: one averaging at a time
            while start > computed[p]:  # its gradient is done before this averaging can start: it is
                ended(p, bound[p])       # applied first (rule 3), and the averaging falls in a later step
                bound[p] = computed[p] = bound[p] + float(step_s[p])
                heapq.heappush(heap, (bound[p], 1, p, len(times[p]) + 1))
            events.append((t, i, k, p, len(times[p]) + 1, start))  # the passive's step under way (its end >= t)
            done = start + c
            ports[p][lane] = done
            bound[p] = max(bound[p], done)                    # it applies its gradient once the averaging is done
            heapq.heappush(heap, (bound[p], 1, p, len(times[p]) + 1))
            ended(i, done)
            heapq.heappush(heap, (done + float(step_s[i]), 0, i, k + 1))
        elif k == len(times[i]) + 1 and t == bound[i]:  # a passive worker's step ends (stale entries skipped)
            ended(i, t)
            bound[i] = computed[i] = t + float(step_s[i])
            heapq.heappush(heap, (bound[i], 1, i, k + 1))

    ends = sorted(t for ts in times for t in ts)
    t_end = ends[target - 1]
    last = [next(k for k, t in enumerate(ts, start=1) if t >= t_end) for ts in times]

    def natural(i: int, k: int) -> int:
        """floor(G(t) / n) at worker i's boundary after its step k (0 at the start)."""
        if k == 0:
            return 0
        t = times[i][k - 1]
        return total_steps if t >= t_end else bisect.bisect_right(ends, t) // n

    # the averagings that run: requested before the end, and (ports busy to the end) starting within
    # the passive worker's last step; the active end's step is then its last (its gradient is done
    # before t_end and applied after the passive's last step ends, at or after t_end)
    run = sorted(e for e in events if e[0] < t_end and e[4] <= last[e[3]])
    level = [min(natural(a, ka - 1), natural(p, kp - 1)) for _, a, ka, p, kp, _ in run]
    seq: list[list[int]] = [[] for _ in range(n)]  # each worker's averagings, in its program order
    for e, (_, a, _, p, _, _) in enumerate(run):
        seq[a].append(e)
        seq[p].append(e)

    def step_of(i: int, e: int) -> int:
        """The local step of worker ``i`` in which averaging ``e`` runs."""
        return run[e][2] if run[e][1] == i else run[e][4]

    # levels: non-decreasing along every worker's sequence, equal within a step; the largest such
    # levels below the caps (a fixpoint of min-propagation)
    changed = True
    while changed:
        changed = False
        for i in range(n):
            s = seq[i]
            for j in range(len(s) - 2, -1, -1):
                if level[s[j]] > level[s[j + 1]]:
                    level[s[j]] = level[s[j + 1]]
                    changed = True
            for j in range(1, len(s)):
                if step_of(i, s[j]) == step_of(i, s[j - 1]) and level[s[j]] > level[s[j - 1]]:
                    level[s[j]] = level[s[j - 1]]
                    changed = True

    # a worker's last step without the averagings that do not run (requested at or after t_end, or
    # starting after the passive worker's last step)
    ran: list[dict[int, list[float]]] = [{} for _ in range(n)]  # worker -> step -> [when each averaging ends]
    for _, a, ka, p, kp, start in run:
        for i, k in ((a, ka), (p, kp)):
            ran[i].setdefault(k, []).append(start + float(cost_s(a, p)))
    for x, a, ka, p, kp, _ in events:  # the passive worker had stopped: the active one stops at the end
        if x < t_end and kp > last[p]:
            ran[a].setdefault(ka, []).append(t_end)
    for i in range(n):
        k = last[i]
        done = (times[i][k - 2] if k > 1 else 0.0) + float(step_s[i])  # the gradient is done
        times[i][k - 1] = max([done] + ran[i].get(k, []))
    plans = [VirtualNode(times=times[i][: last[i]]) for i in range(n)]
    constrained: list[dict[int, int]] = [{} for _ in range(n)]  # boundary k (before step k + 1) -> level
    for e, (x, a, ka, p, kp, _) in enumerate(run):
        for i, k, peer in ((a, ka, p), (p, kp, a)):
            plans[i].exchanges.setdefault(k, []).append((peer, x))
            constrained[i][k - 1] = level[e]
    for i, node in enumerate(plans):
        upcoming = sorted(constrained[i].items(), reverse=True)  # popped from the end: ascending boundaries
        prev = 0
        for k in range(1, last[i] + 1):
            while upcoming and upcoming[-1][0] < k:
                upcoming.pop()
            if k == last[i]:
                value = total_steps
            elif k in constrained[i]:
                value = constrained[i][k]
            else:
                value = min(natural(i, k), upcoming[-1][1] if upcoming else total_steps)
            value = max(prev, value)
            node.progress.append(value)
            prev = value
        assert all(v < total_steps for v in node.progress[:-1]), "ad_psgd plan: the total reached early"
        for k, level_k in constrained[i].items():
            assert (node.progress[k - 1] if k else 0) == level_k, "ad_psgd plan: an averaging off its record level"
    return plans


@dataclass
class ADPSGDConfig(GossipConfig):
    """``algo=ad_psgd``'s keys: :class:`GossipConfig`'s and the pairing."""

    name: str = "ad_psgd"
    topology: str = option("ring", choices=TOPOLOGIES, doc="G: static; its edges between active and passive "
                           "workers must connect them all (random_regular: active / passive by a local max cut)",
                           symbol="")
    weights: str = option("uniform", choices=WEIGHTS, doc="unused: pairs average 1/2 each")
    seed: int | None = option(None, doc="the active workers' choice of neighbour per step and "
                              "algo.topology=random_regular's graph (null: the run's seed)")
    pairing: str = option("virtual_time", choices=PAIRINGS, doc="virtual_time: asynchronous, as published (the "
                          "modeled step times of cluster.compute=profile, the default, and cluster.speeds decide who "
                          "averages when; fast workers take more steps, nobody waits for a straggler); lockstep: the "
                          "lock-step variant, every worker's step t with the others' step t (the slowest sets the "
                          "pace; any cluster.compute)",
                          symbol={"virtual_time": "asynchronous", "lockstep": "lock-step"})


class ADPSGD(Gossip):
    """AD-PSGD: each step every active worker averages with a random passive neighbour;
    asynchronous by default (``algo.pairing=virtual_time``, as published), lock-step as a variant."""

    name = "ad_psgd"
    Config = ADPSGDConfig
    label = "AD-PSGD"
    paper = "docs/papers.md#ad-psgd"
    defining_keys = ("algo.topology", "algo.pairing")  # "AD-PSGD, ring, asynchronous" / "..., lock-step"

    @classmethod
    def validate_config(cls, algo: dict, world_size: int) -> None:
        super().validate_config(algo, world_size)
        config = cls.parse_config(algo)
        try:  # random_regular's graph depends on the seed: checked again in validate_run when it is the run's
            check_bipartition(Topology(config.topology, world_size, config.weights, int(config.seed or 0),
                                       config.degree))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    @classmethod
    def validate_run(cls, cfg: dict, world_size: int) -> None:
        config = cls.parse_config(cfg.get("algo") or {})
        check_virtual_time_run({**cfg, "algo": {**(cfg.get("algo") or {}), "pairing": config.pairing}},
                               otherwise="algo.pairing=lockstep, AD-PSGD's lock-step variant (algo=ad_psgd runs "
                                         "virtual_time, the asynchronous algorithm, by default)")
        if config.topology == "random_regular" and config.seed is None:  # the graph of the run's seed (setup)
            try:
                check_bipartition(Topology(config.topology, world_size, config.weights, int(cfg.get("seed") or 0),
                                           config.degree))
            except ValueError as exc:
                raise ConfigError(str(exc)) from None

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        self.step = 0
        self.virtual = self.config.pairing == "virtual_time"
        self.lockstep = not self.virtual
        self.plan: VirtualNode | None = None

    def setup(self, model, optimizer, ctx=None):
        out = super().setup(model, optimizer, ctx)
        if self.virtual:
            self.plan = self._plan()[self.node]
        return out

    def _plan(self) -> list[VirtualNode]:
        """Every worker's asynchronous schedule (algo.pairing=virtual_time), identical on every rank."""
        step_s, total = self.ctx.worker_step_s, self.ctx.total_steps
        if step_s is None or total is None:
            raise ConfigError("algo=ad_psgd's algo.pairing=virtual_time (the default) needs cluster.compute=profile "
                              "(modeled step times of every worker) and a known run length; or set "
                              "algo.pairing=lockstep for the lock-step variant")
        nbytes = sum(t.numel() * t.element_size() for t in self.mixed_tensors())
        return virtual_plan(self.topology, self.seed, step_s,
                            lambda a, p: float(self.comm.pair_cost(a, p, nbytes)[0]), total,
                            self.comm.network_config.ports)

    def progress(self, step: int) -> int:
        if self.virtual:
            return self.plan.progress[step - 1] if step > 0 else 0
        return step

    def schedule_position(self, step: int) -> int | None:
        return self.progress(step) if self.virtual else None

    def peers(self, step: int) -> list[int]:
        """Whom this worker averages with at ``step`` (lock-step), in order."""
        partners = step_partners(self.topology, self.seed, step)
        if self.node in partners:
            return [partners[self.node]]
        return sorted(a for a, p in partners.items() if p == self.node)

    @contextlib.contextmanager
    def _answering_at(self, x: float):
        """A passive worker's reply to a request sent at virtual time ``x`` (rule 3): within the
        block the clock reads ``x`` (every entry moved back by the same amount), so the reply
        leaves at ``max(x, ports free)`` and the averaging completes ``c`` later; afterwards the clock is the later
        of where it was and that completion."""
        clock = self.comm.clock
        if clock is None:
            yield
            return
        saved = clock.now.copy()
        clock.now = saved - max(0.0, float(saved[0]) - x)
        try:
            yield
        finally:
            clock.now = np.maximum(clock.now, saved)

    def optimizer_step(self) -> None:
        tensors = self.mixed_tensors()
        before = flat_of(tensors)
        self.optimizer.step()
        delta = flat_of(tensors) - before
        x = before
        if self.virtual:
            exchanges = self.plan.exchanges.get(self.step + 1, [])
        else:
            exchanges = [(peer, None) for peer in self.peers(self.step)]
        passive = sides(self.topology)[self.node] == 1
        for peer, at in exchanges:
            theirs = torch.empty_like(x)
            with self._answering_at(at) if at is not None and passive else contextlib.nullcontext():
                self.comm.sendrecv(x, theirs, peer)
            x = ((x.double() + theirs.double()) / 2).to(x.dtype)
        if exchanges:
            self.comm.round()
            self.rounds += 1
        write_flat(x + delta, tensors)
        self.step += 1

    def state_dict(self) -> dict:
        return {"step": self.step, "rounds": self.rounds}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.rounds = state["step"], state["rounds"]
