"""Asynchronous Local-SGD in real timing (``algo=async_local_sgd algo.timing=real``): updates are
applied in the order they arrive, and a worker's speed is emulated by stretching its local steps in
wall time, for users who want true asynchrony (docs/papers.md#asynchronous-local-sgd; the issue's "real" mode).
:mod:`lsgd.algorithms.asynchronous.async_local_sgd` has the algorithm (tasks, pseudo-gradients, outer
optimizers, staleness discount, ``max_staleness``, FedBuff); this module only replaces the
virtual-time plan by messages.

Workers (ranks 1..W). Worker ``w`` runs tasks of ``H_w`` local steps (``algo.local_steps``, with
``algo.dylu`` DyLU from the modeled step times, as in virtual mode). Each local step is stretched to
at least ``step_s[w] x algo.time_scale`` wall seconds (``step_s[w]``: the modeled seconds per step
of worker w, ``cluster.compute=profile`` with ``cluster.speeds``; the worker sleeps the rest of the
step after its real compute; a step whose compute takes longer is not shortened): the rule of the
trainer's ``cluster.stretch`` for every method (:func:`lsgd.compute.stretch.stretch_step`, the same helper;
:mod:`lsgd.compute.stretch`), with ``algo.time_scale`` for its scale, so
``cluster.stretch=true`` with real timing is a ConfigError (the steps would be stretched twice).
At the end of a task (in ``after_step`` of its last step, after that step's loss was accumulated) it pushes the
pseudo-gradient ``g = theta_start - theta_end`` with its floating buffers on its own 2-rank group,
then a small header (float64: its loss sum, loss count and non-finite count since its last push,
``H_w``, and the model version it started from), and waits for the reply: a header (the server's
progress, a stop flag, the version of the model that follows) and, unless told to stop, the
server's model, from which it starts its next task. Told to stop, it leaves its loop.

Server (rank 0). It keeps one receive posted per worker (a daemon thread per posted receive waits
for it and queues the worker's index: gloo's receive work has no completion poll), applies
whichever push completed first (pushes found complete at the same moment: lowest worker index
first) with :meth:`AsyncLocalSGD.apply` (the same outer optimizers, staleness discount,
``max_staleness`` and FedBuff code as virtual mode), copies the worker's buffers, adds the shipped
losses to its record accumulators, replies and reposts that worker's receive. Staleness of an
arrival = arrivals the server handled between the version it handed that worker and this arrival;
the server checks that the worker's header names that version. Progress = ``min(T, floor(local
steps of the handled tasks / W))`` as in virtual mode. The arrival that brings the progress to T is
answered with stop; :meth:`RealTiming.finish` (after the trainer's loop, also after a divergence)
answers every other worker's next push with stop, discarding those tasks, so no worker is left
waiting.

Bookkeeping: progress is not known in advance, so records, evaluations and checkpoints cannot be
collectives at planned points; the algorithm sets ``bookkeeping = "server"``: the server alone makes
the records (at every multiple its progress crosses; ``train_loss`` = mean of the losses shipped
with the tasks handled since the previous record, repeated when one arrival crosses several record
points), evaluates its own model over the whole test set, and workers make no records. At the end
every rank joins one gather, so ``summary.json`` has every rank's figures (``modeled_time_s`` the
maximum of the clocks). Checkpoints are not supported: ``checkpoint_every`` > 0 and
``launcher.preemption`` ``checkpoint`` or ``requeue`` are ConfigErrors (a resume could not restore
the messages in flight nor the arrival order anyway); under ``auto`` a preemption signal is never
turned into a checkpoint (the server's bookkeeping has no collective to agree on it).

The server writes one row per handled arrival to metrics.jsonl (``"kind": "async_arrival"``: index,
worker, the version it pulled (the server's arrival count then), staleness (outer steps the
server took since: ``index - pulled`` less the dropped arrivals and, under FedBuff, the arrivals
that did not complete a step), local steps, dropped, the progress after it and wall
seconds since the server's first receive); records carry ``staleness``, ``staleness_max``,
``updates_worker<w>`` (and ``dropped``) as in virtual mode, with the measured ``wall_time_s``.

What is and is not reproducible: the arrival order depends on the machine's real timing, so two
runs with more than one worker generally differ (in update counts, staleness and the final model).
With one worker the order is forced, and the run equals sync DiLoCo on one worker bit for bit.
The cluster clock still runs: a worker's clock advances by its modeled compute per step and by
the modeled cost of its messages, and the server's by its messages (a receive completes at
``max(server ready, worker's send start + cost)``), but the events follow wall-clock order rather
than the modeled one, so ``modeled_time_s`` in real mode is the modeled cost of the run as it
happened, not the time of the virtual-time schedule. A worker's measured ``compute_time_s``
includes the stretch (the sleep is emulated compute); its ``comm_time_s`` includes waiting for the
server's reply.

Tested on gloo (``tests/distributed/test_async_real.py``, ``tests/cli/test_async_real_cli.py``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time

import torch

from lsgd.algorithms.asynchronous.plan import dylu_steps
from lsgd.algorithms.base import Algorithm
from lsgd.compute.stretch import stretch_step, stretch_target_s
from lsgd.comm.collectives import copy_back
from lsgd.core.errors import ConfigError

log = logging.getLogger("lsgd")

SERVER = 0
#: push header: loss sum, loss count, non-finite losses, local steps of the task, version pulled
PUSH_HEADER = 5
#: reply header: the server's progress, stop (1.0) or go on (0.0), version of the model that follows
REPLY_HEADER = 3
#: kind of the per-arrival rows in metrics.jsonl
ARRIVAL_KIND = "async_arrival"


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors]) if tensors else torch.zeros(0)


def validate_run(cfg: dict) -> None:
    """Run-level checks of real timing (module docstring).

    Raises:
        ConfigError: naming the key and what is allowed.
    """
    compute = (cfg.get("cluster") or {}).get("compute", "profile")
    if compute != "profile":
        raise ConfigError(f"algo=async_local_sgd with algo.timing=real needs cluster.compute=profile (each worker's "
                          f"local steps are stretched to its modeled step time x algo.time_scale); got "
                          f"cluster.compute={compute!r}")
    if (cfg.get("cluster") or {}).get("stretch"):
        raise ConfigError("algo=async_local_sgd with algo.timing=real stretches its workers' steps itself (by "
                          "algo.time_scale): set cluster.stretch=false, got cluster.stretch=true")
    if int(cfg.get("checkpoint_every") or 0) > 0:
        raise ConfigError("algo=async_local_sgd with algo.timing=real makes no checkpoints (the server alone keeps "
                          "the records; the messages in flight and the arrival order cannot be restored): set "
                          f"checkpoint_every=0, got {cfg.get('checkpoint_every')!r}")
    preemption = (cfg.get("launcher") or {}).get("preemption", "off")
    if preemption in ("checkpoint", "requeue"):
        raise ConfigError("algo=async_local_sgd with algo.timing=real cannot checkpoint on preemption: set "
                          f"launcher.preemption=off (or auto), got {preemption!r}")


class RealTiming:
    """The real-timing half of :class:`lsgd.algorithms.asynchronous.async_local_sgd.AsyncLocalSGD` (module
    docstring): the algorithm delegates its hooks here; the state it shares (parameters, outer
    optimizer, counters) stays on the algorithm ``algo``."""

    def __init__(self, algo):
        self.algo = algo
        self.time_scale = float(algo.config.time_scale)
        self.stopped = False
        # server
        self.versions: list[int] = []       # the model version the server last handed each worker (its arrival count)
        self.pulled_updates: list[int] = []  # the server's outer steps (server_updates) when it did
        self.staleness: list[int] = []      # of every handled arrival, in order
        self.updates: list[int] = []        # handled arrivals per worker
        self.applied_steps = 0
        self.progress_now = 0
        self.pending: dict[int, tuple] = {}  # worker -> (payload, header, payload handle, header handle)
        self.arrived: queue.Queue = queue.Queue()
        self.ready: set[int] = set()
        self.released: set[int] = set()
        self.wall0: float | None = None
        # worker
        self.h = 0
        self.target_s = 0.0
        self.task_steps = 0
        self.task_start = 0
        self.pulled_progress = 0
        self.version = 0
        self.t0: float | None = None

    # -- setup ---------------------------------------------------------------------------------
    def setup(self, model, optimizer, ctx):
        a = self.algo
        model = Algorithm.setup(a, model, optimizer, ctx)
        a.params = [p for p in model.parameters()]
        a.buffers = [b for b in model.buffers() if b.is_floating_point()]
        dtypes = {t.dtype for t in a.params + a.buffers}
        if len(dtypes) > 1:
            raise ValueError(f"async_local_sgd moves one flat buffer per message: all parameters and buffers must "
                             f"share a dtype, got {dtypes}")
        a.is_server = a.comm.rank == SERVER
        self.n_workers = a.comm.world_size - 1
        # one 2-rank group per (server, worker): every rank creates them all, in the same order
        pairs = [a.comm.subgroup([SERVER, w]) for w in range(1, self.n_workers + 1)]
        a.pairs = pairs if a.is_server else None
        a.pair = None if a.is_server else pairs[a.comm.rank - 1]
        a.worker = None if a.is_server else a.comm.rank - 1
        self.total = int(a.ctx.total_steps)
        if a.is_server:
            a.outer = a._outer_optimizer()
            self.versions = [0] * self.n_workers
            self.pulled_updates = [0] * self.n_workers
            self.updates = [0] * self.n_workers
        else:
            step_s = a.ctx.worker_step_s
            if step_s is None:
                raise ConfigError("algo=async_local_sgd with algo.timing=real needs cluster.compute=profile (modeled "
                                  "step times of every worker)")
            self.h = dylu_steps(a.local_steps, step_s, a.dylu)[a.worker]
            self.target_s = stretch_target_s(step_s, a.worker, self.time_scale)
            a.start = [p.detach().clone() for p in a.params]
        return model

    # -- the schedule ----------------------------------------------------------------------------
    def progress(self, step: int) -> int:
        if self.algo.is_server:
            return self.progress_now
        return self.total if self.stopped else min(self.total, self.pulled_progress)

    def schedule_position(self, step: int) -> int | None:
        """Server: its progress. Worker: the progress it last pulled plus its local steps in the
        current task (one worker: its local step count, as sync DiLoCo's)."""
        if step <= 0:
            return None
        if self.algo.is_server:
            return self.progress_now
        return min(self.total, self.pulled_progress + step - self.task_start)

    # -- worker ----------------------------------------------------------------------------------
    def before_step(self, step: int) -> None:
        self.t0 = time.perf_counter()

    @torch.no_grad()
    def after_step(self, step: int) -> None:
        """Stretch the local step to its target wall time; at a task's end push g and the header,
        then take the reply (module docstring)."""
        a = self.algo
        if a.is_server:
            return
        if self.t0 is not None:  # a worker blocks nowhere before its task's end: nothing to deduct
            stretch_step(self.target_s, self.t0)
        self.task_steps += 1
        if self.task_steps < self.h:
            return
        g = _flat([s - p for s, p in zip(a.start, a.params)] + a.buffers)
        loss_sum, count, nonfinite = a.ctx.take_losses() if a.ctx.take_losses is not None else (0.0, 0, 0)
        header = torch.tensor([loss_sum, count, nonfinite, self.h, self.version], dtype=torch.float64)
        a.pair.sendrecv(g, None, 0)
        a.pair.exchange({0: header}, None, count=False)
        reply = torch.empty(REPLY_HEADER, dtype=torch.float64)
        a.pair.exchange(None, {0: reply}, count=False)
        progress, stop, version = reply.tolist()
        a.comm.round()
        self.pulled_progress = int(progress)
        if stop:
            self.stopped = True
            return
        theta = torch.empty_like(g)
        a.pair.sendrecv(None, theta, 0)
        copy_back(theta, a.params + a.buffers)
        for s, p in zip(a.start, a.params):
            s.copy_(p)
        self.version = int(version)
        self.task_steps = 0
        self.task_start = step

    # -- server ----------------------------------------------------------------------------------
    def _post(self, w: int) -> None:
        """Post worker ``w``'s next push (payload and header) and a thread that waits for it."""
        a = self.algo
        n = sum(t.numel() for t in a.params + a.buffers)
        payload = torch.empty(n, dtype=a.params[0].dtype, device=a.params[0].device)
        header = torch.empty(PUSH_HEADER, dtype=torch.float64)
        hp = a.pairs[w].irecv(payload, 1)
        hh = a.pairs[w].irecv(header, 1, count=False)

        def wait():
            a.comm.background_thread()  # waits beside the server's loop: not its blocked time
            try:
                hp.wait_works()
                hh.wait_works()
                self.arrived.put((w, None))
            except BaseException as exc:  # a dead peer: the server raises it
                self.arrived.put((w, exc))

        self.pending[w] = (payload, header, hp, hh)
        threading.Thread(target=wait, name=f"lsgd-async-push{w}", daemon=True).start()

    def _post_all(self) -> None:
        if self.wall0 is None:
            self.wall0 = time.perf_counter()
            for w in range(self.n_workers):
                self._post(w)

    def _next(self) -> int:
        """The worker whose push completed first (lowest index among those found complete)."""
        if not self.ready:
            with self.algo.comm.blocking():  # the server waits for a push: communication
                self.ready.add(self._take(self.arrived.get()))
        while True:
            try:
                self.ready.add(self._take(self.arrived.get_nowait()))
            except queue.Empty:
                break
        w = min(self.ready)
        self.ready.discard(w)
        return w

    @staticmethod
    def _take(item) -> int:
        w, exc = item
        if exc is not None:
            raise RuntimeError(f"async_local_sgd (real timing): receiving worker {w}'s push failed") from exc
        return w

    def _receive(self, w: int) -> tuple[torch.Tensor, list[float]]:
        payload, header, hp, hh = self.pending.pop(w)
        hp.wait()  # the transfer is done (the thread waited); this settles the clock and the counters
        hh.wait()
        return payload, header.tolist()

    def _reply(self, w: int, stop: bool) -> None:
        a = self.algo
        pair = a.pairs[w]
        header = torch.tensor([self.progress_now, 1.0 if stop else 0.0, a.served], dtype=torch.float64)
        pair.exchange({1: header}, None, count=False)
        if stop:
            self.released.add(w)
            return
        pair.sendrecv(_flat(a.params + a.buffers), None, 1)
        self.versions[w] = a.served
        self.pulled_updates[w] = a.server_updates()
        self._post(w)

    @torch.no_grad()
    def serve_step(self, step: int) -> None:
        """Apply the next push to arrive (module docstring) and reply."""
        a = self.algo
        self._post_all()
        w = self._next()
        payload, (loss_sum, count, nonfinite, steps, pulled) = self._receive(w)
        if int(pulled) != self.versions[w]:
            raise RuntimeError(f"async_local_sgd (real timing): worker {w} pushed a task from version {int(pulled)}, "
                               f"the server handed it version {self.versions[w]}")
        i = a.served
        staleness = a.server_updates() - self.pulled_updates[w]  # outer steps since its pull
        n_params = sum(p.numel() for p in a.params)
        dropped = a.dropped
        a.apply(payload[:n_params], staleness, index=i)
        copy_back(payload[n_params:], a.buffers)
        if a.ctx.add_losses is not None:
            a.ctx.add_losses(loss_sum, int(count), int(nonfinite))
        self.applied_steps += int(steps)
        self.progress_now = min(self.total, self.applied_steps // self.n_workers)
        a.served = i + 1
        self.updates[w] += 1
        self.staleness.append(staleness)
        a.step_rows.append({"kind": ARRIVAL_KIND, "step": self.progress_now, "index": i, "worker": w,
                            "pulled": int(pulled), "staleness": staleness, "local_steps": int(steps),
                            "dropped": a.dropped > dropped, "wall_s": time.perf_counter() - self.wall0})
        self._reply(w, stop=self.progress_now >= self.total)
        a.comm.round()

    @torch.no_grad()
    def finish(self) -> None:
        """Server: answer every worker not yet released with stop at its next push (its task is
        discarded), so no worker waits forever."""
        if not self.algo.is_server:
            return
        self._post_all()
        while len(self.released) < self.n_workers:
            w = self._next()
            self._receive(w)
            self._reply(w, stop=True)

    # -- metrics, checkpoints --------------------------------------------------------------------
    def metrics(self) -> dict:
        a = self.algo
        if not a.is_server:
            return {}
        out = {"server_updates": a.server_updates(),
               "staleness": sum(self.staleness) / max(len(self.staleness), 1),
               "staleness_max": max(self.staleness, default=0)}
        for w in range(self.n_workers):
            out[f"updates_worker{w}"] = self.updates[w]
        if a.max_staleness is not None:
            out["dropped"] = a.dropped
        return out

    def state_dict(self) -> dict:
        raise RuntimeError("algo=async_local_sgd with algo.timing=real makes no checkpoints (checkpoint_every must be 0)")

    def load_state_dict(self, state: dict) -> None:
        raise RuntimeError("algo=async_local_sgd with algo.timing=real cannot resume from a checkpoint")


__all__ = ["ARRIVAL_KIND", "RealTiming", "validate_run"]
