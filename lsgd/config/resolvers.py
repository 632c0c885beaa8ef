"""OmegaConf resolvers of lsgd's configs: ``${lsgd_run_id:}`` (``hydra.run.dir`` and
``hydra.sweep.subdir``), ``${lsgd_mul:a,b,...}``, the product of integers (a study's arms derive
their batch size and step counts from shared study keys, conf/experiment/local_vs_minibatch.yaml),
``${lsgd_add:a,b,...}``, their sum, ``${lsgd_div:a,b}``, an exact quotient (a fixed global batch split
over the workers, conf/experiment/swarm_at_scale.yaml), ``${lsgd_ratio:a,b}``, a real quotient (an outer
learning rate divided by the number of workers, conf/experiment/async_at_scale.yaml),
``${lsgd_period:samples,global_batch,epochs,points}``, the steps between ``points`` evenly spaced
points of a run (about ten evaluations a run whatever the workers and batch,
conf/experiment/swarm_fmnist.yaml), and ``${lsgd_speeds:level,workers,servers}``, a heterogeneity
level's speeds for the workers behind ``servers`` server ranks (conf/experiment/async_text.yaml:
the synchronous arm's 4 ranks and the asynchronous arms' 4 workers behind one server get the same
speeds).

They are registered when the config package ``lsgd.conf`` is imported (and by the CLI), so any
process that composes or resolves an lsgd config has them: the CLI, tests, and the jobs Hydra's
submitit launcher starts on SLURM nodes, which recompose the config from ``pkg://lsgd.conf``.
"""

from __future__ import annotations

import os
import secrets
from datetime import datetime


def run_id() -> str:
    """A run folder name that cannot collide: time to the microsecond plus 16 random bits
    (``20261122-101502-123456-a3f9``). Under SLURM the job id (shared by all tasks of the job)
    is used, so every task of a multi-node job agrees on one folder."""
    job = os.environ.get("SLURM_JOB_ID")
    if job and "SLURM_PROCID" in os.environ:
        array = os.environ.get("SLURM_ARRAY_JOB_ID")
        return f"slurm-{array}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array else f"slurm-{job}"
    return f"{datetime.now():%Y%m%d-%H%M%S-%f}-{secrets.token_hex(2)}"


def mul(*factors: int) -> int:
    """``${lsgd_mul:8,16}`` -> 128: the product of integer arguments (ints or their decimal strings).

    Raises:
        ValueError: no argument, or an argument that is not an integer (bools and floats included).
    """
    if not factors:
        raise ValueError("lsgd_mul needs at least one integer argument")
    out = 1
    for f in factors:
        if isinstance(f, bool) or not (isinstance(f, int) or (isinstance(f, str) and f.strip().lstrip("-").isdigit())):
            raise ValueError(f"lsgd_mul multiplies integers; got {f!r}")
        out *= int(f)
    return out


def _integer(value, what: str) -> int:
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and value.strip().lstrip("-").isdigit())):
        raise ValueError(f"{what} takes integers; got {value!r}")
    return int(value)


def add(*terms: int) -> int:
    """``${lsgd_add:4,1}`` -> 5: the sum of integer arguments (ints or their decimal strings).

    Raises:
        ValueError: no argument, or an argument that is not an integer (bools and floats included).
    """
    if not terms:
        raise ValueError("lsgd_add needs at least one integer argument")
    return sum(_integer(t, "lsgd_add") for t in terms)


def div(dividend: int, divisor: int) -> int:
    """``${lsgd_div:1024,${launcher.nproc_per_node}}`` -> 64 at 16 workers: ``dividend / divisor``
    when it divides exactly (a global batch split evenly over the workers).

    Raises:
        ValueError: an argument that is not an integer, a divisor < 1, or a remainder (naming both
            numbers: 1024 samples do not split over 48 workers).
    """
    a, b = _integer(dividend, "lsgd_div"), _integer(divisor, "lsgd_div")
    if b < 1:
        raise ValueError(f"lsgd_div: the divisor must be >= 1; got {b}")
    if a % b:
        raise ValueError(f"lsgd_div: {a} is not divisible by {b} (a global batch of {a} does not split evenly over "
                         f"{b} workers)")
    return a // b


