"""Average compressed payloads over workers, coalesced, through the accounting communicator.

:func:`exchange` takes this worker's payloads of several tensors (one :class:`Compressed` per
tensor, in the same order on every worker) and returns, per tensor, the dense average over the
``p`` workers of ``decompress(payload)``. It issues one collective per payload part per call, never
one per tensor, all through :class:`lsgd.comm.communicator.Communicator` so the bytes are counted.

``compressor.exchange == "all_reduce"`` (none, fp16, randomk; the payloads can be summed element-wise):
    the values of all items are concatenated (one buffer per values dtype, in practice one) and
    all-reduced once; fp16 divides by ``p`` before the sum to avoid float16 overflow (as torch's
    ``fp16_compress_hook``), the others divide the float sum by ``p`` after it. randomk requires the
    same indices on every worker (same seed, step, key and cf), which its shared-seed generator
    ensures. Counted bytes: the concatenated values, ``sum_i c_i.nbytes`` (randomk's indices are
    not sent).

``compressor.exchange == "all_gather"`` (topk, dgc, redsync, qsgd):
    1. sizes: when the payload sizes may differ across workers (``uniform=False``; by default
       ``not compressor.fixed_size``: dgc and redsync select a data-dependent count), all-gather the
       per-item value counts, one int64 tensor of ``len(items)`` elements (``8 * len(items)``
       bytes). For fixed-size compressors (topk, qsgd: the count follows from the tensor's numel
       and the cf, which every lsgd algorithm uses alike on all workers) the counts are known and
       this collective is skipped;
    2. concatenate values (promoted to one dtype), int32 indices (sparsifiers) and float32 scales
       (qsgd); pad values and indices with zeros to the largest total count over the workers
       (gloo's all-gather needs equal sizes), and all-gather each part once;
    3. split each worker's buffers by its counts, accumulate every worker's decompressed items in
       rank order and divide by ``p``.

    Dense format: a sparsifier's item whose all-gather would cost at least a dense all-reduce on the
    wire travels dense (:func:`dense_is_cheaper`: ``(p-1) max_r count_r (value size + 4) >=
    2 (p-1)/p numel * element size``; e.g. top-k keeping 99% as Accordion's low level does at any
    p, or top-k at CF 10 on 32 workers): the decompressed tensors (zeros where nothing was
    selected) are all-reduced and divided by ``p``, which is the same average for fewer bytes on
    the wire, so no item ever costs more than the dense all-reduce. Every worker decides from the
    same counts, so all agree.

    Counted bytes, what this worker actually hands to the collectives::

        [8 m]  +  M * (values element size + [4 for indices])  +  [4 m for qsgd scales]

    with ``m = len(items)``, ``[8 m]`` only when sizes are exchanged, and ``M`` the maximum over
    workers of the total values count of the items that travel sparse (padding included; ``M =
    sum_i c_i.values.numel()`` for fixed-size compressors, so the count equals ``sum_i
    c_i.nbytes``), plus ``numel * element size`` for each item that travels dense. When ``M == 0``
    (every item empty on every worker) the values and indices are not exchanged.

``compressor.exchange == "lattice"`` (:class:`lsgd.compression.compressors.Lattice`; Davies et al.
ICLR 2021, distributed mean estimation with the receiver's own vector as reference):
    1. all-gather the packed colours of all items (one uint8 buffer) and their checksums (one
       int64 buffer, 3 per item); every worker's payload has the same size (same shapes);
    2. each worker decodes every other worker's codes against its own tensor (``reference``) and
       checks the checksum; the items any worker failed on are agreed with one all-reduce MAX of
       one flag byte per item;
    3. an item decoded everywhere averages the lattice points: ``(own point + sum of decoded) /
       p``, the same on every worker; a failed item is all-reduced at full precision (its tensor,
       ``numel * element size`` bytes) and divided by ``p``, so no result is ever silently wrong.
    Counted bytes: ``sum_i (ceil(bits n_i / 8) + 24) + m`` (flags) ``+`` the resent tensors.

With world size 1 (torch.distributed not initialized) nothing is communicated and the
decompressed items are returned. An empty ``items`` list returns ``[]`` without communicating;
every worker must then pass an empty list (the item count must agree across workers).
"""

from __future__ import annotations

import functools

import torch

