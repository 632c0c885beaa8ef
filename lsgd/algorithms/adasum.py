"""``adasum``: adaptive summation of gradients or optimizer deltas (papers.md section 5).

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

The training algorithm :class:`Adasum` (config ``algo.name=adasum``) applies the reduction either to
the gradients (``target=gradient``, replacing the gradient all-reduce) or, as Horovod does with an
optimizer, to the delta of a local optimizer step (``target=delta``).
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Sequence
from typing import ClassVar

import torch
import torch.distributed as dist
from torch import Tensor

from lsgd.algorithms.base import Algorithm, float_buffers
from lsgd.comm import Communicator
from lsgd.errors import ConfigError

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


def _partial_dots(a: Tensor, b: Tensor, segs, lo: int, num: int, vectorized: bool) -> Tensor:
    """Float64 ``[a.b | |a|^2 | |b|^2]`` per tensor (shape ``(3 * num,)``) restricted to the region
    ``[lo, lo + a.numel())`` of the buffer; tensors outside the region contribute 0.

    ``vectorized`` (CUDA): one float64 copy of the region and ``segment_reduce``. Otherwise (CPU):
    chunks of ``_CHUNK`` elements converted to float64 in a cache-resident buffer and a 2 x 2 Gram
    matrix ``[a; b] [a; b]^T`` per piece of tensor (one BLAS call reads both rows once), summed per
    tensor with ``index_add_`` in a fixed order.
    """
    out = torch.zeros(3, num, dtype=torch.float64, device=a.device)
    if not segs:
        return out.reshape(-1)
    if vectorized:
        a64, b64 = a.double(), b.double()
        ids = torch.tensor([t for t, _, _ in segs], device=a.device)
        lengths = torch.tensor([e - s for _, s, e in segs], device=a.device)
        for row, prod in enumerate((a64 * b64, a64 * a64, b64 * b64)):
            out[row, ids] = torch.segment_reduce(prod, "sum", lengths=lengths)
        return out.reshape(-1)
    m = a.numel()
    chunk = min(_CHUNK, m)
    buf = torch.empty(2, chunk, dtype=torch.float64, device=a.device)
    grams, ids = [], []
    j = 0  # first segment that may intersect the current chunk
    for c0 in range(0, m, chunk):
        c1 = min(c0 + chunk, m)
        buf[0, : c1 - c0].copy_(a[c0:c1])
        buf[1, : c1 - c0].copy_(b[c0:c1])
        while j < len(segs):
            t, s, e = segs[j]
            s0, e0 = max(s - lo, c0), min(e - lo, c1)
            if s0 < e0:
                piece = buf[:, s0 - c0 : e0 - c0]
                grams.append(torch.mm(piece, piece.t()))
                ids.append(t)
            if e - lo <= c1:
                j += 1
            else:
                break
    g = torch.zeros(num, 2, 2, dtype=torch.float64, device=a.device)
    g.index_add_(0, torch.tensor(ids, device=a.device), torch.stack(grams))
    out[0], out[1], out[2] = g[:, 0, 1], g[:, 0, 0], g[:, 1, 1]
    return out.reshape(-1)


def _combine_(own: Tensor, other: Tensor, c_own: Tensor, c_other: Tensor, segs, lo: int, vectorized: bool) -> None:
    """``own <- c_own[t] * own + c_other[t] * other`` elementwise over the region (tensor ``t`` of
    each element), computed in float32 (float64 for float64 buffers), written in ``own``'s dtype."""
    if not segs:
        return
    cd = _compute_dtype(own.dtype)
    x = own if own.dtype == cd else own.to(cd)
    y = other if other.dtype == cd else other.to(cd)
    if vectorized:
        ids = torch.tensor([t for t, _, _ in segs], device=own.device)
        lengths = torch.tensor([e - s for _, s, e in segs], device=own.device)
        co = torch.repeat_interleave(c_own[ids].to(cd), lengths, output_size=own.numel())
        cx = torch.repeat_interleave(c_other[ids].to(cd), lengths, output_size=own.numel())
        own.copy_(x * co + y * cx)
        return
    co, cx = c_own.tolist(), c_other.tolist()
    for t, s, e in segs:
        x[s - lo : e - lo].mul_(co[t]).add_(y[s - lo : e - lo], alpha=cx[t])
    if x is not own:
        own.copy_(x)


