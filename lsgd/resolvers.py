"""OmegaConf resolvers of lsgd's configs (``${lsgd_run_id:}`` in ``hydra.run.dir`` and
``hydra.sweep.subdir``).

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


def register_resolvers() -> None:
    """Register ``lsgd_run_id`` with OmegaConf (idempotent)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("lsgd_run_id"):
        OmegaConf.register_new_resolver("lsgd_run_id", run_id)
