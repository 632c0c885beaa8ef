"""A worker's modeled compute seconds per local step (:class:`ComputeModel`, :class:`StepTime`), in
profile or measured mode.

Profile mode
------------
:meth:`ComputeModel.calibrate` counts one training step on the first batch
(:func:`lsgd.compute.opcount.count_step`: the forward, the backward and the optimizer's ``step()``)
and prices each phase on the device's roofline (:class:`lsgd.compute.roofline.Roofline`; the
devices: :mod:`lsgd.compute.presets`). The optimizer's step is on the clock too (the trainer
charges it whenever the optimizer steps).

The backward's matmul FLOPs also time DDP's buckets: :attr:`ComputeModel.grad_ready_fraction`
(the fraction of backward FLOPs done when each parameter's gradient is final).

With ``cluster.step_time_s`` set nothing is counted and the step time is given directly, split
forward:backward = 1:2 (the backward of a matmul layer computes two products, the input gradient
and the weight gradient, for the forward's one), optimizer 0.

Either way the profile is a constant: every call of :meth:`ComputeModel.step` returns the same
:class:`StepTime` (divided by the worker's speed), so ``modeled_time_s`` is deterministic and
does not depend on the machine the experiment runs on (``cpu``: it depends on the calibration
file, :func:`lsgd.compute.calibration.cpu_profile_path`, i.e. on the machine that measured it).

Compression compute: :meth:`ComputeModel.seconds` prices PowerSGD's matmul FLOPs at peak x mfu;
:meth:`ComputeModel.counted_seconds` counts any other work (a compressor's compensate, compress,
decompress, update) live under :class:`OpCounter` and prices it on the same roofline; the
``compressed`` algorithm caches the price per tensor
(:meth:`lsgd.algorithms.gradient_compression.compressed.Compressed.compress_bucket`).

Measured mode
-------------
:meth:`ComputeModel.step` takes this machine's measured forward and backward seconds and divides
them by the worker's speed. Reproducible only on the same machine under the same load. The
trainer passes compute only: each window's wall time minus the time the worker's training threads
were blocked in communication inside it (``before_step``'s push/pull waits, a comm hook's
synchronous exchange, DDP's end of backward waiting for its last buckets; :mod:`lsgd.comm.blocked_time`,
limits in ``Trainer.train_step``), so communication is priced once, by the clock's network model.
The rest of the step is on the clock too, each part where it happens (the trainer, not this
class): the optimizer's ``step()`` by its measured wall time (optimizer hooks; a server's step
included), and the algorithm's ``after_backward`` / ``after_step`` (and a server's ``serve_step``)
by their wall time less the communication blocked in them and the optimizer steps inside them:
averaging, gossip mixing, outer steps, compression outside a comm hook. (Before, these were left
out: on the emulated cluster at 1000 Mbit/s the clock was 33-37% fast for D-PSGD on a complete
graph and non-blocking SwarmSGD, whose mixing is arithmetic on every step; issue 23.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lsgd.compute.config import CLUSTER_DEFAULTS, is_number
from lsgd.compute.opcount import Op, OpCounter, StepCount, count_step
from lsgd.compute.presets import DEFAULT_EFFICIENCY, device_spec
from lsgd.compute.roofline import PhaseTime, Roofline
from lsgd.compute.validation import validate_compute

# forward : backward split of a given ``step_time_s`` (backward ~ 2x forward)
FORWARD_FRACTION = 1.0 / 3.0


@dataclass(frozen=True)
class StepTime:
    """Compute seconds of one local step (incl. the worker's speed): forward, backward and the
    optimizer step (0 where not modeled: measured mode, ``cluster.step_time_s``)."""

    forward_s: float
    backward_s: float
    optimizer_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s + self.optimizer_s

    def scaled(self, speed: float) -> StepTime:
        """The same step on a worker of relative speed ``speed``: each time divided by it."""
        return StepTime(self.forward_s / speed, self.backward_s / speed, self.optimizer_s / speed)


class ComputeModel:
    """Per-step compute seconds of one worker on the target cluster.

    Built from the resolved ``cluster`` config dict and this worker's relative speed (from
    :func:`lsgd.compute.workers.resolve_speeds`).

    * ``profile`` mode: :meth:`calibrate` once on a real batch (:func:`count_step`, priced by the
      device's :class:`Roofline`: forward, backward and optimizer step), or ``cluster.step_time_s``
      given directly (then split forward:backward 1:2, the usual backward ~ 2x forward, optimizer
      0; :meth:`calibrate` is a no-op). :meth:`step` then returns the same :class:`StepTime`
      (divided by speed) on every call, whatever measured times it is passed: deterministic,
      independent of this machine (``cpu``: of this machine's calibration file).
    * ``measured`` mode: ``step(measured_forward_s, measured_backward_s)`` returns the measured
      times divided by speed; :meth:`calibrate` is a no-op. The times must be compute alone
      (the trainer takes the communication it waited for out of them: :mod:`lsgd.comm.blocked_time`).

    Raises:
        ConfigError: an invalid ``cluster`` key (:func:`lsgd.compute.validation.validate_cluster`'s messages).
        ValueError: ``speed`` not a number > 0.
    """

    def __init__(self, cluster: Mapping, speed: float = 1.0):
        validate_compute(cluster)
        if not (is_number(speed) and speed > 0):
            raise ValueError(f"speed must be a number > 0, got {speed!r}")

        def get(key: str) -> Any:
            return cluster.get(key, CLUSTER_DEFAULTS[key])

        self.mode: str = get("compute")
        self.device: str = get("device")
        mfu = get("mfu")
        self.mfu: float = DEFAULT_EFFICIENCY[self.device] if mfu is None else float(mfu)
        self.speed: float = float(speed)
        step_time_s = get("step_time_s")
        self.step_time_s: float | None = None if step_time_s is None else float(step_time_s)
        self._roofline: Roofline | None = None
        self.phases: dict[str, PhaseTime] | None = None  # forward / backward / optimizer at speed 1.0
        #: {parameter name: fraction (0..1] of the backward pass's matmul FLOPs done when its
        #: gradient is final}: when DDP's buckets are ready (:meth:`count_grad_ready`); None until counted
        self.grad_ready_fraction: dict[str, float] | None = None
        self._base: StepTime | None = None  # at speed 1.0 (profile mode)
        self._step: StepTime | None = None  # at this worker's speed (profile mode)
        if self.mode == "profile" and self.step_time_s is not None:
            forward_s = self.step_time_s * FORWARD_FRACTION
            self._set_base(StepTime(forward_s, self.step_time_s - forward_s))

    @property
    def roofline(self) -> Roofline:
        """The device's :class:`Roofline` (``cpu``: read from the calibration file on first use)."""
        if self._roofline is None:
            self._roofline = Roofline(device_spec(self.device), self.mfu)
        return self._roofline

    @property
    def peak_flops(self) -> float:
        return self.roofline.spec.peak_flops

    @property
    def forward_flops(self) -> float | None:
        """Matmul-family FLOPs of the forward pass (model FLOPs), None until counted."""
        return None if self.phases is None else self.phases["forward"].matmul_flops

    @property
    def backward_flops(self) -> float | None:
        """Matmul-family FLOPs of the backward pass, None until counted."""
        return None if self.phases is None else self.phases["backward"].matmul_flops

    @property
    def source(self) -> str:
        """Where the step time comes from: ``measured``, ``step_time_s`` or ``roofline``."""
        if self.mode == "measured":
            return "measured"
        return "step_time_s" if self.step_time_s is not None else "roofline"

    @property
    def calibrated(self) -> bool:
        """Whether :meth:`step` can answer: always in measured mode or with ``step_time_s``."""
        return self.mode == "measured" or self._base is not None

    def _set_base(self, base: StepTime) -> None:
        self._base = base
        self._step = base.scaled(self.speed)

    def calibrate(self, model: nn.Module, x: Any, y: Any, loss_fn: Callable[[Any, Any], torch.Tensor],
                  optimizer: torch.optim.Optimizer | None = None) -> None:
        """Count one step on ``(x, y)`` (:func:`count_step`, with ``optimizer``'s step when given),
        price it on the device's roofline and fix the profile; fills :attr:`grad_ready_fraction`.

        No-op in measured mode or when ``cluster.step_time_s`` is set. Calling it again recounts.
        """
        if self.source != "roofline":
            return
        counted = self._count(model, x, y, loss_fn, optimizer)
        self.phases = {name: self.roofline.price(getattr(counted, name))
                       for name in ("forward", "backward", "optimizer")}
        self._set_base(StepTime(*(self.phases[n].seconds for n in ("forward", "backward", "optimizer"))))

    def count_grad_ready(self, model: nn.Module, x: Any, y: Any,
                         loss_fn: Callable[[Any, Any], torch.Tensor]) -> dict[str, float]:
        """Fill and return :attr:`grad_ready_fraction` from one counted step (:func:`count_step`),
        in any mode (:meth:`calibrate` fills it too). Backward runs the layers in reverse, so the
        last layers' gradients are final early: the demo CNN's fc layers (94% of its parameters)
        after 7% of its backward FLOPs. Leaves the profile as it is."""
        self._count(model, x, y, loss_fn, None)
        return self.grad_ready_fraction

    def _count(self, model, x, y, loss_fn, optimizer) -> StepCount:
        gpu = self.device != "cpu"
        counted = count_step(model, x, y, loss_fn, optimizer, gpu=gpu)
        backward = sum(op.matmul_flops for op in counted.backward)
        self.grad_ready_fraction = {n: (f / backward if backward > 0 else 1.0) for n, f in counted.grad_ready.items()}
        return counted

    def step(self, measured_forward_s: float | None = None, measured_backward_s: float | None = None) -> StepTime:
        """Compute time of one local step of this worker.

        Profile mode: the constant profile divided by the speed (the arguments are ignored).
        Measured mode: the measured seconds divided by the speed (both arguments required;
        ``optimizer_s`` 0).

        Raises:
            RuntimeError: profile mode from the roofline before :meth:`calibrate`.
            ValueError: measured mode without both measured times, or a negative one.
        """
        if self.mode == "profile":
            if self._step is None:
                raise RuntimeError("ComputeModel: profile mode needs calibrate(model, x, y, loss_fn) before step()")
            return self._step
        if measured_forward_s is None or measured_backward_s is None:
            raise ValueError("ComputeModel: measured mode needs step(measured_forward_s, measured_backward_s)")
        if measured_forward_s < 0 or measured_backward_s < 0:
            raise ValueError(f"measured times must be >= 0, got {measured_forward_s!r}, {measured_backward_s!r}")
        return StepTime(measured_forward_s / self.speed, measured_backward_s / self.speed)

    def seconds(self, flops: float) -> float:
        """Seconds of ``flops`` of extra compute-bound work on this worker (PowerSGD's matmuls):
        ``flops / (peak x mfu) / speed`` in profile mode; 0 in measured mode, where the trainer
        charges the measured wall time of the hooks that do it (module docstring, Measured mode)."""
        if self.mode == "measured":
            return 0.0
        return float(flops) / self.roofline.flops_rate / self.speed

    def kernel_seconds(self, flops: float, nbytes: float, launches: int = 1) -> float:
        """Seconds of one kernel of ``flops`` FLOPs moving ``nbytes`` bytes on this worker:
        :meth:`Roofline.op_seconds` / speed in profile mode; 0 in measured mode."""
        if self.mode == "measured":
            return 0.0
        return self.roofline.op_seconds(flops, nbytes, launches) / self.speed

    def ops_seconds(self, ops: Sequence[Op]) -> float:
        """Seconds of the counted ``ops`` (:class:`OpCounter`) on this worker: their roofline
        price / speed in profile mode; 0 in measured mode."""
        if self.mode == "measured":
            return 0.0
        return self.roofline.price(ops).seconds / self.speed

    def counted_seconds(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        """Run ``fn()`` (extra work on real tensors, e.g. a compressor) and return ``(its result,
        its seconds on this worker)``: its ops counted live (:class:`OpCounter`, no decomposition,
        so the result is bit-identical to an uncounted call) and priced (:meth:`ops_seconds`). In
        measured mode ``fn`` runs uncounted and the seconds are 0. Costs Python dispatch on every
        op: callers cache the seconds (per tensor shape)."""
        if self.mode == "measured":
            return fn(), 0.0
        counter = OpCounter(decompose=False, gpu=self.device != "cpu")
        with counter:
            out = fn()
        return out, self.ops_seconds(counter.ops)

    @property
    def profile(self) -> dict:
        """JSON-ready summary for the run's ``summary.json`` (prefixed ``profile_`` there).

        Keys: ``mode``, ``source`` (roofline | step_time_s | measured), ``device``, ``peak_flops``
        (FLOP/s), ``memory_bandwidth`` (bytes/s), ``launch_s`` (s per kernel), ``mfu`` (the
        efficiency applied to the peak), ``forward_flops``, ``backward_flops``, ``optimizer_flops``
        (matmul-family FLOPs, the MFU convention; null unless counted), ``forward_bytes``,
        ``backward_bytes``, ``optimizer_bytes`` (bytes moved), ``forward_kernels``,
        ``backward_kernels``, ``optimizer_kernels`` (launches), ``forward_s``, ``backward_s``,
        ``optimizer_s``, ``step_time_s`` (seconds at speed 1.0, their sum; null in measured mode
        or before calibration), ``compute_bound_s``, ``memory_bound_s``, ``launch_bound_s``,
        ``first_touch_s`` (the step time split by what bounds each op, the launches and the page
        faults of fresh large outputs), ``achieved_mfu`` (forward + backward matmul FLOPs
        / (step_time_s x peak_flops); on ``cpu`` the peak is the square matmul's rate, which
        oneDNN's convolutions exceed, so a convolution-bound step can show more than 1), ``speed``
        and ``worker_step_time_s`` (``step_time_s / speed``).
        ``cpu`` adds ``cpu_calibration`` (the record of :func:`lsgd.compute.calibration.calibrate_cpu` used).
        """
        profile_mode = self.mode == "profile"
        base = self._base if profile_mode else None
        spec = self.roofline.spec if profile_mode and self.source == "roofline" else None
        phases = self.phases or {}

        def phase(name: str, key: str):
            return getattr(phases[name], key) if name in phases else None

        out = {
            "mode": self.mode,
            "source": self.source,
            "device": self.device if profile_mode else None,
            "peak_flops": spec.peak_flops if spec else None,
            "memory_bandwidth": spec.memory_bandwidth if spec else None,
            "launch_s": spec.launch_s if spec else None,
            "mfu": self.mfu if profile_mode else None,
        }
        for name in ("forward", "backward", "optimizer"):
            out[f"{name}_flops"] = phase(name, "matmul_flops")
            out[f"{name}_bytes"] = phase(name, "bytes")
            out[f"{name}_kernels"] = phase(name, "launches")
        out.update({
            "forward_s": None if base is None else base.forward_s,
            "backward_s": None if base is None else base.backward_s,
            "optimizer_s": None if base is None else base.optimizer_s,
            "step_time_s": None if base is None else base.total_s,
        })
        for key, attr in (("compute_bound_s", "compute_bound_s"), ("memory_bound_s", "memory_bound_s"),
                          ("launch_bound_s", "launch_s"), ("first_touch_s", "first_touch_s")):
            out[key] = sum(getattr(p, attr) for p in phases.values()) if phases else None
        matmul = (phases["forward"].matmul_flops + phases["backward"].matmul_flops) if phases else None
        out["achieved_mfu"] = (matmul / (base.total_s * spec.peak_flops)
                               if phases and base is not None and base.total_s > 0 and spec else None)
        out["speed"] = self.speed
        out["worker_step_time_s"] = None if self._step is None else self._step.total_s
        if spec is not None and spec.info is not None:
            out["cpu_calibration"] = spec.info
        return out