# -- point-to-point helpers -------------------------------------------------------------------
class _P2P:
    """Point-to-point exchanges with group ranks, counted on ``comm`` as ``p2p`` sends.

    NCCL (and other non-gloo backends): ``batch_isend_irecv`` (one NCCL group call, so a pair's
    send and receive run concurrently without deadlock). gloo: independent ``isend`` then
    ``irecv`` (gloo's sends never block, so the pair cannot deadlock); posting the send first moved
    the halving/doubling traffic of 1M floats on 4 loopback ranks in 8.2 ms against 11.4 ms with
    the receive posted first and 13.1 ms through ``batch_isend_irecv``.
    """

    _warm: ClassVar[set] = set()

    def __init__(self, group, comm: Communicator | None, device: torch.device):
        self.group, self.comm = group, comm
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if self.rank < 0:
            raise ValueError("adasum_reduce_ called on a rank outside the process group")
        self.global_ranks = dist.get_process_group_ranks(group) if group is not None else list(range(self.size))
        self.batched = dist.get_backend(group) != "gloo"
        if self.batched:
            self._warm_up(device)

    def _warm_up(self, device: torch.device) -> None:
        # NCCL: a batched P2P call that is the first operation on a group must involve every rank of
        # the group; the fold involves only some. One uncounted 1-element all-reduce per group first.
        key = id(self.group) if self.group is not None else None
        if key not in _P2P._warm:
            dist.all_reduce(torch.zeros(1, device=device), group=self.group)
            _P2P._warm.add(key)

    def sendrecv(self, send: Tensor | None, recv: Tensor | None, peer: int) -> None:
        """Send ``send`` to and receive ``recv`` from group rank ``peer`` at the same time (either
        may be None or empty: then skipped; both sides agree on the sizes)."""
        send = send if send is not None and send.numel() else None
        recv = recv if recv is not None and recv.numel() else None
        if send is None and recv is None:
            return
        dst = self.global_ranks[peer]
        t0 = time.perf_counter()
        if self.batched:
            ops = [dist.P2POp(dist.irecv, recv, dst, self.group)] if recv is not None else []
            ops += [dist.P2POp(dist.isend, send, dst, self.group)] if send is not None else []
            works = dist.batch_isend_irecv(ops)
        else:
            works = [dist.isend(send, dst, group=self.group)] if send is not None else []
            works += [dist.irecv(recv, dst, group=self.group)] if recv is not None else []
        for work in works:
            work.wait()
        if self.comm is not None and send is not None:
            self.comm.record("p2p", send.numel() * send.element_size(), time.perf_counter() - t0)


# -- the distributed reduction ----------------------------------------------------------------
_SCRATCH: dict[tuple[torch.dtype, torch.device], Tensor] = {}


