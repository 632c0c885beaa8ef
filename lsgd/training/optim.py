"""Base (inner) optimizers and learning-rate schedules, from the ``optim`` and ``schedule`` groups.

Optimizers are torch's own: ``sgd`` (momentum, Nesterov, weight decay; dampening 0) and ``adamw``;
``lamb`` is timm's maintained ``timm.optim.Lamb`` set up as the LAMB paper's Algorithm 2 (You et al.,
ICLR 2020): Adam moments with bias correction, per-layer trust ratio ||x|| / ||r + lambda x|| applied
always (``always_adapt``), no global gradient clipping unless ``optim.max_grad_norm`` is set.

Gradient clipping, every optimizer (``optim.clip_grad_norm``, :func:`clip_grad_norm`; null: off):
global-norm clipping, ``g <- g * min(1, c / ||g||_2)`` with ``||g||_2`` over all parameters'
gradients together (Pascanu, Mikolov and Bengio, ICML 2013, "On the difficulty of training
recurrent neural networks", Algorithm 2; the LSTM language models of Zaremba et al. 2014 and Merity
et al. 2018 clip at 5 and 0.25), through torch's ``torch.nn.utils.clip_grad_norm_``. The trainer
applies it to the gradient the optimizer is about to apply: after the algorithm's ``after_backward``
(for ddp, compressed, accordion and gravac the synchronized gradient every worker holds, so the
replicas stay identical; for compressed methods after compression, exchange and error feedback:
the residual keeps the unclipped ``g_ef - C(g_ef)``) and before ``optimizer_step``; for local-update
methods, the worker's local gradient. It is not DGC's local per-tensor clipping before compression
(``algo.clip_norm``, :mod:`lsgd.algorithms.gradient_compression.compressed`). Its few memory-bound operations (one norm
and one scale over the gradients) are not charged to the profile clock.

Learning-rate scaling (``optim.lr_scaling``, :func:`scaled_lr`), with B = batch_size x workers the
global batch and B0 = ``optim.base_batch_size`` (null: one worker's batch) the batch ``optim.lr`` was
tuned for:

* ``none``: ``lr`` as given;
* ``linear``: ``lr * B / B0`` (Goyal et al. 2017), the rule for averaging gradients;
* ``sqrt``: ``lr * sqrt(B / B0)`` (Krizhevsky 2014; Hoffer et al. 2017), common for Adam/LAMB;
* ``adasum``: ``lr * min(B / B0, optim.adasum_lr_factor)`` times the node size with
  ``algo.hierarchical`` (Maleki et al. 2021, Sec. 5: about 2-2.5x the best single-worker rate
  rather than linear scaling; Horovod scales by the GPUs per node when it averages inside a node).
Schedules are multiplicative factors of the base learning rate as a function of the completed
step, applied with ``torch.optim.lr_scheduler.LambdaLR`` (its state is checkpointed):

* ``constant``: 1
* ``step``: ``w(n) * gamma ** k`` after n completed steps, where k = number of ``milestones`` (in
  epochs) already reached and w the linear warm-up below (``warmup_epochs`` 0, the default: w = 1).
  Goyal et al. 2017 ("Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour", Sec. 2.2) warm
  up over 5 epochs from the batch-256 rate to the linearly scaled one: ``warmup_start_factor`` =
  256 / global batch.
* ``cosine``: linear warm-up over ``warmup_epochs`` from ``warmup_start_factor``, then cosine decay to
  ``min_factor`` at the last step (Goyal et al. 2017 warm-up; Loshchilov and Hutter 2017 cosine).

The linear warm-up of ``step`` and ``cosine``: with W = round(``warmup_epochs`` x steps per epoch)
steps and s = ``warmup_start_factor``, w(n) = s + (1 - s) n / W for n < W, then 1.
* ``inverse_sqrt``: ``min(n / w, sqrt(w / n))`` for the n-th step (n = completed steps + 1) and
  w = ``warmup_steps``: linear warm-up to ``lr`` at step w, then decay as 1 / sqrt(n). With
  ``lr`` = d_model^-0.5 * w^-0.5 this is Vaswani et al. 2017's rate (Sec. 5.3, "Attention Is All
  You Need": lrate = d_model^-0.5 * min(n^-0.5, n * w^-1.5), w = 4000; 7.0e-4 for d_model 512).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable

import torch

from lsgd.core.errors import ConfigError
from lsgd.core.registry import Registry

#: The base optimizers, by ``optim.name``: builders ``(params, optim cfg, kernels) -> torch optimizer``.
OPTIMIZERS: Registry = Registry("optimizer", "optim.name")
#: The learning-rate schedules, by ``schedule.name``: builders of the factor function
#: ``(schedule cfg, steps_per_epoch, total_steps) -> (completed steps -> factor)``.
SCHEDULES: Registry = Registry("schedule", "schedule.name")
LR_SCALINGS = ("none", "linear", "sqrt", "adasum")


def scaled_lr(cfg: dict, world_size: int) -> float:
    """Base learning rate after ``optim.lr_scaling`` (module docstring) for ``world_size`` workers.

    Args:
        cfg: the whole run config (``optim``, ``batch_size``, ``algo``).
        world_size: number of workers.

    Raises:
        ConfigError: unknown ``optim.lr_scaling`` (allowed: none, linear, sqrt, adasum).
    """
    optim = cfg["optim"]
    rule = optim.get("lr_scaling", "none") or "none"
    lr = float(optim["lr"])
    if rule == "none":
        return lr
    base = optim.get("base_batch_size") or cfg["batch_size"]
    ratio = int(cfg["batch_size"]) * world_size / float(base)
    if rule == "linear":
        return lr * ratio
    if rule == "sqrt":
        return lr * math.sqrt(ratio)
    if rule == "adasum":
        local = 1
        algo = cfg.get("algo", {})
        if algo.get("hierarchical"):  # workers per node, as lsgd.algorithms.adasum.adasum resolves it
            local = int(algo.get("local_size") or os.environ.get("LOCAL_WORLD_SIZE", 1))
        return lr * min(ratio, float(optim.get("adasum_lr_factor", 2.0))) * local
    raise ConfigError(f"optim.lr_scaling={rule!r} is unknown; allowed: {', '.join(LR_SCALINGS)}")


def clip_grad_norm(params: Iterable[torch.nn.Parameter], max_norm: float | None) -> float | None:
    """Clip the gradients of ``params`` in place to global L2 norm ``max_norm`` (module docstring).

    ``g <- g * min(1, max_norm / (||g||_2 + 1e-6))``, the norm taken over every ``.grad`` together
    (parameters without a gradient are skipped), by ``torch.nn.utils.clip_grad_norm_``.

    Args:
        params: the parameters whose ``.grad`` is clipped (any shapes).
        max_norm: the threshold c > 0 (the gradient's units), or None: no clipping.

    Returns:
        The total norm before clipping (a float; NaN or inf when a gradient is, and then the
        gradients are scaled by NaN or 0, as torch does: the trainer's divergence check stops
        the run), or None when ``max_norm`` is None.
    """
    if max_norm is None:
        return None
    norm = torch.nn.utils.clip_grad_norm_(list(params), float(max_norm))
    return float(norm)


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: dict, device: torch.device | str = "cpu") -> torch.optim.Optimizer:
    """torch optimizer from the ``optim`` group, with the kernels of ``device``
    (:func:`lsgd.training.accel.optimizer_kernels`: fused sgd / adamw on CUDA, torch's default on CPU).

    Raises:
        ConfigError: unknown ``optim.name`` (allowed: :data:`OPTIMIZERS`).
    """
    from lsgd.training.accel import optimizer_kernels

    name = cfg.get("name")
    build = OPTIMIZERS[name]
    return build(params, cfg, optimizer_kernels(name, device))


@OPTIMIZERS.register("sgd", label="SGD", summary="torch's SGD: momentum, Nesterov, weight decay (dampening 0)")
def _sgd(params, cfg: dict, kernels: dict) -> torch.optim.Optimizer:
    return torch.optim.SGD(
            params,
            lr=float(cfg["lr"]),
            momentum=float(cfg.get("momentum", 0.0)),
            nesterov=bool(cfg.get("nesterov", False)),
            weight_decay=float(cfg.get("weight_decay", 0.0)),
            **kernels,
        )


@OPTIMIZERS.register("adamw", label="AdamW", summary="torch's AdamW (decoupled weight decay; DiLoCo's inner optimizer)")
def _adamw(params, cfg: dict, kernels: dict) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
            params,
            lr=float(cfg["lr"]),
            betas=tuple(cfg.get("betas", (0.9, 0.999))),
            eps=float(cfg.get("eps", 1e-8)),
            weight_decay=float(cfg.get("weight_decay", 0.01)),
            **kernels,
        )


@OPTIMIZERS.register("lamb", label="LAMB", summary="timm's LAMB (You et al. 2020, Algorithm 2; BERT pre-training)")
def _lamb(params, cfg: dict, kernels: dict) -> torch.optim.Optimizer:
    from timm.optim import Lamb

    max_norm = cfg.get("max_grad_norm")
    return Lamb(
            params,
            lr=float(cfg["lr"]),
            betas=tuple(cfg.get("betas", (0.9, 0.999))),
            eps=float(cfg.get("eps", 1e-6)),
            weight_decay=float(cfg.get("weight_decay", 0.01)),
            bias_correction=True,
            grad_averaging=True,
            max_grad_norm=float(max_norm) if max_norm is not None else None,
            always_adapt=True,
            trust_clip=False,
        )


def lr_factor_fn(cfg: dict, steps_per_epoch: int, total_steps: int) -> Callable[[int], float]:
    """Factor of the base learning rate after ``step`` completed steps.

    Args:
        cfg: the ``schedule`` group.
        steps_per_epoch: local steps per epoch (identical on every worker).
        total_steps: local steps of the whole run.

    Raises:
        ConfigError: unknown ``schedule.name`` (allowed: :data:`SCHEDULES`), or
            ``schedule.warmup_steps`` < 1. (``warmup_epochs`` >= 0 and ``warmup_start_factor`` in
            [0, 1] are checked by :func:`lsgd.config.validation.validate`.)
    """
    return SCHEDULES[cfg.get("name")](cfg, steps_per_epoch, total_steps)


@SCHEDULES.register("constant", summary="the base learning rate throughout")
def _constant(cfg: dict, steps_per_epoch: int, total_steps: int) -> Callable[[int], float]:
    return lambda step: 1.0


@SCHEDULES.register("step", summary="multiplied by gamma at each milestone epoch, after an optional linear warm-up")
def _step(cfg: dict, steps_per_epoch: int, total_steps: int) -> Callable[[int], float]:
    milestones = [int(round(m * steps_per_epoch)) for m in cfg.get("milestones", [])]
    gamma = float(cfg.get("gamma", 0.1))
    warmup = warmup_steps(cfg, steps_per_epoch)
    if not warmup:
        return lambda step: gamma ** sum(step >= m for m in milestones)
    start = float(cfg.get("warmup_start_factor", 0.1))

    def step_factor(step: int) -> float:
        ramp = start + (1.0 - start) * step / warmup if step < warmup else 1.0
        return ramp * gamma ** sum(step >= m for m in milestones)

    return step_factor


@SCHEDULES.register("cosine", summary="cosine decay to min_factor over the run, after an optional linear warm-up")
def _cosine(cfg: dict, steps_per_epoch: int, total_steps: int) -> Callable[[int], float]:
    warmup = warmup_steps(cfg, steps_per_epoch)
    start = float(cfg.get("warmup_start_factor", 0.1))
    floor = float(cfg.get("min_factor", 0.0))

    def factor(step: int) -> float:
        if step < warmup:
            return start + (1.0 - start) * step / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


@SCHEDULES.register("inverse_sqrt", summary="linear warm-up, then 1 / sqrt(step) (the Transformer's schedule)")
def _inverse_sqrt(cfg: dict, steps_per_epoch: int, total_steps: int) -> Callable[[int], float]:
    w = int(cfg.get("warmup_steps", 4000))
    if w < 1:
        raise ConfigError(f"schedule.warmup_steps must be an integer >= 1; got {w}")
    return lambda step: min((step + 1) / w, math.sqrt(w / (step + 1)))


def warmup_steps(cfg: dict, steps_per_epoch: int) -> int:
    """Local steps of the linear warm-up of ``step`` and ``cosine``: round(``warmup_epochs`` x
    ``steps_per_epoch``), 0 without warm-up."""
    return round(float(cfg.get("warmup_epochs", 0) or 0) * steps_per_epoch)


def lr_decay_steps(cfg: dict, steps_per_epoch: int) -> tuple[int, ...]:
    """The learning-rate decays of a ``step`` schedule: the local step counts (completed steps,
    ascending, distinct) from which a milestone's decay applies; empty for ``constant``, and for
    ``cosine`` and ``inverse_sqrt``, whose continuous decay has no milestones (Accordion's decay
    rule uses these). A warm-up only raises the rate, so it adds no decay and moves none.

    Args:
        cfg: the ``schedule`` group.
        steps_per_epoch: local steps per epoch.
    """
    if cfg.get("name") != "step" or float(cfg.get("gamma", 0.1)) >= 1.0:
        return ()
    return tuple(sorted({int(round(float(m) * steps_per_epoch)) for m in cfg.get("milestones", [])} - {0}))


def build_scheduler(optimizer, cfg: dict, steps_per_epoch: int, total_steps: int):
    """``LambdaLR`` over :func:`lr_factor_fn`; call ``.step()`` once per local step."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor_fn(cfg, steps_per_epoch, total_steps))
