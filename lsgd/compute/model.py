"""The compute model of the cluster clock: how long one local step takes on the target cluster.

Every worker carries a virtual clock (``modeled_time_s``, see ``lsgd.clock.network``). Its communication
advances by the alpha-beta cost of each collective; its compute advances, once per local step, by
the :class:`StepTime` that :class:`ComputeModel` returns here. This module models compute only,
from the ``cluster:`` config block:

=================  ==========================================================================
key                meaning
=================  ==========================================================================
``compute``        ``profile`` (deterministic, independent of this machine) or ``measured``
``device``         target device, one of :data:`DEVICES`: a GPU preset or ``cpu`` (this machine)
``mfu``            fraction of the peak FLOP/s a compute-bound kernel reaches, in (0, 1]; null:
                   the device's :data:`DEFAULT_EFFICIENCY` (0.4 on a GPU, 1.0 on ``cpu``)
``step_time_s``    compute seconds per local step at speed 1.0 (profile mode; overrides the count)
``speeds``         one relative speed per worker, or a preset of :data:`HETEROGENEITY`
``gpus_per_node``  workers per node (intra-node link inside a node, inter-node link between)
``stretch``        make each worker's modeled speed real in wall time (profile mode; below)
``time_scale``     wall seconds per modeled compute second of the stretch (> 0)
=================  ==========================================================================

Units: time in seconds (s), work in floating-point operations (FLOPs), rates in FLOP/s, memory
traffic in bytes and bytes/s.

Profile mode: a roofline per operator plus a launch cost per kernel
-------------------------------------------------------------------
One training step is counted once (:meth:`ComputeModel.calibrate`, on the first batch, on a deep
copy of the model and of the optimizer: :func:`count_step`) with a ``TorchDispatchMode``
(:class:`OpCounter`) that sees every aten operator the step runs: the forward, the backward and
the real optimizer's ``step()``, each separately. Views and aliasing ops (``view``, ``t``,
``expand``, ``detach``, ``as_strided``, ``_unsafe_view``, any op whose output aliases an input
without writing it), allocations and metadata ops launch no kernel and are skipped. For every
other op (:class:`Op`):

* FLOPs: matmul-family ops (``mm``, ``addmm``, ``bmm``, convolutions, attention) from
  ``torch.utils.flop_counter.flop_registry``, 2 per multiply-accumulate, the counts of
  ``FlopCounterMode``; any other op one FLOP per element of its largest operand (elementwise ops,
  reductions, copies: a crude count that hardly matters, as such ops are memory-bound);
* bytes: every input tensor read plus every output written (elements x element size, at the
  dtype the step really runs in on this machine: float32 by default, so a mixed-precision step on
  the device moves up to 2x less than counted);
* kernels: 1 (a CUDA ``_foreach_`` optimizer op: the launches of torch's multi_tensor_apply).

and a phase (forward, backward, optimizer) takes, at speed 1.0 (:class:`Roofline`)::

    sum over its ops of  max(FLOPs / (peak x mfu), bytes / memory bandwidth) + kernels x launch_s

the roofline of Williams, Waterman and Patterson (CACM 2009) per operator, plus the fixed cost of
launching each kernel, so that a small model is launch-bound (the demo CNN on an a100: 0.21 ms
per step, 36 kernels, where its FLOPs alone gave 4.5 us) and a big one compute-bound (where the
roofline reduces to the old FLOPs / (peak x mfu)). The optimizer's step is on the clock too
(the trainer charges it whenever the optimizer steps). On a GPU preset the twin optimizer runs
torch's ``foreach`` kernels, torch's default on CUDA; on ``cpu`` its default for-loop. On ``cpu``
an op that evaluates a transcendental function per element (:data:`SPECIAL_OPS`: softmax, GELU,
exp, tanh) adds elements / ``special_rate`` (a measured ``exp`` rate) to its compute term; a
matmul (:data:`GEMM_OPS`: mm, addmm, bmm, baddbmm) runs at the measured rate of its shape, the
matmul curve interpolated (log-log) at its smallest GEMM dimension
(:meth:`DeviceSpec.matmul_rate`: GPT-tiny's 64-wide head runs well below the square rate); and
every fresh output of at least :data:`FRESH_ALLOCATION_BYTES` (32 MiB) adds its bytes /
``first_touch_bandwidth``: glibc maps such blocks fresh on every allocation, and the kernel's
page faults (zeroing each page) cost more than the op's own write (GPT-tiny's 268 MB logits,
their log-softmax and both gradients: four per step). A convolution (:data:`CONV_OPS`) runs at
the measured rate of oneDNN's convolutions, the conv curve interpolated at its GEMM's smallest
dimension (:meth:`DeviceSpec.conv_rate`, :func:`conv_min_dim`: PyTorch runs CPU convolutions
with oneDNN, not with the GEMM library of ``torch.mm``, at up to twice the square matmul rate
here); batch-norm's training forward and max-pooling (:data:`ELEMENT_RATE_OPS`) take at least
their elements / their measured rate (their CPU kernels are neither matmuls nor copy-speed
streams); and batch-norm's backward counts the second pass its CPU kernel makes over its inputs
(:data:`CPU_EXTRA_BYTES`). None of these terms exists on a GPU preset (:class:`DeviceSpec`,
``matmul_curve``, ``first_touch_bandwidth``, ``conv_curve`` and ``element_rates``, says why).

``mfu``: the roofline's "peak x efficiency". The key keeps its name and, on the GPU presets, its
old default 0.4 (configs that set it keep working, and a compute-bound model keeps its step
time), but it now means the efficiency of a compute-bound kernel, not of the whole step; the
step's model FLOPs utilization is an output (``profile["achieved_mfu"]``). On ``cpu`` its
default is 1.0: the peak there is already a measured matmul rate.

The backward's matmul FLOPs also time DDP's buckets: :attr:`ComputeModel.grad_ready_fraction`
(the fraction of backward FLOPs done when each parameter's gradient is final).

With ``cluster.step_time_s`` set nothing is counted and the step time is given directly, split
forward:backward = 1:2 (the backward of a matmul layer computes two products, the input gradient
and the weight gradient, for the forward's one), optimizer 0.

Either way the profile is a constant: every call of :meth:`ComputeModel.step` returns the same
:class:`StepTime` (divided by the worker's speed), so ``modeled_time_s`` is deterministic and
does not depend on the machine the experiment runs on (``cpu``: it depends on the calibration
file, :func:`cpu_profile_path`, i.e. on the machine that measured it).

Compression compute: :meth:`ComputeModel.seconds` prices PowerSGD's matmul FLOPs at peak x mfu;
:meth:`ComputeModel.counted_seconds` counts any other work (a compressor's compensate, compress,
decompress, update) live under :class:`OpCounter` and prices it on the same roofline; the
``compressed`` algorithm caches the price per tensor (:meth:`Compressed.compress_bucket`).

The ``cpu`` preset and ``lsgd calibrate``
-----------------------------------------
``lsgd calibrate [--threads N]`` (:func:`calibrate_cpu`) measures this machine with torch's
thread count: a 1024 x 1024 float32 matmul (FLOP/s), the matmul curve (``(4096 x k) @ (k x
4096)`` at k = 4, 16, 64, 256, :data:`MATMUL_CURVE_K`, then the square point at k = 1024), the
convolution curve (3 x 3 convolutions c -> c, forward and backward, c = 4, 16, 64,
:data:`CONV_CURVE_C`), a 64 MiB copy (bytes/s), the page faults of a fresh 64 MiB allocation
(first-touch bytes/s), ``torch.exp`` on 16 MiB (elements/s), batch-norm's training forward and
a 2 x 2 max-pool on 1 MiB (elements/s) and a tiny model's whole training step (seconds per op:
PyTorch's per-op eager cost, the CPU's launch overhead), each kernel as the median CPU time of
the calling thread over its repeats (:func:`_cpu_seconds`; about 5 s in all), and stores them per thread count in
``$XDG_CACHE_HOME/lsgd/cpu.json`` (atomically). ``cluster.device=cpu`` reads the record for the
workers' thread count; when it is missing a local launch measures it once before the workers
start (and says so), a torchrun/SLURM launch stops with a ConfigError (its tasks would each
measure different figures). A ``cpu`` profile depends on the machine, its load and the thread
count: it is for holding the model against ``compute=measured`` on the same machine.

Held against measured time (``scripts/bench_compute_model.py``) on an AMD EPYC (Zen 4, 2 cores
shared with other jobs), torch 2.14.1, 1 thread, batch 32, SGD with momentum and weight decay,
3 interleaved rounds of calibration and measurement. A step is timed as the calibration times its
kernels, the median of its repeats in CPU time of the thread (with one torch thread the whole
step runs on it); "ratio" is the least profile over the rounds / the least of the rounds' median
steps, "least" the ratio to the least single step, "w/o" the same rounds priced without the conv
curve and the element rates (convolutions at the square matmul rate, batch-norm and max-pool on
the plain roofline). Load average 9-11 during the run (00:37 UTC):

=========  =================  ===========  =====================  ========  ============  =====  ====
model      ops fwd/bwd/opt    profile ms   measured ms cpu; wall  ratio     round range   least  w/o
=========  =================  ===========  =====================  ========  ============  =====  ====
cnn        15 / 18 / 40       8.02         8.52; 18.3             0.94      0.91-0.94     0.99   0.80
logreg     3 / 5 / 8          0.10         0.12; 0.12             0.86      0.85-0.90     0.92   0.86
gpt-tiny   28 / 48 / 112      854          970; 1522              0.88      0.87-0.98     0.94   0.88
resnet20   91 / 79 / 236      59.1         66.6; 102              0.89      0.80-0.96     0.91   1.22
=========  =================  ===========  =====================  ========  ============  =====  ====

(calibrations: square matmul 106-111 GFLOP/s, k = 4 at 10-11, k = 16 at 53-60; convolutions
143-157 GFLOP/s at c = 16 and 208-231 at c = 64; copy 36-40 GB/s; batch-norm 0.76-0.80 G
elements/s, max-pool 0.21-0.23; per-op 4.0-4.2 us.) The run before it (the same model, at load
10-15): cnn 0.88, logreg 0.91, gpt-tiny 0.94, resnet20 0.85; two runs with the kernels' least
time instead of their median (load 15-17 and 9-12): cnn 0.85 / 0.87, logreg 0.89 / 0.87,
gpt-tiny 0.93 / 0.90, resnet20 0.92 / 0.83. The earlier model, on a quiet machine
(load average 0.3; wall-clock medians): cnn 0.79, logreg 0.76, gpt-tiny 0.94, resnet20 1.28.
Where the error went, per op (``--by-op``: every op of a real step timed alone, the least of
several steps): ResNet-20's 38 convolutions ran at 110-210 GFLOP/s against the ~100 of the
square ``torch.mm`` that priced them (1.30 without the conv curve); the CNN's two max-pools took 2.5 ms and its
batch-norms' forward 0.85 ms, priced 0.25 and 0.15 ms on the plain roofline; logreg's 10-wide
head ran at 21 GFLOP/s, the curve's k = 16 rate gave it 55. With this model the ops of a step
sum to what they measure (``--by-op`` at load 13.6, with that round's calibration from the
kernels' least times: CNN 8.10 ms
modeled against 7.96 measured, ResNet-20 63.67 against 63.76); the gap is outside the ops, the
step minus the sum of its ops: 2.9 ms of the CNN's 10.9 and 15.2 of ResNet-20's 79.0 there,
1 ms of the CNN's at load 7. It grows with the load (a sum of per-op least times is below any
one step on a noisy machine, and other processes evict the caches between slices), and it is not
the interpreter running cold after a big kernel (a tiny model's modules with a 2 MiB write
before each ran 1.9 us slower per module). The per-op overhead of a tiny model's step (4.1-4.6
us) prices the host's share on a quiet machine. Known misses: a strided convolution
(ResNet-20's two 16 -> 32 and 32 -> 64 downsampling layers: 65-130 GFLOP/s measured) and a stem
on 1-3 input channels (45-70) run below the curve's rate at their GEMM dimension; ResNet-20's
first stage (2 MiB activations) at about 115-140 against the 1 MiB curve's ~150; and in a step
the convolutions ran 10-20% below the same shapes repeated alone (ResNet-20's second and third
stages at about 175 and 197 GFLOP/s, alone 206-221 and about 229; an L2-sized write before
each repeat did not close it), which leaves ResNet-20 the lowest ratio.

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

Wall-clock stretch (``cluster.stretch``)
----------------------------------------
The clock makes a worker slow in ``modeled_time_s`` only; on this machine every worker computes
at the same speed. ``cluster.stretch=true`` (profile mode only: the target must be a modeled step
time) makes the speeds real in wall time for any method: each worker's local step (from the
step's start, its batch loaded, through forward, backward and the optimizer step, up to the
algorithm's ``after_step``, where local SGD, DiLoCo and SlowMo synchronize) lasts at least
``step_s[w] x time_scale`` wall seconds, ``step_s[w]`` = the profile's step time / speed of worker
w (``RunContext.worker_step_s``): the worker sleeps the rest (:func:`stretch_step`); a step whose
real compute is longer is not shortened. The time the step spent blocked in communication
(a DDP all-reduce in backward, a gossip exchange in ``after_backward``) does not count towards
the target: it is the step's communication, so a method that synchronizes every step runs at
``max_w(step_s[w] x time_scale) + its communication`` per step (the fast workers wait in the
next step's collective for the slow ones; measured: DDP on 2 gloo workers at speeds [1.0, 0.5],
0.05 s per step, took 0.103 s per step, the fast worker blocked 0.64 s over 12 steps), and a method that synchronizes every H steps at
about ``H x max_w(step_s[w] x time_scale) + its synchronization`` per round. One limit: the sleep
falls after the step's backward, so DDP's overlap of bucket all-reduces with the backward is
not stretched (its communication runs on the real, short backward). The sleep is emulated
compute: a worker's measured ``compute_time_s`` includes it; ``modeled_time_s`` and bytes do not
change (the clock is not touched). The same rule, with ``algo.time_scale``, stretches the workers
of ``algo=async_local_sgd algo.timing=real`` (:mod:`lsgd.algorithms.asynchronous.real_timing`), which stretches
its own steps: ``cluster.stretch=true`` with it is a ConfigError. A server rank (parameter server,
asynchronous Local-SGD's server) has no local step and is never stretched.

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

import contextlib
import copy
import datetime
import json
import logging
import math
import os
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from lsgd.core.errors import ConfigError

log = logging.getLogger(__name__)

# Published device figures (datasheets). Peak: dense (no 2:4 structured sparsity) FP16/BF16
# tensor-core FLOP/s with FP32 accumulate, the rate mixed-precision training runs at (NVIDIA quotes
# sparse rates as 2x these). Memory bandwidth: the datasheet's HBM figure, bytes/s.
#
# ======  ===============  ============  ===========  ======================================================
# key     part             dense peak    memory bw    source
# ======  ===============  ============  ===========  ======================================================
# v100    Tesla V100 SXM2   125 TFLOP/s   900 GB/s    NVIDIA V100 datasheet, "Tensor Performance: 125
#                                                     TFLOPS" (SXM2; PCIe 112), "Memory Bandwidth: 900 GB/sec"
#                                                     (HBM2); = 640 tensor cores x 128 FLOP/clock x 1.53 GHz.
# a100    A100 SXM4 80GB    312 TFLOP/s  2039 GB/s    NVIDIA A100 datasheet, "BF16/FP16 Tensor Core: 312
#                                                     TFLOPS | 624 TFLOPS*" (* sparsity; 40 GB and 80 GB
#                                                     alike), "GPU Memory Bandwidth: 2,039 GB/s" (80GB SXM;
#                                                     the 40GB part has 1,555 GB/s). The 80GB SXM is chosen:
#                                                     the common part of today's A100 clusters.
# h100    H100 SXM5       989.4 TFLOP/s  3350 GB/s    NVIDIA Hopper architecture whitepaper, "Peak FP16 /
#                                                     BF16 Tensor TFLOPS with FP32 Accumulate: 989.4 /
#                                                     1978.9" (dense / sparse; = 528 tensor cores x 1024
#                                                     FLOP/clock x 1.83 GHz); H100 datasheet, SXM "GPU
#                                                     memory bandwidth: 3.35TB/s".
# h200    H200 SXM        989.4 TFLOP/s  4800 GB/s    NVIDIA H200 datasheet, "BF16/FP16 Tensor Core: 1,979
#                                                     TFLOPS*" (* sparsity), "GPU Memory Bandwidth:
#                                                     4.8TB/s": the H100 SXM5's compute with HBM3e.
# cpu     this machine     measured      measured     ``lsgd calibrate`` (:func:`calibrate_cpu`)
# ======  ===============  ============  ===========  ======================================================
DEVICE_PEAK_FLOPS: dict[str, float] = {
    "v100": 125e12,
    "a100": 312e12,
    "h100": 989.4e12,
    "h200": 989.4e12,
}

DEVICE_MEMORY_BANDWIDTH: dict[str, float] = {
    "v100": 900e9,
    "a100": 2039e9,
    "h100": 3.35e12,
    "h200": 4.8e12,
}

# Launch overhead per kernel on a GPU, seconds: the host-side cost of submitting one kernel
# (driver call, argument marshalling, command queue) that a stream of small kernels cannot hide.
# 5 us: the middle of the 4-6 us per submitted kernel measured with CUDA 13.0 (driver 580) in
# "pegainfer (3): From Launch Overhead to CUDA Graph" (susun-blog.com/blog/pegainfer-3-cuda-graph,
# code github.com/xiaguan/cuda-kernel-launch-lab), the "few microseconds" of NVIDIA's CUDA Graphs
# material (developer.nvidia.com/blog/cuda-graphs). PyTorch's eager dispatch adds its own
# microseconds per op on the host (NVIDIA's Nsight Systems walkthrough measures ~20 us for one
# PyTorch element-wise op on a V100, launch included), so 5 us is a floor, not an average.
GPU_LAUNCH_OVERHEAD_S = 5e-6

#: the efficiency (fraction of peak FLOP/s a compute-bound kernel reaches) when ``cluster.mfu`` is
#: null: 0.4 on the GPU presets (the value ``mfu`` had before the roofline, so compute-bound models
#: keep their step time), 1.0 on ``cpu`` (its peak is itself a measured matmul rate)
DEFAULT_EFFICIENCY: dict[str, float] = {"v100": 0.4, "a100": 0.4, "h100": 0.4, "h200": 0.4, "cpu": 1.0}

#: every allowed ``cluster.device``
DEVICES: tuple[str, ...] = (*DEVICE_PEAK_FLOPS, "cpu")


@dataclass(frozen=True)
class DeviceSpec:
    """The roofline figures of one device.

    Attributes:
        name: a key of :data:`DEVICES`.
        peak_flops: FLOP/s (dense FP16/BF16 tensor-core peak; ``cpu``: a measured float32 matmul).
        memory_bandwidth: bytes/s (datasheet; ``cpu``: a measured large copy, read + write).
        launch_s: seconds of fixed cost per kernel (GPU: :data:`GPU_LAUNCH_OVERHEAD_S`; ``cpu``: the
            measured cost per op of a tiny model's training step, PyTorch's per-op eager cost).
        special_rate: elements/s of a transcendental function (``cpu``: measured ``torch.exp``);
            None (GPU presets): not modeled, as a GPU's special-function units keep such
            elementwise ops memory-bound.
        matmul_curve: the matmul shape-efficiency curve, ``((k, FLOP/s), ...)`` sorted by k > 0:
            the FLOP/s of a float32 matmul whose smallest dimension is k (``cpu``: measured by
            :func:`calibrate_cpu` at :data:`MATMUL_CURVE_K`); None (GPU presets, an old
            calibration file): every matmul at ``peak_flops`` (:meth:`matmul_rate`).
        first_touch_bandwidth: bytes/s of the page faults of a fresh large allocation (``cpu``:
            measured by :func:`calibrate_cpu`), paid by every op output of at least
            :data:`FRESH_ALLOCATION_BYTES` on top of its roofline (:attr:`Op.fresh_bytes`); None
            (GPU presets, an old calibration file): not priced. Why only on ``cpu``: PyTorch's CPU
            allocator hands a large tensor to glibc's ``malloc``, which serves any block above its
            mmap threshold with a fresh ``mmap`` and unmaps it on free (``mallopt(3)``,
            ``M_MMAP_THRESHOLD``), so the kernel faults in and zeroes every page of such an output
            on its first write, every step (measured on this AMD EPYC: about 2 GB/s against
            15-30 GB/s for a write to memory already mapped); the CUDA caching allocator keeps
            freed blocks and reuses them the next step, so on a GPU a step allocates nothing new
            after the first.
        conv_curve: the convolution curve, ``((c, FLOP/s), ...)`` sorted by c > 0: the FLOP/s of
            a float32 convolution (forward and backward together) whose GEMM's smallest
            dimension is c (``cpu``: measured by :func:`calibrate_cpu` on 3 x 3 convolutions of
            c -> c channels, :data:`CONV_CURVE_C`); None (GPU presets, an old calibration file):
            convolutions at ``peak_flops`` (:meth:`conv_rate`). Why a curve of its own: PyTorch
            runs a CPU convolution with oneDNN's direct-convolution kernels (``mkldnn_convolution``),
            not with the GEMM library of ``torch.mm`` (MKL), and they reach a different rate: on
            this AMD EPYC about 150-220 GFLOP/s for 16-128 channels against about 100 for a
            1024 x 1024 ``torch.mm``, and well under it below 16 output channels (an AVX-512
            register holds 16 of them). Not on the GPU presets for the reason
            :meth:`matmul_rate` gives: they are datasheet peaks, and cuDNN's per-shape rates
            would have to be measured on the device.
        element_rates: ``{rate key: elements/s}`` for the ops of :data:`ELEMENT_RATE_OPS` (``cpu``:
            measured by :func:`calibrate_cpu`): ops whose CPU kernel is neither a matmul nor a
            copy-speed stream, so that neither roofline term sees their time (batch-norm's
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
        ``min_dim`` (:func:`conv_min_dim`): :attr:`conv_curve` interpolated as
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


def device_spec(name: str) -> DeviceSpec:
    """The :class:`DeviceSpec` of ``name``; ``cpu`` reads (or makes) this machine's calibration for
    torch's current thread count (:func:`cpu_spec`).

    Raises:
        ConfigError: ``name`` not in :data:`DEVICES`.
    """
    if name == "cpu":
        return cpu_spec()
    if name not in DEVICE_PEAK_FLOPS:
        raise ConfigError(f"cluster.device={name!r} is not allowed; allowed: {', '.join(DEVICES)}")
    return DeviceSpec(name, DEVICE_PEAK_FLOPS[name], DEVICE_MEMORY_BANDWIDTH[name], GPU_LAUNCH_OVERHEAD_S)


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
    "mfu": None,
    "step_time_s": None,
    "speeds": None,
    "gpus_per_node": 1,
    "stretch": False,
    "time_scale": 1.0,
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
    if device not in DEVICES:
        raise ConfigError(f"cluster.device={device!r} is not allowed; allowed: {', '.join(DEVICES)}")
    mfu = cluster.get("mfu", CLUSTER_DEFAULTS["mfu"])
    if mfu is not None and not (_is_number(mfu) and 0 < mfu <= 1):
        raise ConfigError(f"cluster.mfu must be null (the device's default: {DEFAULT_EFFICIENCY['a100']} on a GPU, "
                          f"1.0 on cpu) or a number in (0, 1] (the fraction of peak FLOP/s a compute-bound "
                          f"kernel reaches), got {mfu!r}")
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
    stretch = cluster.get("stretch", CLUSTER_DEFAULTS["stretch"])
    if not isinstance(stretch, bool):
        raise ConfigError(f"cluster.stretch must be true or false (stretch each worker's local steps to its modeled "
                          f"step time in wall time), got {stretch!r}")
    scale = cluster.get("time_scale", CLUSTER_DEFAULTS["time_scale"])
    if not (_is_number(scale) and scale > 0):
        raise ConfigError(f"cluster.time_scale must be a number > 0 (wall seconds per modeled compute second of "
                          f"cluster.stretch), got {scale!r}")
    compute = cluster.get("compute", CLUSTER_DEFAULTS["compute"])
    if stretch and compute != "profile":
        raise ConfigError(f"cluster.stretch=true needs cluster.compute=profile (each worker's local step is stretched "
                          f"to its modeled step time / speed); got cluster.compute={compute!r}; allowed: profile, "
                          f"or cluster.stretch=false")


def stretch_target_s(step_s: Sequence[float] | None, worker: int | None, time_scale: float) -> float | None:
    """Wall seconds a local step of worker ``worker`` lasts at least under the stretch (module
    docstring, "Wall-clock stretch"): ``step_s[worker] x time_scale`` (``step_s``: every worker's
    modeled seconds per step, :attr:`lsgd.algorithms.base.RunContext.worker_step_s`). None for a
    rank with no local step (``worker`` None: a server).

    Raises:
        ConfigError: ``step_s`` is None (not profile mode).
    """
    if worker is None:
        return None
    if step_s is None:
        raise ConfigError("the wall-clock stretch needs cluster.compute=profile (modeled step times of every worker)")
    return float(step_s[worker]) * float(time_scale)


def stretch_step(target_s: float, start: float, blocked_s: float = 0.0, sleep: Callable[[float], Any] = time.sleep) -> float:
    """Sleep the rest of a local step so that it lasts at least ``target_s`` wall seconds (module
    docstring, "Wall-clock stretch"). ``start``: the step's ``time.perf_counter()`` at its start;
    ``blocked_s``: seconds of it the worker was blocked in communication (not counted towards the
    target). Returns the seconds slept (0 when the step already took ``target_s`` or more).

    Shared by the trainer (``cluster.stretch``) and asynchronous Local-SGD's real timing
    (``algo.timing=real``).
    """
    rest = target_s - (time.perf_counter() - start - blocked_s)
    if rest <= 0:
        return 0.0
    sleep(rest)
    return rest


# -------------------------------------------------------------------------------- the cpu preset
#: the calibration file's format: 2 since the convolution curve, the element rates and the
#: thread-CPU-time timings (a format-1 file is not read: the preset measures anew, or a joined
#: launch asks for ``lsgd calibrate``; :func:`cpu_spec_from_record` still reads a record in hand)
CPU_PROFILE_FORMAT = 2


def cpu_profile_path() -> Path:
    """Where ``lsgd calibrate`` writes this machine's figures and ``cluster.device=cpu`` reads them:
    ``$XDG_CACHE_HOME/lsgd/cpu.json`` (``~/.cache/lsgd/cpu.json`` when unset)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "lsgd" / "cpu.json"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_seconds(fn: Callable[[], Any], repeats: int,
                 stat: Callable[[list[float]], float] = statistics.median) -> float:
    """``stat`` (default: the median) of ``repeats`` timings of ``fn()``, each the CPU time of the
    calling thread (``time.thread_time``: user + system time of this thread, page faults
    included), so that other processes on a shared machine do not inflate the figures: a time
    slice taken by another process is not this thread's CPU time. (Measured on this 2-core
    machine at load average 6-9: a wall-clock median put the 1024 x 1024 matmul at 33-76 GFLOP/s
    between calls, the thread CPU time at 100-110.) The median, not the least: a training step's
    kernels run with the caches other processes leave them (the bench times a step as the median
    of its repeats, in the same clock); at load average 10 the least put the convolution curve
    10-20% above the median, the matmul about 3%. On a quiet machine the two agree.
    Needs torch to run ``fn``'s work on the calling thread: one torch thread (the workers'
    setting on a small machine); with more, the other threads' work would not be counted, so there
    the clock is the wall clock (``time.perf_counter``)."""
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return stat(times)


def _tiny_step_overhead(repeats: int) -> float:
    """Seconds per counted op of a whole training step of a tiny MLP (2 x Linear(4, 4), batch 2,
    SGD with momentum): what PyTorch's eager mode costs per op when the arithmetic is nothing
    (Python module calls, autograd recording, the backward engine, the optimizer's loop)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(2, 4), torch.randint(0, 4, (2,))
    loss_fn = torch.nn.functional.cross_entropy
    counted = count_step(model, x, y, loss_fn, opt, gpu=False)
    ops = sum(op.launches for op in counted.forward + counted.backward + counted.optimizer)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(20):
        step()
    # single steps (about 0.1 ms each), median of many: robust to a loaded machine's preemptions
    return _cpu_seconds(step, 40 * repeats) / ops


#: the smallest GEMM dimensions k at which :func:`calibrate_cpu` measures the thin matmuls of the
#: matmul curve (``(curve_n x k) @ (k x curve_n)``); the curve's last point is the square
#: ``matmul_n`` matmul (k = 1024)
MATMUL_CURVE_K: tuple[int, ...] = (4, 16, 64, 256)
#: the two large dimensions of those thin matmuls (64 MiB float32 outputs)
MATMUL_CURVE_N = 4096

#: glibc's largest mmap threshold on a 64-bit system (``DEFAULT_MMAP_THRESHOLD_MAX`` = 4 MiB x
#: sizeof(long), ``mallopt(3)``): an allocation at least this large is always a fresh ``mmap``,
#: whose pages fault on first write (:attr:`DeviceSpec.first_touch_bandwidth`)
FRESH_ALLOCATION_BYTES = 32 * 2**20


def measure_matmul_curve(ks: Sequence[int] = MATMUL_CURVE_K, n: int = MATMUL_CURVE_N,
                         repeats: int = 3) -> list[list[float]]:
    """``[[k, FLOP/s], ...]`` of float32 ``(n x k) @ (k x n)`` matmuls (2 n^2 k FLOPs each; the
    median of ``repeats`` timed runs after a warm-up), k ascending: points of the shape-efficiency
    curve of :meth:`DeviceSpec.matmul_rate`. The output is preallocated (``out=``), so the rate is
    the kernel's alone: the page faults of a fresh output are priced separately
    (:attr:`DeviceSpec.first_touch_bandwidth`). ``n`` large (64 MiB outputs at 4096): the other
    two dimensions as large as the GPT head's, whose output does not fit in any cache."""
    curve = []
    with torch.no_grad():
        for k in sorted(int(k) for k in ks):
            a, b = torch.randn(n, k), torch.randn(k, n)
            out = torch.empty(n, n)
            torch.mm(a, b, out=out)  # warm-up (first-call setup, page faults)
            curve.append([float(k), 2.0 * n * n * k / _cpu_seconds(lambda: torch.mm(a, b, out=out), repeats)])
    return curve


def measure_first_touch(mib: int = 64, repeats: int = 5) -> float:
    """Bytes/s of the page faults of a fresh ``mib`` MiB allocation (above glibc's mmap threshold,
    :data:`FRESH_ALLOCATION_BYTES`): ``bytes / (t_fresh - t_reused)``, where ``t_fresh`` fills a
    newly allocated tensor (``torch.empty(n).fill_``: each page faults, the kernel zeroes it,
    then the fill writes it) and ``t_reused`` fills one already mapped (the write alone)."""
    n = mib * 2**20 // 4
    with torch.no_grad():
        dst = torch.empty(n)
        dst.fill_(0.0)
        torch.empty(n).fill_(1.0)  # warm-up
        fresh = _cpu_seconds(lambda: torch.empty(n).fill_(1.0), repeats)
        reused = _cpu_seconds(lambda: dst.fill_(1.0), repeats)
    return n * 4 / max(fresh - reused, 1e-3 * fresh)


def _steady_allocator(mib: int = 16) -> None:
    """Put glibc's allocator where a training step keeps it: allocate, touch and free a ``mib``
    MiB block (below :data:`FRESH_ALLOCATION_BYTES`), which raises glibc's dynamic mmap threshold
    to its size (``mallopt(3)``: freeing an mmapped chunk of at most 32 MiB sets
    ``M_MMAP_THRESHOLD`` to it), so later allocations below it come from the heap, as a step's
    activations do once the previous steps freed theirs. In a fresh process (threshold 128 KiB)
    every 1 MiB conv output would instead be a fresh ``mmap`` whose pages fault on each call
    (measured: the c = 16 conv point at 54 GFLOP/s against 168). No effect on another allocator."""
    block = torch.empty(mib * 2**20 // 4)
    block.fill_(0.0)
    del block


#: channel counts c of the convolution curve: :func:`calibrate_cpu` times 3 x 3 convolutions of
#: c -> c channels (padding 1, stride 1, batch 32) on images of 8192 / c pixels, so that every
#: point's activations are 1 MiB (a ResNet-20 or demo-CNN activation is 0.5-2 MiB: L2/L3-sized)
CONV_CURVE_C: tuple[int, ...] = (4, 16, 64)
CONV_CURVE_BATCH = 32
CONV_CURVE_PIXELS = 8192


def measure_conv_curve(cs: Sequence[int] = CONV_CURVE_C, batch: int = CONV_CURVE_BATCH,
                       pixels: int = CONV_CURVE_PIXELS, repeats: int = 7) -> list[list[float]]:
    """``[[c, FLOP/s], ...]``: the rate of a float32 3 x 3 convolution of c -> c channels (forward,
    then backward to both the input and the weight: ``aten.convolution`` and
    ``aten.convolution_backward``, the ops a training step runs), c ascending; FLOP/s = 3 x the
    forward's 2 x batch x c x H x W x c x 9 (the backward computes two products of the forward's
    size) / (forward + backward seconds, the median of ``repeats`` after a warm-up). Images of
    ``pixels / c`` pixels (H x W, H = W or W = 2H), so every point moves the same bytes. The
    GEMM's smallest dimension of such a convolution is c (:func:`conv_min_dim`: min(c, 9c))."""
    curve = []
    _steady_allocator()
    with torch.no_grad():
        for c in sorted(int(c) for c in cs):
            hw = max(1, pixels // c)
            h = 2 ** (int(math.log2(hw)) // 2)
            w = max(1, hw // h)
            x, weight = torch.randn(batch, c, h, w), torch.randn(c, c, 3, 3)
            args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
            grad = torch.randn(batch, c, h, w)

            def step() -> None:
                aten.convolution(x, weight, None, *args)
                aten.convolution_backward(grad, x, weight, None, *args, [True, True, False])

            step()  # warm-up (oneDNN's primitive creation)
            flops = 3 * 2.0 * batch * c * h * w * c * 9
            curve.append([float(c), flops / _cpu_seconds(step, repeats)])
    return curve


def measure_element_rates(repeats: int = 7) -> dict[str, float]:
    """``{key: elements/s}`` of every op of :data:`ELEMENT_RATE_OPS`, each timed on a float32
    (32, 32, 16, 16) tensor (1 MiB: the activations of a small conv net; the median of ``repeats``
    runs after a warm-up): ``batch_norm_train``: ``aten.native_batch_norm`` in training mode
    (statistics and normalization; elements: the input's); ``max_pool2d``: a 2 x 2, stride 2
    ``aten.max_pool2d_with_indices`` (elements: output elements x window size, here the input's)."""
    x = torch.randn(32, 32, 16, 16)
    c = x.shape[1]
    weight, bias, mean, var = torch.ones(c), torch.zeros(c), torch.zeros(c), torch.ones(c)
    bench = {
        "batch_norm_train": lambda: aten.native_batch_norm(x, weight, bias, mean, var, True, 0.1, 1e-5),
        "max_pool2d": lambda: aten.max_pool2d_with_indices(x, [2, 2], [2, 2], [0, 0], [1, 1], False),
    }
    rates = {}
    _steady_allocator()
    with torch.no_grad():
        for key, fn in bench.items():
            fn()
            rates[key] = x.numel() / _cpu_seconds(fn, repeats)
    return rates


def calibrate_cpu(matmul_n: int = 1024, copy_mib: int = 64, special_mib: int = 16, repeats: int = 7,
                  curve_k: Sequence[int] | None = None, curve_n: int | None = None) -> dict:
    """Measure this machine's roofline figures with torch's current thread count.

    * ``peak_flops``: 2 n^3 / t of an ``n x n`` float32 matmul (``matmul_n``).
    * ``matmul_curve``: ``[[k, FLOP/s], ...]``: float32 ``(curve_n x k) @ (k x curve_n)``
      matmuls at each k of ``curve_k`` below ``matmul_n`` (:func:`measure_matmul_curve`; default
      :data:`MATMUL_CURVE_K` and :data:`MATMUL_CURVE_N`, read at call time), then
      the square matmul's point ``[matmul_n, peak_flops]``: the rate of a matmul whose smallest
      dimension is k (:meth:`DeviceSpec.matmul_rate`).
    * ``first_touch_bandwidth``: bytes/s of the page faults of a fresh 64 MiB allocation
      (:func:`measure_first_touch`).
    * ``memory_bandwidth``: bytes read + written / t of copying a ``copy_mib`` MiB float32 tensor
      into another (``Tensor.copy_``).
    * ``special_rate``: elements / t of ``torch.exp`` on a ``special_mib`` MiB float32 tensor:
      the rate of transcendental functions (exp, log, tanh, erf; :data:`SPECIAL_OPS`), which on a
      CPU cost tens of FLOP-equivalents per element and set the time of softmax and GELU.
    * ``conv_curve``: ``[[c, FLOP/s], ...]``: 3 x 3 convolutions of c -> c channels, forward and
      backward (:func:`measure_conv_curve`, c in :data:`CONV_CURVE_C`): the rate of a
      convolution whose GEMM's smallest dimension is c (:meth:`DeviceSpec.conv_rate`).
    * ``element_rates``: ``{key: elements/s}`` of batch-norm's training forward and max-pooling
      (:func:`measure_element_rates`, :data:`ELEMENT_RATE_OPS`).
    * ``launch_s``: seconds per op of a whole training step of a tiny model
      (:func:`_tiny_step_overhead`, over many steps): PyTorch's fixed per-op cost on
      this host, the CPU's counterpart of a kernel launch.

    Each time is the median CPU time of the calling thread over ``repeats`` runs after a
    warm-up (:func:`_cpu_seconds`: robust to other processes on a shared machine). Takes two to
    four seconds (the thin matmuls about half). The figures belong to this machine and its
    thread count: a ``cpu`` profile does not carry over to another machine.

    Returns:
        ``{"peak_flops" (FLOP/s), "matmul_curve" ([[k, FLOP/s], ...]), "conv_curve" ([[c,
        FLOP/s], ...]), "element_rates" ({key: elements/s}), "first_touch_bandwidth" (bytes/s),
        "memory_bandwidth" (bytes/s), "special_rate" (elements/s), "launch_s" (s), "threads",
        "cpu", "torch", "measured_at" (UTC, ISO 8601)}``.
    """
    with torch.no_grad():
        a, b = torch.randn(matmul_n, matmul_n), torch.randn(matmul_n, matmul_n)
        out = torch.empty(matmul_n, matmul_n)
        torch.mm(a, b, out=out)  # warm-up (first-call setup, page faults)
        mm_s = _cpu_seconds(lambda: torch.mm(a, b, out=out), repeats)
    peak = 2.0 * matmul_n**3 / mm_s
    curve_k = MATMUL_CURVE_K if curve_k is None else curve_k
    curve_n = MATMUL_CURVE_N if curve_n is None else curve_n
    curve = measure_matmul_curve([k for k in curve_k if k < matmul_n], curve_n) + [[float(matmul_n), peak]]
    with torch.no_grad():
        src = torch.ones(copy_mib * 2**20 // 4)
        dst = torch.empty_like(src)
        dst.copy_(src)
        copy_s = _cpu_seconds(lambda: dst.copy_(src), repeats)
        z = torch.randn(special_mib * 2**20 // 4)
        out = torch.empty_like(z)
        torch.exp(z, out=out)
        exp_s = _cpu_seconds(lambda: torch.exp(z, out=out), repeats)
    return {
        "peak_flops": peak,
        "matmul_curve": curve,
        "first_touch_bandwidth": measure_first_touch(),
        "memory_bandwidth": 2.0 * src.numel() * src.element_size() / copy_s,
        "special_rate": z.numel() / exp_s,
        "conv_curve": measure_conv_curve(CONV_CURVE_C, CONV_CURVE_BATCH, CONV_CURVE_PIXELS),
        "element_rates": measure_element_rates(),
        "launch_s": _tiny_step_overhead(repeats),
        "threads": torch.get_num_threads(),
        "cpu": _cpu_name(),
        "torch": torch.__version__,
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _read_cpu_profiles(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cluster.device=cpu: the calibration file {path} is unreadable ({exc}); "
                          "run `lsgd calibrate` to rewrite it") from None
    if not isinstance(data, dict) or data.get("format") != CPU_PROFILE_FORMAT:
        return {}
    return dict(data.get("by_threads") or {})


def write_cpu_profile(record: dict, path: Path | None = None) -> Path:
    """Store ``record`` (:func:`calibrate_cpu`) under its thread count in the calibration file,
    keeping the other thread counts' records; atomic (a temporary file, then ``os.replace``)."""
    path = cpu_profile_path() if path is None else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    profiles = _read_cpu_profiles(path) if path.exists() else {}
    profiles[str(int(record["threads"]))] = record
    text = json.dumps({"format": CPU_PROFILE_FORMAT, "by_threads": profiles}, indent=2, sort_keys=True) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".cpu.", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def read_cpu_profile(threads: int | None = None, path: Path | None = None) -> dict | None:
    """The calibration record for ``threads`` (default: torch's current count), or None."""
    threads = torch.get_num_threads() if threads is None else int(threads)
    return _read_cpu_profiles(cpu_profile_path() if path is None else Path(path)).get(str(threads))


def ensure_cpu_profile(threads: int | None = None, calibrate: bool = True) -> dict:
    """The calibration record for ``threads`` torch threads; when there is none, measure it now
    (:func:`calibrate_cpu` with that many threads; about a second), store it and log that it did.

    Raises:
        ConfigError: no record and ``calibrate`` false (a launch whose ranks would each measure
            their own figures: run ``lsgd calibrate`` on every node first).
    """
    threads = torch.get_num_threads() if threads is None else int(threads)
    record = read_cpu_profile(threads)
    if record is not None:
        return record
    path = cpu_profile_path()
    if not calibrate:
        raise ConfigError(f"cluster.device=cpu needs this machine's figures for {threads} torch thread(s) in {path}: "
                          f"run `lsgd calibrate --threads {threads}` on every node before the launch")
    log.warning("cluster.device=cpu: no calibration for %d torch thread(s) in %s; measuring this machine now "
                "(`lsgd calibrate` does it ahead of time)", threads, path)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        record = calibrate_cpu()
    finally:
        torch.set_num_threads(before)
    write_cpu_profile(record, path)
    return record


def cpu_spec(threads: int | None = None) -> DeviceSpec:
    """The ``cpu`` :class:`DeviceSpec` for ``threads`` torch threads (default: the current count),
    from the calibration file (measured now when missing, :func:`ensure_cpu_profile`)."""
    return cpu_spec_from_record(ensure_cpu_profile(threads))


def cpu_spec_from_record(r: Mapping) -> DeviceSpec:
    """The ``cpu`` :class:`DeviceSpec` of a calibration record (:func:`calibrate_cpu`). A record
    written before a figure existed keeps working: no ``special_rate`` -> transcendental functions
    unpriced, no ``matmul_curve`` -> every matmul at ``peak_flops`` (the square rate), no
    ``first_touch_bandwidth`` -> fresh allocations unpriced."""
    def points(key: str) -> tuple[tuple[float, float], ...] | None:
        curve = r.get(key)
        return tuple(sorted((float(k), float(rate)) for k, rate in curve)) if curve else None

    rates = {str(k): float(v) for k, v in (r.get("element_rates") or {}).items() if v}
    return DeviceSpec("cpu", float(r["peak_flops"]), float(r["memory_bandwidth"]), float(r["launch_s"]),
                      special_rate=float(r["special_rate"]) if r.get("special_rate") else None,
                      matmul_curve=points("matmul_curve"),
                      first_touch_bandwidth=float(r["first_touch_bandwidth"]) if r.get("first_touch_bandwidth") else None,
                      conv_curve=points("conv_curve"), element_rates=rates or None,
                      info=dict(r))


# -------------------------------------------------------------------------------- counting operators
aten = torch.ops.aten

#: ops that launch no kernel: allocations and metadata (besides every view / alias, :func:`_launches_nothing`)
NO_KERNEL_OPS = frozenset({
    aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default, aten.new_empty.default,
    aten.new_empty_strided.default, aten._unsafe_view.default, aten.lift_fresh.default, aten.resize_.default,
    aten.is_same_size.default, aten.is_contiguous.default, aten.is_contiguous.memory_format,
    aten.is_strides_like_format.default, aten.is_non_overlapping_and_dense.default, aten.size.default,
    aten.sym_size.default, aten.stride.default, aten.sym_stride.default, aten.storage_offset.default,
    aten.sym_storage_offset.default, aten.numel.default, aten.sym_numel.default, aten.dim.default,
    aten.sym_is_contiguous.default,
})

_NOTHING: dict[Any, bool] = {}


def _launches_nothing(func) -> bool:
    """Views, aliasing and metadata ops: an output that aliases an input without writing it
    (``view``, ``t``, ``expand``, ``detach``, ``as_strided``, ``split``, ...), allocations,
    ``_unsafe_view`` (a view by another name), and ops outside ``aten`` (the profiler's record
    markers, prims, collectives: communication is the clock's, not compute)."""
    known = _NOTHING.get(func)
    if known is None:
        schema = getattr(func, "_schema", None)
        aliases = schema is not None and any(
            r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
        known = (func in NO_KERNEL_OPS or getattr(func, "is_view", False) or aliases
                 or getattr(func, "namespace", "aten") != "aten")
        _NOTHING[func] = known
    return known


def _tensor_bytes(t: torch.Tensor) -> int:
    """Bytes an op touches in ``t``: its elements x element size, at most its storage (an
    expanded tensor reads its storage once)."""
    n = t.numel() * t.element_size()
    try:
        return min(n, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return n


#: torch's multi_tensor_apply (ATen/native/cuda/MultiTensorApply.cuh): a ``_foreach_`` op launches
#: a kernel per group of at most ``depth_to_max_tensors[depth - 1]`` tensors and 320 blocks of
#: 65536 elements (``kChunkSize``), depth = number of tensor lists
FOREACH_MAX_TENSORS = (110, 64, 48, 36, 30)
FOREACH_MAX_BLOCKS = 320
FOREACH_CHUNK = 65536


def foreach_launches(lists: Sequence[Sequence[torch.Tensor]]) -> int:
    """Kernels a CUDA ``_foreach_`` op launches over ``lists`` (lists of tensors, depth =
    ``len(lists)``): max(ceil(tensors / max tensors per launch), ceil(chunks / 320))."""
    if not lists or not lists[0]:
        return 0
    depth = min(len(lists), len(FOREACH_MAX_TENSORS))
    tensors = lists[0]
    chunks = sum(max(1, -(-t.numel() // FOREACH_CHUNK)) for t in tensors)
    return max(-(-len(tensors) // FOREACH_MAX_TENSORS[depth - 1]), -(-chunks // FOREACH_MAX_BLOCKS))


#: ops whose elements each evaluate a transcendental function (exp, log, tanh, erf): softmax and
#: its backward, GELU, SiLU, sigmoid, tanh
SPECIAL_OPS = frozenset({
    aten.exp, aten.exp_, aten.log, aten.log_, aten._softmax, aten._log_softmax, aten._log_softmax_backward_data,
    aten.gelu, aten.gelu_backward, aten.tanh, aten.sigmoid, aten.silu, aten.silu_backward, aten.erf,
    aten.log_sigmoid_forward, aten.softplus, aten.elu,
})


@dataclass(frozen=True)
class Op:
    """One counted operator.

    Attributes:
        name: the aten op (``aten.mm.default``).
        flops: FLOPs: the matmul-family count of :data:`torch.utils.flop_counter.flop_registry`
            (2 per multiply-accumulate) where the op is registered, else one per element of its
            largest operand (elementwise ops, reductions, copies; such ops are memory-bound on
            every preset, so the approximation hardly matters).
        bytes: inputs read + outputs written (elements x element size, :func:`_tensor_bytes`); an
            in-place op reads and writes its target (one returning nothing, as ``_foreach_add_``,
            writes the arguments its schema marks as mutated).
        launches: kernels (1; CUDA ``_foreach_`` ops: :func:`foreach_launches`; on ``cpu`` one
            per tensor, PyTorch's for-loop fallback dispatching each).
        matmul_flops: the registry's count (0 for ops it does not list): "model FLOPs".
        special: transcendental evaluations (elements of the largest operand of an op in
            :data:`SPECIAL_OPS`, else 0), priced at the device's ``special_rate`` where it has one.
        min_dim: the smallest of the GEMM dimensions (M, K, N) of a matmul op of
            :data:`GEMM_OPS` (batch dimensions excluded: ``bmm``'s B is a loop over GEMMs), else
            0; priced at the device's :meth:`DeviceSpec.matmul_rate` for that dimension.
        fresh_bytes: bytes of the op's newly allocated outputs (not in-place, not ``out=``) of at
            least :data:`FRESH_ALLOCATION_BYTES` each, priced at the device's
            ``first_touch_bandwidth`` where it has one.
        conv_dim: the GEMM's smallest dimension of a convolution (:func:`conv_min_dim`), else 0;
            priced at the device's :meth:`DeviceSpec.conv_rate` for it where it has a conv curve.
        rate_key, rate_elements: for an op of :data:`ELEMENT_RATE_OPS`, its key and its elements
            (else ``""`` and 0); its compute term is at least ``rate_elements / rate`` on a
            device that measured that rate (:attr:`DeviceSpec.element_rates`).
    """

    name: str
    flops: float
    bytes: float
    launches: int
    matmul_flops: float
    special: float = 0.0
    min_dim: int = 0
    fresh_bytes: float = 0.0
    conv_dim: int = 0
    rate_key: str = ""
    rate_elements: float = 0.0


#: matmul ops priced by their shape (:attr:`Op.min_dim`, :meth:`DeviceSpec.matmul_rate`), with
#: the positions of their two GEMM operands: ``mm(a, b)``, ``addmm(bias, a, b)``, ``bmm(a, b)``,
#: ``baddbmm(self, a, b)``. Convolutions are left at the square rate: oneDNN runs them as direct
#: convolutions, not as one GEMM of a known shape, and the CNN and ResNet-20 profiles are already
#: within 25% of measured without a shape term (``scripts/bench_compute_model.py``); attention
#: (``_scaled_dot_product_*``) likewise (a fused kernel).
GEMM_OPS: dict[Any, tuple[int, int]] = {aten.mm: (0, 1), aten.addmm: (1, 2), aten.bmm: (0, 1), aten.baddbmm: (1, 2)}


#: FLOPs of attention ops that ``flop_registry`` lists only in their CUDA form: the CPU's fused
#: attention (what ``F.scaled_dot_product_attention`` runs when the step is counted on a CPU host)
#: counted with torch's own formulas (``torch.utils.flop_counter.sdpa_flop_count`` and
#: ``sdpa_backward_flop_count``: 2 FLOPs per multiply-accumulate of QK^T and PV, the causal mask
#: not subtracted, as for the CUDA kernels), so GPT's attention is not counted as free
EXTRA_FLOPS: dict[Any, Callable[..., float]] = {
    aten._scaled_dot_product_flash_attention_for_cpu:
        lambda q, k, v, *a, **kw: sdpa_flop_count(q.shape, k.shape, v.shape),
    aten._scaled_dot_product_flash_attention_for_cpu_backward:
        lambda g, q, k, v, *a, **kw: sdpa_backward_flop_count(g.shape, q.shape, k.shape, v.shape),
}


def gemm_min_dim(packet, args: Sequence[Any]) -> int:
    """The smallest of M, K, N of the GEMM op ``packet`` (a key of :data:`GEMM_OPS`) on ``args``
    (``a``: [..., M, K], ``b``: [..., K, N]); 0 for any other op or unexpected arguments."""
    where = GEMM_OPS.get(packet)
    if where is None:
        return 0
    try:
        a, b = args[where[0]], args[where[1]]
        m, k = a.shape[-2], a.shape[-1]
        return int(min(m, k, b.shape[-1]))
    except (IndexError, AttributeError, TypeError):
        return 0


#: convolution ops priced by their shape (:attr:`Op.conv_dim`, :meth:`DeviceSpec.conv_rate`), with
#: the positions of their weight and ``groups`` arguments: ``convolution(input, weight, bias,
#: stride, padding, dilation, transposed, output_padding, groups)`` and
#: ``convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
#: transposed, output_padding, groups, output_mask)``: what ``nn.Conv1d/2d/3d`` dispatch below
#: autograd
CONV_OPS: dict[Any, tuple[int, int, int]] = {aten.convolution: (1, 6, 8), aten.convolution_backward: (2, 7, 9)}


def conv_min_dim(packet, args: Sequence[Any]) -> int:
    """The smallest GEMM dimension of the convolution op ``packet`` (a key of :data:`CONV_OPS`) on
    ``args``, as a convolution is lowered to a GEMM (im2col: M = batch x output pixels, K = input
    channels per group x kernel elements, N = output channels per group): min(K, N), M being the
    large one in a training step. From the weight (``[C_out, C_in / groups, *kernel]``;
    transposed: ``[C_in, C_out / groups, *kernel]``) and ``groups``; 0 for any other op or
    unexpected arguments."""
    where = CONV_OPS.get(packet)
    if where is None:
        return 0
    try:
        w, transposed, groups = args[where[0]], bool(args[where[1]]), int(args[where[2]])
        kernel = math.prod(int(d) for d in w.shape[2:])
        if transposed:
            c_in_group, c_out_group = w.shape[0] // groups, w.shape[1]
        else:
            c_in_group, c_out_group = w.shape[1], w.shape[0] // groups
        return int(max(1, min(c_in_group * kernel, c_out_group)))
    except (IndexError, AttributeError, TypeError, ValueError, ZeroDivisionError):
        return 0


def _bn_train_elements(args: Sequence[Any], kwargs: Mapping, out: Any) -> float:
    """Elements of a batch-norm forward in training mode (``training``, the 6th argument, true),
    else 0 (evaluation mode normalizes with the running statistics: a plain elementwise stream)."""
    training = args[5] if len(args) > 5 else kwargs.get("training", False)
    return float(args[0].numel()) if training else 0.0


def _pool_window_elements(args: Sequence[Any], kwargs: Mapping, out: Any) -> float:
    """Window elements a max-pooling reads: output elements x kernel elements."""
    kernel = args[1] if len(args) > 1 else kwargs["kernel_size"]
    kernel = [int(k) for k in kernel] if isinstance(kernel, (list, tuple)) else [int(kernel)]
    if len(kernel) == 1:
        kernel = kernel * 2
    first = out[0] if isinstance(out, (tuple, list)) else out
    return float(first.numel() * math.prod(kernel))


#: ops priced at a measured per-element rate on ``cpu`` (:attr:`DeviceSpec.element_rates`,
#: measured by :func:`measure_element_rates`): op packet -> (rate key, elements of a call from its
#: ``(args, kwargs, out)``). PyTorch's CPU kernels of these two are neither matmuls nor
#: copy-speed streams: batch-norm's training forward (``batch_norm_cpu_collect_stats`` then the
#: transform) ran at 6.3-6.6 GB/s of input + output on this AMD EPYC for every shape tried, where
#: a copy runs at 17-30 GB/s, and a 2 x 2 max-pool at 0.23 G window elements/s whatever the
#: shape (channels-first, no vectorization across the window); in the demo CNN's step those two
#: took 3.2 of 7.9 ms of kernel time, priced 0.4 ms on the plain roofline.
ELEMENT_RATE_OPS: dict[Any, tuple[str, Callable[[Sequence[Any], Mapping, Any], float]]] = {
    aten.native_batch_norm: ("batch_norm_train", _bn_train_elements),
    aten._native_batch_norm_legit: ("batch_norm_train", _bn_train_elements),
    aten._native_batch_norm_legit_functional: ("batch_norm_train", _bn_train_elements),
    aten.max_pool2d_with_indices: ("max_pool2d", _pool_window_elements),
}


def _bn_backward_second_pass(args: Sequence[Any], kwargs: Mapping) -> float:
    """Bytes that ``native_batch_norm_backward`` (training, input gradient wanted) reads twice on
    a CPU: ``grad_out`` and ``input`` (ATen's ``batch_norm_cpu_backward``: a first pass sums
    ``grad_out`` and ``grad_out x (input - mean)`` per channel, a second reads both again to
    write ``grad_input``)."""
    train = args[7] if len(args) > 7 else kwargs.get("train", False)
    mask = args[9] if len(args) > 9 else kwargs.get("output_mask", (True, True, True))
    if not train or not mask or not mask[0]:
        return 0.0
    return float(_tensor_bytes(args[0]) + _tensor_bytes(args[1]))


#: memory traffic of a CPU kernel beyond "every input read once, every output written once":
#: op packet -> extra bytes from ``(args, kwargs)``, counted on ``cpu`` only (:class:`OpCounter`
#: with ``gpu=False``; the GPU presets' kernels are other code). Batch-norm's backward re-reads
#: its two large inputs (5 tensor-sized streams, not 3): in the demo CNN's step it ran at about the
#: copy bandwidth on those 5 streams (0.40 ms measured, 0.33 ms so priced, 0.20 ms on 3 streams).
CPU_EXTRA_BYTES: dict[Any, Callable[[Sequence[Any], Mapping], float]] = {
    aten.native_batch_norm_backward: _bn_backward_second_pass,
}


def _element_rate(packet, args: Sequence[Any], kwargs: Mapping, out: Any) -> tuple[str, float]:
    entry = ELEMENT_RATE_OPS.get(packet)
    if entry is None:
        return "", 0.0
    try:
        elements = entry[1](args, kwargs, out)
    except (IndexError, KeyError, AttributeError, TypeError, ValueError):
        return "", 0.0
    return (entry[0], elements) if elements else ("", 0.0)


class OpCounter(TorchDispatchMode):
    """Records every aten operator that launches a kernel (:class:`Op`) while active.

    Views, aliases, allocations and metadata ops run but are not recorded
    (:func:`_launches_nothing`). ``decompose`` (the twin step): an op the FLOP registry does not
    list is first offered its decomposition, as :class:`~torch.utils.flop_counter.FlopCounterMode`
    does, so both count the same FLOPs; off for live counting (a decomposition may round
    differently from the fused kernel). ``gpu``: count a ``_foreach_`` op's CUDA launches, else one
    per tensor and the CPU kernels' extra passes (:data:`CPU_EXTRA_BYTES`).

    Attributes:
        ops: the recorded :class:`Op` list, in execution order.
        matmul_flops: running total of :attr:`Op.matmul_flops` (read by backward hooks).
    """

    def __init__(self, decompose: bool = False, gpu: bool = True):
        super().__init__()
        self.decompose, self.gpu = decompose, gpu
        self.ops: list[Op] = []
        self.matmul_flops = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _launches_nothing(func):
            return func(*args, **kwargs)
        if self.decompose and func._overloadpacket not in flop_registry and func._overloadpacket not in EXTRA_FLOPS:
            with self:
                r = func.decompose(*args, **kwargs)
            if r is not NotImplemented:
                return r
        out = func(*args, **kwargs)
        self.ops.append(self._record(func, args, kwargs, out))
        return out

    def _record(self, func, args, kwargs, out) -> Op:
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if not outs:  # an in-place op that returns nothing (``_foreach_add_``): it writes its mutated arguments
            schema = func._schema.arguments
            outs = [t for a, v in zip(schema, args) if a.alias_info is not None and a.alias_info.is_write
                    for t in tree_flatten(v)[0] if isinstance(t, torch.Tensor)]
        nbytes = float(sum(_tensor_bytes(t) for t in ins) + sum(_tensor_bytes(t) for t in outs))
        packet = func._overloadpacket
        if not self.gpu and packet in CPU_EXTRA_BYTES:
            try:
                nbytes += CPU_EXTRA_BYTES[packet](args, kwargs)
            except (IndexError, KeyError, AttributeError, TypeError):
                pass
        counted = packet in flop_registry or packet in EXTRA_FLOPS
        if packet in flop_registry:
            matmul = float(flop_registry[packet](*args, **kwargs, out_val=out))
        elif packet in EXTRA_FLOPS:
            matmul = float(EXTRA_FLOPS[packet](*args, **kwargs))
        else:
            matmul = 0.0
        self.matmul_flops += matmul
        flops = matmul if counted else float(max((t.numel() for t in ins + outs), default=0))
        launches = 1
        if func.__name__.startswith("_foreach_"):
            lists = [a for a in args if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
            if lists:
                launches = foreach_launches(lists) if self.gpu else len(lists[0])
            if matmul == 0.0:
                flops = float(sum(t.numel() for t in lists[0])) if lists else flops
        special = float(max((t.numel() for t in ins + outs), default=0)) if packet in SPECIAL_OPS else 0.0
        rate_key, rate_elements = _element_rate(packet, args, kwargs, out)
        return Op(str(func), flops, nbytes, launches, matmul, special, gemm_min_dim(packet, args),
                  _fresh_bytes(func, out), conv_min_dim(packet, args), rate_key, rate_elements)


def _fresh_bytes(func, out) -> float:
    """Bytes of ``func``'s outputs that are new allocations of at least
    :data:`FRESH_ALLOCATION_BYTES`: returns its schema does not alias to an argument (an in-place
    or ``out=`` op writes memory that already exists)."""
    returns = getattr(getattr(func, "_schema", None), "returns", None)
    if not returns:
        return 0.0
    values = out if isinstance(out, (tuple, list)) and len(returns) > 1 else (out,)
    total = 0.0
    for r, v in zip(returns, values):
        if r.alias_info is not None:
            continue
        for t in tree_flatten(v)[0]:
            if isinstance(t, torch.Tensor):
                n = _tensor_bytes(t)
                if n >= FRESH_ALLOCATION_BYTES:
                    total += n
    return total


@dataclass
class StepCount:
    """The operators of one training step, by phase (:func:`count_step`).

    Attributes:
        forward, backward, optimizer: the :class:`Op` lists (``optimizer`` empty without one).
        grad_ready: ``{parameter name: backward matmul FLOPs done when its gradient is final}``.
    """

    forward: list[Op]
    backward: list[Op]
    optimizer: list[Op]
    grad_ready: dict[str, float]


def _twin_optimizer(optimizer: torch.optim.Optimizer, model: nn.Module, twin: nn.Module,
                    foreach: bool | None) -> torch.optim.Optimizer:
    """An optimizer of ``optimizer``'s class and param groups over ``twin``'s parameters, with a
    deep copy of its state; ``foreach`` (when not None) set in every group that has the option."""
    twin_of = {id(p): q for p, q in zip(model.parameters(), twin.parameters())}
    groups = []
    for g in optimizer.param_groups:
        group = {k: v for k, v in g.items() if k != "params"}
        if foreach is not None and "foreach" in group:
            group["foreach"] = foreach
        group["params"] = [twin_of[id(p)] for p in g["params"] if id(p) in twin_of]
        groups.append(group)
    try:
        opt = type(optimizer)(groups)
    except TypeError:
        opt = type(optimizer)(groups, **optimizer.defaults)
    for p, state in optimizer.state.items():
        if id(p) in twin_of:
            opt.state[twin_of[id(p)]] = copy.deepcopy(state)
    return opt


def count_step(
    model: nn.Module, x: Any, y: Any, loss_fn: Callable[[Any, Any], torch.Tensor],
    optimizer: torch.optim.Optimizer | None = None, gpu: bool = True,
) -> StepCount:
    """The operators of one training step on ``(x, y)``, counted with :class:`OpCounter`.

    Forward ``loss_fn(model(x), y)``, ``loss.backward()`` and, with ``optimizer``, its ``step()``
    run on a deep copy of ``model`` (same mode and device) and of the optimizer (its class, param
    groups and state; :func:`_twin_optimizer`), each under its own counter. The model's parameters,
    buffers (BatchNorm statistics), gradients and hooks and the optimizer's state are untouched; the
    global CPU and CUDA RNG states (dropout) are saved and restored. The optimizer is stepped once
    uncounted first, so the counted step is a steady-state one (momentum buffers exist, as in every
    step but the first). ``gpu``: the target is a GPU, whose optimizers torch runs as ``foreach``
    (multi-tensor) kernels by default: the twin optimizer then uses ``foreach=True``; on ``cpu``
    torch's default (a for-loop over parameters) is kept. Costs one extra forward/backward, two
    optimizer steps and, for the copies, the model's and optimizer state's memory once more.

    Args:
        model: a plain ``nn.Module`` (not a DDP wrapper: its backward would communicate).
        x, y: one local batch, already on the model's device.
        loss_fn: ``loss_fn(model(x), y)`` -> a scalar tensor.
        optimizer: the run's optimizer over ``model.parameters()``, or None.
        gpu: see above.
    """
    rng = _rng_states()
    try:
        twin = copy.deepcopy(model)
        for p in twin.parameters():
            p.grad = None
        forward = OpCounter(decompose=True, gpu=gpu)
        with forward:
            loss = loss_fn(twin(x), y)
        backward = OpCounter(decompose=True, gpu=gpu)
        ready: dict[str, float] = {}

        def at_ready(name: str):
            def hook(_param) -> None:
                ready[name] = backward.matmul_flops
            return hook

        hooks = [p.register_post_accumulate_grad_hook(at_ready(n)) for n, p in twin.named_parameters()
                 if p.requires_grad]
        try:
            with backward:
                loss.backward()
        finally:
            for h in hooks:
                h.remove()
        step = OpCounter(decompose=True, gpu=gpu)
        if optimizer is not None:
            twin_opt = _twin_optimizer(optimizer, model, twin, True if gpu else None)
            twin_opt.step()  # uncounted: initializes the state (momentum buffers, Adam's moments)
            with step:
                twin_opt.step()
        return StepCount(forward.ops, backward.ops, step.ops, ready)
    finally:
        _set_rng_states(rng)


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
    """(forward FLOPs, backward FLOPs) of one training step on the batch ``(x, y)``: the
    matmul-family FLOPs of :func:`count_step` (the counts of
    :class:`torch.utils.flop_counter.FlopCounterMode`: 2 FLOPs per multiply-accumulate of every
    matmul, convolution and attention product; elementwise ops not counted), on a twin of
    ``model`` (untouched, RNG states restored).

    Args:
        grad_ready: when given, filled with ``{parameter name: backward FLOPs done when its
            gradient is final}`` (read by a post-accumulate-grad hook on each parameter; names as
            ``model.named_parameters()``; parameters that get no gradient are left out). The
            gradient of a parameter used twice (tied weights) is final at its last accumulation.
    """
    counted = count_step(model, x, y, loss_fn)
    if grad_ready is not None:
        grad_ready.update(counted.grad_ready)
    return (sum(op.matmul_flops for op in counted.forward), sum(op.matmul_flops for op in counted.backward))


# -------------------------------------------------------------------------------- pricing
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
        device that measured that rate (:data:`ELEMENT_RATE_OPS`); plus ``special /
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
    :func:`resolve_speeds`).

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
        ConfigError: an invalid ``cluster`` key (:func:`validate_cluster`'s messages).
        ValueError: ``speed`` not a number > 0.
    """

    def __init__(self, cluster: Mapping, speed: float = 1.0):
        _validate_compute(cluster)
        if not (_is_number(speed) and speed > 0):
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
        ``cpu`` adds ``cpu_calibration`` (the record of :func:`calibrate_cpu` used).
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
