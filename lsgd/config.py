"""Validation of a resolved run config, in the main process, before any worker starts.

Every check raises :class:`lsgd.errors.ConfigError` with the key and the allowed values.
(Unknown group options, e.g. ``algo=foo``, are rejected earlier by Hydra, whose message lists the
available options of the group.)
"""

from __future__ import annotations

import os

import torch

from lsgd.errors import ConfigError


def _int_at_least(cfg: dict, key: str, minimum: int, where: str = "") -> None:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}{key} must be an integer >= {minimum}, got {value!r}")


def _positive(cfg: dict, key: str, where: str) -> None:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{where}{key} must be a number > 0, got {value!r}")


def _choice(cfg: dict, key: str, allowed, where: str) -> None:
    if cfg.get(key) not in allowed:
        raise ConfigError(f"{where}{key}={cfg.get(key)!r} is not allowed; allowed: {', '.join(map(str, allowed))}")


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


def validate(cfg: dict) -> None:
    """Check a resolved config (plain dict) and resolve ``launcher.nproc_per_node: auto`` in place.

    Raises:
        ConfigError: the first invalid key, with the allowed values.
    """
    from lsgd.algorithms import ALGORITHMS
    from lsgd.algorithms.diloco import OUTER_OPTIMIZERS
    from lsgd.algorithms.local_sgd import BUFFER_POLICIES
    from lsgd.data import check_available, dataset_info
    from lsgd.models import check_compatible
    from lsgd.optim import OPTIMIZERS, SCHEDULES

    _int_at_least(cfg, "batch_size", 1)
    _int_at_least(cfg, "epochs", 1)
    if cfg.get("max_steps") is not None:
        _int_at_least(cfg, "max_steps", 1)
    _int_at_least(cfg, "log_every", 1)
    _int_at_least(cfg, "eval_every", 1)
    _int_at_least(cfg, "checkpoint_every", 0)
    _choice(cfg, "eval_unit", ("epoch", "step"), "")
    _choice(cfg, "device", ("auto", "cpu", "cuda"), "")
    if cfg.get("target_acc") is not None and not 0 < float(cfg["target_acc"]) <= 1:
        raise ConfigError(f"target_acc must be in (0, 1], got {cfg['target_acc']!r}")

    algo = cfg["algo"]
    _choice(algo, "name", sorted(ALGORITHMS), "algo.")
    if algo["name"] != "ddp":
        _int_at_least(algo, "local_steps", 1, "algo.")
        _choice(algo, "buffer_policy", BUFFER_POLICIES, "algo.")
    if algo["name"] == "post_local_sgd":
        _int_at_least(algo, "warmup_steps", 0, "algo.")
    if algo["name"] == "slowmo":
        _positive(algo, "slow_lr", "algo.")
        m = algo.get("slow_momentum")
        if not isinstance(m, (int, float)) or not 0 <= m < 1:
            raise ConfigError(f"algo.slow_momentum must be in [0, 1), got {m!r}")
    if algo["name"] == "diloco":
        _choice(algo, "outer_optimizer", OUTER_OPTIMIZERS, "algo.")
        _positive(algo, "outer_lr", "algo.")

    _choice(cfg["optim"], "name", OPTIMIZERS, "optim.")
    _positive(cfg["optim"], "lr", "optim.")
    _choice(cfg["schedule"], "name", SCHEDULES, "schedule.")
    _positive(cfg["network"], "bandwidth_gbps", "network.")

    launcher = cfg["launcher"]
    if launcher.get("nproc_per_node") == "auto":
        launcher["nproc_per_node"] = resolve_nproc(cfg)
    _int_at_least(launcher, "nproc_per_node", 1, "launcher.")
    _choice(launcher, "backend", ("auto", "gloo", "nccl"), "launcher.")
    device = resolve_device(cfg)
    if device == "cuda":
        if not cuda_available():
            raise ConfigError("device=cuda but no CUDA device is visible; use device=cpu or device=auto")
        n_gpu = torch.cuda.device_count()
        if launcher["nproc_per_node"] > n_gpu:
            raise ConfigError(
                f"launcher.nproc_per_node={launcher['nproc_per_node']} exceeds the {n_gpu} visible GPU(s) "
                f"on this machine; allowed: 1..{n_gpu}"
            )
    elif resolve_backend(cfg) == "nccl":
        raise ConfigError("launcher.backend=nccl needs device=cuda; allowed on CPU: gloo, auto")

    info = dataset_info(cfg["dataset"])
    check_compatible(cfg["model"], info)
    global_batch = int(cfg["batch_size"]) * int(launcher["nproc_per_node"])
    if info.num_train is not None and info.num_train < global_batch:
        raise ConfigError(
            f"batch_size={cfg['batch_size']} x launcher.nproc_per_node={launcher['nproc_per_node']} = {global_batch} "
            f"exceeds the {info.num_train} training samples of dataset.name={info.name}; lower batch_size"
        )
    check_available(cfg["dataset"])


def threads_per_worker(nproc: int) -> int:
    """Torch intra-op threads per worker so ``nproc`` workers share the cores without
    oversubscription: max(1, cores // nproc)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, nproc))
