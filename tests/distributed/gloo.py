"""Run a function on N real worker processes joined in a gloo process group.

The ranks are forked from a forkserver that has imported torch and lsgd once (:data:`PRELOAD`): a
freshly spawned rank spends seconds of CPU importing torch, and on 2 cores a 4-rank test paid that
at every group. The forkserver, and so every rank, starts with :data:`THREAD_ENV`.
"""

from __future__ import annotations

import contextlib
import multiprocessing.forkserver
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, fn, world_size, port, args):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
    )
    try:
        fn(rank, world_size, *args)
        # every rank is done with the group before any tears it down: a rank destroying its gloo
        # context while a peer's last messages are in flight can abort the process (SIGABRT,
        # "terminate called without an active exception", seen once in CI)
        dist.barrier()
    finally:
        dist.destroy_process_group()


#: imported once by the forkserver that forks every rank
PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "lsgd.training.trainer", "gloo"]

#: One OpenMP thread on *every* thread of a rank, as ``lsgd.launch.spawn.spawn_local`` arranges by
#: exporting OMP_NUM_THREADS before its workers start (``torch.set_num_threads(1)`` in
#: :func:`_entry` covers only the calling thread, not gloo's callback threads).
THREAD_ENV = {"OMP_NUM_THREADS": "1"}


@contextlib.contextmanager
def environ(values: dict[str, str]):
    """Set environment variables for the block, then restore them."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def start_forkserver(preload: list[str] = PRELOAD) -> None:
    """Start this process's forkserver with ``preload`` and :data:`THREAD_ENV` (no-op when it is
    already running: the first caller's preload stands)."""
    mp.get_context("forkserver").set_forkserver_preload(preload)
    with environ(THREAD_ENV):
        multiprocessing.forkserver.ensure_running()


def run_gloo(fn, world_size: int, *args) -> None:
    """Call ``fn(rank, world_size, *args)`` in ``world_size`` processes forked from the
    forkserver (gloo group); ``fn`` must be importable by name (a module-level function)."""
    start_forkserver()
    mp.start_processes(_entry, args=(fn, world_size, _free_port(), args), nprocs=world_size, join=True,
                       start_method="forkserver")
