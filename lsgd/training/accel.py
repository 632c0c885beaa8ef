"""The speed switches of a GPU run: mixed precision, channels_last, torch.compile, optimizer kernels.

All four are off by default (fp32, NCHW, eager, torch's default kernels), so a run that does not
ask for them computes what it always computed.

**Mixed precision** (``precision``: ``fp32`` | ``bf16`` | ``fp16``). Forward and loss run under
``torch.autocast(device_type, dtype)`` (cuda or cpu, from the run's device); parameters, gradients
and optimizer state stay float32 (the *master weights*: autocast casts copies of the weights per op,
Micikevicius et al. 2018, "Mixed Precision Training", Sec. 3.1), so every algorithm that averages
models, compresses gradients or keeps error feedback does it in float32, as before. Evaluation runs
in float32. ``fp16`` adds dynamic loss scaling with ``torch.amp.GradScaler`` (Micikevicius et al.
Sec. 3.2: scale the loss by S, unscale the gradients before the step, skip the step and halve S
when a gradient is inf/NaN, double S after ``grad_scaler.growth_interval`` clean steps). ``bf16``
needs no scaler (float32's exponent range).

What is communicated stays float32: the communicated dtype is a separate choice. For gradients it
is ``algo=compressed algo.compressor=fp16`` (fp16 or bf16, 2 bytes per element, counted as such),
which this module does not duplicate; for the local-SGD family's model averaging it is
``algo.comm_dtype`` (:mod:`lsgd.algorithms.averaging.local_sgd`: the change since the last round travels in
bf16 / fp16).

**A skipped step is skipped on every worker** (:class:`Precision.unscale_`). How torch does it:
under DDP the gradients are all-reduced inside backward, so an inf on one worker is an inf in every
worker's averaged gradient and each worker's own GradScaler reaches the same verdict without any
extra message (torch's AMP examples with DDP); FSDP's ``ShardedGradScaler`` all-reduces the
found-inf flag (``ReduceOp.MAX``) because each rank holds only a shard of the gradients; torchft's
LocalSGD/DiLoCo leave AMP to the user's inner loop. lsgd does the following, by the algorithm's
:attr:`lsgd.algorithms.base.Algorithm.grad_scaler`:

* ``synchronized`` (ddp): the gradients every worker unscales are already the all-reduced ones, so
  the verdict is the same on every worker; nothing extra is sent (as torch + DDP).
* ``flag`` (local_sgd, post_local_sgd, slowmo, diloco, demo): workers step on their own gradients, so the
  found-inf flag (one float32) is all-reduced with MAX at every step, before the optimizer step
  (counted: 4 bytes and one latency per step on the clock). Every worker then skips the same local
  steps and halves / grows its scale at the same steps, so the scales stay equal on all workers
  (not only at the averaging rounds) and a model average never mixes a worker that stepped with
  one that did not on the same batch count. The alternative (each worker skips alone, scales
  re-synchronized at each round) lets replicas drift by skipped steps between rounds; we judged a
  4-byte all-reduce per step (latency-bound, tens of microseconds on a cluster network) cheaper
  than explaining that drift in every comparison. DeMo, whose optimizer step holds its all-gathers,
  skips them on every worker together, and a skipped step leaves its momentum untouched (the inf
  gradient never enters it).
* None (every other algorithm): ``precision=fp16`` is refused (ConfigError). Compression with
  error feedback would have to keep its residual out of a skipped step (the residual of an inf
  gradient poisons every later step), gossip methods communicate inside their optimizer step, and
  server methods step on the server; none of them is built for a skipped step yet. ``bf16`` works
  with all of them.

The scaler handles overflow in the gradients only: a loss that is itself inf / NaN (an fp16
activation out of range in forward) counts as a non-finite training loss, and the run stops at the
next record with status ``diverged`` as at any precision.

The cluster clock's compute profile (:mod:`lsgd.compute.opcount`) counts a step's operators in float32
whatever ``precision`` (bytes at 4 per element, FLOPs at the device's mixed-precision peak), so
``modeled_time_s`` does not yet credit bf16 / fp16 with their halved memory traffic.

Where a step is skipped the learning-rate schedule still advances (torch's AMP recipe: the
scheduler steps every iteration), the batch is consumed and the algorithm's ``after_step`` runs
(rounds stay aligned across workers).

**channels_last** (``model.channels_last``, convnets): the model's 4-d parameters and every 4-d
input batch in ``torch.channels_last`` memory format (NHWC strides); cuDNN's tensor-core
convolutions run in NHWC (NVIDIA, "Deep Learning Performance: Tensor Layouts").

**compile** (``compile: true``): the training module (DDP's wrapper included: torch's DDPOptimizer
splits the graph at bucket boundaries) goes through ``torch.compile``. Inductor needs a C++
compiler on CPU and Triton on CUDA; where one is missing the run goes on eagerly with a warning
saying why (:func:`compile_problem`).

**Optimizer kernels** (:func:`optimizer_kernels`): on CUDA, ``fused=True`` for torch's SGD and
AdamW (one kernel for all parameters; torch's documentation of ``torch.optim``: "fused ... is
fastest"); on CPU torch's default (its for-loop), which the golden cases were recorded with.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil

import torch
from torch import nn

from lsgd.core.errors import ConfigError

log = logging.getLogger("lsgd")

#: ``precision`` values and their autocast dtypes (fp32: no autocast)
PRECISIONS = ("fp32", "bf16", "fp16")
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

#: ``grad_scaler.*`` keys and torch's defaults (torch.amp.GradScaler)
SCALER_DEFAULTS = {"init_scale": 2.0 ** 16, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}

#: how an algorithm agrees on a skipped step (module docstring)
SCALER_AGREEMENTS = ("synchronized", "flag")


def validate_precision(cfg: dict, device: str, algo_cls) -> None:
    """Check ``precision``, ``grad_scaler.*`` and ``compile`` for a run on ``device`` (cpu / cuda)
    with algorithm class ``algo_cls``.

    Raises:
        ConfigError: ``precision`` not one of fp32, bf16, fp16; a mixed precision with
            ``dtype=float64``; a precision this torch cannot autocast on the device (bf16 on a GPU
            without bf16, fp16 without a GradScaler for the device); fp16 with an algorithm that
            cannot skip a step on every worker (the allowed ones are named); a ``grad_scaler`` key
            out of range; ``compile`` not a boolean.
    """
    precision = cfg.get("precision", "fp32")
    if precision not in PRECISIONS:
        raise ConfigError(f"precision={precision!r} is not allowed; allowed: {', '.join(PRECISIONS)}")
    if not isinstance(cfg.get("compile", False), bool):
        raise ConfigError(f"compile={cfg.get('compile')!r} is not allowed; allowed: true, false")
    if precision == "fp32":
        return
    if (cfg.get("dtype") or "float32") != "float32":
        raise ConfigError(f"precision={precision} autocasts float32 master weights; dtype={cfg['dtype']} is not "
                          "allowed with it; allowed: dtype=float32 (or precision=fp32 with dtype=float64)")
    if not torch.amp.is_autocast_available(device):
        raise ConfigError(f"precision={precision}: this torch ({torch.__version__}) has no autocast on {device}; "
                          "allowed here: fp32")
    if precision == "bf16" and device == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError("precision=bf16 but this GPU has no bfloat16 support (before Ampere); allowed: fp32, fp16")
    if precision != "fp16":
        return
    try:
        torch.amp.GradScaler(device)
    except Exception as exc:  # an old torch without a CPU GradScaler
        raise ConfigError(f"precision=fp16 needs torch.amp.GradScaler on {device}, which this torch "
                          f"({torch.__version__}) lacks ({exc}); allowed here: fp32, bf16") from None
    if getattr(algo_cls, "grad_scaler", None) not in SCALER_AGREEMENTS:
        from lsgd.algorithms import ALGORITHMS

        ok = sorted(n for n, c in ALGORITHMS.items() if getattr(c, "grad_scaler", None) in SCALER_AGREEMENTS)
        raise ConfigError(f"precision=fp16 is not supported with algo.name={algo_cls.name} (its steps cannot be "
                          f"skipped on every worker after a gradient overflow); algo.name allowed with fp16: "
                          f"{', '.join(ok)}; or precision=bf16 (no loss scaling) with any algorithm")
    scaler = cfg.get("grad_scaler") or {}
    unknown = sorted(set(scaler) - set(SCALER_DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown key(s) grad_scaler.{', grad_scaler.'.join(unknown)}; allowed: "
                          f"{', '.join(SCALER_DEFAULTS)}")
    values = {**SCALER_DEFAULTS, **{k: v for k, v in scaler.items() if v is not None}}
    checks = {"init_scale": lambda v: v > 0, "growth_factor": lambda v: v > 1,
              "backoff_factor": lambda v: 0 < v < 1, "growth_interval": lambda v: isinstance(v, int) and v >= 1}
    ranges = {"init_scale": "> 0", "growth_factor": "> 1", "backoff_factor": "in (0, 1)",
              "growth_interval": "an integer >= 1"}
    for key, ok in checks.items():
        v = values[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not ok(v):
            raise ConfigError(f"grad_scaler.{key} must be {ranges[key]}, got {v!r}")


class Precision:
    """Autocast and (fp16) a GradScaler whose skip verdict every worker shares.

    Args:
        precision: ``fp32``, ``bf16`` or ``fp16``.
        device: the run's device (autocast's ``device_type`` is its type).
        comm: the worker's :class:`lsgd.comm.communicator.Communicator` (the found-inf all-reduce), or None.
        agreement: ``synchronized`` or ``flag`` (module docstring); None with fp32 / bf16.
        scaler: ``grad_scaler.*`` keys (:data:`SCALER_DEFAULTS` for those missing).
    """

    def __init__(self, precision: str = "fp32", device: torch.device | str = "cpu", comm=None,
                 agreement: str | None = None, scaler: dict | None = None):
        self.precision = precision
        self.device = torch.device(device)
        self.dtype = AUTOCAST_DTYPES.get(precision)
        self.comm = comm
        self.agreement = agreement
        self.scaler = None
        self.skipped = 0  # optimizer steps skipped after an overflow (the same count on every worker)
        if precision == "fp16":
            args = {**SCALER_DEFAULTS, **{k: v for k, v in (scaler or {}).items() if v is not None}}
            self.scaler = torch.amp.GradScaler(self.device.type, **args)

    @classmethod
    def from_config(cls, cfg: dict, device: torch.device, comm, algo_cls) -> Precision:
        return cls(cfg.get("precision", "fp32"), device, comm, getattr(algo_cls, "grad_scaler", None),
                   cfg.get("grad_scaler"))

    def autocast(self):
        """The context of forward and loss: ``torch.autocast`` at bf16 / fp16, nothing at fp32."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, of the loss times the scale S under fp16 (gradients are S times
        the true ones until :meth:`unscale_`)."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> bool:
        """Divide the gradients by S (fp16) and return whether the step must be skipped: True
        when some worker's gradients hold an inf or NaN, the same answer on every worker (module
        docstring: ``flag`` all-reduces the found-inf flag with MAX, counted; ``synchronized``
        gradients need nothing). False at fp32 / bf16. Call after backward, before the algorithm's
        gradient hooks, once per step, then :meth:`update` after the (possibly skipped) step.

        One device-to-host read per step (the verdict decides whether the step runs, as in
        ``GradScaler.step``)."""
        if self.scaler is None:
            return False
        self.scaler.unscale_(optimizer)
        # GradScaler keeps the verdict per device in its per-optimizer state; update() reads it
        # back from there, so the agreed flag is written into it (as FSDP's ShardedGradScaler does)
        infs = self.scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
        flag = torch.zeros(1, dtype=torch.float32, device=self.device)
        for t in infs.values():
            flag = torch.maximum(flag, t.reshape(1).to(self.device, torch.float32))
        if self.agreement == "flag" and self.comm is not None and self.comm.world_size > 1:
            self.comm.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        for t in infs.values():
            t.copy_(flag.reshape(t.shape).to(t.device, t.dtype))
        skip = bool(flag.item())
        self.skipped += skip
        return skip

    def update(self) -> None:
        """After the step: halve S if this step was skipped, double it after ``growth_interval``
        clean steps in a row (GradScaler.update; the same on every worker, as the verdicts are)."""
        if self.scaler is not None:
            self.scaler.update()

    @property
    def scale(self) -> float | None:
        """The current loss scale S (None without a scaler)."""
        return float(self.scaler.get_scale()) if self.scaler is not None else None

    def metrics(self) -> dict:
        """Keys of a metrics record: ``grad_scale`` (S now) and ``skipped_steps`` (cumulative) at
        fp16; none otherwise."""
        if self.scaler is None:
            return {}
        return {"grad_scale": self.scale, "skipped_steps": self.skipped}

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict(), "skipped": self.skipped} if self.scaler is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state["scaler"])
            self.skipped = int(state.get("skipped", 0))


