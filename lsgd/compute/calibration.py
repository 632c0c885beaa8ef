"""The ``cpu`` device preset: ``lsgd calibrate`` measures this machine's roofline figures and keeps
them in the calibration file, from which ``cluster.device=cpu`` reads them.

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

How the ``cpu`` profile holds against measured steps
----------------------------------------------------
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
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lsgd.compute.opcount import count_step
from lsgd.compute.roofline import DeviceSpec
from lsgd.core.errors import ConfigError
from lsgd.core.files import write_atomic

log = logging.getLogger(__name__)

aten = torch.ops.aten

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
    :data:`lsgd.compute.opcount.FRESH_ALLOCATION_BYTES`): ``bytes / (t_fresh - t_reused)``, where
    ``t_fresh`` fills a newly allocated tensor (``torch.empty(n).fill_``: each page faults, the
    kernel zeroes it, then the fill writes it) and ``t_reused`` fills one already mapped (the write
    alone)."""
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
    MiB block (below :data:`lsgd.compute.opcount.FRESH_ALLOCATION_BYTES`), which raises glibc's
    dynamic mmap threshold to its size (``mallopt(3)``: freeing an mmapped chunk of at most 32 MiB
    sets ``M_MMAP_THRESHOLD`` to it), so later allocations below it come from the heap, as a step's
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
    GEMM's smallest dimension of such a convolution is c
    (:func:`lsgd.compute.opcount.conv_min_dim`: min(c, 9c))."""
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
    """``{key: elements/s}`` of every op of :data:`lsgd.compute.opcount.ELEMENT_RATE_OPS`, each timed on a float32
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
      the rate of transcendental functions (exp, log, tanh, erf;
      :data:`lsgd.compute.opcount.SPECIAL_OPS`), which on a CPU cost tens of FLOP-equivalents per
      element and set the time of softmax and GELU.
    * ``conv_curve``: ``[[c, FLOP/s], ...]``: 3 x 3 convolutions of c -> c channels, forward and
      backward (:func:`measure_conv_curve`, c in :data:`CONV_CURVE_C`): the rate of a
      convolution whose GEMM's smallest dimension is c (:meth:`DeviceSpec.conv_rate`).
    * ``element_rates``: ``{key: elements/s}`` of batch-norm's training forward and max-pooling
      (:func:`measure_element_rates`, :data:`lsgd.compute.opcount.ELEMENT_RATE_OPS`).
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
    write_atomic(path, text)
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
