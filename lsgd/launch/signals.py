"""The main process's signals in a local launch: a first SIGINT / SIGTERM stops the workers at their
next step with a checkpoint, a second kills them at once (:class:`MainSignals`); a launch that a
signal stopped before its workers all stopped cleanly raises :class:`RunInterrupted`.

The workers' side of the same protocol (their handlers, the stop agreement, the checkpoint) is
:mod:`lsgd.training.preemption`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from pathlib import Path


class RunInterrupted(Exception):
    """A local launch stopped by a signal whose workers did not all stop cleanly (a second signal
    killed them, or one arrived before they watched for it); ``signum``: the first signal."""

    def __init__(self, signum: int):
        from lsgd.training.preemption import signal_name

        self.signum = signum
        super().__init__(f"interrupted by {signal_name(signum)}")


class MainSignals:
    """SIGINT / SIGTERM in the main process of a local launch (:mod:`lsgd.training.preemption`): the first
    is passed to the workers through ``stop`` (they checkpoint at their next step and return); a
    second kills the workers (SIGKILL) at once. Installed from the run folder's creation on (before
    the data are prepared): a first signal before the workers are started starts none (the run ends
    ``interrupted`` with no step), a second raises KeyboardInterrupt there (a download stops at
    once). Each is noted in the run's ``train.log`` (a ``[main]`` line: when the launcher got it
    and what it did). torch elastic's own handlers for these two are left out
    (``LaunchConfig.signals_to_handle``): they raise ``SignalException`` in the agent, which then
    signals the workers and waits up to 30 s for them to exit, while a worker that returns waits
    for the agent to read its result (``queue_finished_reading_event`` in elastic's ``_wrap``),
    which only a finished agent loop does: so both waited the full 30 s, then SIGKILL.

    Workers start with SIGINT blocked: a blocked signal mask is inherited through fork and exec,
    so a spawned worker holds a Ctrl-C pending until :class:`lsgd.training.preemption.PreemptionWatch` has
    installed its handler and unblocks it (a Ctrl-C in its first seconds, while it imports torch,
    printed a ``KeyboardInterrupt`` traceback per worker). The block is on the main thread, which
    starts the workers (and every thread it starts after inherits it); a helper thread started
    before it keeps SIGINT unblocked, so the kernel delivers a Ctrl-C to the main process there and
    Python still runs :meth:`_handle` in the main thread (CPython runs handlers in the main thread
    whichever thread received the signal)."""

    HANDLED = (signal.SIGINT, signal.SIGTERM)
    #: blocked in the main thread (and so in the workers it spawns) while the launch runs
    BLOCKED = {signal.SIGINT}
    #: loggers that report the workers' exit after an interrupt as errors, with tracebacks: quiet then
    QUIET = ("torch.distributed.elastic", "torch.multiprocessing")

    def __init__(self, stop, run_dir: Path | None = None):
        self.stop = stop
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.signal: int | None = None
        self._previous: dict = {}
        self._levels: dict[str, int] = {}
        self._mask: set | None = None
        self._receiver = None
        self.entered = False  # the handlers are installed
        self.launched = False  # spawn_local is starting (or started) the workers

    def _note(self, text: str) -> None:
        """A ``[main]`` line in train.log (O_APPEND, as the workers' lines; no lock, so safe in a
        handler that interrupted anything)."""
        if self.run_dir is None:
            return
        import time

        with contextlib.suppress(OSError), open(self.run_dir / "train.log", "a") as f:
            f.write(f"[main] {time.strftime('%H:%M:%S')} WARNING {text}\n")

    def _handle(self, signum, frame) -> None:
        from lsgd.training.preemption import signal_name

        if self.signal is None:
            self.signal = signum
            self.stop.set(signum)
            for name in self.QUIET:
                self._levels.setdefault(name, logging.getLogger(name).level)
                logging.getLogger(name).setLevel(logging.CRITICAL)
            self._note(f"got {signal_name(signum)}: the workers stop at their next step with a checkpoint; "
                       "a second signal kills them at once" if self.launched else
                       f"got {signal_name(signum)} before the workers started: starting none; a second signal "
                       "stops at once")
            return
        if not self.launched:  # a second signal while the data are prepared: stop that at once
            self._note(f"got {signal_name(signum)} after {signal_name(self.signal)}: stopping at once")
            raise KeyboardInterrupt
        import multiprocessing

        children = multiprocessing.active_children()  # the workers elastic started
        self._note(f"got {signal_name(signum)} after {signal_name(self.signal)}: killing the workers at once "
                   f"(SIGKILL to pid {', '.join(str(c.pid) for c in children) or 'none left'})")
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)

    def __enter__(self):
        import threading

        for sig in self.HANDLED:
            self._previous[sig] = signal.signal(sig, self._handle)
        # the thread that receives the signals the main thread blocks (it only waits)
        self._receiver = threading.Event()
        threading.Thread(target=self._receiver.wait, name="lsgd-signals", daemon=True).start()
        # multiprocessing starts its resource tracker with SIGINT / SIGTERM blocked the same way
        # (CPython bpo-33613) and then unblocks them unconditionally: start it first
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
        self._mask = signal.pthread_sigmask(signal.SIG_BLOCK, self.BLOCKED)
        self.entered = True
        return self

    def __exit__(self, *exc) -> None:
        if self._mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)  # a pending signal is handled here
        if self._receiver is not None:
            self._receiver.set()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)
