"""Base (inner) optimizers and learning-rate schedules, from the ``optim`` and ``schedule`` groups.

Optimizers are torch's own: ``sgd`` (momentum, Nesterov, weight decay; dampening 0) and ``adamw``.
Schedules are multiplicative factors of the base learning rate as a function of the completed
step, applied with ``torch.optim.lr_scheduler.LambdaLR`` (its state is checkpointed):

* ``constant``: 1
* ``step``: ``gamma ** k`` where k = number of ``milestones`` (in epochs) already reached
* ``cosine``: linear warm-up over ``warmup_epochs`` from ``warmup_start_factor``, then cosine decay to
  ``min_factor`` at the last step (Goyal et al. 2017 warm-up; Loshchilov and Hutter 2017 cosine).
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import torch

from lsgd.errors import ConfigError

OPTIMIZERS = ("sgd", "adamw")
SCHEDULES = ("constant", "step", "cosine")


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: dict) -> torch.optim.Optimizer:
    """torch optimizer from the ``optim`` group.

    Raises:
        ConfigError: unknown ``optim.name`` (allowed: sgd, adamw).
    """
    name = cfg.get("name")
    if name == "sgd":
        return torch.optim.SGD(
            params,
            lr=float(cfg["lr"]),
            momentum=float(cfg.get("momentum", 0.0)),
            nesterov=bool(cfg.get("nesterov", False)),
            weight_decay=float(cfg.get("weight_decay", 0.0)),
        )
    if name == "adamw":
        return torch.optim.AdamW(
            params,
            lr=float(cfg["lr"]),
            betas=tuple(cfg.get("betas", (0.9, 0.999))),
            eps=float(cfg.get("eps", 1e-8)),
            weight_decay=float(cfg.get("weight_decay", 0.01)),
        )
    raise ConfigError(f"optim.name={name!r} is unknown; allowed: {', '.join(OPTIMIZERS)}")


def lr_factor_fn(cfg: dict, steps_per_epoch: int, total_steps: int) -> Callable[[int], float]:
    """Factor of the base learning rate after ``step`` completed steps.

    Args:
        cfg: the ``schedule`` group.
        steps_per_epoch: local steps per epoch (identical on every worker).
        total_steps: local steps of the whole run.

    Raises:
        ConfigError: unknown ``schedule.name`` (allowed: constant, step, cosine).
    """
    name = cfg.get("name")
    if name == "constant":
        return lambda step: 1.0
    if name == "step":
        milestones = [int(round(m * steps_per_epoch)) for m in cfg.get("milestones", [])]
        gamma = float(cfg.get("gamma", 0.1))
        return lambda step: gamma ** sum(step >= m for m in milestones)
    if name == "cosine":
        warmup = int(round(float(cfg.get("warmup_epochs", 0)) * steps_per_epoch))
        start = float(cfg.get("warmup_start_factor", 0.1))
        floor = float(cfg.get("min_factor", 0.0))

        def factor(step: int) -> float:
            if step < warmup:
                return start + (1.0 - start) * step / warmup
            progress = (step - warmup) / max(1, total_steps - warmup)
            return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

        return factor
    raise ConfigError(f"schedule.name={name!r} is unknown; allowed: {', '.join(SCHEDULES)}")


def build_scheduler(optimizer, cfg: dict, steps_per_epoch: int, total_steps: int):
    """``LambdaLR`` over :func:`lr_factor_fn`; call ``.step()`` once per local step."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor_fn(cfg, steps_per_epoch, total_steps))
