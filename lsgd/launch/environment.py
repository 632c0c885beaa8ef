"""Where this process sits in a distributed launch that someone else started: torchrun
(``torch.distributed.run``), SLURM's ``srun`` (one task per worker) or a submitit task (Hydra's
submitit launcher).

:func:`detect_launch_env` reads the environment variables and returns a :class:`LaunchEnv`
(rank, world size, this node's tasks, the rendezvous address), or None when no such launch
describes this process: ``lsgd train`` then starts its own workers (:mod:`lsgd.launch.spawn`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class LaunchEnv:
    """Where this process sits in an externally started job.

    Attributes: rank, world_size, local_rank, local_world_size, master_addr, master_port and
    ``source`` ('torchrun' or 'slurm').
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    source: str

    def export(self, env: dict) -> None:
        """Write the torch.distributed ``env://`` variables into ``env`` (e.g. os.environ)."""
        env.update(
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK=str(self.local_rank),
            LOCAL_WORLD_SIZE=str(self.local_world_size),
            MASTER_ADDR=self.master_addr,
            MASTER_PORT=str(self.master_port),
        )


def first_host(nodelist: str) -> str:
    """First host name of a SLURM node list (``SLURM_JOB_NODELIST`` syntax).

    Examples: ``"node[01-04,07]" -> "node01"``, ``"gpu3,gpu5" -> "gpu3"``,
    ``"rack[2-3]-n[10-12]" -> "rack2-n10"``.

    Raises:
        ValueError: an empty node list.
    """
    nodelist = nodelist.strip()
    if not nodelist:
        raise ValueError("empty SLURM node list")
    # the first comma-separated entry that is not inside brackets
    depth, end = 0, len(nodelist)
    for i, ch in enumerate(nodelist):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            end = i
            break
    entry = nodelist[:end]
    # replace every bracket group by its first element (ranges keep their zero padding)
    return re.sub(r"\[([^\]]*)\]", lambda m: m.group(1).split(",")[0].split("-")[0], entry)


def slurm_master_port(job_id: str) -> int:
    """A port shared by all tasks of SLURM job ``job_id``: 15000 + job_id mod 20000."""
    digits = re.sub(r"\D", "", job_id) or "0"
    return 15000 + int(digits) % 20000


def detect_launch_env(env: Mapping[str, str]) -> LaunchEnv | None:
    """Detect an external distributed launch from environment variables.

    * torchrun / torch.distributed.run: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
      ``MASTER_PORT`` all set.
    * SLURM ``srun`` (one task per worker, as Hydra's submitit launcher starts them):
      ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID`` and ``SLURM_STEP_ID`` set (the batch
      script itself has no step id); master = first host of ``SLURM_JOB_NODELIST`` (or
      ``MASTER_ADDR``), port from ``MASTER_PORT`` or derived from ``SLURM_JOB_ID``.

    * a job started by submitit (Hydra's submitit launcher; ``SUBMITIT_EXECUTOR=slurm``): ranks,
      task count and the first host from ``submitit.JobEnvironment`` (its tasks span the whole
      allocation, so the job's node list is the step's).

    Returns None when neither applies (then ``lsgd train`` spawns its own workers).

    Raises:
        ValueError: inconsistent values (rank outside [0, world_size)).
    """
    if all(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")):
        out = LaunchEnv(
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env["LOCAL_RANK"]),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])),
            master_addr=env["MASTER_ADDR"],
            master_port=int(env["MASTER_PORT"]),
            source="torchrun",
        )
    elif env.get("SUBMITIT_EXECUTOR") == "slurm" and "SLURM_STEP_ID" in env:
        out = _submitit_env(env)
    elif all(k in env for k in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_ID")):
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "localhost"
        tasks_per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or env["SLURM_NTASKS"]
        out = LaunchEnv(
            rank=int(env["SLURM_PROCID"]),
            world_size=int(env["SLURM_NTASKS"]),
            local_rank=int(env["SLURM_LOCALID"]),
            local_world_size=int(re.match(r"\d+", tasks_per_node).group(0)),
            master_addr=env.get("MASTER_ADDR") or first_host(nodelist),
            master_port=int(env.get("MASTER_PORT") or slurm_master_port(env.get("SLURM_JOB_ID", "0"))),
            source="slurm",
        )
    else:
        return None
    if not 0 <= out.rank < out.world_size:
        raise ValueError(f"rank {out.rank} outside [0, {out.world_size}) in the {out.source} environment")
    return out


def _submitit_env(env: Mapping[str, str]) -> LaunchEnv:
    """A submitit task's place, read through ``submitit.JobEnvironment`` (which reads os.environ)."""
    import submitit

    job = submitit.JobEnvironment()
    return LaunchEnv(
        rank=job.global_rank,
        world_size=job.num_tasks,
        local_rank=job.local_rank,
        local_world_size=job.num_tasks // max(1, job.num_nodes),
        master_addr=env.get("MASTER_ADDR") or job.hostnames[0],
        master_port=int(env.get("MASTER_PORT") or slurm_master_port(str(job.job_id))),
        source="slurm",
    )
