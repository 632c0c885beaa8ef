"""``adasum``: adaptive summation of gradients or optimizer deltas (docs/papers.md#adasum).

Source: Maleki, Musuvathi, Mytkowicz, Saarikivi, Xu, Eksarevskiy, Ekanayake and Barsoum,
"Scaling Distributed Training with Adaptive Summation", MLSys 2021; the reduction follows Horovod's
``AdasumMPI`` (``horovod/common/ops/adasum/adasum.h``, ``FusedAllreduce`` and
``FusedPairwiseReduceWithComm``).

The pairwise operator (:func:`adasum_pair`)::

    Adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

gives the sum of orthogonal inputs and the mean of parallel ones, whatever their scales. Dot products
and squared norms are accumulated in float64; a coefficient is 1 where its squared norm is below
``sqrt(DBL_MIN)`` (about 1.49e-154), so a zero input leaves the other input unchanged. The combination
itself is computed in float32 for float16, bfloat16 and float32 inputs (float64 for float64 inputs)
from the float64 coefficients rounded to that type, then cast back to the input dtype once.

Adasum is not associative, so the tree order is part of the definition. For ``p`` ranks, let ``q``
be the largest power of two ``<= p``:

1. fold: each extra rank ``r = q .. p-1`` is combined into rank ``r - q``:
   ``g_{r-q} <- Adasum(g_{r-q}, g_r)`` (lower rank first);
2. binary tree over ranks ``0 .. q-1`` pairing ``(2i, 2i+1)`` at every level, lower half first:
   ``Adasum(Adasum(g0, g1), Adasum(g2, g3))`` for ``q = 4``;
3. every folded rank ``r`` receives the result from rank ``r - q``.

Each tensor of the list is reduced separately (per-tensor coefficients, as Horovod applies Adasum per
weight and bias). :func:`adasum_tree_reference` is the plain single-process statement of this
definition; :func:`adasum_reduce_` computes it with Horovod's vector-halving distance-doubling
algorithm (see its docstring for the communication and the bytes it sends). Horovod itself supports
only power-of-two rank counts (issue #3400); the fold above extends it to any ``p``.
:func:`adasum_reduce_hierarchical_` is Horovod's GPU hierarchy (Adasum across nodes of the node
means: reduce-scatter inside the node, Adasum across nodes on each shard, all-gather inside the
node). All communication goes through :class:`lsgd.comm.communicator.Communicator` (point-to-point
:meth:`~lsgd.comm.communicator.Communicator.sendrecv` and the node's collectives), which counts it and advances
the cluster clock.

Where the time goes (per rank and call, wall microseconds per item, means over ranks ``< q`` of
medians over 40 calls; ``scripts/bench_adasum.py``'s lists, gloo ranks sharing 2 cores, 26 Nov 2026,
load average 4-6; "before" is the torch path, ``LSGD_ADASUM_FUSED=0``, in the same hold)::

    1M list (57 tensors)       4 ranks: before -> now       8 ranks: before -> now
    total wall / CPU           15.9 / 6.4 ms -> 13.0 / 5.0  39.1 / 9.2 ms -> 30.9 / 6.9
    dot products, levels 0..   801, 417 -> 429, 216         891, 518, 333 -> 457, 248, 142
    combination, levels 0..    280, 164 -> 82, 46           342, 225, 153 -> 113, 64, 40
    concatenate / copy back    ~160 / ~390                  ~220 / ~410
    post the receives          385 -> 344                   639 -> 800
    halving exchanges          2342, 1506 -> 1805, 874      5079, 3258, 1729 -> 4451, 2241, 1339
    all-gather exchanges       943, 1732 -> 754, 1437       1226, 1480, 2900 -> 935, 1369, 3081
    dot-vector exchanges       807, 764, 662                2367, 1981, 959, 1223, 775, 1039
                               -> 576, 527, 418             -> 1428, 1129, 632, 793, 533, 628

    ResNet-50 (161 tensors, 102 MB), 4 ranks: concatenation into fresh memory 68 ms of 285 (now a
    kept buffer), dot products 39.6 -> 24.5 ms, combination 15.6 -> 8.9 ms, copy back 15-19 ms,
    exchanges most of the rest.

The exchanges wait for the partner's compute and for a core (more ranks than cores); each dependent
message also paid a round trip until every receive was posted ahead
(:meth:`~lsgd.comm.communicator.Communicator.post_recv`; see :func:`adasum_reduce_`; the message pattern with
the compute stubbed out is cheaper than the all-reduce, 0.89x). The compute is the CPU per rank,
and with 4-8 ranks on 2 cores the wall time follows it: the float64 dot products and the
combination of float32 buffers run in one compiled pass each (:mod:`lsgd.algorithms.adasum.kernels`,
numba), in one fixed order, which on this project's AMD machines is bit for bit what the torch path
computes: the float32 products are exact in float64, and the kernel adds them in the orders MKL's
``dgemv`` / ``ddot``, ``index_add_`` and ``segment_reduce`` use there (read off the library; a test
holds the kernel to the torch path where :func:`torch_order_matches`), and the combination rounds as
ATen's ``mul_`` then ``add_(alpha=)`` (a fused multiply-add) do. On another CPU the torch path adds
in another order and the kernels keep theirs (the same bits on every machine; :func:`fused_kernels`). One process, the 1M list's
level-0 region (475K floats): dot products 518 -> 350 us, combination 149 -> 42 us. The dot
products stay sequential chains (their order is the torch path's; numba leaves LLVM's SLP
vectorizer off, so the four lanes are not packed into one vector), which is why they cost more than
the combination. The torch path stays for float64 / float16 / bfloat16 buffers, for several torch
threads (MKL then splits its sums between threads, another order), on CUDA (its ``vectorized``
path), and without numba. The concatenation and the copy back are plain memory copies, paid by the
all-reduce as well.

The training algorithm :class:`Adasum` (config ``algo.name=adasum``) applies the reduction either to
the gradients (``target=gradient``, replacing the gradient all-reduce) or, as Horovod does with an
optimizer, to the delta of a local optimizer step (``target=delta``).
"""

