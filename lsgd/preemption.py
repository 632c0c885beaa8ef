"""Preemption: a run that gets SIGTERM, SIGUSR1 or SIGUSR2 checkpoints at the next step and stops;
under SLURM it then requeues its job, and the requeued job resumes the same run folder.

``launcher.preemption``:

* ``auto`` (default): ``requeue`` when the ranks joined a SLURM ``srun`` launch, else ``off``;
* ``requeue``: checkpoint, write ``summary.json`` with status ``preempted``, then rank 0 runs
  ``scontrol requeue $SLURM_JOB_ID`` and every rank exits with code 0 (a SLURM job only);
* ``checkpoint``: checkpoint, status ``preempted``, exit code 143 (128 + SIGTERM);
* ``off``: the signals keep their default action.

How a signal becomes a stop: the handler only sets a flag. At every step's bookkeeping (after that
step's record, so the resumed run starts exactly after it) the ranks all-reduce the flag (MAX, an
uncounted 4-byte collective), so every rank stops at the same step even when the signal reached them
at different steps. SLURM signals all tasks of the job (``scancel --signal=TERM``, preemption's
SIGTERM, the ``--signal=USR1@120`` warning before a time limit, submitit's ``USR2``).

Why our own handler: submitit's (``JobEnvironment._handle_signals``) pickles the *callable* again
(Hydra's launcher, with its original arguments), not the training state, ignores SIGTERM, and
requeues at once from inside the signal handler; torch elastic restarts local workers but knows
nothing of SLURM's requeue. A requeued SLURM job keeps its job id (so ``${lsgd_run_id:}`` names the
same folder) and sees ``SLURM_RESTART_COUNT`` >= 1; :func:`lsgd.launch.run` then resumes that folder.
Note that SLURM makes a requeued job eligible again only about two minutes after the requeue
(its begin time). An admin who starts it sooner (``scontrol update jobid=N StartTime=now``) must
wait until the second after the requeue: nodes reject a credential created in the second they
revoked the old one, and the job then ends FAILED without running.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess

import torch

log = logging.getLogger("lsgd")

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
MODES = ("auto", "requeue", "checkpoint", "off")
CHECKPOINT_EXIT_CODE = 128 + signal.SIGTERM


class Preempted(Exception):
    """Raised inside the training loop once every rank agreed to stop (the checkpoint is written)."""


def resolve_mode(mode: str, launch_source: str | None) -> str:
    """``auto`` -> ``requeue`` under a SLURM srun launch (``launch_source == 'slurm'``), else ``off``.

    Raises:
        ValueError: a mode not in :data:`MODES`, or ``requeue`` outside a SLURM job.
    """
    if mode not in MODES:
        raise ValueError(f"launcher.preemption={mode!r} is not allowed; allowed: {', '.join(MODES)}")
    if mode == "auto":
        return "requeue" if launch_source == "slurm" else "off"
    if mode == "requeue" and not os.environ.get("SLURM_JOB_ID"):
        raise ValueError("launcher.preemption=requeue needs a SLURM job (SLURM_JOB_ID is not set); "
                         "allowed here: auto, checkpoint, off")
    return mode


class PreemptionWatch:
    """Signal handlers that note SIGTERM/SIGUSR1/SIGUSR2 (``mode != 'off'``) and the per-step agreement.

    Use as a context manager around the training loop; the previous handlers come back on exit.
    """

    def __init__(self, mode: str):
        self.mode = mode
        self.signal: int | None = None  # the first signal received
        self._previous: dict[int, object] = {}

    @property
    def enabled(self) -> bool:
        return self.mode in ("requeue", "checkpoint")

    def _handle(self, signum, frame) -> None:
        if self.signal is None:
            self.signal = signum
            log.warning("got %s: checkpointing at the next step, then stopping (launcher.preemption=%s)",
                        signal.Signals(signum).name, self.mode)

    def __enter__(self):
        if self.enabled:
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def agreed(self, comm, device: torch.device) -> bool:
        """True on every rank when some rank got a signal (an uncounted all-reduce MAX of the flag)."""
        if not self.enabled:
            return False
        flag = torch.tensor([1 if self.signal is not None else 0], dtype=torch.int32, device=device)
        comm.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, count=False)
        return bool(flag.item())


def requeue_slurm_job() -> bool:
    """``scontrol requeue $SLURM_JOB_ID`` (the array task's id for job arrays); True when it worked.

    The job must be requeueable (``sbatch --requeue``, or the cluster's ``JobRequeue=1`` default).
    """
    job = os.environ.get("SLURM_JOB_ID")
    if os.environ.get("SLURM_ARRAY_JOB_ID") and os.environ.get("SLURM_ARRAY_TASK_ID"):
        job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    if not job:
        log.error("launcher.preemption=requeue: SLURM_JOB_ID is not set; resume the run with resume=<run folder>")
        return False
    try:
        res = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.error("scontrol requeue %s failed: %s; resume the run with resume=<run folder>", job, exc)
        return False
    if res.returncode != 0:
        log.error("scontrol requeue %s failed (exit %d): %s; resume the run with resume=<run folder>",
                  job, res.returncode, res.stderr.strip())
        return False
    log.warning("requeued SLURM job %s: it resumes this run folder when it starts again", job)
    return True
