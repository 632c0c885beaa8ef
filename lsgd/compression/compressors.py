"""Gradient compressors: what one worker sends for one tensor, and how to read it back.

Every compressor maps a tensor ``x`` (any shape, floating dtype, at most 2**31 - 1 elements) to a
:class:`Compressed` payload and back to a dense tensor of the same shape and dtype:

========  ==========================================  ===============  ==========  ==========================
name      payload (n = x.numel(), k = ceil(n / cf))   bytes (float32)  exchange    source
========  ==========================================  ===============  ==========  ==========================
none      x                                           4 n              all-reduce  dense baseline
fp16      x.half() (or bfloat16)                      2 n              all-reduce  torch fp16_compress_hook
topk      k largest |x|: values, int32 indices        8 k              all-gather  GRACE; Aji & Heafield 2017
randomk   k random coordinates (shared seed): values  4 k              all-reduce  GRACE; Stich et al. 2018
dgc       sampled-threshold top-k: values, indices    8 selected       all-gather  Lin et al., ICLR 2018
redsync   trimmed top-k threshold search              8 selected       all-gather  Fang et al., JPDC 2019
qsgd      int8 sign * level, float32 norm             n + 4            all-gather  Alistarh et al., NIPS 2017
lattice   packed colours k mod 2^bits, int64[3] sum   bits n / 8 + 24  lattice     Davies et al., ICLR 2021
========  ==========================================  ===============  ==========  ==========================

``lattice`` (:class:`Lattice`) needs a reference at the receiver: every worker decodes the others'
codes against its *own* tensor (distributed mean estimation: the workers' gradients are close),
so it has its own exchange in :mod:`lsgd.compression.exchange`.

``powersgd`` is in :data:`COMPRESSORS` (config validation) but runs as torch's DDP comm hook
(:mod:`lsgd.compression.powersgd`); :func:`build` refuses it.

The compression factor ``cf`` (theta in GraVAC) is dense size / compressed size: a sparsifier keeps
``k = ceil(n / cf)`` elements (at least 1) of every tensor. ``cf`` may be overridden per call
(``compress(x, cf=...)``), which GraVAC and Accordion use to vary it from step to step, and the
sparsifiers support GraVAC's "multi-level" compression (:meth:`Compressor.compress_further`: select
again inside an earlier selection, cheaper than starting from the dense tensor).

Randomness (randomk's indices, dgc's threshold sample, qsgd's stochastic rounding) is seeded by
:func:`lsgd.core.seeding.derive_seed` of ``(name, seed, step, key, ...)`` (the same mixer as the data
partition's), so it is reproducible and, for randomk and dgc, identical on every worker that
compresses the same ``(step, key)``; qsgd also mixes in the worker's rank so its rounding noise is
independent across workers. dgc's sample (and qsgd's rounding of float64 tensors or on other
devices) comes from a ``torch.Generator`` on the tensor's device with that seed; randomk's indices
and qsgd's rounding of float32 CPU tensors from numpy's PCG64 with it
(:mod:`lsgd.compression.fastrand`: torch's CPU generator costs 10-12 ns per number, more than these
paths' whole budget). Selected indices are returned sorted ascending.
"""

from __future__ import annotations

import abc
import inspect
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from lsgd.compression import alloc
from lsgd.compression.fastrand import random_float32, random_int64
from lsgd.compression.options import (
    DGCOptions,
    LatticeOptions,
    PowerSGDOptions,
    QSGDOptions,
    RandomKOptions,
    SparsifierOptions,
)
from lsgd.compression.powersgd import PowerSGD
from lsgd.core.registry import Registry
from lsgd.core.seeding import derive_seed
from lsgd.core.typed_config import fields

SPARSIFIERS = ("topk", "randomk", "dgc", "redsync")

# -- payload ------------------------------------------------------------------------------------
@dataclass
class Compressed:
    """One worker's compressed payload of one tensor.

    Attributes:
        values: 1-D payload values (float32 / float16 / bfloat16 / int8, ...).
        indices: 1-D int32 flat indices into the flattened original tensor, ascending, one per value
            (sparsifiers); ``None`` for dense payloads (none, fp16, qsgd).
        shape: the original tensor's shape.
        dtype: the original tensor's dtype.
        scale: qsgd: float32 tensor of one element, the L2 norm of the original tensor; else None.
        send_indices: False when the receivers regenerate the indices themselves (randomk: the
            indices follow from the seed shared by all workers), so they are not sent.
    """

    values: torch.Tensor
    indices: torch.Tensor | None
    shape: torch.Size
    dtype: torch.dtype
    scale: torch.Tensor | None = None
    send_indices: bool = True
    reference: torch.Tensor | None = None  # lattice: the tensor encoded (the decoding reference; never sent)
    point: torch.Tensor | None = None      # lattice: its own lattice point s k (float64, flat; never sent)

    @property
    def nbytes(self) -> int:
        """Bytes that travel: values, plus indices when present and sent, plus the scale."""
        total = self.values.numel() * self.values.element_size()
        if self.indices is not None and self.send_indices:
            total += self.indices.numel() * self.indices.element_size()
        if self.scale is not None:
            total += self.scale.numel() * self.scale.element_size()
        return total

    @property
    def numel(self) -> int:
        """Number of elements of the original tensor."""
        return math.prod(self.shape)


# -- helpers -------------------------------------------------------------------------------------
def _generator(device: torch.device, *parts: object) -> torch.Generator:
    """A generator on ``device`` seeded by :func:`lsgd.core.seeding.derive_seed` of ``parts``
    (the compressor's name first, then its seed, the step, the tensor key, ...)."""
    g = torch.Generator(device=device)
    g.manual_seed(derive_seed(*parts))
    return g


