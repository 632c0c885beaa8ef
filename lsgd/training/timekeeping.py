"""A training step's time: what the trainer measures and what it models, in one place.

The trainer's loop (:meth:`lsgd.training.trainer.Trainer.train_step`) calls its
:class:`StepTimer` at fixed points of every local step::

    step_start -> forward -> forward_done -> backward -> backward_done -> (fp16: unscale)
    -> update_start -> gradient hooks, clipping, optimizer step, schedule -> update_done
    -> algorithm.after_step -> step_done

a server's loop around its serve step (:meth:`StepTimer.serve_start`, :meth:`StepTimer.served`,
:meth:`StepTimer.serve_done`), and :meth:`StepTimer.mark_gap` after each bookkeeping. The timer
keeps these quantities:

* **Modeled time** (the cluster clock, :class:`lsgd.clock.worker_clock.Clock`: ``modeled_time_s``,
  and its compute part ``modeled_compute_s``): this rank's time on the configured cluster.
  Communication enters it where it happens, priced by the communicator (``comm_time_s``,
  :mod:`lsgd.comm.communicator`); compute enters it here, from the compute model
  (:class:`lsgd.compute.model.ComputeModel`):

  - forward and backward, charged after backward (``Clock.compute``, then ``Clock.backward``, whose
    window DDP's buckets overlap): in profile mode (``cluster.compute=profile``) the same modeled
    step every time (the roofline profile or ``cluster.step_time_s``, / speed), with no read from
    the GPU; in measured mode (``cluster.compute=measured``) the forward and backward windows'
    wall time less the time blocked in communication in each, / speed;
  - the optimizer step, by an optimizer hook wherever this rank steps its optimizer (a parameter
    server's workers never do; its server does, between its incast and its broadcast): the
    profile's optimizer seconds (roofline), or its measured seconds / speed (measured mode);
  - measured mode only: the rest of the step too, each where it happens: the algorithm's gradient
    hooks and ``after_step`` (their own arithmetic: averaging, mixing, outer steps, compression
    outside a comm hook; wall time less blocked time less the optimizer steps already charged,
    / speed), a server's serve step likewise, and the time between two steps (loading the batch,
    the loop; bookkeeping, being measurement, falls before :meth:`StepTimer.mark_gap`).

* **Measured compute** (:attr:`StepTimer.compute_time_s`, the ``compute_time_s`` metric): each
  step's wall time minus the time this worker's training threads were blocked in communication
  (:meth:`lsgd.comm.communicator.Communicator.blocked_s`, read around each window,
  :mod:`lsgd.comm.blocked_time`): the forward window (``before_step``'s push/pull waits included)
  and the backward window (a comm hook's synchronous exchange, DDP's end of backward waiting for
  its last buckets) keep only what was computed; communication is priced by the clock alone.
  Limits: a DDP all-reduce in flight on gloo's threads while backward continues is overlap, not
  blocking, so the CPU it takes from backward on a loaded machine stays in the measured compute;
  torch's PowerSGD chain, completed inside the hook on gloo, counts whole as communication (its
  compression matmuls run in the chain's callbacks); a wait torch makes outside lsgd's
  communicator and hooks (DDP's one-off bucket rebuild broadcast in the second forward) stays
  compute; on CUDA a wait hidden in ``torch.cuda.synchronize`` (an NCCL kernel still running) is
  compute. On cuda a step's measured compute comes from CUDA events read at the records
  (:class:`lsgd.training.accel.CudaStepTimes`: no host sync per step); on cpu from
  ``perf_counter``.

* **The current step's compute** (:attr:`StepTimer.step_compute_s`, ``RunContext.step_compute_s``):
  ``(modeled, measured)`` seconds of its forward + backward (the clock's, and the wall time from
  the step's start to the end of backward), for algorithms that weigh compute against
  communication.

* **The stretch** (``cluster.stretch``, :attr:`StepTimer.stretched_s`): before ``after_step`` the
  worker sleeps until the step (less its time blocked in communication) lasts ``stretch_s``
  (:func:`lsgd.compute.stretch.stretch_step`); the sleep is in ``compute_time_s`` (emulated
  compute), not on the clock.

The timer does only what the run needs: the measured windows in measured mode; profile mode
charges its constant step and reads the time only at the step's start, after backward
(:attr:`StepTimer.step_compute_s`) and at its end (and for the stretch). On cuda nothing here
reads the GPU back per step except where the clock needs the value now
(:meth:`StepTimer._sync_time` in measured mode). Units: seconds throughout. The order of every
clock call and every reading is the loop's: the modeled times are bit for bit those of the loop
that did this accounting inline.
"""

from __future__ import annotations

import time

import torch

from lsgd.compute.model import ComputeModel
from lsgd.compute.stretch import stretch_step
from lsgd.training.accel import CudaStepTimes


