"""The compute model of the cluster clock: how long one local step takes on the target cluster.

Every worker carries a virtual clock (``modeled_time_s``, see ``lsgd.clock``). Its communication
advances by the alpha-beta cost of each collective; its compute advances, once per local step, by
the :class:`StepTime` that :class:`ComputeModel` returns here. This module models compute only,
from the ``cluster:`` config block:

=================  ==========================================================================
key                meaning
=================  ==========================================================================
``compute``        ``profile`` (deterministic, independent of this machine) or ``measured``
``device``         target accelerator, a key of :data:`DEVICE_PEAK_FLOPS`
``mfu``            model FLOPs utilization assumed on that device, in (0, 1]
``step_time_s``    compute seconds per local step at speed 1.0 (profile mode; overrides FLOPs)
``speeds``         one relative speed per worker, or a preset of :data:`HETEROGENEITY`
``gpus_per_node``  workers per node (intra-node link inside a node, inter-node link between)
=================  ==========================================================================

Units: time in seconds (s), work in floating-point operations (FLOPs), rates in FLOP/s.

Profile mode
------------
The step's FLOPs are counted once (:meth:`ComputeModel.calibrate`) on a real batch with
:class:`torch.utils.flop_counter.FlopCounterMode`, and the step time at speed 1.0 is::

    forward_s  = forward_flops  / (DEVICE_PEAK_FLOPS[device] * mfu)
    backward_s = backward_flops / (DEVICE_PEAK_FLOPS[device] * mfu)

Why FlopCounterMode: it is PyTorch's own dispatch-level counter, so it sees exactly the matrix
products the model runs (``mm``, ``addmm``, ``bmm``, convolutions, scaled-dot-product attention,
each counted as 2 FLOPs per multiply-accumulate), forward and backward separately, for any model,
with no hand-written per-architecture formula. It counts the backward the autograd graph really
runs: the first layer's input gradient is not computed (nor counted) when the input does not
require grad, so a step's backward is about, not exactly, 2x its forward. Elementwise ops,
normalization, activations and the loss are not counted; this is the usual "model FLOPs"
convention behind MFU (Chowdhery et al. 2022, PaLM, Appendix B: matmul FLOPs only, 6ND for a
transformer), and the inefficiency of everything else is what ``mfu`` < 1 stands for.

With ``cluster.step_time_s`` set, the FLOP count is skipped and the step time is given directly,
split forward:backward = 1:2 (the backward of a matmul layer computes two products, the input
gradient and the weight gradient, for the forward's one; the usual backward ~ 2x forward ratio).

Either way the profile is a constant: every call of :meth:`ComputeModel.step` returns the same
:class:`StepTime` (divided by the worker's speed), so ``modeled_time_s`` is deterministic and
does not depend on the machine the experiment runs on.

Measured mode
-------------
:meth:`ComputeModel.step` takes this machine's measured forward and backward seconds and divides
them by the worker's speed. Reproducible only on the same machine under the same load.

Speeds and heterogeneity
------------------------
A worker with speed ``v`` takes ``t / v`` seconds for a step that takes ``t`` at speed 1.0.
Presets are normalised so that the fastest worker has speed exactly 1.0: the profile (the device
peak and mfu, or ``step_time_s``) is the time of the fastest worker, and the others are slower.
This is the convention of Liu et al. 2024's dynamic local updates (H_w = floor(v(w) / max v * H),
the fastest worker runs the full H) and of the HALoS simulator (utnslab/halos,
``simulation/common.py``: ``worker_speeds /= worker_speeds.max()``, compute time =
steps x local_step_time / speed).

The preset names none / slight / moderate / very are the heterogeneity levels of Liu, Douillard
et al. 2024, "Asynchronous Local-SGD Training for Language Modeling" (arXiv 2401.09135). Their
exact per-level speed distribution could not be recovered from the sources available here (the
paper's text was not reachable; the DeepMind toy notebook, google-deepmind/asyncdiloco
``AsyncLocalSGDToyExample.ipynb``, uses one fixed set of seconds per step,
[0.58, 0.75, 1.51, 3.33] for 4 workers, i.e. a slowest/fastest ratio of 5.74, and no levels;
HALoS takes speeds from a file). lsgd therefore defines each level by its spread ``r`` =
(fastest speed) / (slowest speed), :data:`HETEROGENEITY_SPREAD`:

===========  ======  ==================================================================
level        r       4 workers (before the seeded shuffle)
===========  ======  ==================================================================
none         1       1, 1, 1, 1
slight       1.5     1, 0.874, 0.763, 0.667
moderate     3       1, 0.693, 0.481, 0.333
very         6       1, 0.550, 0.303, 0.167   (the toy notebook's 4 workers: 1, 0.77, 0.38, 0.17)
===========  ======  ==================================================================

The spreads double from level to level, and ``very`` is anchored on the only published numbers
(the notebook's ratio 5.74). The ``n`` workers' speeds are spaced geometrically between 1 and
1/r (``r ** (-k / (n - 1))``, k = 0 .. n-1), so every level has exactly its spread whatever the
number of workers (independent draws would give 2 workers an arbitrary spread), and are then
assigned to ranks by a permutation drawn from ``seed`` (the same permutation for every level, so
the slowest rank of ``slight`` is the slowest of ``very``). The result depends only on
(preset, world_size, seed): every rank computes the same list.

Nodes
-----
Rank ``r`` lives on node ``r // gpus_per_node`` (:func:`node_of`). ``world_size`` need not be a
multiple of ``gpus_per_node``: the last node is then partial (``num_nodes`` rounds up), as when
a job takes the spare GPUs of a node; ``gpus_per_node`` > ``world_size`` is one partial node.

Device peaks
------------
:data:`DEVICE_PEAK_FLOPS` holds the published dense (no structured sparsity) FP16/BF16 tensor-core
peak of each accelerator, the rate mixed-precision training runs at; see its table.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from lsgd.errors import ConfigError

# Published dense peak FLOP/s for mixed-precision training: FP16/BF16 inputs on tensor cores
# with FP32 accumulate, without 2:4 structured sparsity (NVIDIA quotes sparse rates as 2x these).
#
# ======  ===============  ============  =====================================================
# key     part             dense peak    source
# ======  ===============  ============  =====================================================
# v100    Tesla V100 SXM2   125 TFLOP/s  NVIDIA V100 datasheet, "Tensor Performance: 125
#                                        TFLOPS" (SXM2; PCIe 112); = 640 tensor cores x 128
#                                        FLOP/clock x 1.53 GHz boost. Volta has FP16 only.
# a100    A100 SXM4         312 TFLOP/s  NVIDIA A100 datasheet, "BF16/FP16 Tensor Core: 312
#                                        TFLOPS | 624 TFLOPS*" (* with sparsity); 40 GB and
#                                        80 GB parts alike.
# h100    H100 SXM5       989.4 TFLOP/s  NVIDIA Hopper architecture whitepaper, "Peak FP16 /
#                                        BF16 Tensor TFLOPS with FP32 Accumulate:
#                                        989.4 / 1978.9" (dense / sparse); the datasheet's
#                                        "1,979 teraFLOPS*" is the sparse rate. = 528 tensor
#                                        cores x 1024 FLOP/clock x 1.83 GHz.
# h200    H200 SXM        989.4 TFLOP/s  NVIDIA H200 datasheet, "BF16/FP16 Tensor Core: 1,979
#                                        TFLOPS*" (* with sparsity): the H100 SXM5's compute
#                                        with more and faster HBM3e memory.
# ======  ===============  ============  =====================================================
DEVICE_PEAK_FLOPS: dict[str, float] = {
    "v100": 125e12,
    "a100": 312e12,
    "h100": 989.4e12,
    "h200": 989.4e12,
}

HETEROGENEITY: tuple[str, ...] = ("none", "slight", "moderate", "very")

# fastest / slowest worker speed of each heterogeneity level (see the module docstring)
HETEROGENEITY_SPREAD: dict[str, float] = {"none": 1.0, "slight": 1.5, "moderate": 3.0, "very": 6.0}

COMPUTE_MODES = ("profile", "measured")

# forward : backward split of a given ``step_time_s`` (backward ~ 2x forward)
FORWARD_FRACTION = 1.0 / 3.0

# the ``cluster:`` block of conf/config.yaml; a missing key takes this value
CLUSTER_DEFAULTS: dict[str, Any] = {
    "compute": "profile",
    "device": "a100",
    "mfu": 0.4,
    "step_time_s": None,
    "speeds": None,
    "gpus_per_node": 1,
}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _speeds_error(world_size: int, got: Any, why: str = "") -> ConfigError:
    return ConfigError(
        f"cluster.speeds must be null, a preset ({' | '.join(HETEROGENEITY)}) or a list of "
        f"{world_size} positive numbers (one relative speed per worker){why}, got {got!r}"
    )


def resolve_speeds(speeds: Any, world_size: int, seed: int = 0) -> list[float]:
    """``cluster.speeds`` -> one relative speed per worker (1.0 = nominal).

    Args:
        speeds: ``None`` or ``"none"``: every worker 1.0. A preset of :data:`HETEROGENEITY`: the
            level's speeds (module docstring), fastest 1.0, slowest ``1 / HETEROGENEITY_SPREAD``,
            assigned to ranks by a permutation drawn from ``seed``. A list or tuple of
            ``world_size`` positive numbers: returned as given (as floats, not normalised).
        world_size: number of workers.
        seed: the run's seed; with the preset and ``world_size`` it fixes the result.

    Returns:
        ``world_size`` floats; the same on every rank.

    Raises:
        ConfigError: naming ``cluster.speeds`` and the allowed values.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    if speeds is None:
        return [1.0] * world_size
    if isinstance(speeds, str):
        if speeds not in HETEROGENEITY:
            raise _speeds_error(world_size, speeds)
        spread = HETEROGENEITY_SPREAD[speeds]
        if world_size == 1 or spread == 1.0:
            return [1.0] * world_size
        ladder = [spread ** (-k / (world_size - 1)) for k in range(world_size)]
        ranks = list(range(world_size))
        random.Random(seed).shuffle(ranks)  # a private generator: the global RNGs are untouched
        out = [0.0] * world_size
        for k, rank in enumerate(ranks):
            out[rank] = ladder[k]
        return out
    if isinstance(speeds, Sequence) and not isinstance(speeds, (bytes, bytearray)):
        values = list(speeds)
        if len(values) != world_size:
            raise _speeds_error(world_size, speeds, f" (world_size={world_size}, got {len(values)} values)")
        if not all(_is_number(v) and v > 0 for v in values):
            raise _speeds_error(world_size, speeds)
        return [float(v) for v in values]
    raise _speeds_error(world_size, speeds)


