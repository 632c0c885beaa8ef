"""OmegaConf resolvers of lsgd's configs: ``${lsgd_run_id:}`` (``hydra.run.dir`` and
``hydra.sweep.subdir``) and ``${lsgd_mul:a,b,...}``, the product of integers (a study's arms derive
their batch size and step counts from shared study keys, conf/experiment/local_vs_minibatch.yaml).

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


def register_resolvers() -> None:
    """Register ``lsgd_run_id`` and ``lsgd_mul`` with OmegaConf (idempotent)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("lsgd_run_id"):
        OmegaConf.register_new_resolver("lsgd_run_id", run_id)
    if not OmegaConf.has_resolver("lsgd_mul"):
        OmegaConf.register_new_resolver("lsgd_mul", mul)