from __future__ import annotations

import bisect
import importlib
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from lsgd.algorithms.base import AlgoConfig, Algorithm, float_buffers
from lsgd.comm.communicator import Communicator
from lsgd.core.errors import ConfigError
from lsgd.core.typed_config import option

DBL_MIN = 2.2250738585072014e-308
#: squared norms below this give a coefficient of exactly 1 (sqrt(DBL_MIN) ~ 1.49e-154)
NORM_THRESHOLD = DBL_MIN**0.5
TARGETS = ("gradient", "delta")
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: elements per float64 chunk of the CPU dot-product kernel (two rows of 64K doubles stay in cache)
_CHUNK = 1 << 16


# -- the pairwise operator and the reference tree ---------------------------------------------
def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype of the combination step: float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _coefficients(dot: Tensor, anormsq: Tensor, bnormsq: Tensor) -> tuple[Tensor, Tensor]:
    """Float64 coefficients (ca, cb) of Adasum from float64 a.b, |a|^2, |b|^2 (any equal shapes)."""
    one = torch.ones_like(dot)
    ca = torch.where(anormsq >= NORM_THRESHOLD, 1.0 - dot / (2.0 * anormsq), one)
    cb = torch.where(bnormsq >= NORM_THRESHOLD, 1.0 - dot / (2.0 * bnormsq), one)
    return ca, cb


def _check_float(t: Tensor) -> None:
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"Adasum needs float16, bfloat16, float32 or float64 tensors, got {t.dtype}")


def adasum_pair(a: Tensor, b: Tensor) -> Tensor:
    """Adasum of two tensors: ``(1 - a.b/(2|a|^2)) a + (1 - a.b/(2|b|^2)) b`` (a new tensor).

    Dot product and squared norms over all elements in float64; a coefficient is 1 where its squared
    norm is below ``sqrt(DBL_MIN)``; the combination in float32 (float64 for float64 inputs), cast
    back to the input dtype. Source: Maleki et al., MLSys 2021, Eq. (6); Horovod ``adasum.h``.

    Args:
        a, b: tensors of the same shape, dtype (float16, bfloat16, float32 or float64) and device.

    Returns:
        A tensor of that shape and dtype.

    Raises:
        ValueError: shapes, dtypes or devices differ.
        TypeError: not a floating dtype listed above.
    """
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        raise ValueError(
            f"adasum_pair needs equal shapes, dtypes and devices: {tuple(a.shape)} {a.dtype} {a.device} "
            f"vs {tuple(b.shape)} {b.dtype} {b.device}"
        )
    _check_float(a)
    a64, b64 = a.detach().reshape(-1).double(), b.detach().reshape(-1).double()
    ca, cb = _coefficients(torch.dot(a64, b64), torch.dot(a64, a64), torch.dot(b64, b64))
    cd = _compute_dtype(a.dtype)
    return (a.detach().to(cd) * ca.to(cd) + b.detach().to(cd) * cb.to(cd)).to(a.dtype)