def node_of(rank: int, gpus_per_node: int) -> int:
    """The node of ``rank``: ranks ``[k * gpus_per_node, (k + 1) * gpus_per_node)`` share node k."""
    return rank // gpus_per_node


def num_nodes(world_size: int, gpus_per_node: int) -> int:
    """Nodes used by ``world_size`` workers; the last one is partial when it does not divide."""
    return -(-world_size // gpus_per_node)


def _validate_compute(cluster: Mapping) -> None:
    """The keys :class:`ComputeModel` uses: compute, device, mfu, step_time_s."""
    compute = cluster.get("compute", CLUSTER_DEFAULTS["compute"])
    if compute not in COMPUTE_MODES:
        raise ConfigError(f"cluster.compute={compute!r} is not allowed; allowed: {', '.join(COMPUTE_MODES)}")
    device = cluster.get("device", CLUSTER_DEFAULTS["device"])
    if device not in DEVICE_PEAK_FLOPS:
        raise ConfigError(f"cluster.device={device!r} is not allowed; allowed: {', '.join(DEVICE_PEAK_FLOPS)}")
    mfu = cluster.get("mfu", CLUSTER_DEFAULTS["mfu"])
    if not (_is_number(mfu) and 0 < mfu <= 1):
        raise ConfigError(f"cluster.mfu must be a number in (0, 1] (model FLOPs utilization), got {mfu!r}")
    step_time_s = cluster.get("step_time_s", CLUSTER_DEFAULTS["step_time_s"])
    if step_time_s is not None and not (_is_number(step_time_s) and step_time_s > 0):
        raise ConfigError(
            f"cluster.step_time_s must be null (count the step's FLOPs) or a number of seconds > 0, got {step_time_s!r}"
        )


def validate_cluster(cluster: Mapping, world_size: int) -> None:
    """Check a resolved ``cluster`` block (plain dict) for ``world_size`` workers.

    A missing key takes its :data:`CLUSTER_DEFAULTS` value; an unknown key is an error (a typo
    would otherwise be ignored silently). ``world_size`` need not be a multiple of
    ``gpus_per_node``: the last node is then partial (module docstring, "Nodes").

    Raises:
        ConfigError: the first invalid key (``cluster.<key>``) with its allowed values.
    """
    if not isinstance(cluster, Mapping):
        raise ConfigError(f"cluster must be a mapping with keys {', '.join(CLUSTER_DEFAULTS)}, got {cluster!r}")
    unknown = sorted(set(cluster) - set(CLUSTER_DEFAULTS))
    if unknown:
        raise ConfigError(f"cluster.{unknown[0]} is not a cluster key; allowed: {', '.join(CLUSTER_DEFAULTS)}")
    _validate_compute(cluster)
    resolve_speeds(cluster.get("speeds", CLUSTER_DEFAULTS["speeds"]), world_size)
    gpus = cluster.get("gpus_per_node", CLUSTER_DEFAULTS["gpus_per_node"])
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ConfigError(f"cluster.gpus_per_node must be an integer >= 1 (workers per node), got {gpus!r}")


def _rng_states() -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _set_rng_states(states: tuple[torch.Tensor, list[torch.Tensor] | None]) -> None:
    cpu, cuda = states
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


def count_step_flops(
    model: torch.nn.Module, x: Any, y: Any, loss_fn: Callable[[Any, Any], torch.Tensor],
    grad_ready: dict[str, float] | None = None,
) -> tuple[float, float]:
    """(forward FLOPs, backward FLOPs) of one training step on the batch ``(x, y)``.

    Counted with :class:`torch.utils.flop_counter.FlopCounterMode` (2 FLOPs per multiply-
    accumulate of every matmul, convolution and attention product), the forward
    ``loss_fn(model(x), y)`` and the ``loss.backward()`` in two separate counters. The step runs on
    a deep copy of ``model`` (same mode: train/eval, same device), so the model's parameters,
    buffers (BatchNorm running statistics), gradients and hooks are untouched; the global CPU and
    CUDA RNG states (dropout) are saved and restored. Costs one extra forward/backward and, for
    the copy, the model's memory once more.

    Args:
        model: a plain ``nn.Module`` (not a DDP wrapper: its backward would communicate).
        x, y: one local batch, already on the model's device.
        loss_fn: ``loss_fn(model(x), y)`` -> a scalar tensor.
        grad_ready: when given, filled with ``{parameter name: backward FLOPs done when its
            gradient is final}`` (read from the backward counter by a post-accumulate-grad hook on
            each parameter; names as ``model.named_parameters()``; parameters that get no gradient
            are left out). The gradient of a parameter used twice (tied weights) is final at its
            last accumulation.
    """
    rng = _rng_states()
    try:
        twin = copy.deepcopy(model)
        for p in twin.parameters():
            p.grad = None
        with FlopCounterMode(display=False) as forward:
            loss = loss_fn(twin(x), y)
        backward = FlopCounterMode(display=False)
        hooks = []
        if grad_ready is not None:
            def at_ready(name: str):
                def hook(_param) -> None:
                    grad_ready[name] = float(backward.get_total_flops())
                return hook

            hooks = [p.register_post_accumulate_grad_hook(at_ready(n)) for n, p in twin.named_parameters()
                     if p.requires_grad]
        try:
            with backward:
                loss.backward()
        finally:
            for h in hooks:
                h.remove()
        return float(forward.get_total_flops()), float(backward.get_total_flops())
    finally:
        _set_rng_states(rng)


@dataclass(frozen=True)
class StepTime:
    """Compute seconds of one local step (forward and backward, incl. the worker's speed)."""

    forward_s: float
    backward_s: float

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s

    def scaled(self, speed: float) -> StepTime:
        """The same step on a worker of relative speed ``speed``: each time divided by it."""
        return StepTime(self.forward_s / speed, self.backward_s / speed)


class ComputeModel:
    """Per-step compute seconds of one worker on the target cluster.

    Built from the resolved ``cluster`` config dict and this worker's relative speed (from
    :func:`resolve_speeds`).

    * ``profile`` mode: :meth:`calibrate` once on a real batch (step FLOPs /
      (``DEVICE_PEAK_FLOPS[device]`` x ``mfu``)), or ``cluster.step_time_s`` given directly (then
      split forward:backward 1:2, the usual backward ~ 2x forward; :meth:`calibrate` is a no-op).
      :meth:`step` then returns the same :class:`StepTime` (divided by speed) on every call,
      whatever measured times it is passed: deterministic, independent of this machine.
    * ``measured`` mode: ``step(measured_forward_s, measured_backward_s)`` returns the measured
      times divided by speed; :meth:`calibrate` is a no-op.

    The optimizer step and data loading are not modeled separately; in measured mode a caller
    that wants them on the clock folds them into ``measured_backward_s``.
    """

    def __init__(self, cluster: Mapping, speed: float = 1.0):
        _validate_compute(cluster)
        if not (_is_number(speed) and speed > 0):
            raise ValueError(f"speed must be a number > 0, got {speed!r}")

        def get(key: str) -> Any:
            return cluster.get(key, CLUSTER_DEFAULTS[key])

        self.mode: str = get("compute")
        self.device: str = get("device")
        self.mfu: float = float(get("mfu"))
        self.peak_flops: float = DEVICE_PEAK_FLOPS[self.device]
        self.speed: float = float(speed)
        step_time_s = get("step_time_s")
        self.step_time_s: float | None = None if step_time_s is None else float(step_time_s)
        self.forward_flops: float | None = None
        self.backward_flops: float | None = None
        #: {parameter name: fraction (0..1] of the backward pass's FLOPs done when its gradient is
        #: final}: when DDP's buckets are ready (:meth:`count_grad_ready`); None until counted
        self.grad_ready_fraction: dict[str, float] | None = None
        self._base: StepTime | None = None  # at speed 1.0 (profile mode)
        self._step: StepTime | None = None  # at this worker's speed (profile mode)
        if self.mode == "profile" and self.step_time_s is not None:
            forward_s = self.step_time_s * FORWARD_FRACTION
            self._set_base(StepTime(forward_s, self.step_time_s - forward_s))

    @property
    def source(self) -> str:
        """Where the step time comes from: ``measured``, ``step_time_s`` or ``flops``."""
        if self.mode == "measured":
            return "measured"
        return "step_time_s" if self.step_time_s is not None else "flops"

    @property
    def calibrated(self) -> bool:
        """Whether :meth:`step` can answer: always in measured mode or with ``step_time_s``."""
        return self.mode == "measured" or self._base is not None

    def _set_base(self, base: StepTime) -> None:
        self._base = base
        self._step = base.scaled(self.speed)

    def calibrate(self, model: torch.nn.Module, x: Any, y: Any, loss_fn: Callable[[Any, Any], torch.Tensor]) -> None:
        """Count the FLOPs of one step on ``(x, y)`` (:func:`count_step_flops`) and fix the profile.

        No-op in measured mode or when ``cluster.step_time_s`` is set. Calling it again recounts.
        """
        if self.source != "flops":
            return
        self.forward_flops, self.backward_flops = self._count(model, x, y, loss_fn)
        rate = self.peak_flops * self.mfu
        self._set_base(StepTime(self.forward_flops / rate, self.backward_flops / rate))

    def count_grad_ready(self, model: torch.nn.Module, x: Any, y: Any,
                         loss_fn: Callable[[Any, Any], torch.Tensor]) -> dict[str, float]:
        """Fill and return :attr:`grad_ready_fraction` from one counted step (:func:`count_step_flops`),
        in any mode (:meth:`calibrate` fills it too). Backward runs the layers in reverse, so the
        last layers' gradients are final early: the demo CNN's fc layers (94% of its parameters)
        after 7% of its backward FLOPs. Leaves the profile as it is."""
        self._count(model, x, y, loss_fn)
        return self.grad_ready_fraction

    def _count(self, model, x, y, loss_fn) -> tuple[float, float]:
        ready: dict[str, float] = {}
        forward, backward = count_step_flops(model, x, y, loss_fn, grad_ready=ready)
        self.grad_ready_fraction = {n: (f / backward if backward > 0 else 1.0) for n, f in ready.items()}
        return forward, backward

    def step(self, measured_forward_s: float | None = None, measured_backward_s: float | None = None) -> StepTime:
        """Compute time of one local step of this worker.

        Profile mode: the constant profile divided by the speed (the arguments are ignored).
        Measured mode: the measured seconds divided by the speed (both arguments required).

        Raises:
            RuntimeError: profile mode from FLOPs before :meth:`calibrate`.
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
        """Seconds of ``flops`` of extra compute on this worker (e.g. gradient compression):
        ``flops / (peak x mfu) / speed`` in profile mode; 0 in measured mode, whose measured step
        times already contain it."""
        if self.mode == "measured":
            return 0.0
        return float(flops) / (self.peak_flops * self.mfu) / self.speed

    @property
    def profile(self) -> dict:
        """JSON-ready summary for the run's ``summary.json``.

        Keys: ``mode``, ``source`` (flops | step_time_s | measured), ``device``, ``peak_flops``
        (FLOP/s), ``mfu``, ``forward_flops``, ``backward_flops`` (FLOPs; null unless counted),
        ``forward_s``, ``backward_s``, ``step_time_s`` (seconds at speed 1.0; null in measured mode
        or before calibration), ``speed`` and ``worker_step_time_s`` (``step_time_s / speed``).
        """
        profile_mode = self.mode == "profile"
        base = self._base if profile_mode else None
        return {
            "mode": self.mode,
            "source": self.source,
            "device": self.device if profile_mode else None,
            "peak_flops": self.peak_flops if profile_mode else None,
            "mfu": self.mfu if profile_mode else None,
            "forward_flops": self.forward_flops,
            "backward_flops": self.backward_flops,
            "forward_s": None if base is None else base.forward_s,
            "backward_s": None if base is None else base.backward_s,
            "step_time_s": None if base is None else base.total_s,
            "speed": self.speed,
            "worker_step_time_s": None if self._step is None else self._step.total_s,
        }