def ratio(numerator: float, denominator: float) -> float:
    """``${lsgd_ratio:0.7,${study.workers}}`` -> 0.175 at 4 workers: ``numerator / denominator`` as a
    float (numbers or their decimal strings).

    Raises:
        ValueError: an argument that is not a finite number (bools included), or a denominator of 0.
    """
    values = []
    for v in (numerator, denominator):
        try:
            if isinstance(v, bool):
                raise ValueError
            x = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"lsgd_ratio divides numbers; got {v!r}") from None
        if x != x or x in (float("inf"), float("-inf")):
            raise ValueError(f"lsgd_ratio divides finite numbers; got {v!r}")
        values.append(x)
    if values[1] == 0:
        raise ValueError(f"lsgd_ratio: the denominator must not be 0 (numerator {values[0]})")
    return values[0] / values[1]


def period(samples: int, global_batch: int, epochs: int, points: int) -> int:
    """``${lsgd_period:60000,${lsgd_mul:${launcher.nproc_per_node},${batch_size}},${epochs},10}`` -> 46
    at 4 workers of 32 for 1 epoch: the steps between ``points`` evenly spaced points of a run of
    ``epochs`` passes over ``samples`` training samples at ``global_batch`` samples a step, the
    trainer's steps of an epoch being ``samples // global_batch`` (lsgd.data.loader), so
    ``eval_unit: step`` with this ``eval_every`` gives about ``points`` evaluations a run (the last
    step evaluates too) at any number of workers, batch or epochs; ``epochs=1, points=1``: one epoch in
    steps (``checkpoint_every`` under ``eval_unit: step``). At least 1 (a run shorter than
    ``points`` steps evaluates every step).

    Raises:
        ValueError: an argument that is not an integer, samples < 0, global_batch, epochs or points < 1.
    """
    n, b, e, k = (_integer(v, "lsgd_period") for v in (samples, global_batch, epochs, points))
    if n < 0 or min(b, e, k) < 1:
        raise ValueError(f"lsgd_period: samples >= 0 and global_batch, epochs, points >= 1; got {n}, {b}, {e}, {k}")
    return max(1, (n // b) * e // k)


def speeds(level: str, workers: int, servers: int = 0) -> list[float]:
    """``${lsgd_speeds:very,4,1}`` -> ``[1.0, w_1, .., w_4]``: the speeds of heterogeneity ``level``
    (``lsgd.compute.workers.HETEROGENEITY``) for ``workers`` workers, as the preset gives them to a run of
    exactly ``workers`` ranks with seed 0 (:func:`lsgd.compute.workers.resolve_speeds`), behind ``servers``
    ranks of speed 1.0 (a server does no local steps; its speed is unused).

    Why: the preset ``cluster.speeds=very`` spreads over *all* ranks, a server included, so a
    4-rank synchronous run and a 1 + 4-rank asynchronous run would give their 4 workers different
    speeds; with this resolver both get the same list. The permutation is seed 0's whatever the
    run's seed, so the runs of an arm over several seeds share their speeds (and stay one arm).

    Raises:
        ValueError: an unknown level, workers < 1 or servers < 0.
    """
    from lsgd.compute.workers import HETEROGENEITY, resolve_speeds

    if level not in HETEROGENEITY:
        raise ValueError(f"lsgd_speeds: level must be one of {', '.join(HETEROGENEITY)}; got {level!r}")
    w, s = _integer(workers, "lsgd_speeds"), _integer(servers, "lsgd_speeds")
    if w < 1 or s < 0:
        raise ValueError(f"lsgd_speeds: workers >= 1 and servers >= 0; got {w}, {s}")
    return [1.0] * s + resolve_speeds(level, w, 0)


def register_resolvers() -> None:
    """Register ``lsgd_run_id``, ``lsgd_mul``, ``lsgd_add``, ``lsgd_div``, ``lsgd_ratio``, ``lsgd_period`` and
    ``lsgd_speeds`` with OmegaConf (idempotent)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("lsgd_run_id"):
        OmegaConf.register_new_resolver("lsgd_run_id", run_id)
    if not OmegaConf.has_resolver("lsgd_mul"):
        OmegaConf.register_new_resolver("lsgd_mul", mul)
    if not OmegaConf.has_resolver("lsgd_add"):
        OmegaConf.register_new_resolver("lsgd_add", add)
    if not OmegaConf.has_resolver("lsgd_div"):
        OmegaConf.register_new_resolver("lsgd_div", div)
    if not OmegaConf.has_resolver("lsgd_ratio"):
        OmegaConf.register_new_resolver("lsgd_ratio", ratio)
    if not OmegaConf.has_resolver("lsgd_period"):
        OmegaConf.register_new_resolver("lsgd_period", period)
    if not OmegaConf.has_resolver("lsgd_speeds"):
        OmegaConf.register_new_resolver("lsgd_speeds", speeds)
