"""Where a worker computes: the device, the process-group backend, the default dtype and the threads
per worker, resolved from a run config (``device: auto``, ``launcher.backend: auto``).

A leaf module (torch only), so the launcher, the trainer and the provenance record resolve these
the same way without importing config validation.
"""

from __future__ import annotations

import os

import torch

from lsgd.core.errors import ConfigError


#: ``dtype`` values: torch's default floating dtype in every worker (parameters, inputs, buffers)
DTYPES = ("float32", "float64")


def default_dtype(cfg: dict) -> torch.dtype:
    """The torch dtype of ``cfg["dtype"]`` (float32 when absent: configs written before the key)."""
    return getattr(torch, cfg.get("dtype") or "float32")


def cuda_available() -> bool:
    return torch.cuda.is_available()


def resolve_device(cfg: dict) -> str:
    """``device: auto`` -> cuda when available, else cpu."""
    device = cfg.get("device", "auto")
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    return device


def resolve_backend(cfg: dict) -> str:
    """``launcher.backend: auto`` -> nccl on cuda, gloo on cpu."""
    backend = cfg["launcher"].get("backend", "auto")
    if backend == "auto":
        return "nccl" if resolve_device(cfg) == "cuda" else "gloo"
    return backend


def resolve_nproc(cfg: dict) -> int:
    """``launcher.nproc_per_node: auto`` -> one worker per visible GPU on CUDA, else 4."""
    if resolve_device(cfg) == "cuda" and cuda_available():
        return max(1, torch.cuda.device_count())
    return 4


def cuda_device_index(local_rank: int, local_world_size: int, device_count: int) -> int:
    """The CUDA device of a worker: ``local_rank`` when the node's tasks share all its GPUs
    (``device_count >= local_world_size``), 0 when each task sees only its own GPU (SLURM
    ``--gpus-per-task=1``, ``CUDA_VISIBLE_DEVICES`` per task).

    Raises:
        ConfigError: fewer GPUs visible than tasks on the node, but more than one.
    """
    if device_count >= local_world_size:
        return local_rank
    if device_count == 1:
        return 0
    raise ConfigError(
        f"{local_world_size} workers on this node but {device_count} visible GPUs: each worker needs its own GPU; "
        f"allowed: at least {local_world_size} visible GPUs shared by the node's tasks, or exactly 1 per task "
        "(srun --gpus-per-task=1)"
    )


def threads_per_worker(nproc: int) -> int:
    """Torch intra-op threads per worker so ``nproc`` workers share the cores without
    oversubscription: max(1, cores // nproc)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, nproc))