def num_kept(n: int, cf: float) -> int:
    """Elements a sparsifier keeps of an ``n``-element tensor at compression factor ``cf``.

    ``k = ceil(n / cf)``, at least 1 (for ``n >= 1``) and at most ``n``; 0 for an empty tensor.
    """
    if n <= 0:
        return 0
    return min(n, max(1, math.ceil(n / cf)))


def _check_cf(cf: float) -> float:
    if isinstance(cf, bool) or not isinstance(cf, (int, float)) or not cf >= 1:
        raise ValueError(f"cf (compression factor) must be a number >= 1, got {cf!r}")
    return float(cf)


def topk_indices(a: torch.Tensor, k: int) -> torch.Tensor:
    """Ascending int64 indices of the ``k`` largest entries of the 1-D tensor ``a``.

    Ties are broken deterministically: with ``v`` the k-th largest value, every element ``> v`` is
    taken, and the remaining places go to the lowest-index elements equal to ``v``. Uses
    ``torch.topk`` (no full sort) plus one equality pass; only when the boundary value ``v`` has
    ties that topk split does it redo the choice with two masks.
    """
    n = a.numel()
    if k >= n:
        return torch.arange(n, device=a.device)
    if k <= 0:
        return torch.empty(0, dtype=torch.long, device=a.device)
    vals, idx = torch.topk(a, k, sorted=False)
    v = vals.min()
    in_a, in_vals = torch.stack([(a == v).count_nonzero(), (vals == v).count_nonzero()]).tolist()  # one host read
    if in_a != in_vals:
        mask = a > v
        eq = (a == v).nonzero().squeeze(1)[: k - int(mask.count_nonzero())]
        mask.index_fill_(0, eq, True)
        return mask.nonzero().squeeze(1)
    return _ascending(idx, n)


def _ascending(idx: torch.Tensor, n: int) -> torch.Tensor:
    """The distinct indices ``idx`` (into a range of ``n``) in ascending order.

    Sorting costs O(k log k); for ``k >= n / 16`` a boolean mask and ``nonzero`` (O(n)) is faster.
    """
    if 16 * idx.numel() < n:
        return idx.sort().values
    return _unique(idx, n)


def _unique(idx: torch.Tensor, n: int) -> torch.Tensor:
    """The distinct values of ``idx`` (indices into a range of ``n``), ascending."""
    if 16 * idx.numel() < n:
        return torch.unique(idx)
    mask = torch.zeros(n, dtype=torch.bool, device=idx.device)
    mask.index_fill_(0, idx, True)  # not mask[idx] = True: advanced indexing waits on the thread pool
    return mask.nonzero().squeeze(1)


# -- base ------------------------------------------------------------------------------------------
class Compressor(abc.ABC):
    """Base class: compress a tensor to a :class:`Compressed` payload and back.

    Attributes:
        name: the registry name (:data:`COMPRESSORS`).
        cf: nominal compression factor = dense bytes / payload bytes for a float32 tensor
            (1 for none); sparsifiers use it as the default of ``compress(..., cf=)``.
        exchange: ``"all_reduce"`` when the payloads of all workers can be summed element-wise
            (none, fp16, randomk) or ``"all_gather"`` (topk, dgc, redsync, qsgd);
            see :mod:`lsgd.compression.exchange`.
        lossy: whether ``decompress(compress(x)) != x`` in general (error feedback applies).
        sparse: payloads carry indices (sparsifiers).
        fixed_size: the payload length of a tensor depends only on its numel and the call's cf
            (not on its values), so workers that compress the same tensors at the same cf send
            equal sizes and the all-gather exchange needs no size exchange (topk, randomk, qsgd,
            none, fp16; not dgc and redsync).
    """

    name = "base"
    exchange = "all_reduce"
    lossy = True
    sparse = False
    fixed_size = True
    predivide = False  # all-reduce exchange: divide by the world size before summing (fp16)

    def __init__(self, cf: float = 1.0):
        self.cf = _check_cf(cf)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(cf={self.cf:g})"

    @abc.abstractmethod
    def compress(self, tensor: torch.Tensor, *, step: int = 0, key: int = 0, cf: float | None = None) -> Compressed:
        """Compress ``tensor`` (any shape); ``cf`` overrides :attr:`cf` for this call.

        ``step`` and ``key`` (the tensor's id, e.g. its parameter index) seed randomk's indices,
        dgc's sample and warm-up, and qsgd's rounding. none, fp16 and qsgd have a fixed payload and
        ignore ``cf``.

        Raises:
            ValueError: ``cf < 1`` (sparsifiers).
        """
        raise NotImplementedError

    @abc.abstractmethod
    def decompress(self, c: Compressed) -> torch.Tensor:
        """Dense tensor of ``c.shape`` and ``c.dtype`` (zeros where a sparsifier sent nothing)."""
        raise NotImplementedError

    def compress_further(self, c: Compressed, cf: float, *, step: int = 0, key: int = 0) -> Compressed:
        """Compress an earlier payload ``c`` again by ``cf`` (GraVAC's multi-level compression).

        Raises:
            TypeError: this compressor is not a sparsifier.
        """
        raise TypeError(f"compressor {self.name!r} does not support compress_further (sparsifiers only: "
                        f"{', '.join(SPARSIFIERS)})")

    def add_to(self, out: torch.Tensor, c: Compressed) -> None:
        """Add ``decompress(c)`` to the flat (1-D, ``c.numel`` elements) tensor ``out`` in place."""
        out.add_(self.decompress(c).reshape(-1))


