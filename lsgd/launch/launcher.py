"""Process-group setup: join an existing launch (torchrun, SLURM srun) or start local workers.

``run(cfg)`` is what ``lsgd train`` executes once per Hydra job, in the main process:

1. resolve the config to a plain dict and validate it (errors before any worker starts),
2. if the environment already describes a distributed launch (:func:`detect_launch_env`), this
   process *is* one worker: join the group and train (no spawning);
3. otherwise start ``launcher.nproc_per_node`` workers on this machine with torch.distributed's
   elastic launcher (torchrun's machinery: ``elastic_launch`` with a standalone c10d rendezvous on a
   free local port, no restarts). A worker that raises makes the agent stop all the others; the
   launcher raises ``ChildFailedError`` carrying the failing rank's traceback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
import types
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from lsgd.training import provenance
from lsgd.core.errors import ConfigError
from lsgd.core.files import write_atomic

log = logging.getLogger("lsgd")


@dataclass(frozen=True)
class LaunchEnv:
    """Where this process sits in an externally started job.

    Attributes: rank, world_size, local_rank, local_world_size, master_addr, master_port and
    ``source`` ('torchrun' or 'slurm').
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    source: str

    def export(self, env: dict) -> None:
        """Write the torch.distributed ``env://`` variables into ``env`` (e.g. os.environ)."""
        env.update(
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK=str(self.local_rank),
            LOCAL_WORLD_SIZE=str(self.local_world_size),
            MASTER_ADDR=self.master_addr,
            MASTER_PORT=str(self.master_port),
        )


def first_host(nodelist: str) -> str:
    """First host name of a SLURM node list (``SLURM_JOB_NODELIST`` syntax).

    Examples: ``"node[01-04,07]" -> "node01"``, ``"gpu3,gpu5" -> "gpu3"``,
    ``"rack[2-3]-n[10-12]" -> "rack2-n10"``.

    Raises:
        ValueError: an empty node list.
    """
    nodelist = nodelist.strip()
    if not nodelist:
        raise ValueError("empty SLURM node list")
    # the first comma-separated entry that is not inside brackets
    depth, end = 0, len(nodelist)
    for i, ch in enumerate(nodelist):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            end = i
            break
    entry = nodelist[:end]
    # replace every bracket group by its first element (ranges keep their zero padding)
    return re.sub(r"\[([^\]]*)\]", lambda m: m.group(1).split(",")[0].split("-")[0], entry)


def slurm_master_port(job_id: str) -> int:
    """A port shared by all tasks of SLURM job ``job_id``: 15000 + job_id mod 20000."""
    digits = re.sub(r"\D", "", job_id) or "0"
    return 15000 + int(digits) % 20000