def _tree(values: list[Tensor]) -> Tensor:
    p = len(values)
    q = 1 << (p.bit_length() - 1)
    vals = [adasum_pair(values[i], values[i + q]) if i + q < p else values[i] for i in range(q)]
    while len(vals) > 1:
        vals = [adasum_pair(vals[2 * i], vals[2 * i + 1]) for i in range(len(vals) // 2)]
    return vals[0]


def adasum_tree_reference(per_rank: list[list[Tensor]]) -> list[Tensor]:
    """Single-process reference of :func:`adasum_reduce_`: the Adasum tree, tensor by tensor.

    For ``p = len(per_rank)`` and ``q`` the largest power of two ``<= p``: fold ``g_i <-
    adasum_pair(g_i, g_{i+q})`` for ``i < p - q``, then pair ``(2i, 2i+1)`` level by level (the
    module docstring). Inputs are not modified.

    Args:
        per_rank: ``per_rank[r][i]`` is tensor ``i`` of rank ``r``; every rank has the same number of
            tensors and tensor ``i`` has the same shape and dtype on every rank.

    Returns:
        ``[Adasum over ranks of tensor i for i ...]`` (new tensors, input shapes and dtypes).

    Raises:
        ValueError: ``per_rank`` is empty or the ranks hold different numbers of tensors (and
            :func:`adasum_pair`'s errors for mismatched tensors).
    """
    if not per_rank:
        raise ValueError("adasum_tree_reference needs at least one rank")
    if any(len(ts) != len(per_rank[0]) for ts in per_rank):
        raise ValueError("every rank must hold the same number of tensors")
    return [_tree([ts[i] for ts in per_rank]) for i in range(len(per_rank[0]))]


# -- segment bookkeeping on the flat buffer ---------------------------------------------------
class _Layout:
    """Offsets of the tensors in one flat buffer; ``segments(lo, hi)`` lists the non-empty
    intersections ``(tensor index, start, end)`` with ``[lo, hi)`` in buffer coordinates."""

    def __init__(self, numels: Sequence[int]):
        self.numels = list(numels)
        self.starts = [0]
        for n in self.numels:
            self.starts.append(self.starts[-1] + n)
        self.n = self.starts[-1]

    def segments(self, lo: int, hi: int) -> list[tuple[int, int, int]]:
        out = []
        i = max(bisect.bisect_right(self.starts, lo) - 1, 0)
        while i < len(self.numels) and self.starts[i] < hi:
            s, e = max(self.starts[i], lo), min(self.starts[i + 1], hi)
            if e > s:
                out.append((i, s, e))
            i += 1
        return out


#: pieces (a tensor's part of a region) shorter than this (and than ``_CHUNK``) are reduced and
#: combined together, gathered into one buffer, by the CPU kernels; longer ones one by one
_SMALL = 1 << 12


class _Plan:
    """How the CPU kernels split a region ``[lo, lo + cover)`` (its segments from
    :meth:`_Layout.segments`): ``big`` pieces ``(tensor, start, end)`` (region coordinates) one by
    one; the ``small`` ones gathered by ``idx`` (their elements' region positions, in segment
    order; ``lengths`` and tensor ``ids`` per piece). Built once per region and kept
    (:func:`_plan`): a training run reduces the same regions every step."""

    def __init__(self, segs, lo: int, small: int, chunk: int, device: torch.device):
        self.big = [(t, s - lo, e - lo) for t, s, e in segs if e - s >= small]
        # the long pieces' chunks (tensor, start, end) for the dot products
        self.chunks = [(t, c0, min(c0 + chunk, e)) for t, s, e in self.big for c0 in range(s, e, chunk)]
        if self.chunks:
            self.chunk_ids = torch.tensor([t for t, _, _ in self.chunks], device=device)
            self.chunk_len = max(c1 - c0 for _, c0, c1 in self.chunks)
        # the float64 buffer's second row is 8 bytes off a 16-byte boundary: MKL's ddot peels one element
        self.peel = bool(self.chunks) and self.chunk_len % 2 == 1
        pieces = [(t, s - lo, e - lo) for t, s, e in segs if e - s < small]
        self.n_small = len(pieces)
        # the chunks and the short pieces as (start, end, tensor) int64 arrays, region coordinates,
        # for the compiled kernel (adasum_fused.partial_dots)
        self.np_chunks = [np.array([c[i] for c in self.chunks], dtype=np.int64) for i in (1, 2, 0)]
        self.np_chunks.insert(3, np.argsort([c1 - c0 for _, c0, c1 in self.chunks], kind="stable").astype(np.int64))
        self.np_small = [np.array([c[i] for c in pieces], dtype=np.int64) for i in (1, 2, 0)]
        self.np_big = [np.array([c[i] for c in self.big], dtype=np.int64) for i in (1, 2, 0)]
        if pieces:
            lengths = [e - s for _, s, e in pieces]
            self.ids = torch.tensor([t for t, _, _ in pieces], device=device)
            self.lengths = torch.tensor(lengths, device=device)
            self.lengths3 = self.lengths.expand(3, -1).contiguous()  # segment_reduce along dim 1
            self.idx = torch.cat([torch.arange(s, e, device=device) for _, s, e in pieces])
            self.total = sum(lengths)


_PLANS: dict = {}

_UNSET = object()
_FUSED = _UNSET


def fused_kernels():
    """The compiled kernels (:mod:`lsgd.algorithms.adasum.kernels`), or None: turned off (environment
    ``LSGD_ADASUM_FUSED=0``), numba missing, or the module fails to compile (a warning, once per
    process). Without them :func:`_partial_dots` and :func:`_combine_` take their torch paths.

    The kernels add in one fixed order (the module's docstring): the order in which MKL and ATen
    add on this project's AMD EPYC machines, so there they give the torch path's bits
    (:func:`torch_order_matches`). On another CPU or BLAS the torch path itself adds in another
    order (MKL picks its kernels by CPU; ATen's by ``ATEN_CPU_CAPABILITY``); the kernels keep theirs,
    so a float32 Adasum reduction on CPU gives the same bits on every machine, and differs from
    that machine's torch path only by the reordering of exact float64 products (within
    ``(n - 1) 2**-53 sum |a_i b_i|`` per dot product) and, in the combination, by one float32
    rounding where the torch path does not fuse its multiply-add."""
    global _FUSED
    if _FUSED is _UNSET:
        _FUSED = None
        if os.environ.get("LSGD_ADASUM_FUSED", "1") != "0":
            try:
                _FUSED = importlib.import_module("lsgd.algorithms.adasum.kernels")
            except Exception as exc:  # ImportError (no numba), numba's typing / lowering errors
                warnings.warn(f"adasum: numba's fused kernels unavailable ({type(exc).__name__}: {exc}); "
                              "using the torch path", RuntimeWarning, stacklevel=2)
    return _FUSED


_MATCHES: bool | None = None


def torch_order_matches() -> bool:
    """Whether the fused kernels give this machine's torch path bit for bit (:func:`_agrees_with_torch`
    on a small probe, once per process); False without the kernels. A diagnostic (the tests hold the
    kernels to the torch path's bits where it is True); the kernels are used either way."""
    global _MATCHES
    if _MATCHES is None:
        kernels = fused_kernels()
        _MATCHES = kernels is not None and _agrees_with_torch(kernels)
    return _MATCHES


def _agrees_with_torch(module) -> bool:
    """Whether ``module``'s kernels give the torch path's bits here, on a small probe (tensors of
    3, 4097, 37, 4100 and 9 elements: long and short pieces, odd and even chunk buffers, every
    length modulo 8 in the tails), one torch thread; about a millisecond, once per process. The
    kernels reproduce the orders of MKL's code paths on this project's machines: on another CPU
    or BLAS the orders can differ (:func:`fused_kernels`)."""
    global _FUSED
    g = torch.Generator().manual_seed(0)
    layout = _Layout([3, 4097, 37, 4100, 9])
    a, b = torch.randn(layout.n, generator=g), torch.randn(layout.n, generator=g)
    c_a = torch.rand(5, generator=g, dtype=torch.float64) + 0.5
    c_b = torch.rand(5, generator=g, dtype=torch.float64) + 0.5
    threads = torch.get_num_threads()
    saved = _FUSED
    try:
        torch.set_num_threads(1)
        out = []
        for kernels in (module, None):
            _FUSED = kernels
            res = []
            for lo, hi in ((0, layout.n), (0, 4100), (5, layout.n - 7)):
                segs = layout.segments(lo, hi)
                res.append(_partial_dots(a[lo:hi], b[lo:hi], segs, lo, 5, False))
                own = a[lo:hi].clone()
                _combine_(own, b[lo:hi], c_a, c_b, segs, lo, False)
                res.append(own)
            out.append(res)
        return all(torch.equal(x, y) for x, y in zip(*out))
    finally:
        _FUSED = saved
        torch.set_num_threads(threads)


def _plan(segs, lo: int, device: torch.device) -> _Plan:
    """The cached :class:`_Plan` of a region (at most 256 kept; the oldest is dropped)."""
    small = min(_SMALL, _CHUNK)
    key = (tuple(segs), lo, small, _CHUNK, str(device))
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= 256:
            del _PLANS[next(iter(_PLANS))]
        plan = _PLANS[key] = _Plan(segs, lo, small, _CHUNK, device)
    return plan


def _partial_dots(a: Tensor, b: Tensor, segs, lo: int, num: int, vectorized: bool) -> Tensor:
    """Float64 ``[a.b | |a|^2 | |b|^2]`` per tensor (shape ``(3 * num,)``) restricted to the region
    ``[lo, lo + a.numel())`` of the buffer; tensors outside the region contribute 0, and so do
    elements past the last tensor (the padding at the end of a hierarchical buffer).

    ``vectorized`` (CUDA): one float64 copy of the region and ``segment_reduce``. Otherwise (CPU),
    the region's :class:`_Plan`: each long piece in chunks of ``_CHUNK`` elements converted to
    float64 in a cache-resident buffer, ``[a; b] a`` (one BLAS gemv: ``|a|^2`` and ``a.b``) and
    ``b.b`` per chunk (measured here: 0.39 ns per element against 0.54 for the 2 x 2 Gram matrix
    ``[a; b] [a; b]^T``), summed per tensor with ``index_add_`` in a fixed order; the
    short pieces (BatchNorm vectors, biases) all at once: gathered, converted to float64, the
    three products and one ``segment_reduce``, a handful of kernels however many there are.
    Float64 products of float32 (or narrower) inputs are exact; only the summation order differs
    between the kernels.
    """
    out = torch.zeros(3, num, dtype=torch.float64, device=a.device)
    if not segs:
        return out.reshape(-1)
    if vectorized:
        cover = segs[-1][2] - lo  # the segments tile [lo, cover); only padding follows
        a64, b64 = a[:cover].double(), b[:cover].double()
        ids = torch.tensor([t for t, _, _ in segs], device=a.device)
        lengths = torch.tensor([e - s for _, s, e in segs], device=a.device)
        for row, prod in enumerate((a64 * b64, a64 * a64, b64 * b64)):
            out[row, ids] = torch.segment_reduce(prod, "sum", lengths=lengths)
        return out.reshape(-1)
    plan = _plan(segs, lo, a.device)
    # the kernel reproduces MKL's single-threaded orders; with more threads MKL splits the sums
    fused = (fused_kernels() if a.dtype == torch.float32 and b.dtype == torch.float32
             and torch.get_num_threads() == 1 else None)
    if fused is not None:
        res = np.zeros((3, num), dtype=np.float64)
        fused.partial_dots(a.numpy(), b.numpy(), *plan.np_chunks, *plan.np_small, plan.peel, res)
        return torch.from_numpy(res).reshape(-1)
    if plan.chunks:
        buf = torch.empty(2, plan.chunk_len, dtype=torch.float64, device=a.device)
        # per chunk [|a|^2, a.b, |b|^2]: [a; b] a (one BLAS gemv reads both rows once) and b.b
        vals = torch.empty(len(plan.chunks), 3, dtype=torch.float64, device=a.device)
        for i, (_, c0, c1) in enumerate(plan.chunks):
            piece = buf[:, : c1 - c0]
            piece[0].copy_(a[c0:c1])
            piece[1].copy_(b[c0:c1])
            torch.mv(piece, piece[0], out=vals[i, :2])
            torch.dot(piece[1], piece[1], out=vals[i, 2])
        sums = torch.zeros(num, 3, dtype=torch.float64, device=a.device).index_add_(0, plan.chunk_ids, vals)
        out[0], out[1], out[2] = sums[:, 1], sums[:, 0], sums[:, 2]
    if plan.n_small:
        x, y = a.index_select(0, plan.idx).double(), b.index_select(0, plan.idx).double()
        prods = torch.empty(3, plan.total, dtype=torch.float64, device=a.device)
        torch.mul(x, y, out=prods[0])
        torch.mul(x, x, out=prods[1])
        torch.mul(y, y, out=prods[2])
        out[:, plan.ids] = torch.segment_reduce(prods, "sum", lengths=plan.lengths3, axis=1)
    return out.reshape(-1)


def _combine_(own: Tensor, other: Tensor, c_own: Tensor, c_other: Tensor, segs, lo: int, vectorized: bool) -> None:
    """``own <- c_own[t] * own + c_other[t] * other`` elementwise over the region (tensor ``t`` of
    each element; padding past the last tensor is left alone), computed in float32 (float64 for
    float64 buffers), written in ``own``'s dtype. CPU: the long pieces of the region's
    :class:`_Plan` in place one by one, the short ones gathered and combined at once."""
    if not segs:
        return
    cd = _compute_dtype(own.dtype)
    x = own if own.dtype == cd else own.to(cd)
    y = other if other.dtype == cd else other.to(cd)
    if vectorized:
        ids = torch.tensor([t for t, _, _ in segs], device=own.device)
        lengths = torch.tensor([e - s for _, s, e in segs], device=own.device)
        cover = segs[-1][2] - lo  # the segments tile [lo, cover); only padding follows
        co = torch.repeat_interleave(c_own[ids].to(cd), lengths, output_size=cover)
        cx = torch.repeat_interleave(c_other[ids].to(cd), lengths, output_size=cover)
        own[:cover].copy_(x[:cover] * co + y[:cover] * cx)
        return
    plan = _plan(segs, lo, own.device)
    fused = fused_kernels() if own.dtype == torch.float32 and other.dtype == torch.float32 else None
    if fused is not None:
        fused.combine(own.numpy(), other.numpy(), *plan.np_big, *plan.np_small,
                      c_own.numpy().astype(np.float32), c_other.numpy().astype(np.float32))
        return
    if plan.big:
        co, cx = c_own.tolist(), c_other.tolist()
        for t, s, e in plan.big:
            x[s:e].mul_(co[t]).add_(y[s:e], alpha=cx[t])
    if plan.n_small:
        co = torch.repeat_interleave(c_own[plan.ids].to(cd), plan.lengths, output_size=plan.total)
        cx = torch.repeat_interleave(c_other[plan.ids].to(cd), plan.lengths, output_size=plan.total)
        x.index_copy_(0, plan.idx, x.index_select(0, plan.idx) * co + y.index_select(0, plan.idx) * cx)
    if x is not own:
        own.copy_(x)


# -- the distributed reduction ----------------------------------------------------------------
_SCRATCH: dict[tuple[str, torch.dtype, torch.device], Tensor] = {}


def _scratch(numel: int, dtype: torch.dtype, device: torch.device, role: str = "recv",
             store: dict | None = None) -> Tensor:
    """A buffer of ``numel`` elements kept between calls, one per ``role`` (``recv``: the receive
    buffer; ``flat``: the concatenated tensors), as Horovod keeps its fusion and receive buffers: a
    fresh large CPU allocation costs a page fault per 4 KiB on first touch, about as much as the copy
    itself (ResNet-50's 102 MB: the concatenation took 64-68 ms into fresh memory on 4 ranks sharing
    2 cores). Grow-only, one per (role, dtype, device) in ``store`` (the worker's own: an
    :class:`Adasum` keeps one; None: this process's, for direct calls); not thread-safe."""
    store = _SCRATCH if store is None else store
    buf = store.get((role, dtype, device))
    if buf is None or buf.numel() < numel:
        buf = store[(role, dtype, device)] = torch.empty(numel, dtype=dtype, device=device)
    return buf[:numel]


@torch.no_grad()
def _adasum_flat_(flat: Tensor, layout: _Layout, comm: Communicator, base: int = 0,
                  local: Communicator | None = None, scratch: dict | None = None) -> None:
    """Adasum over ``comm`` of a 1-D contiguous buffer (in place).

    ``flat`` holds the region ``[base, base + flat.numel())`` of a buffer whose tensors ``layout``
    describes (``base = 0`` and the whole buffer for :func:`adasum_reduce_`; a local rank's shard
    for :func:`adasum_reduce_hierarchical_`). Elements outside every tensor (padding) travel but
    are never combined.

    ``local``: in the hierarchical reduction, the node's communicator. Its ranks hold the other
    shards of the same tensors, so every float64 partial-dot vector is also summed over it (a SUM
    all-reduce of the ``3 * num_tensors`` vector after the cross-node recursive doubling, at the
    fold and at every level): the coefficients come from dot products over whole tensors. Every
    local rank of a node takes the same branches (a node's ranks share their rank in ``comm``),
    so the node runs the same sequence of collectives; a shard that holds no element of a tensor
    contributes zeros.
    """
    p, rank = comm.world_size, comm.rank
    if p == 1:
        return
    m, num = flat.numel(), len(layout.numels)
    vectorized = flat.device.type != "cpu"
    q = 1 << (p.bit_length() - 1)
    levels = q.bit_length() - 1
    node_sum = local is not None and local.world_size > 1

    # the regions of the halving levels: at level k this rank keeps [keep) and gives [give)
    history = []
    lo, hi = 0, m
    for k in range(levels):
        mid = lo + (hi - lo) // 2
        keep, give = ((lo, mid), (mid, hi)) if rank & (1 << k) == 0 else ((mid, hi), (lo, mid))
        history.append((keep, give))
        lo, hi = keep

    # 1. fold the extra ranks r >= q into r - q
    if rank >= q:
        comm.sendrecv(flat, None, rank - q)
        comm.sendrecv(None, flat, rank - q)  # receive-only: waits (and is clocked) until the result arrives
        return
    folds = rank + q < p

    # Every receive up to the all-gather is posted now, in the order the messages come (the fold,
    # then per level the half, then the dot vectors of the recursive doubling): gloo sends a
    # message once its receive is announced, so a receive posted only when it is needed costs a
    # round trip per message (Communicator.post_recv). Each needs its own buffer.
    sizes = ([m] if folds else []) + [keep[1] - keep[0] for keep, _ in history]
    inbox = _scratch(sum(sizes), flat.dtype, flat.device, store=scratch)
    theirs = torch.empty(levels * (levels + 1) // 2, 3 * num, dtype=torch.float64, device=flat.device)
    posted, offset, row = [], 0, 0
    if folds:
        posted.append(comm.post_recv(inbox[:m], rank + q))
        offset = m
    level_recvs = []
    for k, (keep, _) in enumerate(history):
        size = keep[1] - keep[0]
        half = comm.post_recv(inbox[offset : offset + size], rank ^ (1 << k))
        offset += size
        dots = [comm.post_recv(theirs[row + j], rank ^ (1 << j)) for j in range(k + 1)]
        row += k + 1
        level_recvs.append((half, dots))

    def dots_of(a: Tensor, b: Tensor, lo: int, hi: int, recvs):
        """(per-tensor [a.b, |a|^2, |b|^2] summed over the ranks of the subtree (recursive
        doubling over ``recvs``, one posted receive per step) and the node, segments) for the
        region [lo, hi) in buffer coordinates."""
        segs = layout.segments(base + lo, base + hi)
        dots = _partial_dots(a, b, segs, base + lo, num, vectorized)
        # recursive doubling, lower rank's vector first: every rank of the subtree gets bitwise
        # identical sums (float addition is commutative; the tree is the same on all of them)
        for j, recv in enumerate(recvs):
            mate = rank ^ (1 << j)
            comm.sendrecv(dots, recv, mate)
            dots = dots + recv.tensor if rank < mate else recv.tensor + dots
        if node_sum:
            local.all_reduce(dots)
        return dots.view(3, num), segs

    if folds:
        other = posted[0].tensor
        comm.sendrecv(None, posted[0], rank + q)
        dots, segs = dots_of(flat, other, 0, m, [])
        ca, cb = _coefficients(dots[0], dots[1], dots[2])
        _combine_(flat, other, ca, cb, segs, base, vectorized)

    # 2. vector halving, distance doubling over ranks 0..q-1
    gathers = []
    for k, ((keep, give), (half, dot_recvs)) in enumerate(zip(history, level_recvs)):
        partner = rank ^ (1 << k)
        left = rank & (1 << k) == 0  # lower rank: left subtree, keeps the first half
        own, other = flat[keep[0] : keep[1]], half.tensor
        comm.sendrecv(flat[give[0] : give[1]], half, partner)
        # the half just sent comes back in the all-gather, the last message from this partner
        gathers.append(comm.post_recv(flat[give[0] : give[1]], partner))
        a, b = (own, other) if left else (other, own)
        dots, segs = dots_of(a, b, keep[0], keep[1], dot_recvs)
        ca, cb = _coefficients(dots[0], dots[1], dots[2])
        c_own, c_other = (ca, cb) if left else (cb, ca)
        _combine_(own, other, c_own, c_other, segs, base + keep[0], vectorized)

    # 3. distance halving all-gather of the reduced halves
    for k in reversed(range(levels)):
        keep, give = history[k]
        comm.sendrecv(flat[keep[0] : keep[1]], gathers[k], rank ^ (1 << k))

    # 4. hand the result to the folded rank
    if folds:
        comm.sendrecv(flat, None, rank + q)


def _by_dtype(tensors: Sequence[Tensor]) -> list[list[Tensor]]:
    groups: dict[torch.dtype, list[Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    return list(groups.values())


def _validate(tensors: Sequence[Tensor]) -> None:
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"Adasum tensors must share one device, got {sorted(map(str, devices))}")
    for t in tensors:
        _check_float(t)


def _copy_back(flat: Tensor, group: Sequence[Tensor]) -> None:
    offset = 0
    for t in group:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


@torch.no_grad()
def adasum_reduce_(tensors: list[Tensor], comm: Communicator | None = None, scratch: dict | None = None) -> None:
    """In place on every rank of ``comm``'s group: each tensor becomes the Adasum over ranks of that tensor.

    The result is the tree of the module docstring (fold of ranks ``q..p-1``, then pairs ``(2i,
    2i+1)`` level by level), bitwise identical on all ranks, and equal to
    :func:`adasum_tree_reference` up to the summation order of the float64 dot products.

    Algorithm (Horovod ``AdasumMPI``, ``FusedAllreduce``; Maleki et al. MLSys 2021, Sec. 4): the
    tensors are flattened into one buffer per dtype (``n`` elements of ``b`` bytes). At level
    ``k = 0 .. L-1`` (``q = 2^L``) rank ``r`` pairs with ``r XOR 2^k``; the pair splits its current
    region at ``floor(m/2)`` (``m`` = region size), the lower rank keeps the first half and sends the
    second, the higher rank the reverse. Each rank then holds both subtrees' parts of its half; the
    float64 partial ``[a.b, |a|^2, |b|^2]`` of every tensor (a ``3 * num_tensors`` vector) is summed
    over the ``2^(k+1)`` ranks of the subtree by recursive doubling (``k + 1`` point-to-point
    exchanges, lower rank's vector first), and the rank combines its half. Then a distance-halving
    all-gather returns the whole result to every rank.

    Communication: every message is a :meth:`Communicator.sendrecv` with a group rank, counted on
    ``comm`` as one ``p2p`` per non-empty send (bytes = ``numel * element_size``), its measured
    seconds added to ``comm_time_s`` and, with a clock, priced on the pair's link and the ranks'
    ports (:mod:`lsgd.clock.ports`): a send completes at ``start + cost``, a receive at
    ``max(sender's start, ingress free) + cost``, receive-only waits (the folded ranks waiting for
    the result) included. Bytes sent by one rank ``r < q``::

        sum_{k=0}^{L-1} m_k * b          (halving sends m_k - m_{k+1}, the all-gather m_{k+1})
        + L (L + 1) / 2 * 3 * num_tensors * 8      (dot-product exchanges)
        + n * b   if r < p - q          (the result sent back to folded rank r + q)

    with ``m_0 = n`` and ``m_{k+1} = floor(m_k / 2)`` if bit ``k`` of ``r`` is 0 else
    ``ceil(m_k / 2)``. For ``n`` divisible by ``q`` the first term is ``2 (q-1)/q n b``, what a ring
    all-reduce sends; summed over the ``q`` ranks it is ``2 (q-1) n b`` for any ``n``. A folded rank
    ``r >= q`` sends ``n * b`` (its tensors) and nothing else. The sums above are per dtype.

    Numerics: dot products and squared norms in float64 (a coefficient is 1 below ``sqrt(DBL_MIN)``);
    each combination in float32 (float64 for float64 buffers) and stored in the input dtype, so the
    buffer is rounded to the input dtype after every level, as in the reference.

    Backends: gloo for CPU tensors, NCCL for CUDA tensors (the communicator's point-to-point layer;
    NCCL ``batch_isend_irecv`` after a one-off uncounted warm-up all-reduce per group). On gloo
    every receive before the all-gather (the fold, each level's half and its dot vectors) is posted
    at the start, in the order the messages come, and each all-gather receive as soon as its half
    has been sent (:meth:`Communicator.post_recv`: gloo sends a message only once its receive is
    announced, so a receive posted when needed costs a round trip per message); what is counted
    and clocked is unchanged. The receive buffer (one region per receive before the all-gather:
    fewer than ``2n`` elements on folding ranks, fewer than ``n`` on the others) and the flat
    buffer the tensors are concatenated into (``n`` elements) are kept between calls per dtype and
    device (not thread-safe).

    Args:
        tensors: floating tensors (float16, bfloat16, float32, float64) on one device; the same
            list (count, order, shapes, dtypes) on every rank of the group, else the call hangs or
            gives wrong results. An empty list is a no-op.
        comm: the communicator of the group (every rank of it must call); None: a fresh
            :class:`Communicator` of the default group whose counts are discarded (nothing happens
            without an initialized default group). With a group of one rank nothing happens.

    ``scratch``: where the buffers kept between calls live (:func:`_scratch`; a dict per worker).

    Raises:
        ValueError: tensors on different devices.
        TypeError: a tensor that is not float16/bfloat16/float32/float64.
    """
    if not tensors:
        return
    _validate(tensors)
    if comm is None:
        comm = Communicator(device=tensors[0].device)
    if comm.world_size == 1:
        return
    for same in _by_dtype(tensors):
        flat = _scratch(sum(t.numel() for t in same), same[0].dtype, same[0].device, "flat", scratch)
        torch.cat([t.detach().reshape(-1) for t in same], out=flat)
        _adasum_flat_(flat, _Layout([t.numel() for t in same]), comm, scratch=scratch)
        _copy_back(flat, same)


@torch.no_grad()
def adasum_reduce_hierarchical_(tensors: list[Tensor], local: Communicator, cross: Communicator,
                                scratch: dict | None = None) -> None:
    """Horovod's GPU hierarchy (in place): each tensor becomes ``Adasum_over_nodes(mean_over_node(tensor))``.

    Per dtype, with ``n`` elements of ``b`` bytes, ``p_l = local.world_size`` ranks per node and
    ``P = cross.world_size`` nodes (source: Horovod ``AdasumGpuAllreduceOp::NcclHierarchical``, which
    runs NCCL reduce-scatter, ``AdasumMPI``'s fused all-reduce across nodes from level
    ``local_size`` on each local rank's slice, then NCCL all-gather, and divides by ``local_size``;
    Maleki et al. MLSys 2021):

    1. the flat buffer is padded with zeros to ``N = p_l * ceil(n / p_l)`` elements and
       reduce-scattered (SUM) over ``local``: local rank ``l`` gets the node sum of the shard
       ``[l s, (l+1) s)``, ``s = N / p_l``, and divides it by ``p_l`` (the node mean);
    2. :func:`adasum_reduce_`'s halving/doubling over ``cross`` (the same local rank on every node)
       on that shard; a tensor cut across shards gets its coefficients from whole-tensor dot
       products: each partial-dot vector ``[a.b, |a|^2, |b|^2]`` (float64, ``3 * num_tensors``) is
       summed over the node with a SUM all-reduce over ``local`` after the cross-node recursive
       doubling, at the fold and at every level (Horovod sums it over its reduction communicators,
       which from level ``local_size`` on span the node's ranks too);
    3. all-gather of the shards over ``local`` into the buffer.

    Every rank of a node runs the same collectives in the same order (a shard without an element of
    some tensor contributes zeros to its dots), and the result is bitwise identical on all ranks.

    Bytes one rank sends (``T`` tensors; ``q = 2^L`` the largest power of two ``<= P``; ``j`` =
    this node's rank in ``cross``; counted on the communicators, which share their counters)::

        reduce_scatter   payload N b,   wire (p_l - 1)/p_l N b          (local link)
        p2p              adasum_reduce_'s formula with n -> s on the shard (inter-node link)
        all_reduce       (L + [j < P - q]) x 3 T 8 bytes if j < q, else 0;
                         wire 2 (p_l - 1)/p_l of each                   (local link)
        all_gather       payload s b,   wire (p_l - 1) s b = (p_l - 1)/p_l N b   (local link)

    For ``p_l = 1`` the local collectives are copies and count nothing.

    Args:
        tensors: as :func:`adasum_reduce_`.
        local, cross: this rank's node communicator and its communicator of same-local-rank peers
            across nodes (:func:`node_groups`; ``local`` priced on the intra-node link).

    Raises:
        ValueError, TypeError: as :func:`adasum_reduce_`.
    """
    if not tensors:
        return
    _validate(tensors)
    p_l = local.world_size
    if p_l == 1 and cross.world_size == 1:
        return
    for same in _by_dtype(tensors):
        layout = _Layout([t.numel() for t in same])
        s = -(-layout.n // p_l)
        pad = s * p_l - layout.n
        pieces = [t.detach().reshape(-1) for t in same]
        if pad:
            pieces.append(same[0].new_zeros(pad))
        flat = torch.cat(pieces, out=_scratch(s * p_l, same[0].dtype, same[0].device, "flat", scratch))
        shard = flat.new_empty(s)
        local.reduce_scatter(shard, flat)
        shard.div_(p_l)
        _adasum_flat_(shard, layout, cross, base=local.rank * s, local=local, scratch=scratch)
        local.all_gather_into(flat, shard)
        _copy_back(flat, same)


def node_groups(comm: Communicator, local_size: int) -> tuple[Communicator, Communicator]:
    """Split ``comm``'s group into nodes; returns this rank's ``(local, cross)`` communicators.

    Ranks are node-major: node ``i`` holds group ranks ``i * local_size .. (i+1) * local_size - 1``;
    the cross group of local rank ``l`` is ``{l, l + local_size, l + 2 local_size, ...}`` (its rank
    there is the node index). Created with :meth:`Communicator.partition` (node blocks, then cross
    blocks), sharing ``comm``'s counters and clock; ``local`` is priced on the intra-node link and
    ``cross`` on the inter-node link (the nodes of ``local_size`` ranks are the algorithm's nodes;
    set ``cluster.gpus_per_node`` to the same value for the rest of the run to agree). Every rank of
    the default group must call it at the same point (torch's rule for creating groups), so ``comm``
    must span the whole default group.

    Raises:
        ValueError: ``local_size`` < 1 or not a divisor of the world size; ``comm`` is a subgroup.
    """
    world = comm.world_size
    if local_size < 1 or world % local_size:
        raise ValueError(f"local_size={local_size} must be >= 1 and divide the world size {world}")
    if world > 1 and comm.global_ranks != list(range(world)):
        raise ValueError("node_groups needs a communicator of the whole default group")
    nodes = world // local_size
    local = comm.partition([range(i * local_size, (i + 1) * local_size) for i in range(nodes)], link="intra")
    cross = comm.partition([range(lr, world, local_size) for lr in range(local_size)], link="inter")
    return local, cross


# -- training ----------------------------------------------------------------------------------
@dataclass
class AdasumConfig(AlgoConfig):
    """``algo=adasum``'s keys.

    * ``target``: ``gradient``: after backward every ``p.grad`` becomes its Adasum over workers (no
      DDP; gradients are not divided by the world size: the Adasum of identical gradients is that
      gradient). ``delta`` (Horovod's way with an optimizer): after backward the parameters are
      saved as ``x_old``; after the local optimizer step ``delta = x - x_old`` is reduced with
      Adasum and ``x = x_old + Adasum(delta)``. Optimizer state stays local.
    * ``hierarchical``: Horovod's GPU hierarchy, Adasum across nodes of the means inside each node
      of ``local_size`` ranks (:func:`adasum_reduce_hierarchical_`: reduce-scatter in the node,
      Adasum across nodes on each shard, all-gather in the node); the node communicators are priced
      on the intra-node link (:func:`node_groups`). Needs the communicator's group to be the
      default group and at least two nodes (:meth:`Adasum.validate_config`).
    * ``local_size``: workers per node (None: ``LOCAL_WORLD_SIZE`` from the environment, else 1).
    * ``average_buffers``: float buffers (BatchNorm statistics) averaged every step with a
      coalesced all-reduce.
    """

    name: str = "adasum"
    target: str = option("delta", choices=TARGETS, doc="gradient: replaces the gradient all-reduce; delta: "
                         "Horovod's way (local step, Adasum of the parameter delta)")
    hierarchical: bool = option(False, doc="average inside a node, Adasum across nodes (Horovod on GPUs); needs "
                                ">= 2 nodes", symbol=("hierarchical", "flat"))
    local_size: int | None = option(None, at_least=1, doc="workers per node for hierarchical (null: the launch's "
                                    "LOCAL_WORLD_SIZE; must divide the world size)")
    average_buffers: bool = option(True, doc="average BatchNorm running statistics every step")


class Adasum(Algorithm):
    """Synchronous training with Adasum in place of the gradient average (one round per step).

    The keys: :class:`AdasumConfig`. Every worker holds the same model after each step
    (``models_in_sync``). Nothing to checkpoint (``x_old`` lives only between ``after_backward``
    and ``after_step``).

    Raises:
        ConfigError: a key :class:`AdasumConfig` does not allow (unknown ``target``, ``local_size``
            < 1); a node size from ``LOCAL_WORLD_SIZE`` < 1 (and, in :meth:`validate_config`, a
            node size that does not divide the world size with ``hierarchical``).
    """

    name = "adasum"
    Config = AdasumConfig
    label = "Adasum"
    paper = "docs/papers.md#adasum"

    @classmethod
    def validate_config(cls, algo: dict, world_size: int) -> None:
        """Also, with ``hierarchical``: the node size (``local_size``; null: the launcher's
        ``LOCAL_WORLD_SIZE``, and in a local launch, where it is not set yet, all workers on this
        machine) must divide the world size and leave at least two nodes (on one node the
        hierarchy is a plain average: Adasum of a single node mean)."""
        super().validate_config(algo, world_size)
        config = cls.parse_config(algo)
        if not config.hierarchical:
            return
        node = config.local_size
        source = "algo.local_size"
        if node is None:
            env = os.environ.get("LOCAL_WORLD_SIZE")
            node, source = (int(env), "LOCAL_WORLD_SIZE") if env else (world_size, "one machine")
        if world_size % node:
            raise ConfigError(
                f"algo.hierarchical=true needs nodes of equal size: node size {node} ({source}) does not "
                f"divide the world size {world_size}; set algo.local_size to a divisor of {world_size}"
            )
        if node >= world_size > 1:
            raise ConfigError(
                f"algo.hierarchical=true on a single node (node size {node} from {source}, world size "
                f"{world_size}) is plain averaging, not Adasum; set algo.local_size to a divisor of "
                f"{world_size} below it (nodes of that many ranks), or algo.hierarchical=false"
            )

    def __init__(self, cfg: dict, comm: Communicator):
        super().__init__(cfg, comm)
        self.target = self.config.target
        self.hierarchical = bool(self.config.hierarchical)
        local_size = self.config.local_size
        self.local_size = int(local_size if local_size is not None else os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if self.local_size < 1:
            raise ConfigError(f"algo.local_size={self.local_size} must be >= 1")
        self.average_buffers = bool(self.config.average_buffers)
        self._x_old: list[Tensor] | None = None
        self._groups = None
        self._scratch: dict = {}  # this worker's fusion and receive buffers (_scratch)

    def setup(self, model, optimizer, ctx=None):
        model = super().setup(model, optimizer, ctx)
        if self.hierarchical and self.comm.world_size > 1:
            if self.comm.group is not None:
                raise ConfigError("algo.hierarchical=true needs the default process group")
            self._groups = node_groups(self.comm, self.local_size)
        return model

    def reduce_(self, tensors: list[Tensor]) -> None:
        """Adasum of ``tensors`` over the workers, in place (hierarchical if configured)."""
        if self._groups is not None:
            adasum_reduce_hierarchical_(tensors, *self._groups, scratch=self._scratch)
        else:
            adasum_reduce_(tensors, self.comm, scratch=self._scratch)

    def after_backward(self, step: int) -> None:
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.target == "gradient":
            self.reduce_([p.grad for p in params if p.grad is not None])
        elif self.comm.world_size > 1:
            self._x_old = [p.detach().clone() for p in params]

    @torch.no_grad()
    def after_step(self, step: int) -> None:
        if self.target == "delta" and self._x_old is not None:
            params = [p for p in self.model.parameters() if p.requires_grad]
            deltas = [p.detach() - x for p, x in zip(params, self._x_old)]
            self.reduce_(deltas)
            for p, x, d in zip(params, self._x_old, deltas):
                p.copy_(x.add_(d))
            self._x_old = None
        if self.average_buffers:
            buffers = float_buffers(self.model)
            if buffers:
                self.comm.average_(buffers)
        self.comm.round()

    @property
    def models_in_sync(self) -> bool:
        return self.average_buffers or not float_buffers(self.model)
