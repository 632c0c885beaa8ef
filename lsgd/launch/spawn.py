"""Starting the workers of a local launch: ``launcher.nproc_per_node`` processes on this machine
through torch.distributed's elastic launcher (torchrun's machinery: ``elastic_launch`` with a
standalone c10d rendezvous on a free local port, no restarts).

A worker that raises makes the agent stop all the others, and :func:`spawn_local` raises
``ChildFailedError`` carrying the failing rank's traceback; a signal to the main process stops
the workers through :class:`lsgd.launch.signals.MainSignals`; ``launcher.emulate=true`` runs them
in network namespaces behind capped links (:mod:`lsgd.launch.emulate`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import types
import uuid
from pathlib import Path

from lsgd.launch.signals import MainSignals, RunInterrupted


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it; another process may take it before use).
    lsgd's own rendezvous and the benchmark scripts' gloo groups start on it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_local(cfg: dict, run_dir: Path, signals: MainSignals | None = None) -> int | None:
    """Start ``launcher.nproc_per_node`` workers through ``torch.distributed.launcher.api.elastic_launch``.

    Returns the signal that interrupted the run (SIGINT / SIGTERM to this process; the workers
    stopped at one step with a checkpoint, see :mod:`lsgd.training.preemption`), None when none did.
    ``signals``: the launcher's handlers, entered by the caller (:func:`lsgd.launch.launcher.run`
    enters them before it prepares the data); None: entered here when ``launcher.interrupts`` is true.

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
        # SIGINT / SIGTERM are MainSignals' (launcher.interrupts=false: elastic's, which stop the workers)
        signals_to_handle="SIGHUP,SIGQUIT" if interrupts else "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
    )
    if signals is None:
        signals = MainSignals(StopFlag(), run_dir) if interrupts else types.SimpleNamespace(signal=None, stop=None)
    # --- issue 23: launcher.emulate=true runs the workers in network namespaces behind capped links
    # (lsgd.launch.emulate builds them here and removes them however the launch ends) ---
    from lsgd.launch import emulate

    with emulate.launch(cfg, nproc, worker_main, run_dir) as (entry, worker_cfg), \
            signals if isinstance(signals, MainSignals) and not signals.entered else contextlib.nullcontext():
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