def detect_launch_env(env: Mapping[str, str]) -> LaunchEnv | None:
    """Detect an external distributed launch from environment variables.

    * torchrun / torch.distributed.run: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
      ``MASTER_PORT`` all set.
    * SLURM ``srun`` (one task per worker, as Hydra's submitit launcher starts them):
      ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID`` and ``SLURM_STEP_ID`` set (the batch
      script itself has no step id); master = first host of ``SLURM_JOB_NODELIST`` (or
      ``MASTER_ADDR``), port from ``MASTER_PORT`` or derived from ``SLURM_JOB_ID``.

    * a job started by submitit (Hydra's submitit launcher; ``SUBMITIT_EXECUTOR=slurm``): ranks,
      task count and the first host from ``submitit.JobEnvironment`` (its tasks span the whole
      allocation, so the job's node list is the step's).

    Returns None when neither applies (then ``lsgd train`` spawns its own workers).

    Raises:
        ValueError: inconsistent values (rank outside [0, world_size)).
    """
    if all(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")):
        out = LaunchEnv(
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env["LOCAL_RANK"]),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])),
            master_addr=env["MASTER_ADDR"],
            master_port=int(env["MASTER_PORT"]),
            source="torchrun",
        )
    elif env.get("SUBMITIT_EXECUTOR") == "slurm" and "SLURM_STEP_ID" in env:
        out = _submitit_env(env)
    elif all(k in env for k in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_ID")):
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "localhost"
        tasks_per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or env["SLURM_NTASKS"]
        out = LaunchEnv(
            rank=int(env["SLURM_PROCID"]),
            world_size=int(env["SLURM_NTASKS"]),
            local_rank=int(env["SLURM_LOCALID"]),
            local_world_size=int(re.match(r"\d+", tasks_per_node).group(0)),
            master_addr=env.get("MASTER_ADDR") or first_host(nodelist),
            master_port=int(env.get("MASTER_PORT") or slurm_master_port(env.get("SLURM_JOB_ID", "0"))),
            source="slurm",
        )
    else:
        return None
    if not 0 <= out.rank < out.world_size:
        raise ValueError(f"rank {out.rank} outside [0, {out.world_size}) in the {out.source} environment")
    return out


def _submitit_env(env: Mapping[str, str]) -> LaunchEnv:
    """A submitit task's place, read through ``submitit.JobEnvironment`` (which reads os.environ)."""
    import submitit

    job = submitit.JobEnvironment()
    return LaunchEnv(
        rank=job.global_rank,
        world_size=job.num_tasks,
        local_rank=job.local_rank,
        local_world_size=job.num_tasks // max(1, job.num_nodes),
        master_addr=env.get("MASTER_ADDR") or job.hostnames[0],
        master_port=int(env.get("MASTER_PORT") or slurm_master_port(str(job.job_id))),
        source="slurm",
    )


#: Keys a resumed run may change from its saved config.yaml (they do not change what is trained
#: before the end: how long it runs, where its logs go, how long a collective may wait, how the
#: input pipeline builds the same batches: lsgd.data.pipeline).
RESUME_SAFE_KEYS = ("resume", "epochs", "max_steps", "target_acc", "results_dir", "logger", "launcher.timeout_s",
                    "launcher.preemption", "launcher.interrupts", "dataset.num_workers", "dataset.pin_memory",
                    "dataset.persistent_workers", "dataset.prefetch_factor")


#: Keys a resumed run takes from this command line, never from the saved config (a testing aid).
RESUME_FROM_COMMAND_LINE = ("inject_failure",)


def _defaults_config() -> dict:
    """The config of ``lsgd train`` with no overrides (inside a running Hydra app)."""
    from hydra import compose
    from omegaconf import OmegaConf

    return OmegaConf.to_container(compose(config_name="config"), resolve=True)


def _leaves(d, prefix: str = "") -> dict:
    if not isinstance(d, dict):
        return {prefix: d}
    out = {}
    for k, v in d.items():
        out.update(_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _overlay(base: dict, saved: dict) -> dict:
    """``saved`` over ``base``: a group's section (a mapping with ``name``: algo, model, ...) is
    taken whole from ``saved``; other mappings merge key by key, so keys the saved run predates keep
    ``base``'s values."""
    out = dict(base)
    for k, v in saved.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and "name" not in v:
            out[k] = _overlay(out[k], v)
        else:
            out[k] = v
    return out


def resumed_config(cfg: dict, run_dir: Path, defaults: dict) -> dict:
    """The config a resume of ``run_dir`` runs with: the run's saved ``config.yaml``, where this
    command line (``cfg``, composed from its overrides) changed a key from ``defaults`` (the plain
    ``lsgd train`` config) to a value other than the saved one, only for :data:`RESUME_SAFE_KEYS`.
    The saved ``world_size`` comes back as ``_saved_world_size``.

    Raises:
        ConfigError: the run folder has no config.yaml, or the command line changes another key
            (named, with its saved and new values, and the keys allowed).
    """
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        raise ConfigError(f"resume={run_dir}: no config.yaml in the run folder")
    saved = yaml.safe_load(path.read_text())
    new, base, old = _leaves(cfg), _leaves(defaults), _leaves(saved)
    out = _overlay(cfg, {k: v for k, v in saved.items()
                         if (k in cfg or k in defaults) and k not in RESUME_FROM_COMMAND_LINE})
    for key, value in sorted(new.items()):
        if value == base.get(key, object()) or value == old.get(key, object()):
            continue  # not set by this command line, or set to the run's own value
        if not any(key == s or key.startswith(s + ".") for s in RESUME_SAFE_KEYS):
            raise ConfigError(f"resume: {key} cannot change when resuming {run_dir} (saved {old.get(key)!r}, "
                              f"given {value!r}); keys that may: {', '.join(RESUME_SAFE_KEYS)}")
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    out["resume"] = str(run_dir)
    out["_saved_world_size"] = saved.get("world_size")
    return out


def find_resume_dir(cfg: dict, fresh_dir: Path) -> Path:
    """The run folder ``resume`` points to.

    ``resume`` is a path to a run folder, or ``true``: the newest folder of this experiment
    (``<results_dir>/<experiment_name>/*``) with a checkpoint and without a completed summary.

    Raises:
        ConfigError: the path has no checkpoint, or no resumable run exists.
    """
    resume = cfg["resume"]
    if resume is True:
        root = Path(cfg["results_dir"]) / cfg["experiment_name"]
        candidates = []
        for d in root.iterdir() if root.is_dir() else []:
            # (a requeued SLURM job's own folder, this job's Hydra folder, has a checkpoint and counts)
            if not (d / "checkpoints" / "last.json").exists():
                continue
            summary = d / "summary.json"
            if summary.exists() and json.loads(summary.read_text()).get("status") == "completed":
                continue
            candidates.append(d)
        if not candidates:
            raise ConfigError(f"resume=true but no unfinished run with a checkpoint exists under {root}")
        return max(candidates, key=lambda d: (d / "checkpoints" / "last.json").stat().st_mtime)
    path = Path(str(resume))
    if not (path / "checkpoints" / "last.json").exists():
        raise ConfigError(f"resume={resume!r}: no checkpoint found (expected {path}/checkpoints/last.json)")
    return path


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it; another process may take it before use).
    lsgd's own rendezvous and the benchmark scripts' gloo groups start on it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ensure_cpu_calibration(cfg: dict, launch_env: LaunchEnv | None) -> None:
    """``cluster.device=cpu`` (profile mode) needs this machine's figures for the workers' thread
    count (:func:`lsgd.compute.model.ensure_cpu_profile`): measured here, before any worker starts, when
    lsgd spawns them; a ConfigError when joining a launch (its tasks would each measure their own:
    run ``lsgd calibrate`` on every node first)."""
    cluster = cfg.get("cluster") or {}
    if cluster.get("device") != "cpu" or cluster.get("compute", "profile") != "profile" or cluster.get("step_time_s"):
        return
    from lsgd.compute.model import ensure_cpu_profile
    from lsgd.core.devices import threads_per_worker

    if launch_env is None:
        threads = cfg["launcher"].get("threads_per_worker") or threads_per_worker(int(cfg["launcher"]["nproc_per_node"]))
    else:
        threads = (cfg["launcher"].get("threads_per_worker") or int(os.environ.get("OMP_NUM_THREADS") or 0)
                   or threads_per_worker(launch_env.local_world_size))
    ensure_cpu_profile(int(threads), calibrate=launch_env is None)


class RunInterrupted(Exception):
    """A local launch stopped by a signal whose workers did not all stop cleanly (a second signal
    killed them, or one arrived before they watched for it); ``signum``: the first signal."""

    def __init__(self, signum: int):
        from lsgd.training.preemption import signal_name

        self.signum = signum
        super().__init__(f"interrupted by {signal_name(signum)}")


class _MainSignals:
    """SIGINT / SIGTERM in the main process of a local launch (:mod:`lsgd.training.preemption`): the first
    is passed to the workers through ``stop`` (they checkpoint at their next step and return); a
    second kills the workers (SIGKILL) at once. Installed from the run folder's creation on (before
    the data are prepared): a first signal before the workers are started starts none (the run ends
    ``interrupted`` with no step), a second raises KeyboardInterrupt there (a download stops at
    once). Each is noted in the run's ``train.log`` (a ``[main]`` line: when the launcher got it
    and what it did). torch elastic's own handlers for these two are left out
    (``LaunchConfig.signals_to_handle``): they raise ``SignalException`` in the agent, which then
    signals the workers and waits up to 30 s for them to exit, while a worker that returns waits
    for the agent to read its result (``queue_finished_reading_event`` in elastic's ``_wrap``),
    which only a finished agent loop does: so both waited the full 30 s, then SIGKILL.

    Workers start with SIGINT blocked: a blocked signal mask is inherited through fork and exec,
    so a spawned worker holds a Ctrl-C pending until :class:`lsgd.training.preemption.PreemptionWatch` has
    installed its handler and unblocks it (a Ctrl-C in its first seconds, while it imports torch,
    printed a ``KeyboardInterrupt`` traceback per worker). The block is on the main thread, which
    starts the workers (and every thread it starts after inherits it); a helper thread started
    before it keeps SIGINT unblocked, so the kernel delivers a Ctrl-C to the main process there and
    Python still runs :meth:`_handle` in the main thread (CPython runs handlers in the main thread
    whichever thread received the signal)."""

    HANDLED = (signal.SIGINT, signal.SIGTERM)
    #: blocked in the main thread (and so in the workers it spawns) while the launch runs
    BLOCKED = {signal.SIGINT}
    #: loggers that report the workers' exit after an interrupt as errors, with tracebacks: quiet then
    QUIET = ("torch.distributed.elastic", "torch.multiprocessing")

    def __init__(self, stop, run_dir: Path | None = None):
        self.stop = stop
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.signal: int | None = None
        self._previous: dict = {}
        self._levels: dict[str, int] = {}
        self._mask: set | None = None
        self._receiver = None
        self.entered = False  # the handlers are installed
        self.launched = False  # spawn_local is starting (or started) the workers

    def _note(self, text: str) -> None:
        """A ``[main]`` line in train.log (O_APPEND, as the workers' lines; no lock, so safe in a
        handler that interrupted anything)."""
        if self.run_dir is None:
            return
        import time

        with contextlib.suppress(OSError), open(self.run_dir / "train.log", "a") as f:
            f.write(f"[main] {time.strftime('%H:%M:%S')} WARNING {text}\n")

    def _handle(self, signum, frame) -> None:
        from lsgd.training.preemption import signal_name

        if self.signal is None:
            self.signal = signum
            self.stop.set(signum)
            for name in self.QUIET:
                self._levels.setdefault(name, logging.getLogger(name).level)
                logging.getLogger(name).setLevel(logging.CRITICAL)
            self._note(f"got {signal_name(signum)}: the workers stop at their next step with a checkpoint; "
                       "a second signal kills them at once" if self.launched else
                       f"got {signal_name(signum)} before the workers started: starting none; a second signal "
                       "stops at once")
            return
        if not self.launched:  # a second signal while the data are prepared: stop that at once
            self._note(f"got {signal_name(signum)} after {signal_name(self.signal)}: stopping at once")
            raise KeyboardInterrupt
        import multiprocessing

        children = multiprocessing.active_children()  # the workers elastic started
        self._note(f"got {signal_name(signum)} after {signal_name(self.signal)}: killing the workers at once "
                   f"(SIGKILL to pid {', '.join(str(c.pid) for c in children) or 'none left'})")
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)

    def __enter__(self):
        import threading

        for sig in self.HANDLED:
            self._previous[sig] = signal.signal(sig, self._handle)
        # the thread that receives the signals the main thread blocks (it only waits)
        self._receiver = threading.Event()
        threading.Thread(target=self._receiver.wait, name="lsgd-signals", daemon=True).start()
        # multiprocessing starts its resource tracker with SIGINT / SIGTERM blocked the same way
        # (CPython bpo-33613) and then unblocks them unconditionally: start it first
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
        self._mask = signal.pthread_sigmask(signal.SIG_BLOCK, self.BLOCKED)
        self.entered = True
        return self

    def __exit__(self, *exc) -> None:
        if self._mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)  # a pending signal is handled here
        if self._receiver is not None:
            self._receiver.set()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)