def modeled_step_times(compute_model: ComputeModel, speeds: list[float], workers: list[int]) -> tuple[float, ...] | None:
    """Every worker's modeled seconds per local step (profile mode; ``RunContext.worker_step_s``):
    the profile's step time / each worker's speed (``speeds``: every rank's, from
    :func:`lsgd.compute.workers.resolve_speeds`; ``workers``: the worker ranks). None in measured mode
    or without a step time in the profile."""
    base = compute_model.profile["step_time_s"]
    if compute_model.mode != "profile" or base is None:
        return None
    return tuple(base / speeds[r] for r in workers)


class StepTimer:
    """The time accounting of one rank's steps (module docstring): the cluster clock's compute, the
    measured compute and the stretch.

    Args:
        compute_model: this rank's compute model, calibrated (its profile is fixed from here on).
        clock: this rank's cluster clock (shared with the communicator).
        comm: the communicator (:meth:`~lsgd.comm.communicator.Communicator.blocked_s`).
        optimizer: the optimizer whose steps go on the clock (hooks registered here).
        device: the training device (cuda: CUDA-event step times; measured mode syncs).
        speed: this rank's relative speed (measured seconds are divided by it).
        stretch_s: ``cluster.stretch``'s wall seconds a local step lasts at least; None: off, or a server.
    """

    def __init__(self, compute_model: ComputeModel, clock, comm, optimizer: torch.optim.Optimizer,
                 device: torch.device, speed: float, stretch_s: float | None = None):
        self.compute_model, self.clock, self.comm, self.device, self.speed = compute_model, clock, comm, device, speed
        self.measured = compute_model.mode == "measured"
        if compute_model.source == "roofline":
            # the optimizer step's modeled compute, whenever this rank steps its optimizer (a parameter
            # server's workers never do; its server does), after the communication it waited for;
            # the profile is fixed from here on (calibrated before)
            optimizer_s = compute_model.step().optimizer_s
            optimizer.register_step_post_hook(lambda *_: clock.compute(optimizer_s))
        self._measured_opt_s = 0.0  # measured mode: the optimizer steps' seconds charged so far (below)
        self._gap = None            # measured mode: (perf_counter, blocked_s, optimizer s) after the last bookkeeping
        if self.measured:
            # the optimizer step's measured seconds (/ speed), charged where it happens (a server's
            # step between its incast and its broadcast); lsgd.compute.model.ComputeModel measured mode
            optimizer.register_step_pre_hook(lambda *_: setattr(self, "_opt_t0", time.perf_counter()))
            optimizer.register_step_post_hook(lambda *_: self._charge_optimizer(time.perf_counter() - self._opt_t0))
        # profile mode: the clock's forward / backward seconds are the same every step
        self._profile_step = None if self.measured else compute_model.step()
        self._profile_fb_s = (None if self._profile_step is None
                              else self._profile_step.forward_s + self._profile_step.backward_s)
        self.stretch_s = stretch_s
        self.stretched_s = 0.0  # seconds slept by the stretch (in compute_time_s: emulated compute)
        # on cuda a step's measured compute comes from CUDA events, read at the records (no host
        # sync per step); on cpu from perf_counter (step_done)
        self.gpu_steps = CudaStepTimes() if device.type == "cuda" else None
        self._compute_time_s = 0.0
        self.step_compute_s = (0.0, 0.0)  # (modeled, measured) forward + backward of the current step
        # the current step's readings: its start (blocked_s, perf_counter, CUDA event), the end of
        # its forward (measured mode) and the hook window under way (measured mode)
        self._b0 = self._t0 = self._t1 = self._b1 = 0.0
        self._gpu_start = None
        self._window = None

    @property
    def compute_time_s(self) -> float:
        """Measured compute seconds of this rank so far (the ``compute_time_s`` metric): on cuda
        the steps' CUDA-event times, read here (a host sync, at records and checkpoints)."""
        if self.gpu_steps is not None:
            self._compute_time_s += self.gpu_steps.settle()
        return self._compute_time_s

    @compute_time_s.setter
    def compute_time_s(self, value: float) -> None:
        self._compute_time_s = float(value)

    # -- a worker's local step ------------------------------------------------------------------
    def step_start(self) -> None:
        """A local step begins: in measured mode the time since :meth:`mark_gap` (loading the
        batch) goes on the clock; the step's CUDA start event, blocked time and wall time are read."""
        if self.measured and self._gap is not None:  # measured mode: loading the batch since the last step
            self._charge(*self._gap)
            self._gap = None
        self._gpu_start = self.gpu_steps.start() if self.gpu_steps is not None else None
        self._b0, self._t0 = self.comm.blocked_s(), time.perf_counter()

    def forward_done(self) -> None:
        """Forward (and the loss) computed: measured mode reads the end of the forward window."""
        if self.measured:
            self._t1 = self._sync_time()
            self._b1 = self.comm.blocked_s()

    def backward_done(self) -> None:
        """Backward computed: the step's forward and backward seconds on the clock (measured mode:
        each window's wall time less its blocked time, / speed; profile mode: the profile's step,
        no read from the GPU) and :attr:`step_compute_s`."""
        if self.measured:
            t0, b0, t1, b1 = self._t0, self._b0, self._t1, self._b1
            t2 = self._sync_time()
            b2 = self.comm.blocked_s()
            forward_s, backward_s = max(0.0, t1 - t0 - (b1 - b0)), max(0.0, t2 - t1 - (b2 - b1))
            st = self.compute_model.step(forward_s, backward_s)
            self.step_compute_s = (st.forward_s + st.backward_s, t2 - t0)  # (clock's, wall time)
        else:  # profile mode: the same modeled step every time; no read from the GPU
            st = self._profile_step
            self.step_compute_s = (self._profile_fb_s, time.perf_counter() - self._t0)
        clock = self.clock
        clock.compute(st.forward_s)
        clock.backward(st.backward_s)

    def update_start(self) -> None:
        """The update begins (the algorithm's gradient hooks, clipping, the optimizer step, the
        schedule): measured mode opens its window (the optimizer step is charged by its hook, the
        hooks' own arithmetic by :meth:`update_done`)."""
        if self.measured:
            self._window = (time.perf_counter(), self.comm.blocked_s(), self._measured_opt_s)

    def update_done(self) -> None:
        """The update is done, ``after_step`` comes next: measured mode charges the update's own
        compute; ``cluster.stretch`` sleeps the rest of the step; measured mode opens
        ``after_step``'s window."""
        if self.measured:
            self._charge(*self._window)
        if self.stretch_s is not None:  # cluster.stretch: sleep the rest of the step before after_step
            self.stretched_s += stretch_step(self.stretch_s, self._t0, self.comm.blocked_s() - self._b0)
        if self.measured:
            self._window = (time.perf_counter(), self.comm.blocked_s(), self._measured_opt_s)

    def step_done(self) -> None:
        """The step is over (``after_step`` returned): measured mode charges ``after_step``'s own
        compute; the step's measured compute is added to :attr:`compute_time_s` (cuda: its end
        event, read at the next record)."""
        if self.measured:
            self._charge(*self._window)
        if self._gpu_start is not None:  # no host sync: the events are read at the next record
            self._compute_time_s += self.gpu_steps.stop(self._gpu_start)
        else:
            self._compute_time_s += max(0.0, time.perf_counter() - self._t0 - (self.comm.blocked_s() - self._b0))

    def mark_gap(self) -> None:
        """Measured mode: the time from here to the next step's start (the batch's loading, the
        loop) is compute (:meth:`step_start` charges it); bookkeeping (records, evaluation,
        checkpoints) is measurement and falls before the mark. Nothing in profile mode."""
        if self.measured:
            self._gap = (time.perf_counter(), self.comm.blocked_s(), self._measured_opt_s)

    # -- a server's step ------------------------------------------------------------------------
    def serve_start(self) -> None:
        """A server's step begins: its blocked time, wall time and optimizer seconds so far are read."""
        self._b0, self._t0, opt0 = self.comm.blocked_s(), time.perf_counter(), self._measured_opt_s
        self._window = (self._t0, self._b0, opt0)

    def served(self) -> None:
        """The serve step returned: measured mode charges its own compute (nothing in profile mode)."""
        self._charge(*self._window)

    def serve_done(self) -> None:
        """The server's step is over: its wall time less its blocked time is measured compute."""
        self._compute_time_s += max(0.0, time.perf_counter() - self._t0 - (self.comm.blocked_s() - self._b0))

    # -- measured mode's charges ----------------------------------------------------------------
    def _sync_time(self) -> float:
        """``perf_counter`` after the GPU's queued work finished, where the clock needs the
        forward / backward seconds now (``cluster.compute=measured`` on cuda: a host sync, which
        the measured clock needs); profile mode prices the step from its profile and reads no time
        from the GPU (no sync)."""
        if self.device.type == "cuda" and self.compute_model.mode == "measured":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _charge_optimizer(self, seconds: float) -> None:
        """Measured mode: an optimizer step of ``seconds`` wall time on the clock (/ speed)."""
        seconds = max(0.0, seconds) / self.speed
        self._measured_opt_s += seconds
        self.clock.compute(seconds)

    def _charge(self, t0: float, b0: float, opt0: float) -> None:
        """Measured mode: the compute of a hook window that began at ``t0`` (``perf_counter``), with
        :meth:`lsgd.comm.communicator.Communicator.blocked_s` ``b0`` and optimizer seconds charged ``opt0`` then:
        its wall time less the time blocked in communication and less the optimizer steps already
        charged by their hook, / speed, on the clock now (the algorithms' own arithmetic: averaging,
        mixing, outer steps, compression outside a comm hook). Nothing in profile mode."""
        if self.compute_model.mode != "measured":
            return
        own = (time.perf_counter() - t0) - (self.comm.blocked_s() - b0) - (self._measured_opt_s - opt0) * self.speed
        if own > 0:
            self.clock.compute(own / self.speed)