# --------------------------------------------------------------------------------------------
# channels_last
# --------------------------------------------------------------------------------------------
def to_channels_last(model: nn.Module) -> nn.Module:
    """``model`` with its 4-d parameters and buffers in ``torch.channels_last`` (in place; returned)."""
    return model.to(memory_format=torch.channels_last)


def batch_to_channels_last(x: torch.Tensor) -> torch.Tensor:
    """A 4-d (N, C, H, W) batch in channels_last strides (same values and shape); others unchanged."""
    return x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x


# --------------------------------------------------------------------------------------------
# compile
# --------------------------------------------------------------------------------------------
def compile_problem(device: torch.device | str) -> str | None:
    """Why ``torch.compile``'s default backend (Inductor) cannot compile on ``device`` here, or
    None when it can: dynamo unsupported on this Python, no C++ compiler (CPU code generation;
    ``CXX`` or g++ / c++ / clang++ on PATH), no Triton (CUDA kernels)."""
    import torch._dynamo

    if not torch._dynamo.is_dynamo_supported():
        return "torch.compile does not support this Python version"
    if torch.device(device).type == "cuda":
        if importlib.util.find_spec("triton") is None:
            return "Triton is not installed (Inductor generates CUDA kernels with it)"
        return None
    if not any(shutil.which(c) for c in filter(None, (os.environ.get("CXX"), "g++", "c++", "clang++"))):
        return "no C++ compiler on PATH (Inductor compiles CPU kernels with one; set CXX or install g++)"
    return None