def spawn_local(cfg: dict, run_dir: Path, signals: _MainSignals | None = None) -> int | None:
    """Start ``launcher.nproc_per_node`` workers through ``torch.distributed.launcher.api.elastic_launch``.

    Returns the signal that interrupted the run (SIGINT / SIGTERM to this process; the workers
    stopped at one step with a checkpoint, see :mod:`lsgd.training.preemption`), None when none did.
    ``signals``: the launcher's handlers, entered by the caller (:func:`run` enters them before it
    prepares the data); None: entered here when ``launcher.interrupts`` is true.

    Raises:
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError: a worker failed (all
        others were stopped by the agent).
        RunInterrupted: a signal stopped the run before its workers started (none is started),
            or some worker did not return (killed by a second signal).
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from lsgd.core.devices import threads_per_worker
    from lsgd.training.preemption import StopFlag
    from lsgd.training.trainer import worker_main

    nproc = int(cfg["launcher"]["nproc_per_node"])
    interrupts = signals is not None or bool(cfg["launcher"].get("interrupts", True))
    threads = cfg["launcher"].get("threads_per_worker") or threads_per_worker(nproc)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        rdzv_configs={"is_host": True},
        max_restarts=0,
        monitor_interval=0.2,
        start_method="spawn",
        local_addr="127.0.0.1",
        # SIGINT / SIGTERM are _MainSignals' (launcher.interrupts=false: elastic's, which stop the workers)
        signals_to_handle="SIGHUP,SIGQUIT" if interrupts else "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
    )
    if signals is None:
        signals = _MainSignals(StopFlag(), run_dir) if interrupts else types.SimpleNamespace(signal=None, stop=None)
    # --- issue 23: launcher.emulate=true runs the workers in network namespaces behind capped links
    # (lsgd.launch.emulate builds them here and removes them however the launch ends) ---
    from lsgd.launch import emulate

    with emulate.launch(cfg, nproc, worker_main, run_dir) as (entry, worker_cfg), \
            signals if isinstance(signals, _MainSignals) and not signals.entered else contextlib.nullcontext():
        if signals.signal is not None:  # a signal before any worker started: start none
            raise RunInterrupted(signals.signal)
        signals.launched = True
        try:
            elastic_launch(config, entry)(worker_cfg, str(run_dir), signals.stop)
        except ChildFailedError:
            if signals.signal is not None:
                raise RunInterrupted(signals.signal) from None
            raise
    return signals.signal


def run(cfg_node) -> dict | None:
    """Run one training job from a Hydra config (the body of ``lsgd train``).

    Returns the run's summary dict on rank 0 / the main process (None on other ranks).

    * An external launch of a single task (``srun --ntasks=1``, ``torchrun --nproc-per-node=1``)
      has nothing to join: lsgd starts ``launcher.nproc_per_node`` local workers itself.
    * Joining a launch of several tasks, the launch decides the workers: ``launcher.nproc_per_node``
      becomes the tasks on this node (a different explicit value is logged and ignored).
    * The process that creates (or resumes) the run folder writes ``environment.json``
      (:mod:`lsgd.training.provenance`: commit, versions, CPU / GPU, backend); a resumed run appends its own
      session to it.
    * A run folder that already holds a checkpoint is resumed when this is a requeued SLURM job
      (``SLURM_RESTART_COUNT`` >= 1, the same job id and so the same folder); otherwise starting
      afresh there is refused (it would train beside the old checkpoints).
    * A preempted run (:mod:`lsgd.training.preemption`) exits through ``SystemExit``: code 0 after its SLURM
      job was requeued, 143 otherwise, so that submitit records no result for the interrupted attempt.
    * An interrupted run (SIGINT / SIGTERM: status ``interrupted``, a checkpoint at the step where
      the workers stopped) prints one line, the command that resumes it, and exits through
      ``SystemExit`` with 128 + the signal (130 for Ctrl-C, 143 for SIGTERM).

    Raises:
        ConfigError: invalid configuration (before any worker starts).
        ChildFailedError: a worker failed.
        SystemExit: the run was preempted or interrupted.
    """
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from lsgd.config.validation import validate
    from lsgd.training.preemption import resolve_mode

    launch_env = detect_launch_env(os.environ) if _join_mode(cfg_node) else None
    hydra_dir = Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else None
    cfg = OmegaConf.to_container(cfg_node, resolve=True, throw_on_missing=True)
    if cfg.get("resume") and HydraConfig.initialized():
        # the run's own config, with only safe keys changed by this command line
        cfg = resumed_config(cfg, find_resume_dir(cfg, hydra_dir), _defaults_config())
        if launch_env is not None and launch_env.world_size != int(cfg.get("_saved_world_size") or launch_env.world_size):
            raise ConfigError(f"resume: the run was made by {cfg['_saved_world_size']} processes, this launch has "
                              f"{launch_env.world_size}; resume it with the same number of tasks")
        cfg.pop("_saved_world_size", None)
    if launch_env is not None and launch_env.world_size == 1:
        log.info("a single-task %s launch: starting launcher.nproc_per_node local workers", launch_env.source)
        launch_env = None
    if launch_env is None:
        # what a local launch loads (seconds of imports), before its run folder exists: a Ctrl-C
        # there leaves nothing behind, while one inside these imports after the folder was made
        # (before the launcher's handlers) left half-imported modules and a folder to mark
        import torch.distributed.launcher.api  # noqa: F401

        import lsgd.launch.emulate  # noqa: F401
        import lsgd.training.trainer  # noqa: F401
    if launch_env is not None:  # before validation: it reads LOCAL_WORLD_SIZE (hierarchical Adasum's nodes)
        launch_env.export(os.environ)
        asked = cfg["launcher"].get("nproc_per_node")
        if asked not in ("auto", None) and int(asked) != launch_env.local_world_size and launch_env.rank == 0:
            log.warning("launcher.nproc_per_node=%s ignored: the %s launch runs %d task(s) on this node "
                        "(%d in all), one worker each", asked, launch_env.source, launch_env.local_world_size,
                        launch_env.world_size)
    try:
        cfg["launcher"]["preemption"] = resolve_mode(cfg["launcher"].get("preemption", "auto"),
                                                     launch_env.source if launch_env else None)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    validate(cfg, *((launch_env.world_size, launch_env.local_world_size) if launch_env else (None, None)))
    _ensure_cpu_calibration(cfg, launch_env)
    if cfg["launcher"].get("emulate", False) is not False:  # issue 23: root, iproute2, the kernel's features (lsgd.launch.emulate)
        from lsgd.launch.emulate import preflight

        preflight(cfg, joined=launch_env is not None)

    if launch_env is not None and launch_env.rank != 0:
        from lsgd.training.trainer import worker_main

        _exit_if_stopped(worker_main(cfg, None), cfg, launch_env.rank, None)
        return None

    run_dir = hydra_dir
    if cfg.get("resume"):
        run_dir = find_resume_dir(cfg, hydra_dir)
        if hydra_dir is not None and hydra_dir != run_dir and _only_hydra_files(hydra_dir):
            shutil.rmtree(hydra_dir)
        log.info("resuming run %s", run_dir)
    elif run_dir is not None and (run_dir / "checkpoints" / "last.json").exists():
        restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        if not restarts:
            raise ConfigError(f"the run folder {run_dir} already holds a checkpoint: pass resume={run_dir} to "
                              "continue that run, or choose another folder (hydra.run.dir)")
        cfg["resume"] = str(run_dir)
        log.info("requeued SLURM job (restart %d): resuming its run folder %s", restarts, run_dir)
    cfg["run_id"] = run_dir.name
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / "config.yaml").exists() or not cfg.get("resume"):
        saved = dict(cfg)
        saved["world_size"] = launch_env.world_size if launch_env else int(cfg["launcher"]["nproc_per_node"])
        from lsgd.algorithms import ALGORITHMS

        algo_cls = ALGORITHMS[cfg["algo"]["name"]]
        saved.update(algo_cls.describe(cfg["algo"], algo_cls.roles(saved["world_size"]).count("worker")))
        write_atomic(run_dir / "config.yaml", yaml.safe_dump(saved, sort_keys=False))
    from lsgd.data import prepare
    from lsgd.training.preemption import StopFlag

    # from here a Ctrl-C leaves the folder marked interrupted (the except below), never a folder
    # with a config and no summary
    try:
        # what produced the run (lsgd.training.provenance); a resumed run appends its session to the first one's
        provenance.write_environment(run_dir, provenance.collect(provenance.launch_facts(cfg, launch_env)),
                                     resume=bool(cfg.get("resume")))
        # a local launch owns Ctrl-C / SIGTERM from here (_MainSignals): a first signal while the data
        # are prepared starts no worker, a second one stops the preparation at once
        signals = _MainSignals(StopFlag(), run_dir) if launch_env is None and cfg["launcher"].get("interrupts", True) \
            else contextlib.nullcontext()
        with signals:
            # the folder's line once the handlers are in place: a Ctrl-C right after it reaches
            # _MainSignals (before, one in the few lines between this print and the handlers
            # raised KeyboardInterrupt past them and left no summary.json: a test's flake under load)
            print(f"lsgd: {_job_tag()}run folder {run_dir}", file=sys.stderr, flush=True)
            try:
                prepare(cfg["dataset"])
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # the folder exists now: it says failed, not running forever
                _mark_failed(run_dir, cfg, exc)
                raise
            if launch_env is not None:
                from lsgd.training.trainer import worker_main

                _exit_if_stopped(worker_main(cfg, str(run_dir)), cfg, 0, run_dir)
            else:
                try:
                    spawn_local(cfg, run_dir, signals if isinstance(signals, _MainSignals) else None)
                except RunInterrupted as exc:  # no worker started, or one was killed: interrupted, not failed
                    _mark_interrupted(run_dir, cfg, exc.signum)
                    _exit_if_stopped(json.loads((run_dir / "summary.json").read_text()), cfg, None, run_dir)
                except Exception as exc:
                    _mark_failed(run_dir, cfg, exc)
                    _print_first_failure(run_dir)
                    raise
    except KeyboardInterrupt:
        # a Ctrl-C before the handlers, a second one while the data were prepared (or any Ctrl-C
        # where the launcher does not own them): no worker ran, nothing to checkpoint; the folder
        # says interrupted
        _mark_interrupted(run_dir, cfg, signal.SIGINT)
        _exit_if_stopped(json.loads((run_dir / "summary.json").read_text()), cfg, None, run_dir)
        raise
    summary = run_dir / "summary.json"
    result = json.loads(summary.read_text()) if summary.exists() else None
    if result is not None and result.get("status") in ("preempted", "interrupted"):
        _exit_if_stopped(result, cfg, None, run_dir)
    print(f"lsgd: {_job_tag()}{(result or {}).get('status', 'ended')}: {run_dir}", file=sys.stderr, flush=True)
    return result


#: jobs in the running sweep (``lsgd train -m``), set by lsgd.cli before Hydra launches them
SWEEP_JOBS: int | None = None


def _job_tag() -> str:
    """``[k/N] <overrides> `` for a job of a sweep (k from 1; N where lsgd.cli counted the jobs),
    else empty."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return ""
    job = HydraConfig.get().job
    total = f"/{SWEEP_JOBS}" if SWEEP_JOBS else ""
    return f"[{int(job.num) + 1}{total}] {' '.join(HydraConfig.get().overrides.task)}: "


