"""The training loop of one process: read it top to bottom.

``worker_main(cfg, run_dir)`` is the entry point of every process (spawned by lsgd.launch.spawn or
started by torchrun / srun): it joins the process group, then :class:`Trainer` builds data, model,
optimizer, the cluster clock and the algorithm from the config, asks the algorithm for this rank's
role and runs one linear loop:

    worker: batch -> forward/backward (clock: compute) -> algorithm.after_backward
            -> gradient clipping (optim.clip_grad_norm) -> algorithm.optimizer_step -> schedule step
            -> algorithm.after_step -> bookkeeping
    server: algorithm.serve_step -> schedule step -> bookkeeping

The step's time (the cluster clock's compute, the measured compute, the stretch) is kept by a
:class:`lsgd.training.timekeeping.StepTimer` the loop calls at fixed points of the step.
Bookkeeping (log / evaluate / checkpoint: :mod:`lsgd.training.recorder`,
:mod:`lsgd.training.evaluator`, :mod:`lsgd.training.checkpointer`) happens at the same progress
count on every rank (or, where the algorithm's ``bookkeeping`` is ``server``, on the server alone
with no collective). Only rank 0 writes results (metrics.jsonl, summary.json); every rank appends
rank-prefixed lines to train.log and writes its own checkpoint shard.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from lsgd.training.accel import Precision, batch_to_channels_last, compile_module, to_channels_last
from lsgd.algorithms import ALGORITHMS, build_algorithm
from lsgd.algorithms.base import RunContext
from lsgd.compute.model import ComputeModel
from lsgd.compute.stretch import stretch_target_s
from lsgd.compute.workers import resolve_speeds
from lsgd.clock.network import Network
from lsgd.clock.worker_clock import Clock
from lsgd.comm.communicator import Communicator
from lsgd.comm.inprocess.scheduler import Aborted
from lsgd.core.devices import default_dtype, resolve_backend, resolve_device, threads_per_worker
from lsgd.data import ShardedLoader, build_datasets, dataset_info, resolve
from lsgd.data.pipeline import BatchPipeline
from lsgd.models import build_model
from lsgd.training.optim import build_optimizer, build_scheduler, clip_grad_norm, lr_decay_steps, scaled_lr
from lsgd.training.preemption import PreemptionWatch, StopFlag, Stopped
from lsgd.training.provenance import record_workers
from lsgd.training.checkpointer import Checkpointer
from lsgd.training.evaluator import Evaluator, loss_fn
from lsgd.training.recorder import Recorder
from lsgd.training.timekeeping import StepTimer, modeled_step_times

log = logging.getLogger("lsgd")
file_log = logging.getLogger("lsgd.file")  # train.log only (setup_logging)
_PROCESS_RUNS = itertools.count()  # runs this process has joined (a -m sweep joins one per arm)


# --------------------------------------------------------------------------------------------
# process setup
# --------------------------------------------------------------------------------------------
def setup_logging(run_dir: Path | None, rank: int | None) -> None:
    """Rank-prefixed log lines to stderr (rank 0, or every rank at WARNING) and to run_dir/train.log.

    ``rank`` None: one setup for all the workers of an in-process cluster (threads of this
    process), each line prefixed with the rank of the worker that logs it (``dist.get_rank()`` in
    its thread; ``main`` outside the workers)."""
    prefix = f"[rank {rank}]" if rank is not None else "[rank %(lsgd_rank)s]"
    fmt = logging.Formatter(f"{prefix} %(asctime)s %(levelname)s %(message)s", "%H:%M:%S")
    log.handlers.clear()
    log.setLevel(logging.INFO)
    log.propagate = False
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(fmt)
    if rank is not None:
        console.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    else:
        console.addFilter(_worker_rank)
        console.addFilter(lambda record: record.levelno >= logging.WARNING or record.lsgd_rank in (0, "main"))
    log.addHandler(console)
    file_log = logging.getLogger("lsgd.file")  # train.log only (the step lines under a progress bar)
    file_log.handlers.clear()
    file_log.setLevel(logging.INFO)
    file_log.propagate = False
    if run_dir is not None:
        # O_APPEND: whole lines from all ranks interleave without clobbering each other.
        handler = logging.FileHandler(Path(run_dir) / "train.log", mode="a")
        handler.setFormatter(fmt)
        if rank is None:
            handler.addFilter(_worker_rank)
        log.addHandler(handler)
        file_log.addHandler(handler)


def _worker_rank(record: logging.LogRecord) -> bool:
    """A log filter: the record's ``lsgd_rank``, the logging worker's rank (``main`` outside one)."""
    record.lsgd_rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else "main"
    return True


@record
def worker_main(cfg: dict, run_dir: str | None, stop: StopFlag | None = None) -> dict | None:
    """Entry point of one worker. ``run_dir`` is None on ranks that learn it from rank 0, as they
    learn rank 0's ``resume`` decision (a requeued SLURM job resumes its own folder). ``stop``: the
    main process's signal in a local launch (:mod:`lsgd.training.preemption`: SIGINT / SIGTERM stop the run
    at the next step with a checkpoint).

    The process group gets ``launcher.timeout_s`` as collective timeout, so a collective whose peer
    died raises instead of hanging forever. A rank that raises records its error in
    ``failures/rank<r>.json`` and ``summary.json`` names the first failing rank
    (:func:`lsgd.training.failures.record_failure`).

    Returns this rank's summary dict (status ``completed``, ``diverged``, ``preempted`` or
    ``interrupted``).

    Raises:
        RuntimeError: this rank cannot see the run folder rank 0 created (no shared filesystem).
    """
    from lsgd.core.devices import cuda_device_index

    device = resolve_device(cfg)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    device_index = cuda_device_index(local_rank, local_world, torch.cuda.device_count()) if device == "cuda" else None
    if device_index is not None:
        torch.cuda.set_device(device_index)
    # torch threads: launcher.threads_per_worker, else OMP_NUM_THREADS (set by lsgd's own launch),
    # else, joining torchrun/srun, the cores shared by this node's tasks (as a local launch does)
    threads = cfg["launcher"].get("threads_per_worker") or int(os.environ.get("OMP_NUM_THREADS") or 0)
    if not threads and "LOCAL_WORLD_SIZE" in os.environ:
        threads = threads_per_worker(local_world)
    if threads:
        torch.set_num_threads(threads)
    watch = PreemptionWatch(cfg["launcher"].get("preemption", "off"), stop=stop,
                            interrupts=bool(cfg["launcher"].get("interrupts", True)))
    with watch:  # a signal from here on becomes a checkpoint and a stop, not an abrupt death
        # the rendezvous store under a prefix of its own for every run this process joins: the runs
        # of a `-m` sweep under torchrun share torchrun's agent store, where the previous run's keys
        # (same default group name) would otherwise be read as this run's
        timeout = timedelta(seconds=float(cfg["launcher"].get("timeout_s", 300)))
        store, rank, world = next(dist.rendezvous("env://", timeout=timeout))
        store.set_timeout(timeout)
        dist.init_process_group(
            backend=resolve_backend(cfg), store=dist.PrefixStore(f"lsgd_run{next(_PROCESS_RUNS)}", store),
            rank=rank, world_size=world, timeout=timeout,
            device_id=torch.device("cuda", device_index) if device_index is not None else None,
        )
        try:
            return train_in_group(cfg, run_dir, device, watch, local_world)
        finally:
            dist.destroy_process_group()


def train_in_group(cfg: dict, run_dir: str | None, device: str, watch: PreemptionWatch, local_world: int,
                   logging_set: bool = False) -> dict:
    """The part of a worker's run inside its joined process group: learn the run folder and the
    ``resume`` decision from rank 0, set up logging (unless ``logging_set``: the in-process
    launcher sets it once for all its workers), record the nodes, train, and wait for every rank
    before returning this rank's summary. A failure is recorded in ``failures/rank<r>.json``
    (:func:`lsgd.training.failures.record_failure`) and raised."""
    from lsgd.training.failures import check_shared_run_dir, record_failure

    rank = dist.get_rank()
    try:
        box = [run_dir, cfg.get("resume")]
        dist.broadcast_object_list(box, src=0)
        run_dir, cfg["resume"] = box
        check_shared_run_dir(Path(run_dir), rank, device)
        if not logging_set:
            setup_logging(Path(run_dir), rank)
        record_workers(Path(run_dir), rank, dist.get_world_size(), local_world)  # environment.json: threads, nodes
        summary = Trainer(cfg, Path(run_dir), device, watch).fit()
        dist.barrier()  # nobody tears the group down while a peer's last messages are in flight
        return summary
    except Aborted:  # an in-process worker stopped because another failed: that one's record says why
        raise
    except BaseException as exc:
        record_failure(Path(run_dir) if run_dir else None, rank, exc)
        raise


# --------------------------------------------------------------------------------------------
# the trainer
# --------------------------------------------------------------------------------------------
class Trainer:
    """One process's training run (a worker's or a server's). ``fit()`` returns the summary dict."""

    def __init__(self, cfg: dict, run_dir: Path, device: str = "cpu", watch: PreemptionWatch | None = None):
        self.cfg = cfg
        self.watch = watch or PreemptionWatch("off")
        self.run_dir = Path(run_dir)
        self.device = torch.device(device if device != "cuda" else f"cuda:{torch.cuda.current_device()}")
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        self.is_main = self.rank == 0
        seed = int(cfg["seed"])
        # parameters, inputs and every buffer an algorithm allocates follow torch's default dtype:
        # set for every run (a process that runs several, e.g. the golden cases, gets each one's)
        torch.set_default_dtype(default_dtype(cfg))
        self.label_smoothing = float(cfg.get("label_smoothing") or 0.0)  # training loss only

        # roles: the algorithm says what every rank is; data shards go to workers only
        roles = ALGORITHMS[cfg["algo"]["name"]].roles(self.world_size)
        workers = [r for r, role in enumerate(roles) if role == "worker"]
        self.role = roles[self.rank]
        worker_index = workers.index(self.rank) if self.role == "worker" else None
        self.num_workers = len(workers)

        # data: every rank builds the same datasets; a worker reads its own shard (a server keeps
        # worker 0's loader for the epoch length only)
        self.info = dataset_info(cfg["dataset"])
        self.train_set, self.test_set = build_datasets(cfg["dataset"], seed)
        shard = worker_index if worker_index is not None else 0
        self.worker_index = worker_index
        # the input pipeline (lsgd.data.pipeline): DataLoader processes, pinned batches on cuda; one
        # for every shard this worker reads; the same batches as built here
        self.pipeline = BatchPipeline.from_config(self.train_set, resolve(cfg["dataset"]), self.device.type)
        self.loader = ShardedLoader(self.train_set, cfg["dataset"], shard, self.num_workers, int(cfg["batch_size"]), seed,
                                    pipeline=self.pipeline)
        self.loaders = {shard: self.loader}  # other shards' loaders, made when an algorithm moves this worker
        self.steps_per_epoch = self.loader.steps_per_epoch
        total = int(cfg["epochs"]) * self.steps_per_epoch
        self.total_steps = min(total, int(cfg["max_steps"])) if cfg.get("max_steps") else total

        # model: identical initialization on every rank (same seed), then per-rank RNG streams
        # (a worker's stream follows its worker index; servers come after all workers)
        stream = worker_index if worker_index is not None else self.num_workers + self.rank
        torch.manual_seed(seed)
        self.model = build_model(cfg["model"], self.info).to(self.device)
        self.channels_last = bool(cfg["model"].get("channels_last", False))  # lsgd.training.accel: NHWC convnets
        if self.channels_last:
            to_channels_last(self.model)
        torch.manual_seed(seed + 1000 * (stream + 1))
        random.seed(seed + stream)
        np.random.seed(seed + stream)
        self.optimizer = build_optimizer(self.model.parameters(), {**cfg["optim"], "lr": scaled_lr(cfg, self.num_workers)},
                                         self.device)
        self.scheduler = build_scheduler(self.optimizer, cfg["schedule"], self.steps_per_epoch, self.total_steps)
        clip = cfg["optim"].get("clip_grad_norm")
        self.clip_grad_norm = float(clip) if clip is not None else None  # global-norm clipping before each step

        # the cluster clock: compute from the profile (or measured), communication priced on the links
        cluster = cfg.get("cluster") or {}
        speeds = resolve_speeds(cluster.get("speeds"), self.world_size, seed)
        self.compute_model = ComputeModel(cluster, speed=speeds[self.rank])
        self._calibrate()
        network = Network.from_config(cfg["network"], cluster.get("gpus_per_node") or 1)
        self.clock = Clock(network.k)
        self.comm = Communicator(network, clock=self.clock, device=self.device)
        worker_step_s = modeled_step_times(self.compute_model, speeds, workers)
        # cluster.stretch: this worker's local steps last at least its modeled step time x
        # cluster.time_scale of wall time (lsgd.compute.stretch); None: off, or a server
        stretch_s = (stretch_target_s(worker_step_s, worker_index, float(cluster.get("time_scale", 1.0)))
                     if cluster.get("stretch") else None)
        # the steps' time (lsgd.training.timekeeping): from here on the optimizer's steps go on the clock
        self.timer = StepTimer(self.compute_model, self.clock, self.comm, self.optimizer, self.device,
                               speed=speeds[self.rank], stretch_s=stretch_s)

        self.ctx = RunContext(
            rank=self.rank, world_size=self.world_size, role=self.role, worker_index=worker_index,
            num_workers=self.num_workers, steps_per_epoch=self.steps_per_epoch, total_steps=self.total_steps,
            batch_size=int(cfg["batch_size"]), clock=self.clock, device=self.device,
            data=self.loader if self.role == "worker" else None, train_set=self.train_set,
            lr=lambda: self.optimizer.param_groups[0]["lr"], seed=seed,
            lr_decay_steps=lr_decay_steps(cfg["schedule"], self.steps_per_epoch),
            step_compute_s=lambda: self.timer.step_compute_s, compute_seconds=self.compute_model.seconds,
            counted_seconds=self.compute_model.counted_seconds,
            grad_ready_fraction=self.compute_model.grad_ready_fraction,
            worker_step_s=worker_step_s,
            take_losses=lambda: self.recorder.take_losses(),
            add_losses=lambda *losses: self.recorder.add_losses(*losses),
        )
        self.algorithm = build_algorithm(cfg["algo"], self.comm)
        self.net = self.algorithm.setup(self.model, self.optimizer, self.ctx)
        # lsgd.training.accel: autocast (and fp16's GradScaler, its skips agreed by all workers); compile
        self.precision = Precision.from_config(cfg, self.device, self.comm, type(self.algorithm))
        if cfg.get("compile"):
            self.net = compile_module(self.net, self.device)
        if self.algorithm.bookkeeping == "server":  # no collective to agree on a step to stop at
            self.watch.without_interrupts()
        # lock-step ranks read the stop agreement agreement_lag steps after issuing it (16 where workers
        # drift apart between synchronizations: no added coupling); ranks that are not in lock step
        # agree only at records: read at the next one
        self.watch.lag = int(self.algorithm.agreement_lag) if self.algorithm.lockstep else 1
        # an algorithm whose step makes a suitable exchange anyway carries the agreement in it
        # (DDP's clock settlement: lsgd.comm.communicator.Communicator.carry); the others send their own
        self.comm.carry = self.watch if self.watch.active and self.algorithm.lockstep else None
        self._plan_step(cfg)
        local_steps = cfg["algo"].get("local_steps")
        if (self.is_main and isinstance(local_steps, int) and local_steps > self.total_steps
                and not cfg["algo"].get("warmup_steps")):
            log.warning("algo.local_steps=%d is more than the run's %d steps: the workers never synchronize "
                        "(nothing is communicated)", local_steps, self.total_steps)

        # services: records, evaluation, checkpoints
        self.recorder = Recorder(cfg, self.run_dir, self.rank, self.total_steps)
        self.evaluator = Evaluator(self.test_set, self.info.task, int(cfg.get("eval_batch_size", 512)), self.device,
                                   workers=bool(cfg.get("eval_workers", False)),
                                   workers_samples=cfg.get("eval_workers_samples"),
                                   bleu_samples=int(cfg.get("eval_bleu_samples") or 0))
        self.checkpointer = Checkpointer(self.run_dir, self.rank, self.world_size, self.device)

        # progress counters (checkpointed)
        self.step = 0
        self.bookkept = 0  # the algorithm's progress at the last bookkeeping
        self.wall_offset_s = 0.0
        self.diverged = False
        self.stop_signal: int | None = None  # the signal that stopped the run (preempted / interrupted)
        self.start_time = time.perf_counter()

    def _plan_step(self, cfg: dict) -> None:
        """Decide once what every step does (:meth:`train_step`, :meth:`_schedule_step`,
        :meth:`bookkeeping`): the hooks the algorithm overrides, precision's work, the schedule's
        fast path (the timer decides its own: measured-mode windows, the profile's constant step).
        Each Python call, attribute chain and small object a step makes costs microseconds once the
        step's compute has evicted the interpreter's caches (the demo CNN's lsgd step spent ~0.16 ms
        more than a plain loop's 6 ms on one core, most of it there).
        """
        algorithm = self.algorithm
        self._amp = self.precision.dtype is not None        # autocast (bf16 / fp16)
        self._scaler = self.precision.scaler is not None    # fp16's GradScaler
        self._move_inputs = self.device.type != "cpu"      # batches come from host memory
        self._before_step = algorithm.overrides("before_step")
        self._after_backward = algorithm.overrides("after_backward")
        self._own_optimizer_step = algorithm.overrides("optimizer_step")
        # a constant schedule (factor 1 at every step) under the local step count: stepping it only
        # moves LambdaLR's counters (each group's rate stays its base rate)
        self._constant_lr = (cfg["schedule"].get("name") == "constant" and not algorithm.overrides("schedule_position")
                             and type(self.scheduler) is torch.optim.lr_scheduler.LambdaLR)
        inject = cfg.get("inject_failure") or {}
        self._inject_at = (None if inject.get("step") is None
                           else (int(inject["step"]), int(inject.get("rank", 0))))
        self._quiet = (0, 0)  # [from, to): bookkept counts whose next record point is ``to`` (_next_point)

    # -- the loop ---------------------------------------------------------------------------
    def fit(self) -> dict:
        """Train to the end; returns the summary dict (status ``completed``, ``diverged`` or
        ``preempted``). A raising rank (a failed checkpoint load included) writes a ``failed``
        summary (rank 0), finishes the W&B run and re-raises."""
        cfg = self.cfg
        status = "completed"
        resuming = bool(cfg.get("resume")) and self.checkpointer.exists()
        try:
            if resuming:
                self.load_checkpoint()
                resuming = False  # from here on the summary is this session's to write
            elif self.is_main and self.recorder.metrics_path.exists():
                self.recorder.metrics_path.unlink()
            log.info(
                "training %s on %s with %s: %d workers x batch %d, %d steps (%d per epoch), device %s%s",
                cfg["algo"]["name"], cfg["dataset"]["name"], cfg["model"]["name"], self.num_workers,
                cfg["batch_size"], self.total_steps, self.steps_per_epoch, self.device,
                f", {self.world_size - self.num_workers} server(s)" if self.world_size > self.num_workers else "",
            )
            self.start_time = time.perf_counter() - self.wall_offset_s
            self.recorder.start(self.samples)
            self.net.train()
            if self.role == "server":
                self.serve()
            else:
                self.work()
            self.watch.drain()  # the last steps' stop agreements, still in flight (lsgd.training.preemption)
            self.algorithm.finish()
            if self.algorithm.bookkeeping == "server":
                # every rank is out of its loop (the server released the workers): one gather of
                # every rank's figures for summary.json (the records had the server's own)
                self.recorder.figures = self.recorder.worker_figures(self)
            if self.diverged:
                status = "diverged"
            self.comm.quiesce()
        except Stopped as exc:  # preempted or interrupted: every rank at the same step, checkpoint written
            status, self.stop_signal = exc.status, exc.signum
            (log.warning if status == "preempted" else file_log.info)("%s", exc)
        except BaseException as exc:
            # record the failure (rank 0) and always finish the W&B run, then let the launcher see
            # it; a resume that fails before its checkpoint is loaded leaves the run's summary as it was
            if not resuming:
                summary = self.recorder.write_summary(self, "failed", error=f"rank {self.rank}: {exc!r}")
                self.recorder.finish(summary)
            raise
        finally:
            self.recorder.close()
            self.pipeline.close()
        summary = self.recorder.write_summary(self, status)
        self.recorder.finish(summary)
        # an interrupt's console line is the main process's (the resume command); train.log has this one
        (file_log if status == "interrupted" else log).info("finished: status %s, final test metrics %s", status,
                                                           self.recorder.last_eval)
        return summary

    @property
    def compute_time_s(self) -> float:
        """Measured compute seconds of this rank so far (the ``compute_time_s`` metric:
        :attr:`lsgd.training.timekeeping.StepTimer.compute_time_s`)."""
        return self.timer.compute_time_s

    def _check_injected_failure(self) -> None:
        if self._inject_at is not None and (self.step, self.rank) == self._inject_at:
            raise RuntimeError(f"inject_failure: rank {self.rank} fails at step {self.step}")

    def work(self) -> None:
        """A worker's loop over its shard until the algorithm's progress reaches the total (the
        batches of the shard and position :meth:`Algorithm.data_position` says, by default its own
        shard at its step count)."""
        if self.bookkeeping():  # records a resumed rank had crossed but not yet made (not lockstep)
            return
        self.timer.mark_gap()
        while self.algorithm.progress(self.step) < self.total_steps:
            shard, batch = self._data_position(self.step)
            epoch, start = divmod(batch, self.steps_per_epoch)
            for x, y in self._shard_loader(shard).batches(epoch, start):
                self._check_injected_failure()
                self.train_step(x, y)
                stop = self.bookkeeping()
                self.timer.mark_gap()
                if stop or self.algorithm.progress(self.step) >= self.total_steps:
                    break
                batch += 1
                if self._data_position(self.step) != (shard, batch):  # moved to another shard or position
                    break
            if self.diverged:
                return

    def _data_position(self, step: int) -> tuple[int, int]:
        """(shard, batch) local step ``step`` reads (:meth:`Algorithm.data_position`)."""
        where = self.algorithm.data_position(step)
        return (self.worker_index, step) if where is None else (int(where[0]), int(where[1]))

    def _shard_loader(self, shard: int) -> ShardedLoader:
        """The loader of worker shard ``shard`` (the same batches whichever worker reads them)."""
        if shard not in self.loaders:
            self.loaders[shard] = ShardedLoader(self.train_set, self.cfg["dataset"], shard, self.num_workers,
                                                int(self.cfg["batch_size"]), int(self.cfg["seed"]),
                                                pipeline=getattr(self, "pipeline", None))
        return self.loaders[shard]

    def serve(self) -> None:
        """A server's loop: the algorithm's serve step, the schedule, the same bookkeeping."""
        if self.bookkeeping():  # records a resumed rank had crossed but not yet made (not lockstep)
            return
        while self.algorithm.progress(self.step) < self.total_steps:
            self._check_injected_failure()
            self.timer.serve_start()
            self.algorithm.serve_step(self.step)
            self.timer.served()
            self._schedule_step()
            self.step += 1
            self.timer.serve_done()
            self.comm.end_step()
            if self.bookkeeping():
                return

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One local step: forward, backward, algorithm hooks, optimizer and schedule step.

        The timer (:class:`lsgd.training.timekeeping.StepTimer`) keeps the step's time at its
        marks: the modeled compute on the cluster clock, the measured compute (``compute_time_s``),
        ``cluster.stretch``'s sleep before ``after_step``.
        On cuda nothing here reads the GPU back per step except where the run needs the value now
        (the timer's measured mode; fp16's skip verdict, :meth:`Precision.unscale_`): the loss is
        accumulated on the device (:meth:`Recorder.add_loss`).

        The step does only what this run needs (:meth:`_plan_step`): the algorithm's hooks that
        are its own, autocast and the GradScaler where precision asks for them.
        """
        algorithm, timer = self.algorithm, self.timer
        timer.step_start()
        if self._before_step:
            algorithm.before_step(self.step)
        if self._move_inputs:
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        if self.channels_last:
            x = batch_to_channels_last(x)
        if self._amp:
            with self.precision.autocast():
                out = self.net(x)
                loss = self.loss_fn(out, y)
        else:  # fp32: no autocast
            out = self.net(x)
            loss = self.loss_fn(out, y)
        timer.forward_done()
        self.optimizer.zero_grad(set_to_none=True)
        if self._scaler:
            self.precision.backward(loss)  # fp16: of the scaled loss
        else:
            loss.backward()
        timer.backward_done()  # the step's forward and backward on the clock
        # fp16: unscale, and skip the step on every worker if any worker's gradients overflowed
        skip = self.precision.unscale_(self.optimizer) if self._scaler else False
        timer.update_start()
        if self._after_backward:
            algorithm.after_backward(self.step)
        if not skip:
            if self.clip_grad_norm is not None:
                # optim.clip_grad_norm: the (synchronized) gradient the step applies (lsgd.training.optim)
                clip_grad_norm(self.model.parameters(), self.clip_grad_norm)
            if self._own_optimizer_step:
                algorithm.optimizer_step()
            else:
                self.optimizer.step()
        if self._scaler:
            self.precision.update()
        self._schedule_step()
        self.step += 1
        self.recorder.add_loss(loss.detach())  # before after_step: an algorithm may ship the losses there
        timer.update_done()  # cluster.stretch sleeps the rest of the step here
        algorithm.after_step(self.step)
        timer.step_done()
        self.comm.end_step()  # the step's wire bytes: peak_step_bytes

    def _schedule_step(self) -> None:
        """Step the learning-rate schedule once; it follows the algorithm's count where
        :meth:`Algorithm.schedule_position` gives one, else the local (or serve) steps.

        A constant schedule under the local count (:meth:`_plan_step`) moves LambdaLR's two
        counters as its ``step()`` would (``last_epoch``, ``_step_count``: its checkpointed state)
        and leaves each group's rate, which that ``step()`` would set to base rate x 1.0 again."""
        if self._constant_lr:
            scheduler = self.scheduler
            scheduler.last_epoch += 1
            scheduler._step_count += 1
            return
        position = self.algorithm.schedule_position(self.step + 1)
        if position is not None:
            self.scheduler.last_epoch = position - 1
        self.scheduler.step()

    def _calibrate(self) -> None:
        """Count one step's operators on the first batch, the optimizer's step included (RNG states
        and the optimizer untouched): the profile (profile mode, roofline) and, in every mode, when each parameter's gradient is final in backward
        (:attr:`ComputeModel.grad_ready_fraction`, DDP's bucket timing)."""
        if self.compute_model.calibrated and self.compute_model.grad_ready_fraction is not None:
            return
        states = (torch.get_rng_state(), random.getstate(), np.random.get_state())
        x, y = next(iter(self.loader.batches(0, 0)))
        args = (self.model, x.to(self.device), y.to(self.device), self.loss_fn)
        if not self.compute_model.calibrated:
            self.compute_model.calibrate(*args, optimizer=self.optimizer)
        if self.compute_model.grad_ready_fraction is None:
            self.compute_model.count_grad_ready(*args)
        torch.set_rng_state(states[0])
        random.setstate(states[1])
        np.random.set_state(states[2])

    def loss_fn(self, out: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """The training loss: cross-entropy (:func:`lsgd.training.evaluator.loss_fn`) with the run's
        ``label_smoothing``; padding targets (-100) carry no loss. Evaluation does not use it
        (``test_loss`` is plain cross-entropy)."""
        return loss_fn(out, y, reduction, label_smoothing=self.label_smoothing)

    @property
    def progress(self) -> int:
        """The run's progress in local steps per worker (the algorithm's count: the local step
        count, or, where workers take different numbers of steps, its expected value)."""
        return self.algorithm.progress(self.step)

    @property
    def samples(self) -> int:
        """Training samples consumed by all workers so far (from :attr:`progress`)."""
        return self.progress * int(self.cfg["batch_size"]) * self.num_workers

    # -- bookkeeping ---------------------------------------------------------------------------
    def bookkeeping(self) -> bool:
        """Log / evaluate / checkpoint at the algorithm's progress count (every rank reaches the
        same counts); returns True when training must stop (diverged).

        Raises:
            Stopped: some rank got a preemption signal or an interrupt (lsgd.training.preemption:
                ``Preempted`` / ``Interrupted``); this step's record and a checkpoint at this step are
                written first, so a resumed run continues right after it.
        """
        algorithm = self.algorithm
        step = algorithm.progress(self.step)
        if step == self.bookkept:  # progress did not move (a round of local steps under way)
            return False
        local = algorithm.bookkeeping == "server"
        if local and self.role != "server":  # server bookkeeping: workers make no records
            self.bookkept = step
            return False
        lo, hi = self._quiet  # (_next_point's answer, kept)
        if step < (hi if lo <= self.bookkept < hi else self._next_point(self.bookkept)):
            # no record, evaluation or checkpoint in (bookkept, step] (most steps): the progress
            # display and, in lock step, the stop agreement
            if self.recorder.progress is not None:
                self.recorder.tick(step)
            self.bookkept = step
            if algorithm.lockstep and not local:
                stop = self.watch.agreed(self.comm, self.device)
                if stop is not None:
                    self._stop_at(step, stop, saved=False)
            return False
        points = [step] if algorithm.lockstep and not local else self._record_points(self.bookkept, step)
        for at in points:
            stop, saved = self._record_and_checkpoint(at, self.bookkept)
            self.bookkept = at
            if stop:
                return True
            stop = self.watch.agreed(self.comm, self.device) if at < self.total_steps and not local else None
            if stop is not None:
                self._stop_at(at, stop, saved)
        self.bookkept = step
        return False

    def _stop_at(self, at: int, stop: Stopped, saved: bool) -> None:
        """Every rank agreed to stop (``stop``, from :meth:`lsgd.training.preemption.PreemptionWatch.agreed`)
        at progress ``at``: write the checkpoint there (unless ``saved``: this record wrote it).

        Raises:
            Stopped: always (``stop``'s kind, at ``at``).
        """
        if not saved:
            self.comm.quiesce()
            self.save_checkpoint(at)
        raise type(stop)(at, stop.signum)

    def _next_point(self, before: int) -> int:
        """The first progress count after ``before`` at which a record, evaluation or checkpoint
        falls (:meth:`_record_points`; the total included; ``before + 1`` from the total on).
        The answer holds for every count in ``[before, answer)``: it is kept for them."""
        lo, hi = self._quiet
        if lo <= before < hi:
            return hi
        if before >= self.total_steps:
            return before + 1
        cfg = self.cfg
        unit = self.steps_per_epoch if cfg["eval_unit"] == "epoch" else 1
        periods = [p for p in (int(cfg["log_every"]), unit * int(cfg["eval_every"]), unit * int(cfg["checkpoint_every"])) if p > 0]
        hi = min([(before // p + 1) * p for p in periods] + [self.total_steps])
        self._quiet = (before, hi)
        return hi

    def _record_points(self, before: int, step: int) -> list[int]:
        """The progress counts in ``(before, step]`` at which some record, evaluation or checkpoint
        falls (multiples of their periods, and the total), ascending. A rank whose progress jumps
        over several makes each of them, so every rank makes the same records (and collectives) in
        the same order, whatever its local step count."""
        cfg = self.cfg
        unit = self.steps_per_epoch if cfg["eval_unit"] == "epoch" else 1
        periods = [p for p in (int(cfg["log_every"]), unit * int(cfg["eval_every"]), unit * int(cfg["checkpoint_every"])) if p > 0]
        points = {m for p in periods for m in range((before // p + 1) * p, min(step, self.total_steps) + 1, p)}
        if step >= self.total_steps:
            points.add(self.total_steps)
        return sorted(points)

    def _record_and_checkpoint(self, step: int, before: int) -> tuple[bool, bool]:
        """Record (and evaluate, checkpoint) at progress ``step``, the last record having been at
        ``before``; returns (stop, checkpoint saved at this step)."""
        cfg = self.cfg
        last = step >= self.total_steps

        def crossed(every: int) -> bool:  # a multiple of ``every`` in (before, step]
            return every > 0 and step // every > before // every

        unit = self.steps_per_epoch if cfg["eval_unit"] == "epoch" else 1
        ce = int(cfg["checkpoint_every"])
        local = self.algorithm.bookkeeping == "server"  # the server alone, no collective (no checkpoints)
        is_eval = crossed(unit * int(cfg["eval_every"])) or last
        is_ckpt = crossed(unit * ce) and not local and not last
        if not (is_eval or crossed(int(cfg["log_every"]))):  # no record here; a checkpoint may fall here
            self.recorder.tick(step)
            if is_ckpt:
                self.comm.quiesce()
                self.save_checkpoint(step)
            return False, is_ckpt
        rec = self.recorder.make_record(self, step, local=local)
        if rec is None:  # diverged: every rank saw the same reduced flag
            self.diverged = True
            log.warning("non-finite training loss at step %d: stopping with status diverged", step)
            return True, False
        if is_eval:
            if not local:
                self.comm.quiesce()
            out = self.evaluator.evaluate(self.model, self.algorithm, self.comm, self.rank, self.world_size,
                                          is_worker=self.role == "worker", local=local)
            self.recorder.note_eval(out, step)
            rec.update(out)
        self.recorder.emit(rec, step, self.total_steps)
        if is_ckpt:
            self.comm.quiesce()
            self.save_checkpoint(step)
            return False, True
        return False, False

    def evaluate(self) -> dict:
        """Test metrics now (see :class:`lsgd.training.evaluator.Evaluator`)."""
        out = self.evaluator.evaluate(self.model, self.algorithm, self.comm, self.rank, self.world_size,
                                      is_worker=self.role == "worker")
        self.recorder.note_eval(out, self.step)
        return out

    # -- checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self, at: int | None = None) -> None:
        """Every rank writes its shard (atomically) named by the progress count ``at`` (default:
        the current one); see :class:`lsgd.training.checkpointer.Checkpointer`."""
        # the algorithm's state first: it completes the transfer of an exchange in flight to save
        # what was received (changing neither the model nor the clock, which moves where the
        # algorithm waits), then the communicator's counters and clock
        algorithm = self.algorithm.state_dict()
        self.checkpointer.save(self.progress if at is None else at, {
            "local_step": self.step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "algorithm": algorithm,
            "comm": self.comm.state_dict(),
            "compute_time_s": self.timer.compute_time_s,
            "wall_time_s": time.perf_counter() - self.start_time,
            "recorder": self.recorder.state_dict(),
            "precision": self.precision.state_dict(),
            "step_rows": list(self.algorithm.step_rows),  # a checkpoint between two records holds some
        }, self.comm)

    def load_checkpoint(self) -> None:
        """Restore this rank's shard named by checkpoints/last.json and truncate metrics.jsonl to it."""
        state, name = self.checkpointer.load()
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.algorithm.load_state_dict(state["algorithm"])
        self.comm.load_state_dict(state["comm"])
        self.recorder.load_state_dict(state["recorder"])
        self.precision.load_state_dict(state.get("precision") or {})
        self.algorithm.step_rows = list(state.get("step_rows", []))
        self.step = state.get("local_step", state["step"])  # older checkpoints: progress = local steps
        self.bookkept = state["step"]  # the checkpoint's record (a rank not in lockstep may be past it)
        self.timer.compute_time_s = state["compute_time_s"]
        self.wall_offset_s = state["wall_time_s"]
        self.recorder.truncate_to(self.bookkept)
        log.info("resumed from %s at step %d", name, self.bookkept)
