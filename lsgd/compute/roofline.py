"""The roofline: a device's figures (:class:`DeviceSpec`) and the price of counted operators on it
(:class:`Roofline`, :class:`PhaseTime`).

A phase (forward, backward, optimizer) of counted operators (:class:`lsgd.compute.opcount.Op`)
takes, at speed 1.0 (:class:`Roofline`)::

    sum over its ops of  max(FLOPs / (peak x mfu), bytes / memory bandwidth) + kernels x launch_s

the roofline of Williams, Waterman and Patterson (CACM 2009) per operator, plus the fixed cost of
launching each kernel, so that a small model is launch-bound (the demo CNN on an a100: 0.21 ms
per step, 36 kernels, where its FLOPs alone gave 4.5 us) and a big one compute-bound (where the
roofline reduces to the old FLOPs / (peak x mfu)).

On ``cpu`` an op that evaluates a transcendental function per element
(:data:`lsgd.compute.opcount.SPECIAL_OPS`: softmax, GELU, exp, tanh) adds elements /
``special_rate`` (a measured ``exp`` rate) to its compute term; a matmul
(:data:`lsgd.compute.opcount.GEMM_OPS`: mm, addmm, bmm, baddbmm) runs at the measured rate of its
shape, the matmul curve interpolated (log-log) at its smallest GEMM dimension
(:meth:`DeviceSpec.matmul_rate`: GPT-tiny's 64-wide head runs well below the square rate); and
every fresh output of at least :data:`lsgd.compute.opcount.FRESH_ALLOCATION_BYTES` (32 MiB) adds
its bytes / ``first_touch_bandwidth``: glibc maps such blocks fresh on every allocation, and the
kernel's page faults (zeroing each page) cost more than the op's own write (GPT-tiny's 268 MB
logits, their log-softmax and both gradients: four per step). A convolution
(:data:`lsgd.compute.opcount.CONV_OPS`) runs at the measured rate of oneDNN's convolutions, the
conv curve interpolated at its GEMM's smallest dimension (:meth:`DeviceSpec.conv_rate`,
:func:`lsgd.compute.opcount.conv_min_dim`: PyTorch runs CPU convolutions with oneDNN, not with
the GEMM library of ``torch.mm``, at up to twice the square matmul rate here); batch-norm's
training forward and max-pooling (:data:`lsgd.compute.opcount.ELEMENT_RATE_OPS`) take at least
their elements / their measured rate (their CPU kernels are neither matmuls nor copy-speed
streams); and batch-norm's backward counts the second pass its CPU kernel makes over its inputs
(:data:`lsgd.compute.opcount.CPU_EXTRA_BYTES`). None of these terms exists on a GPU preset
(:class:`DeviceSpec`, ``matmul_curve``, ``first_touch_bandwidth``, ``conv_curve`` and
``element_rates``, says why). The figures of each device: :mod:`lsgd.compute.presets` (the GPU
presets) and :mod:`lsgd.compute.calibration` (``cpu``).

``mfu``: the roofline's "peak x efficiency". The key keeps its name and, on the GPU presets, its
old default 0.4 (configs that set it keep working, and a compute-bound model keeps its step
time), but it now means the efficiency of a compute-bound kernel, not of the whole step; the
step's model FLOPs utilization is an output (``profile["achieved_mfu"]``). On ``cpu`` its
default is 1.0: the peak there is already a measured matmul rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lsgd.compute.opcount import Op


@dataclass(frozen=True)
class DeviceSpec:
    """The roofline figures of one device.

    Attributes:
        name: a key of :data:`lsgd.compute.presets.DEVICES`.
        peak_flops: FLOP/s (dense FP16/BF16 tensor-core peak; ``cpu``: a measured float32 matmul).
        memory_bandwidth: bytes/s (datasheet; ``cpu``: a measured large copy, read + write).
        launch_s: seconds of fixed cost per kernel (GPU:
            :data:`lsgd.compute.presets.GPU_LAUNCH_OVERHEAD_S`; ``cpu``: the measured cost per op of a
            tiny model's training step, PyTorch's per-op eager cost).
        special_rate: elements/s of a transcendental function (``cpu``: measured ``torch.exp``);
            None (GPU presets): not modeled, as a GPU's special-function units keep such
            elementwise ops memory-bound.
        matmul_curve: the matmul shape-efficiency curve, ``((k, FLOP/s), ...)`` sorted by k > 0:
            the FLOP/s of a float32 matmul whose smallest dimension is k (``cpu``: measured by
            :func:`lsgd.compute.calibration.calibrate_cpu` at
            :data:`lsgd.compute.calibration.MATMUL_CURVE_K`); None (GPU presets, an old calibration
            file): every matmul at ``peak_flops`` (:meth:`matmul_rate`).
        first_touch_bandwidth: bytes/s of the page faults of a fresh large allocation (``cpu``:
            measured by :func:`lsgd.compute.calibration.calibrate_cpu`), paid by every op output of
            at least :data:`lsgd.compute.opcount.FRESH_ALLOCATION_BYTES` on top of its roofline
            (:attr:`Op.fresh_bytes`); None (GPU presets, an old calibration file): not priced. Why
            only on ``cpu``: PyTorch's CPU allocator hands a large tensor to glibc's ``malloc``,
            which serves any block above its mmap threshold with a fresh ``mmap`` and unmaps it on
            free (``mallopt(3)``, ``M_MMAP_THRESHOLD``), so the kernel faults in and zeroes every
            page of such an output on its first write, every step (measured on this AMD EPYC:
            about 2 GB/s against 15-30 GB/s for a write to memory already mapped); the CUDA
            caching allocator keeps freed blocks and reuses them the next step, so on a GPU a step
            allocates nothing new after the first.
        conv_curve: the convolution curve, ``((c, FLOP/s), ...)`` sorted by c > 0: the FLOP/s of
            a float32 convolution (forward and backward together) whose GEMM's smallest
            dimension is c (``cpu``: measured by :func:`lsgd.compute.calibration.calibrate_cpu` on
            3 x 3 convolutions of c -> c channels, :data:`lsgd.compute.calibration.CONV_CURVE_C`);
            None (GPU presets, an old calibration file): convolutions at ``peak_flops``
            (:meth:`conv_rate`). Why a curve of its own: PyTorch runs a CPU convolution with
            oneDNN's direct-convolution kernels (``mkldnn_convolution``), not with the GEMM library
            of ``torch.mm`` (MKL), and they reach a different rate: on this AMD EPYC about 150-220
            GFLOP/s for 16-128 channels against about 100 for a 1024 x 1024 ``torch.mm``, and well
            under it below 16 output channels (an AVX-512 register holds 16 of them). Not on the
            GPU presets for the reason :meth:`matmul_rate` gives: they are datasheet peaks, and
            cuDNN's per-shape rates would have to be measured on the device.
        element_rates: ``{rate key: elements/s}`` for the ops of
            :data:`lsgd.compute.opcount.ELEMENT_RATE_OPS` (``cpu``: measured by
            :func:`lsgd.compute.calibration.calibrate_cpu`): ops whose CPU kernel is neither a matmul
            nor a copy-speed stream, so that neither roofline term sees their time (batch-norm's
            training forward computes its statistics at about 0.8 G elements/s, max-pooling
            about 0.25 G window elements/s, both 5-10x slower than their bytes at the copy
            bandwidth); their compute term is at least elements / rate. None (GPU presets, whose
            kernels for these ops are other code, or an old calibration file): not priced so.
        info: where the figures come from (``cpu``: the calibration record).
    """

    name: str
    peak_flops: float
    memory_bandwidth: float
    launch_s: float
    special_rate: float | None = None
    matmul_curve: tuple[tuple[float, float], ...] | None = None
    first_touch_bandwidth: float | None = None
    conv_curve: tuple[tuple[float, float], ...] | None = None
    element_rates: Mapping[str, float] | None = None
    info: dict | None = None

    @property
    def is_gpu(self) -> bool:
        return self.name != "cpu"

    def matmul_rate(self, min_dim: float = 0) -> float:
        """FLOP/s of a matmul-family op whose GEMM's smallest dimension is ``min_dim`` (0: not a
        matmul, or unknown): ``peak_flops`` without a :attr:`matmul_curve` or for ``min_dim`` 0;
        else the curve interpolated linearly in (log k, log rate), i.e. a power law between
        neighbouring grid points, and held constant outside the grid (the first point's rate below
        it, the last point's above it).

        Why only on ``cpu``: a CPU's GEMM (oneDNN / OpenBLAS micro-kernels) blocks the inner
        dimension k into register tiles and streams the M x N output through the caches once per
        k-block, so a thin k (the GPT head's 64) spends its time writing output, not multiplying
        (measured: about a third of the square rate on this AMD EPYC at k = 64). A GPU's tensor
        cores have the same kind of cliff (one MMA instruction covers 16 x 8 x 16 on A100, PTX
        ``mma.m16n8k16``, and 64 x N x 16 on Hopper, ``wgmma``; GEMM thread-block tiles are 64-256
        wide: a dimension below the tile wastes the rest of it), but the GPU presets
        here are datasheet peaks, and no published per-shape efficiency of these parts was found
        to cite; their ``mfu`` (0.4) already stands for an average efficiency. A GPU curve would
        have to be measured on the device, as ``lsgd calibrate`` does for ``cpu``.
        """
        return _interpolate(self.matmul_curve, min_dim, self.peak_flops)

    def conv_rate(self, min_dim: float = 0) -> float:
        """FLOP/s of a convolution (forward or backward) whose GEMM's smallest dimension is
        ``min_dim`` (:func:`lsgd.compute.opcount.conv_min_dim`): :attr:`conv_curve` interpolated as
        :meth:`matmul_rate` interpolates its curve; ``peak_flops`` without a curve or for
        ``min_dim`` 0."""
        return _interpolate(self.conv_curve, min_dim, self.peak_flops)


def _interpolate(curve: Sequence[tuple[float, float]] | None, x: float, default: float) -> float:
    """``curve`` (``((x, rate), ...)`` sorted by x) at ``x``: linear in (log x, log rate) between
    neighbouring points, an end point's rate outside them, ``default`` without a curve or x <= 0."""
    if not curve or not x or x <= 0:
        return default
    if x <= curve[0][0]:
        return curve[0][1]
    if x >= curve[-1][0]:
        return curve[-1][1]
    for k, rate in curve:
        if x == k:  # a grid point: its measured rate, exactly
            return rate
    for (k0, r0), (k1, r1) in zip(curve, curve[1:]):
        if k0 < x < k1:
            w = math.log(x / k0) / math.log(k1 / k0)
            return math.exp((1.0 - w) * math.log(r0) + w * math.log(r1))
    return curve[-1][1]  # unreachable: the grid is sorted



@dataclass(frozen=True)
class PhaseTime:
    """Priced operators of one phase (:meth:`Roofline.price`); times in seconds, at speed 1.0.

    Attributes:
        seconds: sum over ops of max(compute_s, memory_s) + launches x launch_s.
        flops, matmul_flops, bytes, launches: totals of the ops.
        compute_bound_s, memory_bound_s, launch_s, first_touch_s: ``seconds`` split by what
            bounds each op (its FLOPs, its bytes), the launch overheads and the page faults of
            fresh large outputs (:attr:`Op.fresh_bytes`; 0 on a device without
            ``first_touch_bandwidth``).
    """

    seconds: float = 0.0
    flops: float = 0.0
    matmul_flops: float = 0.0
    bytes: float = 0.0
    launches: int = 0
    compute_bound_s: float = 0.0
    memory_bound_s: float = 0.0
    launch_s: float = 0.0
    first_touch_s: float = 0.0


@dataclass(frozen=True)
class Roofline:
    """Prices operators on one device: ``max(FLOPs / (rate x efficiency), bytes / bandwidth) +
    launches x launch overhead`` per op (Williams, Waterman and Patterson, "Roofline: an
    insightful visual performance model", CACM 2009, for the max; the launch term for the fixed
    cost of each kernel). ``rate``: the peak, or for a matmul on a device with a matmul curve the
    curve's rate at the op's smallest GEMM dimension (:meth:`DeviceSpec.matmul_rate`). On a device
    with a ``first_touch_bandwidth`` (``cpu``) an op's fresh large outputs add
    ``fresh_bytes / first_touch_bandwidth`` (page faults, serial with the op's own work).

    Attributes:
        spec: the device figures.
        efficiency: the fraction of ``spec.peak_flops`` a compute-bound kernel reaches (``cluster.mfu``).
    """

    spec: DeviceSpec
    efficiency: float

    @property
    def flops_rate(self) -> float:
        return self.spec.peak_flops * self.efficiency

    def compute_seconds(self, flops: float, special: float = 0.0, min_dim: float = 0, conv_dim: float = 0,
                        rate_key: str = "", rate_elements: float = 0.0) -> float:
        """The compute term: ``flops / (rate x efficiency)``, rate = the device's
        :meth:`DeviceSpec.conv_rate` at ``conv_dim`` for a convolution, else its
        :meth:`DeviceSpec.matmul_rate` at ``min_dim`` (the peak for 0, a non-matmul op, or a
        device without the curve); at least ``rate_elements / element_rates[rate_key]`` on a
        device that measured that rate (:data:`lsgd.compute.opcount.ELEMENT_RATE_OPS`); plus ``special /
        special_rate`` (transcendental evaluations) on a device that has a ``special_rate``."""
        if conv_dim:
            rate = self.spec.conv_rate(conv_dim)
        else:
            rate = self.spec.matmul_rate(min_dim) if min_dim else self.spec.peak_flops
        t = flops / (rate * self.efficiency)
        if rate_key and rate_elements and self.spec.element_rates and self.spec.element_rates.get(rate_key):
            t = max(t, rate_elements / self.spec.element_rates[rate_key])
        if special and self.spec.special_rate:
            t += special / self.spec.special_rate
        return t

    def op_compute_seconds(self, op: Op) -> float:
        """:meth:`compute_seconds` of a counted :class:`Op`."""
        return self.compute_seconds(op.flops, op.special, op.min_dim, op.conv_dim, op.rate_key, op.rate_elements)

    def op_seconds(self, flops: float, nbytes: float, launches: int = 1, special: float = 0.0,
                   min_dim: float = 0, fresh_bytes: float = 0.0) -> float:
        """Seconds of one op: ``max(compute term, nbytes / bandwidth) + launches x launch_s``
        (compute term: ``flops / (rate x efficiency)``, :meth:`compute_seconds`), plus
        ``fresh_bytes / first_touch_bandwidth`` on a device that has one."""
        t = (max(self.compute_seconds(flops, special, min_dim), nbytes / self.spec.memory_bandwidth)
             + launches * self.spec.launch_s)
        if fresh_bytes and self.spec.first_touch_bandwidth:
            t += fresh_bytes / self.spec.first_touch_bandwidth
        return t

    def price_op(self, op: Op) -> float:
        """Seconds of one counted :class:`Op` (its share of :meth:`price`)."""
        t = max(self.op_compute_seconds(op), op.bytes / self.spec.memory_bandwidth) + op.launches * self.spec.launch_s
        if op.fresh_bytes and self.spec.first_touch_bandwidth:
            t += op.fresh_bytes / self.spec.first_touch_bandwidth
        return t

    def price(self, ops: Sequence[Op]) -> PhaseTime:
        """The :class:`PhaseTime` of ``ops``."""
        compute = memory = launch = flops = matmul = nbytes = touch = 0.0
        launches = 0
        touch_bw = self.spec.first_touch_bandwidth
        for op in ops:
            c, m = self.op_compute_seconds(op), op.bytes / self.spec.memory_bandwidth
            if c >= m:
                compute += c
            else:
                memory += m
            launch += op.launches * self.spec.launch_s
            if touch_bw and op.fresh_bytes:
                touch += op.fresh_bytes / touch_bw
            flops += op.flops
            matmul += op.matmul_flops
            nbytes += op.bytes
            launches += op.launches
        return PhaseTime(compute + memory + launch + touch, flops, matmul, nbytes, launches, compute, memory, launch,
                         touch)