class NoCompression(Compressor):
    """``none``: the identity (the dense baseline). ``values`` is the flattened tensor and
    ``decompress`` reshapes it back: both may share memory with the input. Payload:
    ``n * element_size`` bytes (4 n for float32)."""

    name = "none"
    exchange = "all_reduce"
    lossy = False

    def __init__(self):
        super().__init__(1.0)

    def compress(self, tensor, *, step=0, key=0, cf=None):
        return Compressed(tensor.detach().reshape(-1), None, tensor.shape, tensor.dtype)

    def decompress(self, c):
        return c.values.to(c.dtype).reshape(c.shape)


class FP16(Compressor):
    """``fp16``: cast to float16 (or ``dtype="bfloat16"``), as torch's ``fp16_compress_hook`` /
    ``bf16_compress_hook`` (torch.distributed.algorithms.ddp_comm_hooks.default_hooks).

    Payload: 2 n bytes; cf = 2 for float32 tensors. Exchanged by all-reduce with the values divided
    by the world size before the sum (as the torch hook does, to avoid float16 overflow).

    Raises:
        ValueError: ``dtype`` not float16 / bfloat16.
    """

    name = "fp16"
    exchange = "all_reduce"
    lossy = True
    predivide = True
    DTYPES: ClassVar[dict[str, torch.dtype]] = {"float16": torch.float16, "bfloat16": torch.bfloat16}

    def __init__(self, dtype: str = "float16"):
        if dtype not in self.DTYPES:
            raise ValueError(f"fp16 dtype must be one of {', '.join(self.DTYPES)}, got {dtype!r}")
        super().__init__(2.0)
        self.half_dtype = self.DTYPES[dtype]

    def compress(self, tensor, *, step=0, key=0, cf=None):
        return Compressed(tensor.detach().reshape(-1).to(self.half_dtype), None, tensor.shape, tensor.dtype)

    def decompress(self, c):
        return c.values.to(c.dtype).reshape(c.shape)


# -- sparsifiers ----------------------------------------------------------------------------------
class Sparsifier(Compressor):
    """Base of the sparsifiers: payload = (values, int32 indices) of selected coordinates.

    Subclasses implement :meth:`select`. ``compress`` selects on ``|x|`` at ``k = ceil(n / cf)``;
    :meth:`compress_further` applies the same rule to the values of an earlier payload.
    """

    exchange = "all_gather"
    sparse = True
    lossy = True
    send_indices = True

    @abc.abstractmethod
    def select(self, x: torch.Tensor, k: int, cf: float, *, step: int, key: int, level: int) -> torch.Tensor:
        """Ascending int64 indices into the 1-D tensor ``x`` to keep (nominally ``k`` of them).

        ``level`` is 0 for :meth:`compress` and 1 for :meth:`compress_further` (mixed into seeds).
        """
        raise NotImplementedError

    def _effective_cf(self, cf: float | None, step: int) -> float:
        return self.cf if cf is None else _check_cf(cf)

    def compress(self, tensor, *, step=0, key=0, cf=None):
        cf = self._effective_cf(cf, step)
        flat = tensor.detach().reshape(-1)
        k = num_kept(flat.numel(), cf)
        idx = self.select(flat, k, cf, step=step, key=key, level=0)
        # index_select, not flat[idx]: the same values, without advanced indexing's thread-pool
        # dispatch (measured 6-16 ms for 20k of 200k floats on the loaded 2-core machine, vs 0.01 ms)
        m = idx.numel()
        if flat.device.type == "cpu" and m * flat.element_size() >= alloc.LARGE_BYTES:  # huge pages (alloc)
            values = torch.index_select(flat, 0, idx, out=alloc.empty(m, flat.dtype))
            ints = alloc.empty(m, torch.int32).copy_(idx)
        else:  # small: fresh outputs (out= variants here made a resumed run's modeled compute differ in
            # its last bit from the uninterrupted run's: tests/distributed/test_measurement.py, accordion)
            values, ints = flat.index_select(0, idx), idx.to(torch.int32)
        return Compressed(values, ints, tensor.shape, tensor.dtype, send_indices=self.send_indices)

    def compress_further(self, c, cf, *, step=0, key=0):
        """Select again inside ``c`` with ``k2 = ceil(len(c.values) / cf)`` (GraVAC's multi-level
        compression, docs/papers.md#gravac): the result is a payload of the original tensor whose
        indices are ``c.indices[sub]``, total CF about ``CF(c) * cf``.

        Raises:
            ValueError: ``cf < 1``; TypeError: ``c`` carries no indices.
        """
        cf = _check_cf(cf)
        if c.indices is None:
            raise TypeError("compress_further needs a sparse payload (with indices)")
        k2 = num_kept(c.values.numel(), cf)
        sub = self.select(c.values, k2, cf, step=step, key=key, level=1)
        return Compressed(c.values.index_select(0, sub), c.indices.index_select(0, sub), c.shape, c.dtype,
                          send_indices=c.send_indices)

    def _scale(self, c: Compressed) -> float:
        return 1.0

    def decompress(self, c):
        out = alloc.zeros(c.numel, c.dtype, c.values.device)  # huge pages, lazily zeroed (alloc module)
        self.add_to(out, c)
        return out.reshape(c.shape)

    def add_to(self, out, c):
        if c.values.numel() == 0:
            return
        vals = c.values.to(out.dtype)
        s = self._scale(c)
        if s != 1.0:
            vals = vals * s
        out.index_add_(0, c.indices.to(torch.long), vals)


