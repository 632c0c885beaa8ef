"""Run a function on N real worker processes joined in a gloo process group."""

from __future__ import annotations

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


def run_gloo(fn, world_size: int, *args) -> None:
    """Call ``fn(rank, world_size, *args)`` in ``world_size`` spawned processes (gloo group)."""
    mp.spawn(_entry, args=(fn, world_size, _free_port(), args), nprocs=world_size, join=True)
