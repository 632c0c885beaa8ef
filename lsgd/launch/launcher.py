"""Launching one run: ``run(cfg)`` is what ``lsgd train`` executes once per Hydra job, in the main
process:

1. resolve the config to a plain dict (a resumed run's own, :mod:`lsgd.launch.resume`) and
   validate it (errors before any worker starts),
2. if the environment already describes a distributed launch (torchrun, SLURM srun:
   :mod:`lsgd.launch.environment`), this process *is* one worker: join the group and train (no
   spawning);
3. otherwise start ``launcher.nproc_per_node`` workers on this machine (:mod:`lsgd.launch.spawn`),
   or run them in this process (``launcher.inprocess``: :mod:`lsgd.launch.inprocess`), the main
   process owning Ctrl-C / SIGTERM (:mod:`lsgd.launch.signals`);
4. say how the run ended (:mod:`lsgd.launch.status`: the console line, the exit of a stopped run,
   ``summary.json`` where the workers could not write it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
from pathlib import Path

import yaml

from lsgd.core.errors import ConfigError
from lsgd.core.files import write_atomic
from lsgd.core.run_files import CONFIG_FILE, LABELS_FILE
from lsgd.launch.environment import LaunchEnv, detect_launch_env
from lsgd.launch.resume import defaults_config, find_resume_dir, resumed_config, run_folder
from lsgd.launch.signals import MainSignals, RunInterrupted
from lsgd.launch.spawn import spawn_local
from lsgd.launch.status import exit_if_stopped, job_tag, mark_failed, mark_interrupted, print_first_failure
from lsgd.training import provenance

log = logging.getLogger("lsgd")


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

    from lsgd.config.validation import check_ranks_from_study, validate
    from lsgd.training.preemption import resolve_mode

    launch_env = detect_launch_env(os.environ) if _join_mode(cfg_node) else None
    hydra_dir = Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else None
    task = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    check_ranks_from_study(task)  # launcher.nproc_per_node against an experiment's study.workers
    cfg = OmegaConf.to_container(cfg_node, resolve=True, throw_on_missing=True)
    if cfg.get("resume") and HydraConfig.initialized():
        # the run's own config, with only safe keys changed by this command line
        cfg = resumed_config(cfg, find_resume_dir(cfg, hydra_dir), defaults_config())
        if launch_env is not None and launch_env.world_size != int(cfg.get("_saved_world_size") or launch_env.world_size):
            raise ConfigError(f"resume: the run was made by {cfg['_saved_world_size']} processes, this launch has "
                              f"{launch_env.world_size}; resume it with the same number of tasks")
        cfg.pop("_saved_world_size", None)
    if launch_env is not None and launch_env.world_size == 1:
        log.info("a single-task %s launch: starting launcher.nproc_per_node local workers", launch_env.source)
        launch_env = None
    if not cfg.get("resume") and HydraConfig.initialized():
        cfg = _adapt_to_algorithm(cfg, task, launch_env)
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

        exit_if_stopped(worker_main(cfg, None), cfg, launch_env.rank, None)
        return None

    run_dir = run_folder(cfg, hydra_dir)  # fresh, resumed, or a requeued SLURM job's own
    cfg["run_id"] = run_dir.name
    run_dir.mkdir(parents=True, exist_ok=True)
    write_run_config(run_dir, cfg, launch_env.world_size if launch_env else int(cfg["launcher"]["nproc_per_node"]))
    from lsgd.data import prepare
    from lsgd.training.preemption import StopFlag

    # from here a Ctrl-C leaves the folder marked interrupted (the except below), never a folder
    # with a config and no summary
    try:
        # what produced the run (lsgd.training.provenance); a resumed run appends its session to the first one's
        provenance.write_environment(run_dir, provenance.collect(provenance.launch_facts(cfg, launch_env),
                                                                 provenance.network_facts(cfg)),
                                     resume=bool(cfg.get("resume")))
        # a local launch owns Ctrl-C / SIGTERM from here (MainSignals): a first signal while the data
        # are prepared starts no worker, a second one stops the preparation at once
        signals = MainSignals(StopFlag(), run_dir) if launch_env is None and cfg["launcher"].get("interrupts", True) \
            else contextlib.nullcontext()
        with signals:
            # the folder's line once the handlers are in place: a Ctrl-C right after it reaches
            # MainSignals (before, one in the few lines between this print and the handlers
            # raised KeyboardInterrupt past them and left no summary.json: a test's flake under load)
            print(f"lsgd: {job_tag()}run folder {run_dir}", file=sys.stderr, flush=True)
            try:
                prepare(cfg["dataset"])
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # the folder exists now: it says failed, not running forever
                mark_failed(run_dir, cfg, exc)
                raise
            if launch_env is not None:
                from lsgd.training.trainer import worker_main

                exit_if_stopped(worker_main(cfg, str(run_dir)), cfg, 0, run_dir)
            else:
                start = spawn_local
                if cfg["launcher"].get("inprocess", False):
                    from lsgd.launch.inprocess import run_inprocess as start
                try:
                    start(cfg, run_dir, signals if isinstance(signals, MainSignals) else None)
                except RunInterrupted as exc:  # no worker started, or one was killed: interrupted, not failed
                    mark_interrupted(run_dir, cfg, exc.signum)
                    exit_if_stopped(json.loads((run_dir / "summary.json").read_text()), cfg, None, run_dir)
                except Exception as exc:
                    mark_failed(run_dir, cfg, exc)
                    print_first_failure(run_dir)
                    raise
    except KeyboardInterrupt:
        # a Ctrl-C before the handlers, a second one while the data were prepared (or any Ctrl-C
        # where the launcher does not own them): no worker ran, nothing to checkpoint; the folder
        # says interrupted
        mark_interrupted(run_dir, cfg, signal.SIGINT)
        exit_if_stopped(json.loads((run_dir / "summary.json").read_text()), cfg, None, run_dir)
        raise
    summary = run_dir / "summary.json"
    result = json.loads(summary.read_text()) if summary.exists() else None
    if result is not None and result.get("status") in ("preempted", "interrupted"):
        exit_if_stopped(result, cfg, None, run_dir)
    print(f"lsgd: {job_tag()}{(result or {}).get('status', 'ended')}: {run_dir}", file=sys.stderr, flush=True)
    return result


def write_run_config(run_dir: Path, cfg: dict, world_size: int) -> None:
    """Write the run folder's ``config.yaml`` (``cfg`` with ``world_size`` and the algorithm's
    :meth:`~lsgd.algorithms.base.Algorithm.describe` facts) and ``labels.json`` (how the report's
    labels write the run: :meth:`~lsgd.algorithms.base.Algorithm.label_facts`, from the registries;
    :mod:`lsgd.core.labels`). A resumed run keeps the files it has (one made before lsgd wrote
    labels.json gets it)."""
    from lsgd.algorithms import ALGORITHMS

    algo_cls = ALGORITHMS[cfg["algo"]["name"]]
    if not (run_dir / CONFIG_FILE).exists() or not cfg.get("resume"):
        saved = {**cfg, "world_size": world_size}
        saved.update(algo_cls.describe(cfg["algo"], algo_cls.roles(world_size).count("worker")))
        write_atomic(run_dir / CONFIG_FILE, yaml.safe_dump(saved, sort_keys=False))
    if not (run_dir / LABELS_FILE).exists() or not cfg.get("resume"):
        write_atomic(run_dir / LABELS_FILE, json.dumps(algo_cls.label_facts(cfg), indent=1) + "\n")


def _adapt_to_algorithm(cfg: dict, task: list[str], launch_env: LaunchEnv | None) -> dict:
    """``cfg`` composed again (:func:`lsgd.config.adapt.compose_job`) with what its algorithm needs
    under ``debug=default`` (:func:`lsgd.config.adapt.adapt_overrides`: more workers for a ring,
    a server's rank, ADSAGA's model), and one line on stdout saying so (from rank 0 of a joined
    launch); ``cfg`` itself when nothing changes. ``task``: the job's command-line overrides, which win."""
    from hydra.core.hydra_config import HydraConfig

    from lsgd.config.adapt import adapt_line, adapt_overrides, compose_job, explicit_keys

    adapted = adapt_overrides(cfg, explicit_keys(task), joined=launch_env is not None)
    if not adapted:
        return cfg
    option = HydraConfig.get().runtime.choices.get("debug") or "default"
    if launch_env is None or launch_env.rank == 0:
        print(f"{job_tag()}{adapt_line(cfg, adapted, option)}", flush=True)
    return compose_job(task + [override for override, _ in adapted])