def _scratch(numel: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A receive buffer of ``numel`` elements, kept between calls (as Horovod keeps its receive
    buffer): a fresh large CPU allocation costs a page fault per 4 KiB on first touch, about as much
    as the copy itself. Grow-only, one per (dtype, device); not thread-safe."""
    buf = _SCRATCH.get((dtype, device))
    if buf is None or buf.numel() < numel:
        buf = _SCRATCH[(dtype, device)] = torch.empty(numel, dtype=dtype, device=device)
    return buf[:numel]


@torch.no_grad()
def _adasum_flat_(flat: Tensor, numels: Sequence[int], group, comm: Communicator | None) -> None:
    """Adasum over the group of a flat 1-D contiguous buffer holding tensors of ``numels``."""
    if dist.get_world_size(group) == 1:
        return
    p2p = _P2P(group, comm, flat.device)
    p, rank = p2p.size, p2p.rank
    layout = _Layout(numels)
    n, num = layout.n, len(layout.numels)
    vectorized = flat.device.type != "cpu"
    q = 1 << (p.bit_length() - 1)
    levels = q.bit_length() - 1

    # 1. fold the extra ranks r >= q into r - q
    if rank >= q:
        p2p.sendrecv(flat, None, rank - q)
        p2p.sendrecv(None, flat, rank - q)
        return
    scratch = _scratch(n if rank + q < p else (n + 1) // 2, flat.dtype, flat.device)
    if rank + q < p:
        other = scratch[:n]
        p2p.sendrecv(None, other, rank + q)
        segs = layout.segments(0, n)
        dots = _partial_dots(flat, other, segs, 0, num, vectorized).view(3, num)
        ca, cb = _coefficients(dots[0], dots[1], dots[2])
        _combine_(flat, other, ca, cb, segs, 0, vectorized)

    # 2. vector halving, distance doubling over ranks 0..q-1
    lo, hi = 0, n
    history = []
    for k in range(levels):
        bit = 1 << k
        partner = rank ^ bit
        mid = lo + (hi - lo) // 2
        left = rank & bit == 0  # lower rank: left subtree, keeps the first half
        keep, give = ((lo, mid), (mid, hi)) if left else ((mid, hi), (lo, mid))
        own = flat[keep[0] : keep[1]]
        other = scratch[: keep[1] - keep[0]]
        p2p.sendrecv(flat[give[0] : give[1]], other, partner)
        history.append((keep, give))
        a, b = (own, other) if left else (other, own)
        segs = layout.segments(*keep)
        dots = _partial_dots(a, b, segs, keep[0], num, vectorized)
        # sum the partial dots over the 2^(k+1) ranks of this subtree: recursive doubling, lower
        # rank's vector first, so every rank of the subtree gets bitwise identical sums
        theirs = torch.empty_like(dots)
        for j in range(k + 1):
            mate = rank ^ (1 << j)
            p2p.sendrecv(dots, theirs, mate)
            dots = dots + theirs if rank < mate else theirs + dots
        dots = dots.view(3, num)
        ca, cb = _coefficients(dots[0], dots[1], dots[2])
        c_own, c_other = (ca, cb) if left else (cb, ca)
        _combine_(own, other, c_own, c_other, segs, keep[0], vectorized)
        lo, hi = keep

    # 3. distance halving all-gather of the reduced halves
    for k in reversed(range(levels)):
        keep, give = history[k]
        p2p.sendrecv(flat[keep[0] : keep[1]], flat[give[0] : give[1]], rank ^ (1 << k))

    # 4. hand the result to the folded rank
    if rank + q < p:
        p2p.sendrecv(flat, None, rank + q)


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


def _initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


@torch.no_grad()
def adasum_reduce_(tensors: list[Tensor], group=None, comm: Communicator | None = None) -> None:
    """In place on every rank of ``group``: each tensor becomes the Adasum over ranks of that tensor.

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

    Bytes sent by one rank ``r < q`` (counted with ``comm.record("p2p", nbytes, seconds)``, one record
    per non-empty send; empty sends are skipped)::

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

    Communication uses ``torch.distributed`` point-to-point ops on the tensors' device: gloo
    (``isend``/``irecv``) for CPU tensors, NCCL (``batch_isend_irecv``) for CUDA tensors; on NCCL
    one uncounted 1-element all-reduce is issued the first time a group is used, so that the first
    batched P2P call, which on NCCL must involve every rank, is not the fold. The receive buffer
    (``n`` elements on folding ranks, else ``ceil(n/2)``) is kept between calls per dtype and
    device (not thread-safe). Times recorded on ``comm`` are host wall-clock seconds per exchange
    (on CUDA: until the ops are enqueued and waited on by the current stream).

    Args:
        tensors: floating tensors (float16, bfloat16, float32, float64) on one device; the same
            list (count, order, shapes, dtypes) on every rank of the group, else the call hangs or
            gives wrong results. An empty list is a no-op.
        group: the process group; None: ``comm.group`` if ``comm`` is given, else the default
            group. Must be called by every rank of the group. Without an initialized default
            group, or with a group of one rank, nothing happens.
        comm: if given, every send is counted on it (kind ``p2p``; bytes = ``numel *
            element_size``); its wire/model terms use ``comm``'s world size.

    Raises:
        ValueError: tensors on different devices; this process is not in ``group``.
        TypeError: a tensor that is not float16/bfloat16/float32/float64.
    """
    if not tensors:
        return
    _validate(tensors)
    if not _initialized():
        return
    if group is None and comm is not None:
        group = comm.group
    if dist.get_world_size(group) == 1:
        return
    for same in _by_dtype(tensors):
        flat = torch.cat([t.detach().reshape(-1) for t in same])
        _adasum_flat_(flat, [t.numel() for t in same], group, comm)
        _copy_back(flat, same)


@torch.no_grad()
def adasum_reduce_hierarchical_(tensors: list[Tensor], local_group, cross_group, comm: Communicator | None = None) -> None:
    """Horovod's GPU hierarchy: average inside the node, then Adasum across nodes (in place).

    Each tensor becomes ``Adasum_over_nodes(mean_over_node_ranks(tensor))``: a coalesced SUM
    all-reduce of one flat buffer per dtype over ``local_group`` divided by its size (counted as
    ``all_reduce`` of the buffer's bytes on ``comm``), then :func:`adasum_reduce_` of the same
    per-tensor segments over ``cross_group`` (counted as ``p2p``). Source: Horovod
    ``AdasumGpuAllreduceOp`` (NCCL inside the node, AdasumMPI across nodes); Maleki et al. 2021.

    Args:
        tensors: as :func:`adasum_reduce_`.
        local_group, cross_group: this rank's node group and its group of same-local-rank peers
            across nodes (:func:`node_groups`).
        comm: counts the traffic (its world size is used for the wire/model terms of the local
            all-reduce too).

    Raises:
        as :func:`adasum_reduce_`.
    """
    if not tensors:
        return
    _validate(tensors)
    if not _initialized():
        return
    local_size = dist.get_world_size(local_group)
    for same in _by_dtype(tensors):
        flat = torch.cat([t.detach().reshape(-1) for t in same])
        if local_size > 1:
            t0 = time.perf_counter()
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=local_group)
            if comm is not None:
                comm.record("all_reduce", flat.numel() * flat.element_size(), time.perf_counter() - t0)
            flat.div_(local_size)
        _adasum_flat_(flat, [t.numel() for t in same], cross_group, comm)
        _copy_back(flat, same)


def node_groups(local_size: int):
    """Create the node groups of the default group; returns ``(local_group, cross_group)`` of this rank.

    Ranks are node-major: node ``i`` holds ranks ``i * local_size .. (i+1) * local_size - 1``; the
    cross group of local rank ``l`` is ``{l, l + local_size, l + 2 local_size, ...}``. Every rank
    creates every group with ``dist.new_group`` in the same order (node groups, then cross groups),
    as torch requires; call it on all ranks at the same point.

    Raises:
        ValueError: ``local_size`` < 1 or not a divisor of the world size; no initialized group.
    """
    if not _initialized():
        raise ValueError("node_groups needs an initialized default process group")
    world, rank = dist.get_world_size(), dist.get_rank()
    if local_size < 1 or world % local_size:
        raise ValueError(f"local_size={local_size} must be >= 1 and divide the world size {world}")
    local = cross = None
    for node in range(world // local_size):
        ranks = list(range(node * local_size, (node + 1) * local_size))
        g = dist.new_group(ranks)
        if rank in ranks:
            local = g
    for lr in range(local_size):
        ranks = list(range(lr, world, local_size))
        g = dist.new_group(ranks)
        if rank in ranks:
            cross = g
    return local, cross


# -- training ----------------------------------------------------------------------------------
class Adasum(Algorithm):
    """Synchronous training with Adasum in place of the gradient average (one round per step).

    Config keys:

    * ``target``: ``gradient``: after backward every ``p.grad`` becomes its Adasum over workers (no
      DDP; gradients are not divided by the world size: the Adasum of identical gradients is that
      gradient). ``delta`` (Horovod's way with an optimizer): after backward the parameters are
      saved as ``x_old``; after the local optimizer step ``delta = x - x_old`` is reduced with
      Adasum and ``x = x_old + Adasum(delta)``. Optimizer state stays local.
    * ``hierarchical`` (default False): average inside each node of ``local_size`` ranks, then
      Adasum across nodes (:func:`adasum_reduce_hierarchical_`); needs the communicator's group to
      be the default group.
    * ``local_size`` (int or None: ``LOCAL_WORLD_SIZE`` from the environment, default 1).
    * ``average_buffers`` (default True): float buffers (BatchNorm statistics) averaged every step
      with a coalesced all-reduce.

    Every worker holds the same model after each step (``models_in_sync``). Nothing to checkpoint
    (``x_old`` lives only between ``after_backward`` and ``after_step``).

    Raises:
        ConfigError: unknown ``target``; ``local_size`` < 1.
    """

    name = "adasum"

    def __init__(self, cfg: dict, comm: Communicator):
        super().__init__(cfg, comm)
        self.target = cfg.get("target", "delta")
        if self.target not in TARGETS:
            raise ConfigError(f"algo.target={self.target!r} is unknown; allowed: {', '.join(TARGETS)}")
        self.hierarchical = bool(cfg.get("hierarchical", False))
        local_size = cfg.get("local_size")
        self.local_size = int(local_size if local_size is not None else os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if self.local_size < 1:
            raise ConfigError(f"algo.local_size={self.local_size} must be >= 1")
        self.average_buffers = bool(cfg.get("average_buffers", True))
        self._x_old: list[Tensor] | None = None
        self._groups = None

    def setup(self, model, optimizer):
        model = super().setup(model, optimizer)
        if self.hierarchical and self.comm.world_size > 1:
            if self.comm.group is not None:
                raise ConfigError("algo.hierarchical=true needs the default process group")
            self._groups = node_groups(self.local_size)
        return model

    def reduce_(self, tensors: list[Tensor]) -> None:
        """Adasum of ``tensors`` over the workers, in place (hierarchical if configured)."""
        if self._groups is not None:
            adasum_reduce_hierarchical_(tensors, *self._groups, comm=self.comm)
        else:
            adasum_reduce_(tensors, group=self.comm.group, comm=self.comm)

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