from lsgd.clock.network import cost_terms
from lsgd.comm.communicator import Communicator
from lsgd.compression.compressors import Compressed, Compressor, NoCompression

_IDENTITY = NoCompression()


def exchange(comm: Communicator, compressor: Compressor, items: list[Compressed], *,
             uniform: bool | None = None) -> list[torch.Tensor]:
    """Per item, the dense average over workers of ``compressor.decompress(item)``.

    Args:
        comm: the accounting communicator (its ``world_size``, ``all_reduce``, ``all_gather``).
        compressor: the compressor that produced ``items`` (picks the collective by its
            ``exchange`` attribute).
        items: this worker's payloads, one per tensor, in the same order on all workers.
        uniform: all-gather exchange only: True when every worker's item ``i`` has the same
            values count (no size exchange), False to exchange the sizes; None (default):
            ``compressor.fixed_size``. Must be the same on all workers.

    Returns:
        One tensor per item, of the item's original shape and dtype.

    Raises:
        ValueError: ``compressor.exchange`` is neither ``all_reduce`` nor ``all_gather``.
    """
    if not items:
        return []
    p = comm.world_size
    if p == 1:
        return [compressor.decompress(c) for c in items]
    if compressor.exchange == "all_reduce":
        return _exchange_all_reduce(comm, compressor, items, p)
    if compressor.exchange == "all_gather":
        uniform = compressor.fixed_size if uniform is None else uniform
        return _exchange_all_gather(comm, compressor, items, p, uniform)
    if compressor.exchange == "lattice":
        return _exchange_lattice(comm, compressor, items, p)
    raise ValueError(f"compressor.exchange must be 'all_reduce', 'all_gather' or 'lattice', got {compressor.exchange!r}")


def _exchange_lattice(comm, compressor, items, p):
    """The lattice exchange (module docstring); ``compressor.resent`` counts failed items."""
    from lsgd.compression.lattice import LatticeCode

    quant = compressor.quantizer
    sizes = [c.values.numel() * c.values.element_size() for c in items]
    payload = torch.cat([c.values.reshape(-1).view(torch.uint8) for c in items])
    sums = torch.cat([c.scale.reshape(-1) for c in items])
    payloads, checksums = comm.all_gather(payload), comm.all_gather(sums)
    me = comm.rank
    totals = [c.point.clone() for c in items]
    flags = torch.zeros(len(items), dtype=torch.uint8, device=payload.device)
    for r in range(p):
        if r == me:
            continue
        offset = 0
        for i, c in enumerate(items):
            raw = payloads[r][offset : offset + sizes[i]]
            offset += sizes[i]
            codes = raw.clone().view(c.values.dtype)
            value, ok = quant.decode(LatticeCode(codes, checksums[r][3 * i : 3 * i + 3], c.numel), c.reference)
            totals[i] += value
            if not ok:
                flags[i] = 1
    comm.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
    failed = [i for i in range(len(items)) if flags[i]]
    resent = {}
    if failed:  # full precision for the items some worker could not decode
        compressor.resent += len(failed)
        dense = [Compressed(items[i].reference.reshape(-1).clone(), None, items[i].shape, items[i].dtype) for i in failed]
        resent = dict(zip(failed, _exchange_all_reduce(comm, _IDENTITY, dense, p)))
    return [resent[i].reshape(c.shape) if i in resent else (totals[i] / p).to(c.dtype).reshape(c.shape)
            for i, c in enumerate(items)]


def _exchange_all_reduce(comm, compressor, items, p):
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, c in enumerate(items):
        by_dtype.setdefault(c.values.dtype, []).append(i)
    summed: list[torch.Tensor | None] = [None] * len(items)
    for positions in by_dtype.values():
        flat = torch.cat([items[i].values.reshape(-1) for i in positions])
        if compressor.predivide:
            flat.div_(p)
        comm.all_reduce(flat)
        if not compressor.predivide:
            if flat.is_floating_point():
                flat.div_(p)
            else:
                flat = flat.double().div_(p)
        offset = 0
        for i in positions:
            n = items[i].values.numel()
            summed[i] = flat[offset : offset + n]
            offset += n
    out = []
    for c, values in zip(items, summed):
        avg = Compressed(values, c.indices, c.shape, c.dtype, scale=c.scale, send_indices=c.send_indices)
        out.append(compressor.decompress(avg))
    return out


