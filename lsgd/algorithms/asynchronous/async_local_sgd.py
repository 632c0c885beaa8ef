"""``async_local_sgd``: asynchronous Local-SGD with a parameter server (Liu, Douillard et al. 2024,
"Asynchronous Local-SGD Training for Language Modeling", arXiv 2401.09135; docs/papers.md#asynchronous-local-sgd).

Roles: rank 0 is the server, ranks 1..W the workers (data shards go to the W workers). The server
holds the global model theta (its ``self.model``: evaluation and checkpoints see it) and the outer
optimizer. Worker ``w``:

1. starts a task from the server's model theta_start (the model it pulled last);
2. runs ``H_w`` local steps with the run's inner optimizer (``optim``, AdamW for the paper; its
   state stays on the worker across tasks); ``H_w = algo.local_steps``, or with DyLU
   (``algo.dylu``) ``max(1, floor(v_w / max v x H))``, v = speed (Liu et al. 2024 section 3.3);
3. pushes the pseudo-gradient ``g = theta_start - theta_end`` (start minus end) with its
   floating buffers (BatchNorm statistics) and pulls the server's new model at once.

The server applies one outer step per arrival, in the order of virtual finish time (ties by worker
id), and sends the model back (with the buffers of the worker that arrived last: the server runs no
forward pass of its own). Outer optimizers (``algo.outer_optimizer``, lr eps = ``algo.outer_lr``,
momentum beta = ``algo.outer_momentum``):

* ``sgd``: theta <- theta - eps g;
* ``nesterov``: torch SGD with Nesterov momentum per arrival (naive async DiLoCo):
  b <- beta b + g; theta <- theta - eps (g + beta b);
* ``delayed_nesterov`` (DN, Liu et al. 2024 Algorithm 2; docs/papers.md#asynchronous-local-sgd; the same as HALoS,
  utnslab/halos src/halos/opt.py): for the t-th arrival g_t (t = 0, 1, ...), buffer N =
  ``algo.dn_buffer``, c = ``algo.dn_c``: Delta <- Delta + g_t; if (t + 1) % N == 0:
  m <- beta m + Delta / N, theta <- theta - eps ((1 - cN + c) beta m + g_t / N), Delta <- 0;
  otherwise theta <- theta - eps (c beta m + g_t / N). With c = 0 each arrival is plain SGD at
  eps / N and the momentum acts once per N arrivals; N = 1 is Nesterov per arrival.

Staleness (server versions, i.e. outer steps taken, between a worker's pull and its push: a dropped
arrival and, under FedBuff, an arrival that only fills the buffer are no version; without either
it is the arrivals in between) baselines: ``algo.staleness_exponent``
a > 0 scales g by ``((1 + s_avg) / (1 + s))^a`` (polynomial discount, normalised to 1 at staleness
``algo.staleness_avg`` = s_avg, default 0, as FLSim's ``PolynomialStalenessWeight`` with its
``avg_staleness``); ``algo.max_staleness`` drops arrivals staler than it (the worker still pulls
the current model; the dropped task's steps still count as spent compute in the progress).

FedBuff (``algo.fedbuff`` = K; Nguyen et al. 2022, "Federated Learning with Buffered Asynchronous
Aggregation", AISTATS, Algorithm 1; FLSim's asynchronous trainer): the server adds each arrival's
weighted pseudo-gradient to a buffer and takes the outer step on buffer / K every K arrivals (the
model the workers pull changes only then). Its staleness is counted in server steps, as FLSim counts
model versions (and as every staleness here is): without drops, an arrival with index q (0-based)
whose worker pulled after arrival p - 1 has ``q // K - p // K`` server steps of staleness.

Timing (``algo.timing``): ``real`` applies updates in arrival order and emulates each worker's
speed by stretching its local steps in wall time (``algo.time_scale``; records on the server alone,
not reproducible with more than one worker): :mod:`lsgd.algorithms.asynchronous.real_timing`. ``virtual`` (the
default) decides the order on the cluster clock:
every rank computes the same plan (:mod:`lsgd.algorithms.asynchronous.plan`, whose docstring has the rules,
each rank's progress and the deadlock-freedom argument) from every worker's modeled seconds per
step (``cluster.compute=profile`` with ``cluster.speeds``) and the modeled cost of the messages,
then follows its part: reproducible bit for bit, and records, evaluations and checkpoints follow
virtual time (the trainer's non-lockstep bookkeeping). A worker pushes and pulls in
:meth:`before_step` of the step after its task's last, after that boundary's records. Each
worker's messages travel on its own 2-rank process group with the server (torchft's
ParameterServer pattern; docs/papers.md#asynchronous-local-sgd).

Grace period (``algo.grace_period_s`` = g seconds of virtual time, default 0 = off; Liu et al.
2024's simulation and the DeepMind toy notebook, 0.5 simulated s there): the server applies
near-simultaneous arrivals back to back before the workers restart. When it receives an arrival
at r, every further arrival that reaches it by r + g joins the group; the group's pushes are
received and applied one after another (each with its own staleness, so the second member is at
least one update stale), and only then does the server send the model after the whole group to
each member in turn (the floating buffers of the group's last member). The group closes at its
last member: the server does not sit out the rest of the window when nobody else comes (the
notebook's rule; :mod:`lsgd.algorithms.asynchronous.plan`, rule 5, says why and how records stay free
of deadlock). ``comm_rounds`` still counts arrivals.

Data (``algo.shard_policy``): ``worker`` (default) gives each worker its own shard for the whole
run; ``least_visited`` (Liu et al. 2024's simulation, the notebook's ``sample_data``) gives each
new task the least-visited of the W shards (visits = local steps given to it so far, ties by shard
id), computed in the plan so every rank agrees. A task reads its shard's batches from where the
shard's reading stopped (each shard one stream, each batch read once: :meth:`data_position`, the
trainer keeps one :class:`lsgd.data.ShardedLoader` per shard it visits), and the learning-rate
schedule of a step is its shard's position (per-shard warm-up + cosine).

Progress: floor(local steps of the applied tasks / W), so ``T`` progress steps are the compute of
W workers x T local steps; the run ends when the server has applied enough. The learning-rate
schedule of a worker follows the network's average local step count at its virtual time (with
``least_visited``: its shard's position); the server's follows the progress. ``lr`` in records is
the server's (rank 0).

Bytes (all ``p2p``): per task, the worker sends n + b and the server n + b back (n parameter bytes,
b floating-buffer bytes). Metrics (rank 0, the server): ``server_updates`` (outer steps taken: the
arrivals applied, without dropped ones; with FedBuff one per K), ``staleness`` (mean over applied arrivals)
and ``staleness_max``, ``updates_worker<w>`` (arrivals applied from worker w, 0-based), ``dropped``
(with ``max_staleness``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from lsgd.algorithms.asynchronous import plan as async_plan

from lsgd.algorithms.asynchronous import real_timing as async_real
from lsgd.algorithms.base import AlgoConfig, ServerAlgorithm, float_buffers, holding_model_of
from lsgd.comm.collectives import copy_back
from lsgd.core.errors import ConfigError
from lsgd.core.typed_config import option

log = logging.getLogger("lsgd")

SERVER = 0
OUTER_OPTIMIZERS = ("sgd", "nesterov", "delayed_nesterov")
TIMINGS = ("virtual", "real")


class DelayedNesterov:
    """Delayed Nesterov (module docstring) over ``params`` (updated in place from their ``.grad``).

    Args:
        params: the server's parameters theta.
        lr: eps, the outer learning rate.
        beta: momentum.
        buffer: N >= 1, arrivals per momentum update.
        c: momentum activation between momentum updates (0: none).
    """

    def __init__(self, params: list[torch.Tensor], lr: float, beta: float, buffer: int, c: float = 0.0):
        self.params, self.lr, self.beta, self.buffer, self.c = list(params), float(lr), float(beta), int(buffer), float(c)
        self.t = 0
        self.m = [torch.zeros_like(p) for p in self.params]
        self.delta = [torch.zeros_like(p) for p in self.params]

    @torch.no_grad()
    def step(self) -> None:
        """Apply the arrival held in the parameters' ``.grad``."""
        n, beta, c = self.buffer, self.beta, self.c
        update_momentum = (self.t + 1) % n == 0
        for p, m, delta in zip(self.params, self.m, self.delta):
            g = p.grad
            delta.add_(g)
            if update_momentum:
                m.mul_(beta).add_(delta / n)
                p.sub_(self.lr * ((1 - c * n + c) * beta * m + g / n))
                delta.zero_()
            else:
                p.sub_(self.lr * (c * beta * m + g / n))
        self.t += 1

    def state_dict(self) -> dict:
        return {"t": self.t, "m": [t.clone() for t in self.m], "delta": [t.clone() for t in self.delta]}

    def load_state_dict(self, state: dict) -> None:
        self.t = int(state["t"])
        for dst, src in zip(self.m + self.delta, list(state["m"]) + list(state["delta"])):
            dst.copy_(src)


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors]) if tensors else torch.zeros(0)