class TopK(Sparsifier):
    """``topk``: exact top-k by magnitude of each tensor (GRACE's TopKCompressor; Aji and Heafield
    2017; the GraVAC study's main sparsifier).

    ``k = ceil(n / cf)``; ties at the k-th largest magnitude go to the lowest indices
    (:func:`topk_indices`). Payload: k values + k int32 indices (8 k bytes for float32).
    """

    name = "topk"

    def __init__(self, cf: float = 10.0):
        super().__init__(cf)

    def select(self, x, k, cf, *, step, key, level):
        return topk_indices(x.abs(), k)


class RandomK(Sparsifier):
    """``randomk``: ``k = ceil(n / cf)`` distinct coordinates, each kept with probability exactly
    ``k / n`` (GRACE's RandomKCompressor; Stich, Cordonnier and Jaggi, NeurIPS 2018), drawn by
    rotated stratified sampling so that no permutation of ``n`` is ever materialized.

    The indices come from a seed derived from ``(seed, step, key)`` (plus the level for
    :meth:`compress_further`), identical on every worker, so they are not sent
    (``send_indices=False``; payload 4 k bytes for float32) and the payloads of all workers can be
    summed by an all-reduce. ``unbiased=True`` multiplies by ``n / k`` on decompression
    (E[D(C(x))] = x); the default (biased, as GRACE with error feedback) does not.

    Sampling (:func:`stratified_indices`): the circle ``0 .. n - 1`` is cut, from a uniformly random
    rotation ``r``, into ``k`` consecutive strata, the first ``n mod k`` of ``m + 1`` coordinates and
    the rest of ``m = n // k``; one coordinate is drawn uniformly in each stratum. A coordinate lies
    in a stratum of size ``b`` with probability (over ``r``) ``b * (number of such strata) / n``, and
    is then drawn with probability ``1 / b``, so ``P(i kept) = sum_strata b (1 / b) / n = k / n``
    for every ``i``: the estimator ``(n / k) x_i`` on the kept coordinates is unbiased, as for a
    uniform k-subset (the documented scaling), and its variance ``E ||D(C(x)) - x||^2 = (n / k - 1)
    ||x||^2`` is exactly a uniform k-subset's (it depends only on the inclusion probabilities). What
    differs is the joint law: two coordinates of one stratum are never kept together, so the kept
    set is spread over the tensor (a change of sampling scheme from the earlier i.i.d.-draws-and-
    de-duplication, which moved the random-k goldens). Cost: O(k) in int64 (about
    ten passes over ``k`` integers plus the gather), against O(n) for the permutation or the
    de-duplication of i.i.d. draws it replaces. Random bits: numpy's PCG64
    (:mod:`lsgd.compression.fastrand`); the offset in a stratum of ``b`` is ``(w b) >> 32`` of a
    32-bit word ``w``, uniform within ``b / 2**32`` (relative) of exactly.
    """

    name = "randomk"
    exchange = "all_reduce"
    send_indices = False

    def __init__(self, cf: float = 10.0, seed: int = 0, unbiased: bool = False):
        super().__init__(cf)
        self.seed = int(seed)
        self.unbiased = bool(unbiased)

    def select(self, x, k, cf, *, step, key, level):
        n = x.numel()
        if k >= n:
            return torch.arange(n, device=x.device)
        return stratified_indices(n, k, derive_seed("randomk", self.seed, step, key, level), x.device)

    def _scale(self, c):
        return c.numel / c.values.numel() if self.unbiased and c.values.numel() else 1.0