def _join_mode(cfg_node) -> bool:
    mode = cfg_node.launcher.get("join", "auto")
    if mode not in ("auto", "never"):
        raise ConfigError(f"launcher.join={mode!r} is not allowed; allowed: auto, never")
    return mode == "auto"


def _ensure_cpu_calibration(cfg: dict, launch_env: LaunchEnv | None) -> None:
    """``cluster.device=cpu`` (profile mode) needs this machine's figures for the workers' thread
    count (:func:`lsgd.compute.calibration.ensure_cpu_profile`): measured here, before any worker starts, when
    lsgd spawns them; a ConfigError when joining a launch (its tasks would each measure their own:
    run ``lsgd calibrate`` on every node first)."""
    cluster = cfg.get("cluster") or {}
    if cluster.get("device") != "cpu" or cluster.get("compute", "profile") != "profile" or cluster.get("step_time_s"):
        return
    from lsgd.compute.calibration import ensure_cpu_profile
    from lsgd.core.devices import threads_per_worker

    if launch_env is None:
        threads = cfg["launcher"].get("threads_per_worker") or threads_per_worker(int(cfg["launcher"]["nproc_per_node"]))
    else:
        threads = (cfg["launcher"].get("threads_per_worker") or int(os.environ.get("OMP_NUM_THREADS") or 0)
                   or threads_per_worker(launch_env.local_world_size))
    ensure_cpu_profile(int(threads), calibrate=launch_env is None)