@dataclass
class AsyncLocalSGDConfig(AlgoConfig):
    """``algo=async_local_sgd``'s keys (module docstring)."""

    name: str = "async_local_sgd"
    timing: str = option("virtual", choices=TIMINGS, doc="virtual: the arrival order is simulated on the cluster "
                         "clock (needs cluster.compute=profile); real: updates applied in arrival order, speeds "
                         "emulated in wall time (records on the server only, no checkpoints)")
    time_scale: float = option(1.0, above=0, doc="real timing: a local step lasts at least its modeled seconds x "
                               "time_scale of wall time")
    local_steps: int = option(50, at_least=1, doc="H: local steps per task (the paper's default)", symbol="H")
    dylu: bool = option(False, doc="dynamic local updates: H_w = max(1, floor(v_w / max v * H)), v = worker speed")
    outer_optimizer: str = option("delayed_nesterov", choices=OUTER_OPTIMIZERS, doc="the server's outer step: sgd, "
                                  "nesterov (per arrival: naive async DiLoCo) or delayed_nesterov")
    outer_lr: float = option(0.7, above=0, doc="eps: the outer learning rate")
    outer_momentum: float = option(0.9, at_least=0, below=1, doc="beta: the outer momentum")
    dn_buffer: int = option(4, at_least=1, doc="N: arrivals per momentum update (delayed_nesterov; about the "
                            "number of workers)", symbol="N")
    dn_c: float = option(0.0, at_least=0, doc="c: momentum activation between momentum updates (delayed_nesterov)",
                         symbol="c")
    staleness_exponent: float = option(0.0, at_least=0, doc="a: scale g by ((1 + staleness_avg) / (1 + "
                                       "staleness))^a (0: no discount)")
    staleness_avg: float = option(0.0, at_least=0, doc="the staleness whose weight is 1 (FLSim's avg_staleness)")
    max_staleness: int | None = option(None, at_least=0, doc="drop arrivals staler than this many server updates "
                                       "(null: keep all)")
    fedbuff: int | None = option(None, at_least=1, doc="K: FedBuff, one outer step on the mean of every K "
                                 "(weighted) arrivals (null: off)")
    grace_period_s: float = option(0.0, at_least=0, doc="g, seconds of virtual time (finite): arrivals reaching "
                                   "the server within g of the one it receives are applied back to back before their "
                                   "workers restart (0: off; the paper's notebook 0.5)")
    shard_policy: str = option("worker", choices=async_plan.SHARD_POLICIES, doc="worker: each worker its own shard; "
                               "least_visited: each new task the least-visited shard (local steps given to it), read "
                               "from where it stopped; lr schedule per shard")