def stratified_indices(n: int, k: int, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``k`` distinct indices into ``range(n)`` (``1 <= k <= n < 2**31``), ascending, int64 of shape
    ``[k]``: one uniform draw in each of ``k`` strata of a uniformly rotated circle
    (:class:`RandomK`), every index kept with probability ``k / n``. Deterministic in ``seed``."""
    m, extra = divmod(n, k)
    words = random_int64(k + 1, seed)
    low = words.bitwise_and_(0xFFFFFFFF)                        # k + 1 uniform 32-bit words, int64
    rot = int(low[k]) * n >> 32                                 # rotation, uniform in [0, n)
    pos = low[:k]
    big = extra * (m + 1)
    pos[:extra].mul_(m + 1).bitwise_right_shift_(32).add_(torch.arange(0, big, m + 1))
    pos[extra:].mul_(m).bitwise_right_shift_(32).add_(torch.arange(big, n, m))
    # positions ascend; shifting by -rot (mod n) keeps two ascending runs: those >= rot, then the rest
    j0 = int(torch.searchsorted(pos, rot))
    idx = torch.cat([pos[j0:].sub_(rot), pos[:j0].add_(n - rot)])
    return idx if torch.device(device).type == "cpu" else idx.to(device)


class DGC(Sparsifier):
    """``dgc``: Deep Gradient Compression's sampled-threshold top-k (Lin, Han, Mao, Wang and Dally,
    "Deep Gradient Compression", ICLR 2018, Sec. 3; public code github.com/synxlin/deep-gradient-compression).

    Selection rule at ``k = ceil(n / cf)`` (documented here as this implementation's choice):

    1. sample ``s = min(n, max(ceil(sample_ratio * n), 1000))`` magnitudes uniformly with
       replacement (generator seeded by ``(seed, step, key, level)``); when ``s >= n`` the sample
       would be the whole tensor and exact top-k is used;
    2. threshold = the ``ceil(s / cf)``-th largest sampled magnitude; select ``|x| >= threshold``;
    3. if fewer than ``ceil(k / 2)`` are selected, halve the threshold and count again, at most 3
       times, then fall back to exact top-k;
    4. if more than ``k`` are selected, keep the exact top-k among them (ties as :class:`TopK`).

    So ``ceil(k/2) <= selected <= k`` and the selected set is always the top-``selected`` set of
    ``|x|``. Payload: 8 * selected bytes for float32 (it varies across steps and workers).

    Density warm-up (Sec. 3.4, "warm-up training"): over the first ``warmup_epochs`` epochs W the
    density (1 / compression factor) falls exponentially, one level per epoch, to the target: in
    epoch ``e = step // steps_per_epoch < W`` the compression factor is ``cf ** ((e + 1) / (W + 1))``
    (density ``(1/cf) ** ((e + 1) / (W + 1))``), from epoch W on ``cf`` itself. This is the
    authors' rule (``DGCCompressor.warmup_compress_ratio`` in dgc/compression.py:
    ``warmup_coeff = ratio ** (1 / (W + 1))``, ratio ``warmup_coeff ** (e + 1)`` in epoch e); with
    the paper's W = 4 and cf = 1000 it gives densities 25.1%, 6.3%, 1.58%, 0.40%, then 0.1%: the
    paper's "25%, 6.25%, 1.5625%, 0.4%". The ramp applies to the call's target ``cf`` (``compress(...,
    cf=)``) as well. Momentum correction and factor masking (Sec. 3.2) are error-feedback
    memories (:class:`lsgd.compression.memory.DGCMemory`), built by the algorithm.

    Raises:
        ValueError: ``warmup_epochs > 0`` without ``steps_per_epoch >= 1``.
    """

    name = "dgc"
    fixed_size = False
    MIN_SAMPLE = 1000
    RETRIES = 3

    def __init__(self, cf: float = 10.0, sample_ratio: float = 0.01, warmup_epochs: int = 0,
                 steps_per_epoch: int | None = None, seed: int = 0):
        super().__init__(cf)
        self.sample_ratio = float(sample_ratio)
        self.warmup_epochs = int(warmup_epochs)
        if self.warmup_epochs > 0 and (steps_per_epoch is None or int(steps_per_epoch) < 1):
            raise ValueError(f"dgc warmup_epochs={warmup_epochs} needs steps_per_epoch >= 1, got {steps_per_epoch!r}")
        self.steps_per_epoch = int(steps_per_epoch) if steps_per_epoch is not None else None
        self.seed = int(seed)
        self._scratch: dict = {}  # abs_at_least's |x| and mask of the largest tensor so far (5 bytes per float32)

    def effective_cf(self, step: int, cf: float | None = None) -> float:
        """The compression factor used at local step ``step`` (0-based) for target ``cf``
        (default :attr:`cf`): ``cf ** ((e + 1) / (W + 1))`` in warm-up epoch ``e < W``, else ``cf``."""
        cf = self.cf if cf is None else cf
        if self.warmup_epochs <= 0:
            return cf
        epoch = step // self.steps_per_epoch
        if epoch >= self.warmup_epochs:
            return cf
        return cf ** ((epoch + 1) / (self.warmup_epochs + 1))

    def _effective_cf(self, cf, step):
        return self.effective_cf(step, super()._effective_cf(cf, step))

    def select(self, x, k, cf, *, step, key, level):
        n = x.numel()
        if k >= n:
            return torch.arange(n, device=x.device)
        s = min(n, max(math.ceil(self.sample_ratio * n), self.MIN_SAMPLE))
        if s >= n:
            return topk_indices(x.abs(), k)
        g = _generator(x.device, "dgc", self.seed, step, key, level)
        sample = x.index_select(0, torch.randint(0, n, (s,), generator=g, device=x.device)).abs()
        k_s = max(1, math.ceil(s / cf))
        threshold = torch.topk(sample, k_s, sorted=False).values.min()
        need = math.ceil(k / 2)
        idx = abs_at_least(x, threshold, self._scratch)
        for _ in range(self.RETRIES):
            if idx.numel() >= need:
                break
            threshold = threshold * 0.5
            idx = abs_at_least(x, threshold, self._scratch)
        if idx.numel() < need:
            return topk_indices(x.abs(), k)
        if idx.numel() > k:
            idx = idx.index_select(0, topk_indices(x.index_select(0, idx).abs(), k))
        return idx


def abs_at_least(x: torch.Tensor, threshold: torch.Tensor, scratch: dict | None = None) -> torch.Tensor:
    """Ascending int64 indices of the 1-D tensor ``x`` where ``|x| >= threshold``: the set of
    ``(x.abs() >= threshold).nonzero()``, DGC's selection pass (the bulk of its cost), computed as
    two whole-tensor operations into scratch buffers (kept in ``scratch`` between calls: no fresh
    pages to fault in and zero) and, on the CPU, numpy's ``flatnonzero`` of the mask.

    Measured on the loaded 2-core machine (25 Nov 2026, 25M floats, about 0.1% selected): numpy's
    ``flatnonzero`` 6.9 ms against 50.8 ms for ``torch.nonzero`` of the same mask; reused buffers
    78 ms vs 98 ms fresh for the whole pass with torch.nonzero; cache-sized blocks (more
    operations, each waiting for the loaded thread pool) 298 ms."""
    n = x.numel()
    scratch = {} if scratch is None else scratch
    key = (x.dtype, x.device)
    if key not in scratch or scratch[key][0].numel() < n:
        scratch[key] = (alloc.empty(n, x.dtype, x.device), alloc.empty(n, torch.bool, x.device))
    a, mask = scratch[key][0][:n], scratch[key][1][:n]
    torch.ge(torch.abs(x, out=a), threshold, out=mask)
    if x.device.type == "cpu":
        return torch.from_numpy(np.flatnonzero(mask.numpy()))
    return mask.nonzero().squeeze(1)


class RedSync(Sparsifier):
    """``redsync``: RedSync's trimmed top-k threshold search (Fang, Fu, Yang and Cheng, "RedSync:
    Reducing synchronization bandwidth for distributed deep learning training system", JPDC 2019,
    Sec. 4; the GraVAC study's Redsync compressor).

    Rule at ``k = ceil(n / cf)`` (this implementation's choice): with ``m = mean(|x|)`` and
    ``M = max(|x|)`` the threshold is ``m + ratio * (M - m)`` (computed as ``M - (1 - ratio) (M - m)``,
    exact at ``ratio = 1``), ``ratio = 1, 1/2, 1/4, ...`` (at
    most 30 halvings, then ``ratio = 0``) until ``|x| >= threshold`` selects at least ``k``
    elements. When ``ratio = 1/16`` still selects fewer, ``ratio = 0`` (the mean) is tried once, and
    if even that selects fewer than ``k`` (cf close to 1, or very heavy tails) exact top-k is
    used. If the accepted ratio selects more than ``2 k``, bisect
    ``ratio`` between the last two tries (at most 10 steps) for a count in ``[k, 2k]``, and if still
    above ``2 k`` keep the exact top-k of the selected ones. Hence ``k <= selected <= 2k``; each try
    is one pass over ``|x|``. Payload 8 * selected bytes (float32).
    """

    name = "redsync"
    fixed_size = False
    MAX_HALVINGS = 30
    CHECK_MEAN_BELOW = 1 / 16
    MAX_BISECTIONS = 10

    def __init__(self, cf: float = 10.0):
        super().__init__(cf)

    def select(self, x, k, cf, *, step, key, level):
        n = x.numel()
        if k >= n:
            return torch.arange(n, device=x.device)
        a = x.abs()
        mean, top = a.mean(), a.max()
        mask = torch.empty(n, dtype=torch.bool, device=x.device)

        def count(ratio: float) -> int:
            # top - (1 - ratio) (top - mean), not mean + ratio (top - mean): the same threshold, but
            # ratio 1 gives exactly max |x| (the other form can round just above it, select nothing
            # and so change the whole search with the last bit of the mean, i.e. with the CPU)
            return int(torch.ge(a, top - (1.0 - ratio) * (top - mean), out=mask).count_nonzero())

        hi, ratio, c = None, 1.0, count(1.0)
        for _ in range(self.MAX_HALVINGS):
            if c >= k:
                break
            if ratio == self.CHECK_MEAN_BELOW and count(0.0) < k:
                return topk_indices(a, k)
            hi, ratio = ratio, ratio * 0.5
            c = count(ratio)
        if c < k:
            ratio, c = 0.0, count(0.0)
        if c > 2 * k and hi is not None:
            lo, mask_is_lo = ratio, True
            for _ in range(self.MAX_BISECTIONS):
                mid = 0.5 * (lo + hi)
                cm = count(mid)
                if cm < k:
                    hi, mask_is_lo = mid, False
                else:
                    lo, c, mask_is_lo = mid, cm, True
                    if cm <= 2 * k:
                        break
            if not mask_is_lo:  # the mask holds a rejected try: recompute it at the accepted ratio
                count(lo)
        idx = mask.nonzero().squeeze(1)
        if idx.numel() > 2 * k:
            idx = idx[topk_indices(a[idx], k)]
        return idx


# -- quantizer ----------------------------------------------------------------------------------
class QSGD(Compressor):
    """``qsgd``: stochastic quantization to ``levels`` levels (Alistarh, Grubic, Li, Tomioka and
    Vojnovic, "QSGD: Communication-Efficient SGD via Gradient Quantization and Encoding", NIPS 2017,
    Sec. 3.1; GRACE's QSGDCompressor), without the Elias coding.

    With ``s = levels`` and ``norm = ||x||_2``: ``l_i = floor(s |x_i| / norm + u_i)``,
    ``u_i ~ U[0, 1)``; payload ``values = int8(sign(x_i) * l_i)`` (``s <= 127``) and
    ``scale = norm`` (float32, 1 element); ``decompress = norm / s * values``. Unbiased:
    ``E[D(C(x))] = x``, with variance ``sum_i (norm/s)^2 p_i (1 - p_i) <= n (norm / s)^2 / 4``
    (``p_i`` the fractional part of ``s |x_i| / norm``). Payload: ``n + 4`` bytes; nominal cf 4 for
    float32. The levels are computed in the tensor's dtype (float32 for float16 / bfloat16), the norm
    sent as float32. The rounding noise ``u`` comes from a generator seeded by ``(seed, step, key, rank)``,
    ``rank`` = the torch.distributed rank when initialized (or the ``rank`` argument), so workers
    round independently. Exchanged by all-gather. float32 tensors on the CPU take a fast path
    (:meth:`_levels_float32`: the same law of the levels up to a bias of 2**-16 of a level, random
    bits from numpy's PCG64 instead of torch's generator, so other draws than before); float64
    (the goldens) and other devices keep the torch-generator path unchanged.

    Raises:
        ValueError: ``levels`` not an integer in [1, 127].
    """

    name = "qsgd"
    exchange = "all_gather"
    lossy = True

    def __init__(self, levels: int = 127, seed: int = 0, rank: int | None = None):
        if isinstance(levels, bool) or not isinstance(levels, int) or not 1 <= levels <= 127:
            raise ValueError(f"qsgd levels must be an integer in [1, 127] (int8 payload), got {levels!r}")
        super().__init__(4.0)
        self.levels = levels
        self.seed = int(seed)
        self.rank = rank

    def _rank(self) -> int:
        if self.rank is not None:
            return int(self.rank)
        import torch.distributed as dist

        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0

    def compress(self, tensor, *, step=0, key=0, cf=None):
        flat = tensor.detach().reshape(-1)
        if flat.dtype not in (torch.float32, torch.float64):  # float16 / bfloat16: compute in float32
            flat = flat.float()
        norm = flat.norm()
        s = self.levels
        if flat.dtype == torch.float32 and flat.device.type == "cpu":
            values = self._levels_float32(flat, norm, derive_seed("qsgd", self.seed, step, key, self._rank()))
        else:
            g = _generator(flat.device, "qsgd", self.seed, step, key, self._rank())
            u = torch.rand(flat.numel(), generator=g, device=flat.device)
            # no host read of the norm (a GPU sync per tensor): a zero / non-finite norm gives zero
            # levels through torch.where, as the branch on float(norm) > 0 did
            positive = norm > 0
            level = torch.floor(flat.abs() * (s / torch.where(positive, norm, torch.ones_like(norm))) + u).clamp_(max=s)
            values = torch.where(positive, torch.sign(flat) * level, torch.zeros_like(level)).to(torch.int8)
        return Compressed(values, None, tensor.shape, tensor.dtype, scale=norm.reshape(1).to(torch.float32))

    def _levels_float32(self, flat: torch.Tensor, norm: torch.Tensor, seed: int) -> torch.Tensor:
        """The fast path (float32 on the CPU): int8 ``floor(v + u)``, ``v = x s / norm`` signed, in
        four passes over one float32 buffer that holds the random numbers first.

        ``floor(v + u)`` with ``u ~ U[0, 1)`` has the law of ``sign(v) floor(|v| + u)`` (both are
        ``floor(v)`` or ``floor(v) + 1``, the latter with probability ``frac(v)``), so the levels
        are QSGD's, unbiased. ``128 + u`` comes from 16 random bits (numpy's PCG64,
        :func:`lsgd.compression.fastrand.random_float32`: ``u`` on the 2**-16 grid of [0, 1)), so
        ``t = v + 128 + u`` lies in ``[1, 256)`` (``|v| <= s <= 127``), where ``floor`` is a plain
        truncation to uint8 and ``floor(t) - 128`` the int8 level (its top bit flipped). float32's
        spacing on ``[128, 256)`` is 2**-16, so the rounding of ``t`` and the grid of ``u`` move the
        probability of rounding up by at most 2**-16: a bias of at most ``2**-16 norm / s`` per
        coordinate (the torch-generator path's float32 ``|x| s / norm + u``: up to 2**-17 of a
        level at ``|v| >= 64``), against a rounding noise of up to ``norm / (2 s)``."""
        s = self.levels
        n = flat.numel()
        if not float(norm) > 0:
            return torch.zeros(n, dtype=torch.int8)
        t = random_float32(n, seed, 128.0, 16)                 # 128 + u
        t.add_(flat, alpha=float(s / norm)).clamp_(128 - s, 128 + s)
        return alloc.empty(n, torch.uint8).copy_(t).bitwise_xor_(0x80).view(torch.int8)

    def decompress(self, c):
        # int8 -> float32 copy, then an in-place float32 product (a mixed int8 * float32 product
        # runs unvectorized: 150 ms vs 20 ms for 25M elements, measured)
        out = alloc.empty(c.values.numel(), torch.float32, c.values.device).copy_(c.values)
        out.mul_(c.scale.to(torch.float32) / self.levels)
        return out.to(c.dtype).reshape(c.shape)


class Lattice(Compressor):
    """``lattice``: the lattice (reference-point) quantizer of :mod:`lsgd.compression.lattice`
    (Davies, Gurunathan, Moshrefi, Ashkboos and Alistarh, "New Bounds for Distributed Mean
    Estimation and Variance Reduction", ICLR 2021) as a gradient compressor.

    ``compress`` sends the colours ``k mod 2^bits`` of ``k = floor(x / side + u)`` (unbiased random
    rounding, ``u`` from a generator seeded by ``(seed, step, key, rank)``: workers round
    independently) and the 24-byte checksum of ``k`` (in ``scale``). A receiver decodes each other
    worker's codes against its own tensor (:func:`lsgd.compression.exchange.exchange`): exact while
    the two differ by less than ``2^bits side / 2 - side`` in every coordinate; a decode outside
    that radius is caught by the checksum and the tensor is averaged again at full precision.
    ``decompress`` returns the sender's own lattice point (what every receiver decodes when exact).

    Error feedback is allowed but not needed: the rounding is unbiased (E[s k] = x), its error at
    most ``side`` per coordinate. Has no compression factor (``cf`` is ``32 / bits`` nominally), so
    the adaptive methods (GraVAC, Accordion), which vary a sparsifier's cf, do not take it.

    Raises:
        ValueError: ``bits`` not in 1, 2, 4, 8, 16, or ``side`` not > 0 (the message names
            ``algo.bits`` / ``algo.side``).
    """

    name = "lattice"
    exchange = "lattice"
    lossy = True

    def __init__(self, bits: int = 8, side: float = 1e-4, seed: int = 0, rank: int | None = None):
        from lsgd.compression.lattice import LatticeQuantizer

        self.quantizer = LatticeQuantizer(bits, side)
        super().__init__(32.0 / self.quantizer.bits)
        self.seed = int(seed)
        self.rank = rank
        self.resent = 0  # items averaged again at full precision (a decode outside the radius)

    _rank = QSGD._rank

    def compress(self, tensor, *, step=0, key=0, cf=None):
        g = _generator(tensor.device, "lattice", self.seed, step, key, self._rank())
        code, point = self.quantizer.encode(tensor, g)
        return Compressed(code.payload, None, tensor.shape, tensor.dtype, scale=code.checksum,
                          reference=tensor.detach().clone(), point=point)

    def decompress(self, c):
        return c.point.to(c.dtype).reshape(c.shape)


# -- registry -------------------------------------------------------------------------------------
#: every compressor, by ``algo.compressor``: its class (``powersgd``: the DDP comm hook's
#: :class:`lsgd.compression.powersgd.PowerSGD`, not built by :func:`build`), the dataclass of its keys
#: in the ``algo`` block (:mod:`lsgd.compression.options`; None: it has none), how tables write it
#: (``label``) and, as ``extra["strength_key"]``, the key that sets how strongly it compresses
#: (written after it in a label: CF for the sparsifiers, s levels for QSGD, bits for the lattice, the
#: rank for PowerSGD; None for ``none`` and ``fp16``).
COMPRESSORS: Registry[type] = Registry("compressor", "algo.compressor")
_STATIC = "docs/papers.md#compressed"
COMPRESSORS.add("none", NoCompression, label="dense", summary="the identity (the dense baseline)", paper=_STATIC,
                strength_key=None)
COMPRESSORS.add("fp16", FP16, label="fp16", summary="cast to float16 (or bfloat16), as torch's fp16_compress_hook",
                paper=_STATIC, strength_key=None)
COMPRESSORS.add("topk", TopK, config=SparsifierOptions, label="top-k", summary="exact top-k by magnitude",
                paper=_STATIC, strength_key="algo.cf")
COMPRESSORS.add("randomk", RandomK, config=RandomKOptions, label="random-k",
                summary="k random coordinates, indices from a seed shared by every worker", paper=_STATIC,
                strength_key="algo.cf")
COMPRESSORS.add("dgc", DGC, config=DGCOptions, label="DGC",
                summary="Deep Gradient Compression's sampled-threshold top-k", paper=_STATIC, strength_key="algo.cf")
COMPRESSORS.add("redsync", RedSync, config=SparsifierOptions, label="RedSync",
                summary="RedSync's trimmed top-k threshold search", paper=_STATIC, strength_key="algo.cf")
COMPRESSORS.add("qsgd", QSGD, config=QSGDOptions, label="QSGD", summary="stochastic quantization to s levels (int8)",
                paper=_STATIC, strength_key="algo.levels")
COMPRESSORS.add("lattice", Lattice, config=LatticeOptions, label="lattice",
                summary="lattice quantization, decoded against each receiver's own gradient",
                paper="docs/papers.md#lattice-quantizer", strength_key="algo.bits")
COMPRESSORS.add("powersgd", PowerSGD, config=PowerSGDOptions, label="PowerSGD",
                summary="torch's PowerSGD comm hook (a rank-r power iteration per DDP bucket)", paper=_STATIC,
                strength_key="algo.rank")


def build_params(name: str) -> tuple[str, ...]:
    """The parameters :func:`build` takes for compressor ``name``: its class's constructor's."""
    return tuple(p for p in inspect.signature(COMPRESSORS[name].__init__).parameters if p != "self")


def config_params(name: str) -> tuple[str, ...]:
    """The keys of the ``algo`` block that go to :func:`build` for compressor ``name``: the fields of
    its options dataclass that its constructor takes (DGC's ``momentum_correction`` and ``clip_norm``
    belong to the algorithm's memory and hook instead)."""
    options = COMPRESSORS.entry(name).config
    if options is None:
        return ()
    return tuple(k for k in fields(options) if k in build_params(name))


def build(name: str, **params) -> Compressor:
    """The compressor ``name`` (one of :data:`COMPRESSORS` except powersgd) with ``params``.

    Parameters per compressor (:func:`build_params`): none: -; fp16: ``dtype`` (float16 | bfloat16);
    topk, redsync: ``cf``; randomk: ``cf``, ``seed``, ``unbiased``; dgc: ``cf``, ``sample_ratio`` (0, 1],
    ``warmup_epochs`` (integer >= 0), ``steps_per_epoch`` (needed when ``warmup_epochs > 0``),
    ``seed``; qsgd: ``levels``
    [1, 127], ``seed``, ``rank``.

    Raises:
        ValueError: unknown name (the message lists the allowed ones), ``powersgd`` (it runs as
            torch's DDP comm hook, :mod:`lsgd.compression.powersgd`), an unknown parameter (the
            message lists the allowed ones), ``cf < 1``, qsgd ``levels`` outside [1, 127], or another
            parameter out of range; each message names the offending key.
    """
    if name == "powersgd":
        raise ValueError("compressor 'powersgd' is not built by lsgd.compression.build: it runs as torch's DDP "
                         "comm hook (lsgd.compression.powersgd.PowerSGD)")
    if name not in COMPRESSORS:
        raise ValueError(f"unknown compressor {name!r}; allowed: {', '.join(COMPRESSORS)}")
    allowed = build_params(name)
    for key in params:
        if key not in allowed:
            raise ValueError(f"unknown parameter {key!r} for compressor {name!r}; allowed: "
                             f"{', '.join(allowed) if allowed else '(none)'}")
    if "cf" in params:
        _check_cf(params["cf"])
    if name == "dgc":
        sr = params.get("sample_ratio", 0.01)
        if not 0 < float(sr) <= 1:
            raise ValueError(f"dgc sample_ratio must be in (0, 1], got {sr!r}")
        we = params.get("warmup_epochs", 0)
        if isinstance(we, bool) or not isinstance(we, int) or we < 0:
            raise ValueError(f"dgc warmup_epochs must be an integer >= 0, got {we!r}")
    return COMPRESSORS[name](**params)
