"""Counting a training step's operators: the FLOPs, bytes and kernels of every aten operator it runs
(:class:`OpCounter`, :func:`count_step`).

One training step is counted once (:meth:`lsgd.compute.model.ComputeModel.calibrate`, on the first
batch, on a deep copy of the model and of the optimizer: :func:`count_step`) with a ``TorchDispatchMode``
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

On a GPU preset the twin optimizer runs torch's ``foreach`` kernels, torch's default on CUDA; on
``cpu`` its default for-loop. The device's roofline prices the counted operators
(:mod:`lsgd.compute.roofline`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

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


#: glibc's largest mmap threshold on a 64-bit system (``DEFAULT_MMAP_THRESHOLD_MAX`` = 4 MiB x
#: sizeof(long), ``mallopt(3)``): an allocation at least this large is always a fresh ``mmap``,
#: whose pages fault on first write (:attr:`lsgd.compute.roofline.DeviceSpec.first_touch_bandwidth`)
FRESH_ALLOCATION_BYTES = 32 * 2**20


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
            0; priced at the device's :meth:`lsgd.compute.roofline.DeviceSpec.matmul_rate` for
            that dimension.
        fresh_bytes: bytes of the op's newly allocated outputs (not in-place, not ``out=``) of at
            least :data:`FRESH_ALLOCATION_BYTES` each, priced at the device's
            ``first_touch_bandwidth`` where it has one.
        conv_dim: the GEMM's smallest dimension of a convolution (:func:`conv_min_dim`), else 0;
            priced at the device's :meth:`lsgd.compute.roofline.DeviceSpec.conv_rate` for it where
            it has a conv curve.
        rate_key, rate_elements: for an op of :data:`ELEMENT_RATE_OPS`, its key and its elements
            (else ``""`` and 0); its compute term is at least ``rate_elements / rate`` on a
            device that measured that rate (:attr:`lsgd.compute.roofline.DeviceSpec.element_rates`).
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


#: matmul ops priced by their shape (:attr:`Op.min_dim`,
#: :meth:`lsgd.compute.roofline.DeviceSpec.matmul_rate`), with the positions of their two GEMM
#: operands: ``mm(a, b)``, ``addmm(bias, a, b)``, ``bmm(a, b)``, ``baddbmm(self, a, b)``.
#: Convolutions are left at the square rate: oneDNN runs them as direct convolutions, not as one
#: GEMM of a known shape, and the CNN and ResNet-20 profiles are already within 25% of measured
#: without a shape term (``scripts/bench_compute_model.py``); attention (``_scaled_dot_product_*``)
#: likewise (a fused kernel).
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


#: convolution ops priced by their shape (:attr:`Op.conv_dim`,
#: :meth:`lsgd.compute.roofline.DeviceSpec.conv_rate`), with the positions of their weight and
#: ``groups`` arguments: ``convolution(input, weight, bias,
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


#: ops priced at a measured per-element rate on ``cpu``
#: (:attr:`lsgd.compute.roofline.DeviceSpec.element_rates`, measured by
#: :func:`lsgd.compute.calibration.measure_element_rates`): op packet -> (rate key, elements of a
#: call from its ``(args, kwargs, out)``). PyTorch's CPU kernels of these two are neither matmuls nor
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

