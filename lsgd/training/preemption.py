"""Preemption and interrupts: a run that gets SIGTERM, SIGUSR1 or SIGUSR2 (preemption) or SIGINT
(Ctrl-C) checkpoints at the next step and stops; under SLURM a preempted run then requeues its job,
and the requeued job resumes the same run folder.

Interrupts (whatever ``launcher.preemption`` says): SIGINT, and SIGTERM where preemption is ``off``,
stop the run at the next step boundary with a checkpoint there and status ``interrupted``; the
process exits with 128 + the signal (130 for SIGINT, 143 for SIGTERM) and ``lsgd`` prints one line,
the command that resumes the run (``lsgd train resume=<run folder>``). In a local launch the main
process also receives the signal (alone, from ``kill``, or with its whole process group, from a
terminal's Ctrl-C): it passes it to the workers through a shared integer (:class:`StopFlag`), so a
signal to the main process alone stops them too, and a second signal kills the workers at once.
Algorithms whose server keeps the books alone (``bookkeeping = "server"``: no collective to agree
on a step) cannot checkpoint on a signal: their workers exit at once (status ``interrupted``, no
checkpoint).

``launcher.preemption``:

* ``auto`` (default): ``requeue`` when the ranks joined a SLURM ``srun`` launch, else ``off``;
* ``requeue``: checkpoint, write ``summary.json`` with status ``preempted``, then rank 0 runs
  ``scontrol requeue $SLURM_JOB_ID`` and every rank exits with code 0 (a SLURM job only);
* ``checkpoint``: checkpoint, status ``preempted``, exit code 143 (128 + SIGTERM);
* ``off``: SIGUSR1 / SIGUSR2 keep their default action; SIGTERM is an interrupt (above).

How a signal becomes a stop: the handler only sets a flag. At every step's bookkeeping (after that
step's record, so the resumed run starts exactly after it) the ranks agree on the flag (MAX over the
ranks of an uncounted 4-byte code), so every rank stops at the same step even when the signal
reached them at different steps. The agreement is issued without waiting and read at the next
step's bookkeeping (:meth:`PreemptionWatch.agreed`), so no step waits for its round trip; a signal
stops the run one or two steps after it arrives. DDP (and the methods built on it) sends no message
of its own for it: the code travels in the clock's per-step settlement, which arrives before the
next step's bookkeeping (:attr:`lsgd.comm.communicator.Communicator.carry`). Methods whose workers drift apart
between synchronizations (local SGD and its family, Overlap-Local-SGD, the gossip family) read it 16
steps after its issue (:attr:`~lsgd.algorithms.base.Algorithm.agreement_lag`), so the agreement lets
them drift as the method does (read one step later, it tied every step of every worker to the
slowest's), and issue it every 8th step only (:data:`AGREEMENTS_IN_FLIGHT`: one message per step
cost them 5-8% of the demo CNN's step on a 2-core host, one every 4th step still 2-2.5% on its 4
ranks, one every 8th about half that); a signal stops them 16 to 24 steps after it arrives. SLURM signals all tasks of the job (``scancel --signal=TERM``, preemption's
SIGTERM, the ``--signal=USR1@120`` warning before a time limit, submitit's ``USR2``).

Why our own handler: submitit's (``JobEnvironment._handle_signals``) pickles the *callable* again
(Hydra's launcher, with its original arguments), not the training state, ignores SIGTERM, and
requeues at once from inside the signal handler; torch elastic restarts local workers but knows
nothing of SLURM's requeue. A requeued SLURM job keeps its job id (so ``${lsgd_run_id:}`` names the
same folder) and sees ``SLURM_RESTART_COUNT`` >= 1; :func:`lsgd.launch.launcher.run` then resumes that folder.
Note that SLURM makes a requeued job eligible again only about two minutes after the requeue
(its begin time). An admin who starts it sooner (``scontrol update jobid=N StartTime=now``) must
wait until the second after the requeue: nodes reject a credential created in the second they
revoked the old one, and the job then ends FAILED without running.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import subprocess

import numpy as np
import torch

from lsgd.comm.shared_memory import AGREE

log = logging.getLogger("lsgd")

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
#: signals that interrupt a run (checkpoint, status ``interrupted``) when they are not preemption's
INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)
MODES = ("auto", "requeue", "checkpoint", "off")
CHECKPOINT_EXIT_CODE = 128 + signal.SIGTERM
#: stop agreements in flight at most (:meth:`PreemptionWatch.agreed`): read ``lag`` calls after its
#: issue, one is issued every ``lag // AGREEMENTS_IN_FLIGHT`` calls
AGREEMENTS_IN_FLIGHT = 2

file_log = logging.getLogger("lsgd.file")  # train.log only (lsgd.training.trainer.setup_logging)


class Stopped(Exception):
    """Raised inside the training loop once every rank agreed to stop at ``step`` (the checkpoint
    is written); ``signum`` is the signal that caused it."""

    status = "stopped"

    def __init__(self, step: int, signum: int):
        self.step, self.signum = step, signum
        super().__init__(f"{self.status} at step {step}: checkpoint written, stopping ({signal_name(signum)})")


class Preempted(Stopped):
    """A preemption signal (``launcher.preemption`` ``checkpoint`` or ``requeue``)."""

    status = "preempted"


class Interrupted(Stopped):
    """An interrupt (SIGINT, or SIGTERM with preemption off)."""

    status = "interrupted"


def signal_name(signum: int | None) -> str:
    """``SIGINT`` for 2, etc.; ``signal <n>`` for a number that names no signal."""
    try:
        return signal.Signals(int(signum)).name
    except (TypeError, ValueError):
        return f"signal {signum}"


def exit_code(signum: int | None) -> int:
    """The shell's code for a process stopped by ``signum``: 128 + its number (130 for SIGINT,
    143 for SIGTERM; SIGINT when unknown)."""
    return 128 + int(signum or signal.SIGINT)


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


class StopFlag:
    """The main process's signal, shared with the workers of a local launch: a ``RawValue('i')``
    of the spawn context (0: none, else the signal number), passed to each worker as an argument.
    Reading it is one load from shared memory, no lock."""

    def __init__(self):
        import multiprocessing

        self.value = multiprocessing.get_context("spawn").RawValue("i", 0)

    @property
    def signum(self) -> int:
        return int(self.value.value)

    def set(self, signum: int) -> None:
        if not self.value.value:
            self.value.value = int(signum)


class PreemptionWatch:
    """Signal handlers that note SIGTERM/SIGUSR1/SIGUSR2 (``mode != 'off'``) and, with
    ``interrupts``, SIGINT and SIGTERM, and the per-step agreement. ``stop``: the main process's
    :class:`StopFlag` (a local launch), read as a signal received here.

    Use as a context manager around the training loop; the previous handlers come back on exit.
    ``handlers`` False: none are installed, and ``stop`` is the only source of signals (the workers
    of an in-process cluster are threads; the launcher's main thread owns the signals).
    """

    def __init__(self, mode: str, interrupts: bool = False, stop: StopFlag | None = None, handlers: bool = True):
        self.mode = mode
        self.handlers = handlers
        self.interrupts = interrupts
        self.stop = stop
        self.signal: int | None = None  # the first signal received
        self._previous: dict[int, object] = {}
        #: (call of issue, handle, flag): agreements in flight, oldest first
        self._pending: collections.deque = collections.deque()
        self._calls = 0  # calls of agreed() that read no carried answer (every period-th issues)
        self._due = 0  # the next such call that issues or reads an agreement (the others do nothing)
        self._carried: int | None = None  # an agreement carried by the step's own exchange (carried())
        self._lag = 1
        self._period = 1
        self._mask: set | None = None  # the signal mask before __enter__ unblocked the interrupts

    @property
    def enabled(self) -> bool:
        """Preemption signals checkpoint (``requeue`` or ``checkpoint``)."""
        return self.mode in ("requeue", "checkpoint")

    @property
    def active(self) -> bool:
        """Some signal is watched: the ranks agree at every step."""
        return self.interrupts or self.enabled

    def is_preemption(self, signum: int) -> bool:
        return self.enabled and signum in SIGNALS

    def _handle(self, signum, frame) -> None:
        if self.signal is not None:
            return  # a second Ctrl-C reaches the workers with the main process, which kills them
        self.signal = signum
        if self.is_preemption(signum):
            log.warning("got %s: checkpointing at the next step, then stopping (launcher.preemption=%s)",
                        signal.Signals(signum).name, self.mode)
        elif file_log.hasHandlers():  # (not yet in a worker still starting: Python's last-resort
            # handler would print it on the console; the launcher's train.log line says it then)
            file_log.warning("got %s: checkpointing at the next step, then stopping", signal.Signals(signum).name)

    def __enter__(self):
        if not self.handlers:
            return self
        sigs = set(SIGNALS) if self.enabled else set()
        if self.interrupts:
            sigs.update(INTERRUPT_SIGNALS)
        for sig in sorted(sigs):
            self._previous[sig] = signal.signal(sig, self._handle)
        # a local launch's workers start with SIGINT blocked (lsgd.launch.signals.MainSignals): a Ctrl-C
        # that came before this handler waits, and is handled now; the mask comes back on exit
        self._mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, sigs & set(INTERRUPT_SIGNALS))
        return self

    def __exit__(self, *exc) -> None:
        if self._mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)
            self._mask = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def without_interrupts(self) -> None:
        """No agreement is possible (server bookkeeping): an interrupt ends this process at once
        (exit code 128 + signal, no traceback; the main process reports the run interrupted), and
        so does one that arrived already."""
        if not self.interrupts:
            return
        self.interrupts = False
        for sig in INTERRUPT_SIGNALS:
            if sig in self._previous and not self.is_preemption(sig):
                signal.signal(sig, _exit_now)
        if self.signal is not None and not self.is_preemption(self.signal):
            _exit_now(self.signal, None)

    def code(self) -> int:
        """This rank's stop code now: 0 (no signal to act on), else ``100 * kind + signal``, kind 2
        for preemption, 1 for an interrupt (so a MAX over the ranks prefers preemption, then the
        larger signal number)."""
        signum = self.signal or (self.stop.signum if self.stop is not None else 0)
        if signum and (self.interrupts or self.is_preemption(signum)):
            return (2 if self.is_preemption(signum) else 1) * 100 + signum
        return 0

    def carried(self, code: int) -> None:
        """The MAX over the ranks of :meth:`code`, agreed in an exchange the step made anyway (DDP's
        clock settlement, :attr:`lsgd.comm.communicator.Communicator.carry`), on every rank at the same step:
        the next :meth:`agreed` returns its verdict and sends nothing of its own."""
        self._carried = int(code)

    def _verdict(self, code: int) -> Stopped | None:
        if not code:
            return None
        self.drain()  # every rank has the same agreements in flight: complete them all
        kind, signum = divmod(code, 100)
        return (Preempted if kind == 2 else Interrupted)(-1, signum)

    @property
    def lag(self) -> int:
        """Calls between an agreement's issue and its read (:meth:`agreed`; the trainer sets the
        algorithm's :attr:`~lsgd.algorithms.base.Algorithm.agreement_lag`); 1 by default."""
        return self._lag

    @lag.setter
    def lag(self, value: int) -> None:
        self._lag = int(value)
        self._period = max(1, self._lag // AGREEMENTS_IN_FLIGHT)
        self._due = self._calls  # the next call works out when it next has something to do

    @property
    def period(self) -> int:
        """Calls between two issues of the agreement: ``lag // AGREEMENTS_IN_FLIGHT`` (at least 1)."""
        return self._period

    def agreed(self, comm, device: torch.device) -> Stopped | None:
        """Whether some rank got a signal, as the exception to raise at progress ``step`` (set by
        the caller); None on every rank when none did.

        Where this step's own exchange carried the codes (:meth:`carried`), that answer, and
        nothing is sent. Else the agreement is an uncounted all-reduce MAX of :meth:`code` (where
        the communicator has a shared-memory board, :meth:`lsgd.comm.communicator.Communicator.board`, every
        rank's code posted there and the MAX taken at the read: no message), issued
        without waiting every :attr:`period` calls (the 1st, the ``period + 1``-th, ...) and read
        :attr:`lag` calls after its issue: the ranks call this at the same steps, so they all read
        the same answer at the same step, and no step waits for the flag's round trip (a blocking
        all-reduce per step cost 0.3-0.8 ms on 2 gloo ranks here, several percent of a small
        model's step). With ``lag`` 1 every call issues one and reads the previous one; with a
        larger ``lag`` one call in ``period`` sends a message (a gloo message costs ~0.3 ms of CPU
        on every rank of a 2-core host: per step, ~1.5% of the demo CNN's local step). A signal
        therefore stops the run ``lag`` to ``lag + period`` calls after it arrives (1 to 2 for
        ``lag`` 1; 16 to 24 for :data:`~lsgd.algorithms.base.DRIFT_AGREEMENT_LAG`). A call that
        reads a stop completes the agreements still in flight and issues nothing more. A call that
        neither issues nor reads (``period - 1`` calls in ``period``) costs a counter increment and
        a comparison: the next call that has something to do is worked out by the one before it.
        """
        if self._carried is not None:
            code, self._carried = self._carried, None
            return self._verdict(code) if self.active else None
        calls = self._calls
        self._calls = calls + 1
        if calls < self._due or not self.active:  # nothing to read or issue at this call
            return None
        lag, period, pending = self._lag, self._period, self._pending
        if pending and calls - pending[0][0] >= lag:
            _, handle, flag = pending.popleft()
            handle.wait()
            stop = self._verdict(int(flag.item()))
            if stop is not None:
                return stop
        if calls % period:
            issue = (calls // period + 1) * period
            self._due = min(issue, pending[0][0] + lag) if pending else issue
            return None
        board = comm.board()
        if board is not None:  # every rank on one host: no message (lsgd.comm.shared_memory)
            handle = flag = BoardMax(board, self.code())
        else:
            handle, flag = self._all_reduce(comm, device)
        pending.append((calls, handle, flag))
        self._due = min(calls + period, pending[0][0] + lag)
        return None

    def _all_reduce(self, comm, device: torch.device):
        """(handle, flag): the agreement's uncounted MAX all-reduce of :meth:`code`, issued."""
        flag = torch.tensor([self.code()], dtype=torch.int32, device=device)
        handle = comm.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, count=False, async_op=True)
        if flag.device.type == "cuda":
            # the answer comes to the host by an asynchronous copy into pinned memory queued behind
            # the all-reduce; the next call waits for that copy alone (a .item() there would wait
            # for every kernel queued since, i.e. a host sync per step)
            handle.wait()  # NCCL: the stream waits for the all-reduce, the host does not
            host = torch.empty(1, dtype=torch.int32).pin_memory()
            host.copy_(flag, non_blocking=True)
            handle, flag = _CopyDone(), host
        return handle, flag

    def drain(self) -> None:
        """Complete the agreements in flight, if any (every rank calls it at the same point, before
        the collectives that end a run)."""
        while self._pending:
            self._pending.popleft()[1].wait()


class BoardMax:
    """A stop agreement posted on a shared-memory board (:class:`lsgd.comm.shared_memory.Board`): this rank's
    ``code`` is posted at construction; ``wait()`` gathers every rank's (waiting for ranks that have
    not posted it; a failing rank, while an exception is handled, takes its own), ``item()`` is
    their MAX."""

    __slots__ = ("board", "n", "own", "value")

    def __init__(self, board, code: int):
        self.board, self.own, self.value = board, np.array([float(code)]), None
        self.n = board.post(AGREE, self.own)

    def wait(self) -> None:
        if self.value is None:
            self.value = int(self.board.gather(AGREE, self.n, 1, own=self.own).max())

    def item(self) -> int:
        self.wait()
        return self.value


class _CopyDone:
    """``wait()`` until the device-to-host copy queued before it on the current CUDA stream is done."""

    def __init__(self):
        self.event = torch.cuda.Event()
        self.event.record()

    def wait(self) -> None:
        self.event.synchronize()


def _exit_now(signum, frame) -> None:
    import sys

    sys.stderr.flush()
    os._exit(exit_code(signum))


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