def _exit_if_stopped(summary: dict | None, cfg: dict, rank: int | None, run_dir: Path | None) -> None:
    """After a preempted or interrupted run (:mod:`lsgd.training.preemption`): the process that holds the
    run folder (``run_dir`` given) prints one line with the command that resumes the run; a
    preempted run's rank 0 requeues the SLURM job (``launcher.preemption=requeue``); then the
    process leaves through ``SystemExit`` (see :func:`run`). ``rank`` None: the main process of a
    local launch."""
    status = (summary or {}).get("status")
    if status not in ("preempted", "interrupted"):
        return
    from lsgd.training.preemption import CHECKPOINT_EXIT_CODE, exit_code, requeue_slurm_job

    if run_dir is not None:
        print(f"lsgd: {_job_tag()}{_stop_line(summary, run_dir)}", file=sys.stderr, flush=True)
    if status == "interrupted":
        raise SystemExit(exit_code(getattr(signal, str(summary.get("signal")), signal.SIGINT)))
    if cfg["launcher"]["preemption"] == "requeue":
        if rank == 0 and not requeue_slurm_job():
            raise SystemExit(CHECKPOINT_EXIT_CODE)
        raise SystemExit(0)
    raise SystemExit(CHECKPOINT_EXIT_CODE)


def _stop_line(summary: dict, run_dir: Path) -> str:
    """``interrupted (SIGINT) at step 8, checkpoint saved; resume: lsgd train resume=<run_dir>``."""
    last = Path(run_dir) / "checkpoints" / "last.json"
    saved = json.loads(last.read_text())["step"] if last.exists() else None
    head = f"{summary['status']} ({summary.get('signal') or 'signal'})"
    if summary.get("steps") is not None:
        head += f" at step {summary['steps']}"
    if saved is None:
        return f"{head}; no checkpoint to resume from: {run_dir}"
    at = "checkpoint saved" if saved == summary.get("steps") else f"last checkpoint at step {saved}"
    return f"{head}, {at}; resume: lsgd train resume={run_dir}"


