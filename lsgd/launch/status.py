"""What the launcher tells about a run: its console lines (the run folder, how the run ended, the
command that resumes a stopped run), the exit of a preempted or interrupted run, and the run
folder's ``summary.json`` where the workers could not write it (a run that failed, was killed or
was rejected before it started).

A summary the workers wrote with a final status (:data:`FINAL_STATUSES`) is never overwritten.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import sys
from pathlib import Path

import yaml

from lsgd.core.files import write_atomic
from lsgd.core.run_files import LABELS_FILE
from lsgd.training import provenance


#: jobs in the running sweep (``lsgd train -m``), set by lsgd.cli before Hydra launches them
SWEEP_JOBS: int | None = None


def job_tag() -> str:
    """``[k/N] <overrides> `` for a job of a sweep (k from 1; N where lsgd.cli counted the jobs),
    else empty."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return ""
    job = HydraConfig.get().job
    total = f"/{SWEEP_JOBS}" if SWEEP_JOBS else ""
    return f"[{int(job.num) + 1}{total}] {' '.join(HydraConfig.get().overrides.task)}: "


def exit_if_stopped(summary: dict | None, cfg: dict, rank: int | None, run_dir: Path | None) -> None:
    """After a preempted or interrupted run (:mod:`lsgd.training.preemption`): the process that holds the
    run folder (``run_dir`` given) prints one line with the command that resumes the run; a
    preempted run's rank 0 requeues the SLURM job (``launcher.preemption=requeue``); then the
    process leaves through ``SystemExit`` (see :func:`lsgd.launch.launcher.run`). ``rank`` None: the main process of a
    local launch."""
    status = (summary or {}).get("status")
    if status not in ("preempted", "interrupted"):
        return
    from lsgd.training.preemption import CHECKPOINT_EXIT_CODE, exit_code, requeue_slurm_job

    if run_dir is not None:
        print(f"lsgd: {job_tag()}{stop_line(summary, run_dir)}", file=sys.stderr, flush=True)
    if status == "interrupted":
        raise SystemExit(exit_code(getattr(signal, str(summary.get("signal")), signal.SIGINT)))
    if cfg["launcher"]["preemption"] == "requeue":
        if rank == 0 and not requeue_slurm_job():
            raise SystemExit(CHECKPOINT_EXIT_CODE)
        raise SystemExit(0)
    raise SystemExit(CHECKPOINT_EXIT_CODE)


def stop_line(summary: dict, run_dir: Path) -> str:
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


def only_hydra_files(d: Path) -> bool:
    """Whether ``d`` is a folder holding nothing but Hydra's own files (``.hydra``): a run that never started."""
    return d.is_dir() and all(p.name == ".hydra" for p in d.iterdir())


def remove_unstarted(run_dir: Path) -> None:
    """Remove ``run_dir`` (and its experiment folder, if left empty) when it holds nothing but
    Hydra's own files: a run rejected before it started leaves nothing behind."""
    if run_dir.is_dir() and only_hydra_files(run_dir):
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
    from lsgd.algorithms import ALGORITHMS

    name = (cfg.get("algo") or {}).get("name")
    if isinstance(name, str) and name in ALGORITHMS:  # the report labels the failed arm as the others (labels.json)
        write_atomic(run_dir / LABELS_FILE, json.dumps(ALGORITHMS.entry(name).obj.label_facts(cfg), indent=1) + "\n")
    provenance.write_environment(run_dir, provenance.collect(provenance.launch_facts(cfg)), resume=False)
    mark_failed(run_dir, cfg, exc)


def print_first_failure(run_dir: Path) -> None:
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


def mark_interrupted(run_dir: Path, cfg: dict, signum: int) -> None:
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


def mark_failed(run_dir: Path, cfg: dict, exc: BaseException) -> None:
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
