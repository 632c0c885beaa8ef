"""``adsaga``: asynchronous SAGA with a parameter server over data partitioned between workers
(Glasgow and Wootters, "Asynchronous Distributed Optimization with Stochastic Delays", AISTATS 2022,
arXiv 2009.10717), with asynchronous SGD and synchronous (minibatch) SAGA as baselines.

No public code exists, and the paper's full text was not reachable from this workplace (only its
abstract: "We develop an algorithm ADSAGA based on SAGA for the distributed-data setting, in which
the data is partitioned between many machines ... under a natural stochastic delay model with a
mean delay of m" and, in the earlier version, "with independent exponential work times").
What follows is therefore *our reading*, built from SAGA (Defazio, Bach, Lacoste-Julien 2014,
"SAGA: A Fast Incremental Gradient Method ...", NeurIPS, Algorithm / eq. (1)) and the setting the
abstract states; where the paper may differ we say so. Check it against the paper before quoting
numbers as the paper's.

Problem (the finite sum, every step below refers to it)::

    f(x) = (1/n) sum_{i=1..n} f_i(x) + (lambda/2) ||x||^2,    f_i(x) = CE(softmax(W a_i + c), y_i)

multinomial logistic regression (``model=logreg``, x = (W, c), W (C, D), c (C,)) on n =
``algo.num_samples`` training samples (a seeded subset, the same on every rank), lambda =
``algo.l2`` > 0 so f is lambda-strongly convex. The n samples are dealt to the m workers in equal
disjoint partitions P_w of n/m samples (``num_samples`` is rounded down to a multiple of m); worker
w only ever reads P_w (the distributed-data setting).

Stochastic delay model (the paper's, as we read the abstract): each gradient computation of worker w
takes an independent Exp(mean mu_w) time (``algo.delay=exponential``), mu_w = the worker's modeled
seconds per step (``cluster.step_time_s`` / speed, ``cluster.compute=profile``). With equal speeds
the next worker to finish is uniform among the m workers whatever happened before (memorylessness),
so the delay of an update, counted in server iterations, is geometric with mean about m (the
abstract's "mean delay of m"). ``algo.delay=constant`` (every computation takes exactly mu_w) is the
deterministic control. The durations are drawn from a numpy generator seeded with (run seed,
worker), so every rank draws the same numbers (:class:`DelayModel`); the arrival order is then
decided in virtual time by :func:`lsgd.algorithms.asynchronous.plan.plan` (one local step per task, the
task lasting the drawn duration; earliest arrival first, ties by worker id) and every rank follows
its part: runs are reproducible bit for bit. The worker's cluster clock is moved to the drawn
duration (the trainer charged the profile's step time), in both modes: a synchronous iteration
therefore lasts the slowest of the m draws (plus the messages), which is what asynchrony saves
in ``modeled_time_s``.

ADSAGA, as implemented (``algo.mode=async``, ``algo.variance_reduction=true``), rank 0 the server,
ranks 1..m the workers; B = ``batch_size`` samples per gradient (B = 1 is the paper's setting):

* Worker w keeps the SAGA table of its partition (SAGA's alpha_i = grad f_i(phi_i), the gradient at
  the point where f_i was last evaluated). For this GLM grad_x f_i(x) = r_i(x) (x) (a_i, 1) with the
  residual r_i(x) = softmax(W a_i + c) - onehot(y_i) in R^C, so the table stores one residual per
  sample (C floats, C = 10, instead of (D + 1) C floats; Schmidt, Le Roux, Bach 2017 store SAG's
  table the same way): alpha_i = rho_i (x) (a_i, 1), rho_i = 0 at the start (alpha-bar = 0 matches).
* Task k of worker w (step 1 of the worker): from the model x_s it pulled last (s = the server's
  iteration then), draw J, B distinct indices uniform in P_w (a generator seeded with (seed, w, k)),
  and compute the SAGA difference (SAGA eq. (1) without its table mean)
  ``d = (1/B) sum_{j in J} (r_j(x_s) - rho_j) (x) (a_j, 1)``: (:func:`saga_difference`).
* Push d to the server; set rho_j <- r_j(x_s) for j in J (SAGA's table update); pull the server's x.
* Server, at iteration t on the arrival of d from worker w (staleness t - s): the ADSAGA step
  ``x_{t+1} = x_t - eta (d + alpha_bar + lambda x_t)`` (SAGA eq. (1): g = f_j'(phi) - f_j'(phi_j) +
  (1/n) sum_i f_i'(phi_i), with phi = the stale x_s), then the table mean
  ``alpha_bar <- alpha_bar + (B/n) d`` (the only entries that changed are J's); send x_{t+1} to w.
  eta = ``optim.lr`` (the schedule's value on the server). The regularizer is known to the server
  and evaluated exactly at its current x_t (our choice: it is deterministic, so it needs no table
  and no staleness). Under the delay model the arriving worker is uniform, and j uniform in its
  partition, so j is uniform in [n] and E[d + alpha_bar] = grad of the data term at x_s: the
  estimator is unbiased at the stale point (:func:`saga_difference`'s tests check it).

  Where the paper may differ: the paper may keep the table on the server, weight the step by the
  delay, or take one sample per gradient; we keep the table where the data is (workers send only
  d, n_params floats, as asynchronous SGD does) and allow B >= 1.

Baselines, the same protocol and code:

* Asynchronous SGD (``algo.variance_reduction=false``): the worker sends the plain minibatch
  gradient ``d = (1/B) sum_{j in J} r_j(x_s) (x) (a_j, 1)``; the server steps
  ``x <- x - eta (d + lambda x)``; no table.
* Synchronous SAGA (``algo.mode=sync``): every iteration all m workers compute d_w at the same x
  (pulled at the end of the previous iteration), the server waits for all and steps
  ``x <- x - eta ((1/m) sum_w d_w + alpha_bar + lambda x)``, ``alpha_bar <- alpha_bar + (B/n) sum_w
  d_w`` (minibatch SAGA with m B samples per step; lockstep, no delay model, zero staleness).
  With ``variance_reduction=false`` it is synchronous minibatch SGD.

Progress and iterations: a progress step is m gradients of B samples in every mode: async runs make
m server iterations per progress step (async_plan's ``floor(arrivals / m)``), sync runs one
iteration of m gradients. ``max_steps`` = T therefore gives every arm the same number of component
gradients, m T B.

Bytes (``comm_bytes``, all ``p2p``): per gradient the worker sends n_params floats and receives
n_params floats back (7,850 x 4 bytes on Fashion-MNIST).

Metrics (the server, rank 0, at every record): ``suboptimality`` f(x_t) - f* (float64 over the n
samples; f* from :func:`solve_f_star`, L-BFGS in float64 to a gradient norm below 1e-7, computed
once at setup on the server), ``objective`` f(x_t), ``f_star``, ``iterations`` (server updates so
far), ``gradients`` (component gradients in the applied updates), and for async runs ``staleness``
(mean) and ``staleness_max`` (server iterations between a worker's pull and its push).

Raises (at config validation, before any worker starts): :class:`lsgd.core.errors.ConfigError` naming
the key and its allowed values (:meth:`ADSAGA.validate_config`, :meth:`ADSAGA.validate_run`).
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from lsgd.algorithms.asynchronous import plan as async_plan
from lsgd.algorithms.base import AlgoConfig, ServerAlgorithm, holding_model_of
from lsgd.comm.collectives import copy_back
from lsgd.core.checks import int_at_least
from lsgd.data.partition import derive_seed, generator
from lsgd.core.errors import ConfigError
from lsgd.core.typed_config import option

log = logging.getLogger("lsgd")

SERVER = 0
MODES = ("async", "sync")
DELAYS = ("exponential", "constant")


# --------------------------------------------------------------------------------------------
# the delay model
# --------------------------------------------------------------------------------------------
class DelayModel:
    """Durations of the gradient computations: ``model(w, k)`` is the k-th (0-based) of worker w, in
    seconds (module docstring, "Stochastic delay model").

    ``exponential``: i.i.d. Exp with mean ``means[w]`` (numpy ``default_rng`` seeded with
    ``derive_seed("adsaga-delay", seed, w)``, drawn in order of k and cached, so any rank, in any
    call order, gets the same numbers); ``constant``: exactly ``means[w]``.

    Args:
        distribution: ``exponential`` or ``constant``.
        means: mean seconds per gradient of every worker (> 0).
        seed: the run seed.
    Raises:
        ValueError: unknown distribution or a mean <= 0.
    """

    def __init__(self, distribution: str, means, seed: int):
        if distribution not in DELAYS:
            raise ValueError(f"delay distribution must be one of {', '.join(DELAYS)}, got {distribution!r}")
        if any(not m > 0 for m in means):
            raise ValueError(f"mean delays must be > 0, got {list(means)}")
        self.distribution, self.means = distribution, [float(m) for m in means]
        self.rngs = [np.random.default_rng(derive_seed("adsaga-delay", int(seed), w)) for w in range(len(self.means))]
        self.draws: list[list[float]] = [[] for _ in self.means]

    def __call__(self, w: int, k: int) -> float:
        draws = self.draws[w]
        while len(draws) <= k:
            if self.distribution == "constant":
                draws.append(self.means[w])
            else:
                draws.append(float(self.rngs[w].exponential(self.means[w])))
        return draws[k]


# --------------------------------------------------------------------------------------------
# the finite sum: data, residuals, the SAGA difference, f and f*
# --------------------------------------------------------------------------------------------
def partitions(n_total: int, n: int, workers: int, seed: int) -> torch.Tensor:
    """The finite sum's samples dealt to the workers: int64 (workers, n // workers), row w = P_w.

    A permutation of ``range(n_total)`` seeded with ``("adsaga-subset", seed)`` (the same on every
    rank); its first ``(n // workers) * workers`` entries, cut into equal contiguous rows.

    Raises:
        ValueError: ``n`` > ``n_total`` or ``n < workers``.
    """
    if n > n_total or n < workers:
        raise ValueError(f"num_samples must be in [{workers}, {n_total}] (workers, training samples), got {n}")
    per = n // workers
    perm = torch.randperm(n_total, generator=generator("adsaga-subset", int(seed)))
    return perm[: per * workers].view(workers, per)


def features(train_set, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flattened inputs and labels of samples ``idx``: a (len(idx), D) float32, y (len(idx),) int64
    (the training set's own normalization)."""
    if hasattr(train_set, "batch"):
        x, y = train_set.batch(idx)
    else:
        items = [train_set[int(i)] for i in idx]
        x, y = torch.stack([t[0] for t in items]), torch.tensor([int(t[1]) for t in items])
    return x.reshape(len(idx), -1).float(), y.long()


def residuals(weight: torch.Tensor, bias: torch.Tensor, a: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """r_i = softmax(W a_i + c) - onehot(y_i): (B, C), for weight (C, D), bias (C,), a (B, D), y (B,).
    The gradient of f_i (cross-entropy) is r_i (x) (a_i, 1)."""
    p = torch.softmax(a @ weight.T + bias, dim=1)
    return p - F.one_hot(y, weight.shape[0]).to(p.dtype)


def saga_difference(weight: torch.Tensor, bias: torch.Tensor, a: torch.Tensor, y: torch.Tensor,
                    table: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The worker's message for samples (a, y) at the model (weight, bias) (module docstring):
    ``d = (1/B) sum_j (r_j - rho_j) (x) (a_j, 1)`` flattened as (weight, bias), i.e. (C D + C,);
    with ``table`` None (no variance reduction) rho = 0 and d is the minibatch gradient of the
    data term. Returns (d, r) with r (B, C) the new residuals (the table's new rows).

    Shapes: weight (C, D), bias (C,), a (B, D), y (B,), table (B, C) or None.
    """
    r = residuals(weight, bias, a, y)
    diff = r if table is None else r - table
    b = a.shape[0]
    return torch.cat([(diff.T @ a).reshape(-1) / b, diff.sum(0) / b]), r


def objective(weight: torch.Tensor, bias: torch.Tensor, a: torch.Tensor, y: torch.Tensor, l2: float) -> torch.Tensor:
    """f(x) = (1/n) sum_i CE_i + (l2/2) (||W||^2 + ||c||^2) over all n samples (a (n, D), y (n,)),
    in the inputs' dtype (the server passes float64)."""
    loss = F.cross_entropy(a @ weight.T + bias, y)
    return loss + 0.5 * l2 * (weight.pow(2).sum() + bias.pow(2).sum())


def solve_f_star(a: torch.Tensor, y: torch.Tensor, classes: int, l2: float, tol: float = 1e-7,
                 max_rounds: int = 20) -> float:
    """f* = min f (strongly convex) by full-batch L-BFGS in float64 (torch.optim.LBFGS, strong Wolfe
    line search, rounds of 100 iterations) from x = 0, until the gradient's norm is below ``tol``
    (then f(x) - f* <= ||grad f(x)||^2 / (2 lambda), about 5e-13 at lambda = 0.01: far below the
    float32 iterates' suboptimality).

    Shapes: a (n, D), y (n,). Raises:
        RuntimeError: the gradient norm is still >= ``tol`` after ``max_rounds`` rounds.
    """
    a, y = a.double(), y.long()
    w = torch.zeros(classes, a.shape[1], dtype=torch.float64, requires_grad=True)
    c = torch.zeros(classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, c], lr=1.0, max_iter=100, history_size=50, tolerance_grad=tol * 1e-2,
                            tolerance_change=0.0, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = objective(w, c, a, y, l2)
        loss.backward()
        return loss

    for _ in range(max_rounds):
        opt.step(closure)
        loss = closure()
        norm = torch.cat([w.grad.reshape(-1), c.grad]).norm().item()
        if norm < tol:
            return float(loss.detach())
    raise RuntimeError(f"f*: L-BFGS left a gradient norm {norm:.3g} >= {tol} after {max_rounds * 100} iterations")


# --------------------------------------------------------------------------------------------
# the algorithm
# --------------------------------------------------------------------------------------------
@dataclass
class ADSAGAConfig(AlgoConfig):
    """``algo=adsaga``'s keys (module docstring)."""

    name: str = "adsaga"
    mode: str = option("async", choices=MODES, doc="async: one server update per arriving gradient, in "
                       "virtual-time order; sync: all workers each update")
    variance_reduction: bool = option(True, doc="true: SAGA difference + table mean (ADSAGA / sync SAGA); false: "
                                      "plain minibatch gradient (async / sync SGD)")
    delay: str = option("exponential", choices=DELAYS, doc="exponential: each gradient takes Exp(mean = the "
                        "worker's modeled step time) (the paper's model); constant: exactly the mean")
    l2: float = option(0.01, above=0, doc="lambda: f = mean cross-entropy + (lambda / 2) ||x||^2, lambda-strongly "
                       "convex")
    num_samples: int = option(4096, at_least=1, doc="n: the finite sum's samples (a seeded subset of the training "
                              "set), rounded down to a multiple of the workers; at least the number of workers")


class ADSAGA(ServerAlgorithm):
    """ADSAGA: asynchronous SAGA with a parameter server over data partitioned between workers.

    Asynchronous SGD and synchronous SAGA are its baselines (``algo.variance_reduction``,
    ``algo.mode``); the problem, the delay model and the updates: the module docstring.
    """

    name = "adsaga"
    Config = ADSAGAConfig
    label = "ADSAGA"
    paper = "docs/papers.md#adsaga"
    lockstep = False
    requires = {"model": "logreg"}

    @classmethod
    def validate_config(cls, algo: dict, world_size: int) -> None:
        """Also: at least one sample per worker (``num_samples`` >= the world size - 1 workers)."""
        super().validate_config(algo, world_size)
        int_at_least({"num_samples": cls.parse_config(algo).num_samples}, "num_samples", world_size - 1, "algo.")

    @classmethod
    def validate_run(cls, cfg: dict, world_size: int) -> None:
        model = (cfg.get("model") or {}).get("name")
        if model != cls.requires["model"]:
            raise ConfigError(f"algo=adsaga needs model={cls.requires['model']} (its SAGA table stores "
                              f"logistic-regression residuals); got model={model!r}")
        wd = (cfg.get("optim") or {}).get("weight_decay", 0.0) or 0.0
        if wd != 0:
            raise ConfigError(f"algo=adsaga applies the L2 term itself (algo.l2); set optim.weight_decay=0, got {wd!r}")
        algo = cls.parse_config(cfg["algo"])
        workers = world_size - 1
        per = int(algo.num_samples) // workers
        if int(cfg["batch_size"]) > per:
            raise ConfigError(f"batch_size must be <= algo.num_samples // workers = {per} (distinct samples of a "
                              f"worker's partition per gradient); got batch_size={cfg['batch_size']}")
        compute = (cfg.get("cluster") or {}).get("compute", "profile")
        if algo.mode == "async" and compute != "profile":
            raise ConfigError(f"algo=adsaga with algo.mode=async needs cluster.compute=profile (the arrival order is "
                              f"simulated from modeled delays); got cluster.compute={compute!r}")

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        self.mode = str(self.config.mode)
        self.lockstep = self.mode == "sync"
        self.vr = bool(self.config.variance_reduction)
        self.delay = str(self.config.delay)
        self.l2 = float(self.config.l2)
        self.num_samples = int(self.config.num_samples)
        self.served = 0  # server: iterations applied
        self.plan: async_plan.Plan | None = None
        self.delays: DelayModel | None = None
        self.f_star: float | None = None
        self.pending = None  # worker: (J, new residuals, d) computed, not yet pushed

    # -- setup -------------------------------------------------------------------------------------
    def setup(self, model, optimizer, ctx=None):
        model = super().setup(model, optimizer, ctx)
        self.params = [p for p in model.parameters()]
        if len(self.params) != 2 or self.params[0].dim() != 2:
            raise ValueError("adsaga expects model=logreg (one Linear: weight (C, D), bias (C,))")
        if list(model.buffers()):
            raise ValueError("adsaga moves parameters only; the model must have no buffers")
        self.is_server = self.comm.rank == SERVER
        self.workers = self.comm.world_size - 1
        self.worker = None if self.is_server else self.comm.rank - 1
        self.n_params = sum(p.numel() for p in self.params)
        if self.ctx.train_set is None:
            raise ValueError("adsaga needs the training set in the run context (RunContext.train_set)")
        parts = partitions(len(self.ctx.train_set), self.num_samples, self.workers, self.ctx.seed)
        self.n = parts.numel()  # the finite sum's n (num_samples rounded down to a multiple of the workers)
        self.batch = int(self.ctx.batch_size)
        if self.is_server:
            a, y = features(self.ctx.train_set, parts.reshape(-1))
            self.a64, self.y = a.double(), y
            self.f_star = solve_f_star(self.a64, y, self.params[0].shape[0], self.l2)
            log.info("adsaga: n = %d samples over %d workers, lambda = %g, f* = %.12f", self.n, self.workers,
                     self.l2, self.f_star)
            self.alpha_bar = torch.zeros(self.n_params, dtype=self.params[0].dtype)
        else:
            self.a, self.y = features(self.ctx.train_set, parts[self.worker])
            self.table = torch.zeros(len(self.a), self.params[0].shape[0]) if self.vr else None
        if self.ctx.worker_step_s is not None:
            self.delays = DelayModel(self.delay, self._means_and_costs()[0], self.ctx.seed)
        if self.mode == "async":
            pairs = [self.comm.subgroup([SERVER, w]) for w in range(1, self.workers + 1)]
            self.pairs = pairs if self.is_server else None
            self.pair = None if self.is_server else pairs[self.worker]
            self.plan = self._plan()
        warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()` before `optimizer.step()`"))
        return model

    def _means_and_costs(self) -> tuple[list[float], list[float]]:
        """Every worker's mean seconds per gradient (the profile's step time / speed) and the
        modeled seconds of one parameter message to it, as rank 0 has them (an uncounted
        all-gather, so every rank builds the same delay model and plan)."""
        step_s = self.ctx.worker_step_s
        nbytes = self.n_params * self.params[0].element_size()
        cost = [float(self.comm.pair_cost(SERVER, w + 1, nbytes)[0]) for w in range(self.workers)]
        table = self.comm.gather_values([*step_s, *cost])
        return [float(v) for v in table[0][: self.workers]], [float(v) for v in table[0][self.workers:]]

    def _plan(self) -> async_plan.Plan:
        total = self.ctx.total_steps
        if self.delays is None or total is None:
            raise ConfigError("algo=adsaga with algo.mode=async needs cluster.compute=profile (modeled seconds per "
                              "gradient of every worker) and a known run length")
        step_s, cost = self._means_and_costs()
        p = async_plan.plan(step_s, [1] * self.workers, cost, cost, total, task_s=self.delays)
        # every rank drew the same delays: their plans agree (an uncounted all-gather of a fingerprint)
        fp = self.comm.gather_values([p.end_s, len(p.arrivals), sum(a.staleness for a in p.arrivals),
                                      sum(a.worker * (i % 97) for i, a in enumerate(p.arrivals))])
        if not (fp == fp[0]).all():
            raise RuntimeError(f"adsaga: ranks' arrival plans differ (fingerprints {fp.tolist()})")
        return p

    # -- the schedule ------------------------------------------------------------------------------
    def progress(self, step: int) -> int:
        if self.mode == "sync" or step <= 0:
            return step
        if self.is_server:
            return self.plan.arrivals[step - 1].progress
        return self.plan.workers[self.worker].progress[step - 1]

    def schedule_position(self, step: int) -> int | None:
        if self.mode == "sync" or step <= 0:
            return None
        if self.is_server:
            return self.progress(step)
        return self.plan.workers[self.worker].schedule[step - 1]

    # -- worker ------------------------------------------------------------------------------------
    def sample(self, task: int) -> torch.Tensor:
        """J of the worker's task ``task``: B distinct positions in its partition (int64 (B,)),
        seeded with (seed, worker, task)."""
        g = generator("adsaga-sample", self.ctx.seed, self.worker, task)
        return torch.randperm(len(self.a), generator=g)[: self.batch]

    @torch.no_grad()
    def after_backward(self, step: int) -> None:
        """Worker, local step ``step`` (= task ``step``): the SAGA difference (or the gradient) at the
        model it holds (the trainer's own batch and gradient are not used); sync mode also pushes
        it and pulls the new model."""
        if self.is_server:
            return
        j = self.sample(step)
        d, r = saga_difference(self.params[0], self.params[1], self.a[j], self.y[j],
                               self.table[j] if self.vr else None)
        self.pending = (j, r, d)
        clock = self.ctx.clock
        if self.delays is not None and clock is not None and self.ctx.step_compute_s is not None:
            # the delay model's duration replaces the profile's step time the trainer charged
            extra = self.delays(self.worker, step) - self.ctx.step_compute_s()[0]
            clock.now = clock.now + extra
            clock.compute_s += extra
        if self.mode == "sync":
            self._push_pull(self.comm, SERVER)

    def optimizer_step(self) -> None:
        """Workers take no step of their own (the server does)."""

    @torch.no_grad()
    def before_step(self, step: int) -> None:
        """Async worker, after the boundary of a task that arrives: push d, update the table, pull x."""
        if self.is_server or self.mode == "sync" or step not in self.plan.workers[self.worker].push:
            return
        self._push_pull(self.pair, 0)

    def _push_pull(self, comm, peer: int) -> None:
        j, r, d = self.pending
        comm.sendrecv(d, None, peer)
        if self.vr:
            self.table[j] = r
        x = torch.empty(self.n_params, dtype=d.dtype)
        comm.sendrecv(None, x, peer)
        copy_back(x, self.params)
        self.pending = None
        self.comm.round()

    # -- server ------------------------------------------------------------------------------------
    @torch.no_grad()
    def serve_step(self, step: int) -> None:
        """Server iteration(s) of ``step``: async, the plan's arrival ``step``; sync, all workers."""
        if self.mode == "async":
            pair = self.pairs[self.plan.arrivals[step].worker]
            d = torch.empty(self.n_params, dtype=self.params[0].dtype)
            pair.sendrecv(None, d, 1)
            self.apply(d, d)
            pair.sendrecv(torch.cat([p.reshape(-1) for p in self.params]), None, 1)
        else:
            recvs = {w: torch.empty(self.n_params, dtype=self.params[0].dtype) for w in range(1, self.workers + 1)}
            self.comm.exchange(recvs=recvs)
            total = torch.zeros(self.n_params, dtype=self.params[0].dtype)
            for w in range(1, self.workers + 1):
                total += recvs[w]
            self.apply(total / self.workers, total)
            x = torch.cat([p.reshape(-1) for p in self.params])
            self.comm.exchange(sends={w: x for w in range(1, self.workers + 1)})
        self.served += 1
        self.comm.round()

    @torch.no_grad()
    def apply(self, d_mean: torch.Tensor, d_sum: torch.Tensor) -> None:
        """x <- x - eta (d_mean + alpha_bar + lambda x); alpha_bar <- alpha_bar + (B/n) d_sum
        (without variance reduction: x <- x - eta (d_mean + lambda x)); eta = the scheduled lr."""
        eta = float(self.ctx.lr())
        x = torch.cat([p.reshape(-1) for p in self.params])
        g = d_mean + self.alpha_bar + self.l2 * x if self.vr else d_mean + self.l2 * x
        copy_back(x - eta * g, self.params)
        if self.vr:
            self.alpha_bar += (self.batch / self.n) * d_sum

    # -- evaluation, metrics, checkpoints ----------------------------------------------------------
    @contextlib.contextmanager
    def eval_context(self) -> Iterator[None]:
        """Within the block every rank holds the server's model (an uncounted broadcast)."""
        self.consensus_distance = None
        with holding_model_of(self.model, self.comm, SERVER):
            yield

    def suboptimality(self) -> float:
        """f(x) - f* at the server's model (float64 over the n samples)."""
        with torch.no_grad():
            f = objective(self.params[0].double(), self.params[1].double(), self.a64, self.y, self.l2)
        return float(f) - self.f_star

    def metrics(self) -> dict:
        if not self.is_server:
            return {}
        gap = self.suboptimality()
        out = {"suboptimality": gap, "objective": gap + self.f_star, "f_star": self.f_star,
               "iterations": self.served,
               "gradients": self.served * self.batch * (self.workers if self.mode == "sync" else 1)}
        if self.mode == "async":
            applied = self.plan.arrivals[: self.served]
            out["staleness"] = sum(a.staleness for a in applied) / max(len(applied), 1)
            out["staleness_max"] = max((a.staleness for a in applied), default=0)
        return out

    def state_dict(self) -> dict:
        if self.is_server:
            return {"served": self.served, "alpha_bar": self.alpha_bar.clone()}
        return {"table": None if self.table is None else self.table.clone(), "pending": self.pending}

    def load_state_dict(self, state: dict) -> None:
        if self.is_server:
            self.served = int(state["served"])
            self.alpha_bar.copy_(state["alpha_bar"])
        else:
            if self.table is not None:
                self.table.copy_(state["table"])
            self.pending = state["pending"]


__all__ = ["ADSAGA", "DelayModel", "features", "objective", "partitions", "residuals", "saga_difference",
           "solve_f_star"]