def compile_module(module: nn.Module, device: torch.device | str, backend: str = "inductor") -> nn.Module:
    """``torch.compile(module, backend=backend)``, or ``module`` itself with a warning naming the
    reason when :func:`compile_problem` finds one (only for the default Inductor backend).
    Compilation happens at the first forward (tens of seconds on a small CPU; minutes for a large
    model on a GPU)."""
    problem = compile_problem(device) if backend == "inductor" else None
    if problem is not None:
        log.warning("compile=true but %s: training runs eagerly (uncompiled)", problem)
        return module
    return torch.compile(module, backend=backend)


# --------------------------------------------------------------------------------------------
# optimizer kernels
# --------------------------------------------------------------------------------------------
#: optimizers (``optim.name``) that take torch's ``fused`` / ``foreach`` arguments
TORCH_OPTIMIZERS = ("sgd", "adamw")


def optimizer_kernels(name: str, device: torch.device | str) -> dict:
    """Keyword arguments choosing the kernels of torch optimizer ``name`` on ``device``:
    ``{"fused": True}`` for sgd and adamw on CUDA (one fused kernel per step), ``{}`` elsewhere
    (torch's default: for-loop on CPU, which the golden cases were recorded with; timm's LAMB has
    no such switch)."""
    if torch.device(device).type == "cuda" and name in TORCH_OPTIMIZERS:
        return {"fused": True}
    return {}


