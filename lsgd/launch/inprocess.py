"""``launcher=inprocess``: the run's ``launcher.nproc_per_node`` workers as logical workers of one
in-process cluster (:mod:`lsgd.comm.inprocess`) in this process, instead of one process each.

Each worker runs the same :class:`~lsgd.training.trainer.Trainer`, algorithm and communicator code
as a process of a local launch does, inside its own torch.distributed default group of lsgd's
``lsgd_inprocess`` backend; exactly one worker computes at a time, the others waiting where they
communicate, so a run repeats bit for bit whatever the machine's load. The one computing uses every
core (``launcher.threads_per_worker``, default all of them).

What stays the same as a local launch: the run folder and its files, evaluation, checkpoints and
``resume=``, the Ctrl-C protocol (the main thread's :class:`~lsgd.launch.signals.MainSignals`
passes the first signal to the workers through the stop flag; they checkpoint and stop at the same
step; exit 130), a failing worker's error naming its rank (the others stop), sweeps, reports and
loggers. What differs: time. Modeled time comes from the cluster clock with
``cluster.compute=profile`` (one process's wall time is not a worker's), and the run's wall time is
the simulation's (``wall_time_s``).

The workers share what is read-only and identical on all of them: the loaded data sets
(:func:`lsgd.data.catalog.sharing`), torch's kernels and compiled code, the Python modules.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch

from lsgd.launch.signals import MainSignals, RunInterrupted


def run_inprocess(cfg: dict, run_dir: Path, signals: MainSignals | None = None) -> int | None:
    """Run the workers of ``cfg`` in this process (see the module); returns the signal that
    interrupted the run (its workers stopped at one step with a checkpoint), None when none did.

    Raises:
        RunInterrupted: a signal came before the workers started (none is started).
        lsgd.comm.inprocess.cluster.WorkerFailed: a worker failed (the others were stopped); its
            record is in ``failures/rank<r>.json``.
    """
    from lsgd.comm.inprocess import cluster
    from lsgd.core.devices import resolve_device
    from lsgd.data import catalog
    from lsgd.training.preemption import StopFlag
    from lsgd.training.trainer import setup_logging

    n = int(cfg["launcher"]["nproc_per_node"])
    device = resolve_device(cfg)
    threads = cfg["launcher"].get("threads_per_worker") or _cores()
    stop = signals.stop if signals is not None else StopFlag()
    if signals is not None:
        if signals.signal is not None:
            raise RunInterrupted(signals.signal)
        signals.launched = True
    saved_threads, saved_env = torch.get_num_threads(), {k: os.environ.get(k) for k in _ENV}
    os.environ.update({"LOCAL_WORLD_SIZE": str(n)})  # one node (hierarchical Adasum's default local size)
    torch.set_num_threads(int(threads))
    setup_logging(run_dir, None)
    try:
        with catalog.sharing():
            cluster.run(n, _worker, cfg, str(run_dir), stop, device, cuda=device == "cuda",
                        timeout_s=float(cfg["launcher"].get("timeout_s", 300)) * 6, join_poll_s=0.2)
    finally:
        torch.set_num_threads(saved_threads)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return signals.signal if signals is not None else None


_ENV = ("LOCAL_WORLD_SIZE",)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _worker(rank: int, n: int, cfg: dict, run_dir: str, stop, device: str) -> dict:
    """One logical worker: its own copy of the config (the trainer writes into it), the stop flag
    read in place of signal handlers, then the same run inside the group as a process's."""
    from lsgd.training.preemption import PreemptionWatch
    from lsgd.training.trainer import train_in_group

    cfg = copy.deepcopy(cfg)
    watch = PreemptionWatch(cfg["launcher"].get("preemption", "off"), stop=stop,
                            interrupts=bool(cfg["launcher"].get("interrupts", True)), handlers=False)
    with watch:
        return train_in_group(cfg, run_dir, device, watch, n, logging_set=True)
