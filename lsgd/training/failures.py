"""Which rank failed first, recorded in the run folder, and the shared-folder check of multi-node runs.

When one rank of a joined launch (torchrun, srun) raises, the others fail a moment later in their
next collective with a connection error, and rank 0 may not be the rank that failed. So every rank
that raises writes ``failures/rank<r>.json`` (atomically: rank, host, wall time, error, traceback
tail) before its sockets close, and ``summary.json`` (status ``failed``) names the first failure in
``failed_rank`` and ``error``: the earliest one that is not a peer's connection loss, else the
earliest of all. Rank 0 rewrites the summary (it holds the run's figures); another rank writes one
only when none exists yet, so a job whose rank 0 was killed outright still ends with a summary.

torch.distributed.elastic's ``@record`` already gives the error file and ``ChildFailedError``'s
root cause for workers lsgd spawns itself; these files give the same answer to joined launches,
where no agent collects errors.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import traceback
from pathlib import Path

import torch

from lsgd.core.files import write_atomic

# messages of ranks that failed because a peer went away (consequences, not causes)
PEER_LOSS = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|failed to recv|failed to send|"
    r"Socket closed|Timed out|timed out|DistNetworkError|NCCL communicator was aborted",
    re.IGNORECASE,
)


def _failures_dir(run_dir: Path) -> Path:
    return run_dir / "failures"


def read_failures(run_dir: Path) -> list[dict]:
    """All ``failures/rank<r>.json`` entries, first cause first (see the module docstring)."""
    entries = []
    for f in sorted(_failures_dir(run_dir).glob("rank*.json")):
        try:
            entries.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(entries, key=lambda e: (bool(PEER_LOSS.search(e.get("error", ""))), e.get("time", 0.0)))


def summarize_failures(state: dict, run_dir: Path) -> dict:
    """Add ``failed_rank``, ``error`` (the first cause) and ``failed_ranks`` to a summary dict."""
    entries = read_failures(run_dir)
    if entries:
        first = entries[0]
        state.update(
            failed_rank=first["rank"],
            failed_ranks=sorted(e["rank"] for e in entries),
            error=f"rank {first['rank']} ({first.get('host', '?')}): {first['error']}",
        )
    return state


def record_failure(run_dir: Path | None, rank: int, exc: BaseException) -> None:
    """Write ``failures/rank<rank>.json`` and the ``failed`` summary (see the module docstring).

    Does nothing when ``run_dir`` is None or does not exist on this node (a rank without the
    shared filesystem must not create a local copy of the folder).
    """
    if run_dir is None or not run_dir.is_dir():
        return
    try:
        _failures_dir(run_dir).mkdir(exist_ok=True)
        entry = {
            "rank": rank, "host": os.environ.get("SLURMD_NODENAME") or socket.gethostname(), "pid": os.getpid(), "time": time.time(),
            "error": f"{exc!r}"[-2000:], "traceback": "".join(traceback.format_exception(exc))[-8000:],
        }
        write_atomic(_failures_dir(run_dir) / f"rank{rank}.json", json.dumps(entry, indent=2))
        summary = run_dir / "summary.json"
        if summary.exists():
            state = json.loads(summary.read_text())
            if state.get("status") in ("completed", "diverged", "preempted", "interrupted") or rank != 0:
                return  # a final summary stands; rank 0's failed summary is only refined by rank 0
        else:
            config = run_dir / "config.yaml"
            state = {"run_id": run_dir.name}
            if config.exists():
                import yaml

                cfg = yaml.safe_load(config.read_text())
                state.update(experiment_name=cfg.get("experiment_name"), algo=(cfg.get("algo") or {}).get("name"))
        state["status"] = "failed"
        summarize_failures(state, run_dir)
        text = json.dumps(state, indent=2)
        if rank == 0:
            write_atomic(summary, text)
        else:
            _create_once(summary, text)
    except OSError:
        pass  # recording a failure must never hide the failure itself


def _create_once(path: Path, text: str) -> None:
    """Write ``path`` only if it does not exist (atomic: a hard link of a finished temp file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def check_shared_run_dir(run_dir: Path, rank: int, device: str) -> None:
    """Every rank must see the run folder rank 0 created (its ``config.yaml``): an uncounted
    all-reduce of "cannot see it" flags, so all ranks fail together with one clear message.

    Raises:
        RuntimeError: some rank cannot see ``run_dir`` (names the ranks).
    """
    import torch.distributed as dist

    world = dist.get_world_size()
    missing = torch.zeros(world, dtype=torch.int32, device="cuda" if device == "cuda" else "cpu")
    missing[rank] = 0 if (run_dir / "config.yaml").exists() else 1
    dist.all_reduce(missing)
    ranks = [r for r, m in enumerate(missing.tolist()) if m]
    if ranks:
        raise RuntimeError(
            f"rank(s) {ranks} cannot see the run folder {run_dir} that rank 0 created "
            f"(no {run_dir / 'config.yaml'} there): a multi-node run needs results_dir on a filesystem "
            "every node shares (NFS, Lustre, GPFS); set results_dir=<shared path>"
        )