# --------------------------------------------------------------------------------------------
# step time on a GPU without a host sync per step
# --------------------------------------------------------------------------------------------
class CudaStepTimes:
    """GPU seconds of training steps from CUDA events (``torch.cuda.Event(enable_timing=True)``),
    read back only when asked: a step records two events on the current stream and never waits for
    them (CUDA C++ Programming Guide, "Events": ``cudaEventElapsedTime`` of two recorded events).

    A step's time is the stream's time from its first to its last kernel, waits included: under
    NCCL the compute stream waits for DDP's last all-reduce bucket at the end of backward, so that
    wait counts as the step's time, as a ``torch.cuda.synchronize`` around the step would count it.
    """

    #: pending steps kept before completed ones are folded in without a wait
    FOLD_EVERY = 256

    def __init__(self):
        self.pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def start(self) -> torch.cuda.Event:
        """Record and return a step's start event."""
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def stop(self, start: torch.cuda.Event) -> float:
        """Record the step's end event; returns the seconds of steps already complete that were
        folded in (0.0 unless :data:`FOLD_EVERY` steps are pending; no wait either way)."""
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self.pending.append((start, end))
        return self._fold(wait=False) if len(self.pending) >= self.FOLD_EVERY else 0.0

    def settle(self) -> float:
        """Seconds of all pending steps (waits for the last one's end: a host sync, at a record)."""
        return self._fold(wait=True)

    def _fold(self, wait: bool) -> float:
        if wait and self.pending:
            self.pending[-1][1].synchronize()
        seconds = 0.0
        while self.pending and (wait or self.pending[0][1].query()):
            start, end = self.pending.pop(0)
            seconds += start.elapsed_time(end) / 1e3  # elapsed_time: milliseconds
        return seconds
