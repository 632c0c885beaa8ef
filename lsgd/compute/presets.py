"""The device presets of ``cluster.device``: the published peak FLOP/s, memory bandwidth and launch
cost of each GPU, the ``cpu`` preset (this machine, measured: :mod:`lsgd.compute.calibration`), and
:func:`device_spec`, a device's :class:`~lsgd.compute.roofline.DeviceSpec` by name.

Device peaks
------------
:data:`DEVICE_PEAK_FLOPS` holds the published dense (no structured sparsity) FP16/BF16 tensor-core
peak of each accelerator, the rate mixed-precision training runs at; see its table.
"""

from __future__ import annotations

from lsgd.compute.calibration import cpu_spec
from lsgd.compute.roofline import DeviceSpec
from lsgd.core.errors import ConfigError

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
# cpu     this machine     measured      measured     ``lsgd calibrate`` (:func:`lsgd.compute.calibration.calibrate_cpu`)
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