def dense_is_cheaper(c: Compressed, count: int, p: int) -> bool:
    """Whether item ``c`` travels dense: when all-gathering ``count`` values (plus int32 indices)
    from each of ``p`` workers puts at least as many bytes on every link as a ring all-reduce of
    the dense tensor (``numel * element size`` = n bytes): ``(p-1) count (b_v + b_i) >= 2 (p-1)/p n``,
    the bandwidth terms of :func:`lsgd.clock.network.cost_terms` (the items share one collective, so their
    latency terms are not compared). At p = 2 this is "sparse payload >= dense size"; at 32 workers
    a top-k at CF 10 (20% of the dense bytes with indices) travels dense."""
    if c.indices is None or not c.send_indices:
        return False
    dense = c.numel * torch.empty((), dtype=c.dtype).element_size()
    sparse = count * (c.values.element_size() + c.indices.element_size())
    return cost_terms("all_gather", sparse, p)[1] >= cost_terms("all_reduce", dense, p)[1]


def _exchange_all_gather(comm, compressor, items, p, uniform):
    device = items[0].values.device
    own_counts = [c.values.numel() for c in items]
    if uniform:
        all_counts = [own_counts] * p
    else:
        counts = torch.tensor(own_counts, dtype=torch.int64, device=device)
        all_counts = torch.stack(comm.all_gather(counts)).tolist()  # [p][m]
    dense = [dense_is_cheaper(c, max(row[i] for row in all_counts), p) for i, c in enumerate(items)]
    if not any(dense):
        return _gather_sparse(comm, compressor, items, all_counts, p)
    out: list[torch.Tensor | None] = [None] * len(items)
    pos = [i for i, d in enumerate(dense) if d]
    as_dense = [Compressed(compressor.decompress(items[i]).reshape(-1), None, items[i].shape, items[i].dtype)
                for i in pos]
    for i, t in zip(pos, _exchange_all_reduce(comm, _IDENTITY, as_dense, p)):
        out[i] = t
    pos = [i for i, d in enumerate(dense) if not d]
    if pos:
        sparse = _gather_sparse(comm, compressor, [items[i] for i in pos], [[row[i] for i in pos] for row in all_counts], p)
        for i, t in zip(pos, sparse):
            out[i] = t
    return out


def _gather_sparse(comm, compressor, items, all_counts, p):
    """All-gather exchange of ``items`` whose values counts on every worker are ``all_counts``."""
    device = items[0].values.device
    longest = max(sum(row) for row in all_counts)

    values_dtype = functools.reduce(torch.promote_types, [c.values.dtype for c in items])
    send_indices = compressor.sparse and items[0].send_indices
    with_scale = items[0].scale is not None

    gathered_values = gathered_indices = gathered_scales = None
    if longest > 0:
        values = torch.zeros(longest, dtype=values_dtype, device=device)
        own = torch.cat([c.values.reshape(-1).to(values_dtype) for c in items])
        values[: own.numel()] = own
        gathered_values = comm.all_gather(values)
        if send_indices:
            indices = torch.zeros(longest, dtype=torch.int32, device=device)
            own_idx = torch.cat([c.indices.reshape(-1).to(torch.int32) for c in items])
            indices[: own_idx.numel()] = own_idx
            gathered_indices = comm.all_gather(indices)
    if with_scale:
        scales = torch.cat([c.scale.reshape(-1).to(torch.float32) for c in items])
        gathered_scales = comm.all_gather(scales)

    accs = [torch.zeros(c.numel, dtype=c.dtype, device=device) for c in items]
    for r in range(p):
        offset = 0
        for i, c in enumerate(items):
            n = all_counts[r][i]
            vals = gathered_values[r][offset : offset + n] if gathered_values is not None else c.values[:0]
            if send_indices:
                idx = gathered_indices[r][offset : offset + n] if gathered_indices is not None else c.indices[:0]
            else:
                idx = c.indices
            scale = gathered_scales[r][i : i + 1] if gathered_scales is not None else None
            offset += n
            other = Compressed(vals, idx, c.shape, c.dtype, scale=scale, send_indices=c.send_indices)
            compressor.add_to(accs[i], other)
    return [acc.div_(p).reshape(c.shape) for acc, c in zip(accs, items)]