def _join_mode(cfg_node) -> bool:
    mode = cfg_node.launcher.get("join", "auto")
    if mode not in ("auto", "never"):
        raise ConfigError(f"launcher.join={mode!r} is not allowed; allowed: auto, never")
    return mode == "auto"


def _only_hydra_files(d: Path) -> bool:
    return d.is_dir() and all(p.name == ".hydra" for p in d.iterdir())


def remove_unstarted(run_dir: Path) -> None:
    """Remove ``run_dir`` (and its experiment folder, if left empty) when it holds nothing but
    Hydra's own files: a run rejected before it started leaves nothing behind."""
    if run_dir.is_dir() and _only_hydra_files(run_dir):
        shutil.rmtree(run_dir)
        with contextlib.suppress(OSError):
            run_dir.parent.rmdir()  # only when empty


def record_invalid(cfg_node, run_dir: Path, exc: BaseException) -> None:
    """One arm of a sweep failed validation: write its ``config.yaml`` and a ``summary.json`` with
    status ``failed`` and the message into its folder (``run_dir``), so reports show it and the
    sweep goes on."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(cfg_node, resolve=True)
    cfg["run_id"] = run_dir.name
    if (run_dir / "config.yaml").exists():
        return  # the folder holds a run already (the error is about it): leave its files alone
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(run_dir / "config.yaml", yaml.safe_dump(cfg, sort_keys=False))
    provenance.write_environment(run_dir, provenance.collect(provenance.launch_facts(cfg)), resume=False)
    _mark_failed(run_dir, cfg, exc)


def _print_first_failure(run_dir: Path) -> None:
    """One line naming the rank that failed first and its error, from the workers' own records
    (:mod:`lsgd.training.failures`): torch elastic's summary picks its root cause by the time each process
    wrote its error file, which a peer that lost the connection can win."""
    from lsgd.training.failures import read_failures

    failures = read_failures(run_dir)
    if failures:
        first = failures[0]
        print(f"lsgd: run failed: rank {first['rank']} ({first.get('host', '?')}) failed first: {first['error']} "
              f"({run_dir})", file=sys.stderr, flush=True)


#: statuses a run's summary.json keeps: the launcher never overwrites them
FINAL_STATUSES = ("completed", "diverged", "preempted", "interrupted")


def _mark_interrupted(run_dir: Path, cfg: dict, signum: int) -> None:
    """Write ``summary.json`` with status ``interrupted`` (and the signal's name) unless it holds a
    final status: the workers were killed before they all stopped at one step, so its ``steps``
    is the last checkpoint's (null without one)."""
    from lsgd.training.preemption import signal_name

    summary = run_dir / "summary.json"
    state = json.loads(summary.read_text()) if summary.exists() else {
        "run_id": cfg["run_id"], "experiment_name": cfg["experiment_name"], "algo": cfg["algo"]["name"]}
    if state.get("status") in FINAL_STATUSES:
        return
    last = run_dir / "checkpoints" / "last.json"
    state.update(status="interrupted", signal=signal_name(signum), error=None,
                 steps=json.loads(last.read_text())["step"] if last.exists() else None)
    state.pop("failed_rank", None)
    state.pop("failed_ranks", None)
    write_atomic(summary, json.dumps(state, indent=2))


def _mark_failed(run_dir: Path, cfg: dict, exc: BaseException) -> None:
    """Write ``summary.json`` with status ``failed`` unless a final summary is there
    (:data:`FINAL_STATUSES`)."""
    summary = run_dir / "summary.json"
    if summary.exists():
        state = json.loads(summary.read_text())
        if state.get("status") in FINAL_STATUSES:
            return
    else:
        state = {"run_id": cfg["run_id"], "experiment_name": cfg["experiment_name"], "algo": cfg["algo"]["name"]}
    state.update(status="failed", error=str(exc)[-4000:])
    from lsgd.training.failures import read_failures

    failures = read_failures(run_dir)  # the workers' own records (lsgd.training.failures): who failed first
    if failures:
        state.update(failed_rank=failures[0]["rank"], failed_ranks=sorted(f["rank"] for f in failures))
    write_atomic(summary, json.dumps(state, indent=2))