class AsyncLocalSGD(ServerAlgorithm):
    """Asynchronous Local-SGD / async DiLoCo: a server takes an outer step per worker's arrival.

    The method, its outer optimizers, staleness baselines, timing and data: the module docstring.
    """

    name = "async_local_sgd"
    Config = AsyncLocalSGDConfig
    label = "async local SGD"
    paper = "docs/papers.md#asynchronous-local-sgd"
    defining_keys = ("algo.local_steps",)
    lockstep = False

    @classmethod
    def validate_config(cls, algo: dict, world_size: int) -> None:
        """Also: a finite grace period, and neither a grace period nor ``least_visited`` shards
        with ``timing=real`` (both are rules of the virtual-time plan)."""
        super().validate_config(algo, world_size)
        config = cls.parse_config(algo)
        grace = config.grace_period_s
        if not math.isfinite(grace):
            raise ConfigError(f"algo.grace_period_s must be a finite number >= 0 (seconds of virtual time), got {grace!r}")
        if config.timing == "real":  # both are rules of the virtual-time plan
            if grace > 0:
                raise ConfigError(f"algo.grace_period_s={grace!r} needs algo.timing=virtual (the grace period groups "
                                  f"arrivals in the virtual-time plan); with algo.timing=real set it to 0")
            if config.shard_policy != "worker":
                raise ConfigError(f"algo.shard_policy={config.shard_policy!r} needs algo.timing=virtual (shards "
                                  f"are assigned in the virtual-time plan); with algo.timing=real the allowed value "
                                  f"is worker")

    @classmethod
    def validate_run(cls, cfg: dict, world_size: int) -> None:
        if cls.parse_config(cfg["algo"]).timing == "real":
            return async_real.validate_run(cfg)
        compute = (cfg.get("cluster") or {}).get("compute", "profile")
        if compute != "profile":
            raise ConfigError(f"algo=async_local_sgd with algo.timing=virtual needs cluster.compute=profile (the "
                              f"arrival order is simulated from modeled step times); got cluster.compute={compute!r}")

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        self.local_steps = int(self.config.local_steps)
        self.dylu = bool(self.config.dylu)
        self.exponent = float(self.config.staleness_exponent)
        self.max_staleness = self.config.max_staleness
        self.staleness_avg = float(self.config.staleness_avg)
        self.fedbuff = None if self.config.fedbuff is None else int(self.config.fedbuff)
        self.grace_s = float(self.config.grace_period_s)
        self.shard_policy = self.config.shard_policy
        self.buffer: torch.Tensor | None = None  # FedBuff: the weighted pseudo-gradients since the last server step
        self.buffered = 0                        # FedBuff: arrivals added to the buffer so far
        self.dropped = 0
        self.served = 0  # arrivals the server has handled
        self.plan: async_plan.Plan | None = None
        self.real = async_real.RealTiming(self) if self.config.timing == "real" else None
        if self.real is not None:
            self.bookkeeping = "server"  # progress is not known in advance: the server records alone

    def setup(self, model, optimizer, ctx=None):
        if self.real is not None:
            return self.real.setup(model, optimizer, ctx)
        model = super().setup(model, optimizer, ctx)
        self.params = [p for p in model.parameters()]
        self.buffers = float_buffers(model)
        dtypes = {t.dtype for t in self.params + self.buffers}
        if len(dtypes) > 1:
            raise ValueError(f"async_local_sgd moves one flat buffer per message: all parameters and buffers must "
                             f"share a dtype, got {dtypes}")
        self.is_server = self.comm.rank == SERVER
        n_workers = self.comm.world_size - 1
        # one 2-rank group per (server, worker): every rank creates them all, in the same order
        pairs = [self.comm.subgroup([SERVER, w]) for w in range(1, n_workers + 1)]
        self.pairs = pairs if self.is_server else None
        self.pair = None if self.is_server else pairs[self.comm.rank - 1]
        self.worker = None if self.is_server else self.comm.rank - 1
        self.plan = self._plan(n_workers)
        if self.is_server:
            self.outer = self._outer_optimizer()
        else:
            self.start = [p.detach().clone() for p in self.params]  # theta_start of the current task
        # the server steps the schedule (its lr is the records') and never its inner optimizer
        warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()` before `optimizer.step()`"))
        return model

    def _plan(self, n_workers: int) -> async_plan.Plan:
        step_s, total = self.ctx.worker_step_s, self.ctx.total_steps
        if step_s is None or total is None:
            raise ConfigError("algo=async_local_sgd with algo.timing=virtual needs cluster.compute=profile (modeled "
                              "step times of every worker) and a known run length")
        nbytes = sum(t.numel() * t.element_size() for t in self.params + self.buffers)
        cost = [float(self.comm.pair_cost(SERVER, w + 1, nbytes)[0]) for w in range(n_workers)]
        # one plan for all: every rank takes rank 0's inputs (an uncounted all-gather), so ranks
        # whose FLOP counts of their first batch differ (variable-length text) still agree
        table = self.comm.gather_values([*step_s, *cost])
        if not (table == table[0]).all():
            log.warning("async_local_sgd: ranks' modeled step times or message costs differ; every rank "
                        "follows the plan built from rank 0's")
        step_s, cost = [float(v) for v in table[0][:n_workers]], [float(v) for v in table[0][n_workers:]]
        hs = async_plan.dylu_steps(self.local_steps, step_s, self.dylu)
        return async_plan.plan(step_s, hs, cost, cost, total, self.grace_s, self.shard_policy, fedbuff=self.fedbuff,
                               max_staleness=None if self.max_staleness is None else int(self.max_staleness))

    def _outer_optimizer(self):
        kind = self.config.outer_optimizer
        lr = float(self.config.outer_lr)
        beta = float(self.config.outer_momentum)
        if kind == "sgd":
            return torch.optim.SGD(self.params, lr=lr)
        if kind == "nesterov":
            return torch.optim.SGD(self.params, lr=lr, momentum=beta, nesterov=True)
        return DelayedNesterov(self.params, lr, beta, int(self.config.dn_buffer), float(self.config.dn_c))

    # -- the schedule ------------------------------------------------------------------------------
    def progress(self, step: int) -> int:
        if self.real is not None:
            return self.real.progress(step)
        if step <= 0:
            return 0
        if self.is_server:
            return self.plan.arrivals[step - 1].progress
        return self.plan.workers[self.worker].progress[step - 1]

    def schedule_position(self, step: int) -> int | None:
        if self.real is not None:
            return self.real.schedule_position(step)
        if step <= 0:
            return None
        if self.is_server:
            return self.progress(step)
        return self.plan.workers[self.worker].schedule[step - 1]

    def data_position(self, step: int) -> tuple[int, int] | None:
        """``least_visited``: the planned (shard, batch) of local step ``step``; ``worker``: None
        (the worker's own shard, as every other method)."""
        if self.is_server or self.shard_policy == "worker":
            return None
        data = self.plan.workers[self.worker].data
        return data[step] if step < len(data) else None

    # -- worker ------------------------------------------------------------------------------------
    @torch.no_grad()
    def before_step(self, step: int) -> None:
        """Worker, at the end of a task (after its boundary's records): push g = theta_start -
        theta_end with the buffers, pull the server's model, start the next task from it."""
        if self.real is not None:
            return self.real.before_step(step)
        if self.is_server or step not in self.plan.workers[self.worker].push:
            return
        g = _flat([s - p for s, p in zip(self.start, self.params)] + self.buffers)
        self.pair.sendrecv(g, None, 0)
        theta = torch.empty_like(g)
        self.pair.sendrecv(None, theta, 0)
        copy_back(theta, self.params + self.buffers)
        for s, p in zip(self.start, self.params):
            s.copy_(p)
        self.comm.round()

    # -- server ------------------------------------------------------------------------------------
    @torch.no_grad()
    def serve_step(self, step: int) -> None:
        """Server: receive arrival ``step`` (the plan's order) from its worker and apply the outer
        step; at the last arrival of its group (every arrival without a grace period), send the
        model to each member of the group in turn."""
        if self.real is not None:
            return self.real.serve_step(step)
        arrival = self.plan.arrivals[step]
        pair = self.pairs[arrival.worker]
        n_params = sum(p.numel() for p in self.params)
        recv = torch.empty(n_params + sum(b.numel() for b in self.buffers), dtype=self.params[0].dtype,
                           device=self.params[0].device)
        pair.sendrecv(None, recv, 1)
        self.apply(recv[:n_params], arrival.staleness, index=step)
        copy_back(recv[n_params:], self.buffers)
        if arrival.group_end == step:
            theta = _flat(self.params + self.buffers)
            for i in self.plan.group(step):
                self.pairs[self.plan.arrivals[i].worker].sendrecv(theta, None, 1)
        self.served = step + 1
        self.comm.round()

    def server_updates(self) -> int:
        """Outer steps the server has taken: arrivals applied (dropped ones excluded), with FedBuff
        one per K buffered arrivals."""
        if self.fedbuff is not None:
            return self.buffered // self.fedbuff
        return self.served - self.dropped

    def staleness_weight(self, staleness: int) -> float:
        """``((1 + s_avg) / (1 + s))^a``; 1 without a discount (module docstring)."""
        if self.exponent == 0:
            return 1.0
        return ((1.0 + self.staleness_avg) / (1.0 + staleness)) ** self.exponent

    @torch.no_grad()
    def apply(self, g: torch.Tensor, staleness: int, index: int = 0) -> None:
        """The outer step on the flat pseudo-gradient ``g`` of arrival ``index`` (0-based, in the
        server's order), ``staleness`` server versions (outer steps) stale; with FedBuff, the buffer
        (module docstring)."""
        if self.max_staleness is not None and staleness > int(self.max_staleness):
            self.dropped += 1
            return
        if self.fedbuff is not None:
            k = self.fedbuff
            weighted = g * self.staleness_weight(staleness)
            self.buffer = weighted.clone() if self.buffer is None else self.buffer.add_(weighted)
            self.buffered += 1
            if self.buffered % k:
                return
            g, self.buffer = self.buffer / k, None
        elif self.exponent > 0:
            g = g * self.staleness_weight(staleness)
        offset = 0
        for p in self.params:
            p.grad = g[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        self.outer.step()
        for p in self.params:
            p.grad = None

    # -- evaluation, metrics, checkpoints ------------------------------------------------------------
    @contextlib.contextmanager
    def eval_context(self) -> Iterator[None]:
        """Within the block every rank holds the server's model (an uncounted broadcast from rank 0;
        the workers' own models are restored afterwards)."""
        self.consensus_distance = None
        with holding_model_of(self.model, self.comm, SERVER):
            yield

    def after_step(self, step: int) -> None:
        if self.real is not None:
            self.real.after_step(step)

    def finish(self) -> None:
        if self.real is not None:
            self.real.finish()

    def metrics(self) -> dict:
        if self.real is not None:
            return self.real.metrics()
        if not self.is_server:
            return {}
        applied = self.plan.arrivals[: self.served]
        out = {"server_updates": self.server_updates(),
               "staleness": sum(a.staleness for a in applied) / max(len(applied), 1),
               "staleness_max": max((a.staleness for a in applied), default=0)}
        for w in range(len(self.plan.workers)):
            out[f"updates_worker{w}"] = sum(1 for a in applied if a.worker == w)
        if self.max_staleness is not None:
            out["dropped"] = self.dropped
        return out

    def state_dict(self) -> dict:
        if self.real is not None:
            return self.real.state_dict()
        if self.is_server:
            return {"outer": self.outer.state_dict(), "dropped": self.dropped, "served": self.served,
                    "buffer": None if self.buffer is None else self.buffer.clone(), "buffered": self.buffered}
        return {"start": [t.clone() for t in self.start]}

    def load_state_dict(self, state: dict) -> None:
        if self.real is not None:
            return self.real.load_state_dict(state)
        if self.is_server:
            self.outer.load_state_dict(state["outer"])
            self.dropped = int(state["dropped"])
            self.served = int(state["served"])
            self.buffer = state.get("buffer")
            self.buffered = int(state.get("buffered", 0))
        else:
            with torch.no_grad():
                for t, s in zip(self.start, state["start"]):
                    t.copy_(s)


__all__ = ["AsyncLocalSGD", "DelayedNesterov"]
