"""SparseLoCo's compressor (Sarfi, Thérien, Lidin, Belilovsky 2025, arXiv 2508.15706): top-k of
each chunk of a tensor, the kept values quantized by a 2-bit statistical quantizer, and the
payload that travels (:mod:`lsgd.algorithms.averaging.sparseloco`).

Read from the authors' code (``src/tplr/sparseloco.py`` of github.com/tplr-ai/SparseLoCo, read as
it is copied in a public fork: ``ChunkingTransform``, ``TopKCompressor``), as lsgd could not read
the paper's own text:

**Chunks** (DeMo's chunking, ``chunk`` = 64). A matrix ``[R, C]`` is cut into tiles of ``h x w``
elements, ``h`` the largest divisor of ``R`` not above ``chunk`` and ``w`` that of ``C``
(:func:`largest_divisor`); a tile's elements are read row by row. A vector of ``n`` elements is
cut into pieces of the largest divisor of ``n`` not above ``chunk``. lsgd reads a tensor of more
dimensions (a convolution's weight) as the matrix ``[shape[0], rest]`` and a scalar as a vector of
one: the authors' code chunks matrices and vectors only (a transformer's).

**Top-k per chunk.** A chunk of ``L`` elements keeps ``k = max(1, round(L * topk / chunk^2))``
(Python's round, half to even; at most ``L``) of its largest magnitudes: with ``topk`` = 128 a full
64 x 64 tile keeps 128 of 4096 (3.1%), a vector's piece of 64 keeps 2. Ties go to the lower index
(a stable sort; the authors' ``torch.topk`` leaves them unspecified).

**Statistical quantizer** (``bits`` b, ``2^b`` bins; ``range`` = 6 standard deviations), over all
the values a tensor keeps, ``v`` (m of them):

    shift = mean(v);  c = v - shift;  sigma = ||c|| / sqrt(m - 1)  (0 for m <= 1)
    s = range * sigma / 2^b   (1 where that is 0 or not finite)
    code = clamp(round(c / s + 2^(b-1)), 0, 2^b - 1)      (round half to even)
    lookup[j] = mean of the c whose code is j  (0 for an empty bin)
    v_hat = lookup[code] + shift

``shift`` and the ``2^b`` entries of ``lookup`` travel as float32 (so ``v_hat`` is computed in
float32 from them, by the sender for its error feedback as by every receiver); the codes at b bits.

**Payload** (:func:`encode`, :func:`payload_nbytes`): per tensor, in the model's order, each part
starting on a byte boundary: the indices within their chunks packed at
``ceil(log2 L)`` bits each (at least 1; 12 bits in a 4096-element tile) -- the authors' code
sends int64 indices, their production code a packed codec; lsgd counts the compact fixed width --
then the codes packed at b bits, then ``shift`` and ``lookup`` (``4 (1 + 2^b)`` bytes); with
``bits`` = 0 the values themselves in the tensor's dtype instead of codes and scales. For a tensor
with K kept values of which each index takes w bits::

    ceil(K w / 8) + ceil(K b / 8) + 4 (1 + 2^b)        (bits b > 0)
    ceil(K w / 8) + K x element size                  (bits = 0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lsgd.compression.bitpack import pack_bits, packed_nbytes, unpack_bits


def largest_divisor(n: int, at_most: int) -> int:
    """The largest divisor of ``n`` (>= 1) that is at most ``at_most`` (>= 1)."""
    for d in range(min(n, at_most), 0, -1):
        if n % d == 0:
            return d
    return 1


@dataclass(frozen=True)
class Tiling:
    """How one tensor is cut into chunks (module docstring): the tensor read as ``rows x cols``
    (a vector: one row), tiles of ``h x w``; ``k`` values kept per chunk."""

    shape: torch.Size
    rows: int
    cols: int
    h: int
    w: int
    k: int

    @property
    def chunk_len(self) -> int:
        return self.h * self.w

    @property
    def chunks(self) -> int:
        return (self.rows // self.h) * (self.cols // self.w)

    @property
    def kept(self) -> int:
        """Values the tensor keeps: chunks x k."""
        return self.chunks * self.k

    @property
    def index_bits(self) -> int:
        """Bits of one index within a chunk: ``ceil(log2 L)``, at least 1."""
        return max(1, (self.chunk_len - 1).bit_length())

    def split(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` as ``[chunks, chunk_len]`` (a copy), each chunk's elements row by row."""
        x = t.reshape(self.rows // self.h, self.h, self.cols // self.w, self.w)
        return x.permute(0, 2, 1, 3).reshape(self.chunks, self.chunk_len)

    def join(self, c: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`split`: ``[chunks, chunk_len]`` back to the tensor's shape."""
        x = c.reshape(self.rows // self.h, self.cols // self.w, self.h, self.w)
        return x.permute(0, 2, 1, 3).reshape(self.shape)


def tiling(shape: torch.Size | tuple[int, ...], chunk: int, topk: int) -> Tiling:
    """The :class:`Tiling` of a tensor of ``shape`` (module docstring)."""
    shape = torch.Size(shape)
    numel = math.prod(shape)
    if len(shape) >= 2:
        rows, cols = shape[0], numel // shape[0]
        h, w = largest_divisor(rows, chunk), largest_divisor(cols, chunk)
    else:
        rows, cols = 1, numel
        h, w = 1, largest_divisor(cols, chunk)
    length = h * w
    k = min(length, max(1, round(length * topk / chunk**2)))
    return Tiling(shape, rows, cols, h, w, k)


def select(chunks: torch.Tensor, k: int) -> torch.Tensor:
    """Per row of ``chunks``, the indices of its ``k`` largest magnitudes (ties: the lower index
    first), ``[rows, k]`` int64."""
    return torch.sort(chunks.abs(), dim=1, descending=True, stable=True).indices[:, :k]


@dataclass(frozen=True)
class Quantized:
    """One tensor's kept values as they travel: the codes, ``shift`` and ``lookup`` (float32)."""

    codes: torch.Tensor   # int64 in [0, 2^bits)
    shift: torch.Tensor   # float32, one element
    lookup: torch.Tensor  # float32, 2^bits elements

    def values(self, dtype: torch.dtype) -> torch.Tensor:
        """``lookup[code] + shift``, computed in float32, in ``dtype``."""
        return (self.lookup[self.codes] + self.shift).to(dtype)


def quantize(v: torch.Tensor, bits: int, span: float) -> Quantized:
    """The statistical quantizer of the module docstring over the flat values ``v``."""
    bins = 1 << bits
    v = v.reshape(-1)
    m = v.numel()
    shift = v.mean()
    c = v - shift
    sigma = c.norm() / math.sqrt(m - 1) if m > 1 else torch.zeros((), dtype=v.dtype, device=v.device)
    s = span * sigma / bins
    if not (float(s) > 0 and math.isfinite(float(s))):
        s = torch.ones((), dtype=v.dtype, device=v.device)
    codes = torch.round(c / s + bins // 2).clamp_(0, bins - 1).to(torch.int64)
    sums = torch.zeros(bins, dtype=v.dtype, device=v.device).index_add_(0, codes, c)
    counts = torch.zeros(bins, dtype=v.dtype, device=v.device).index_add_(0, codes, torch.ones_like(c))
    lookup = torch.where(counts > 0, sums / counts.clamp(min=1), torch.zeros_like(sums))
    return Quantized(codes, shift.reshape(1).to(torch.float32), lookup.to(torch.float32))


@dataclass
class Sparse:
    """One tensor's sparse outer gradient: per chunk the kept indices ``[chunks, k]`` and their
    values as every worker reads them ``[chunks, k]`` (the tensor's dtype), with its encoding."""

    tiling: Tiling
    indices: torch.Tensor
    values: torch.Tensor
    quantized: Quantized | None

    def dense(self) -> torch.Tensor:
        """The values scattered into a zero tensor of the original shape."""
        out = torch.zeros(self.tiling.chunks, self.tiling.chunk_len, dtype=self.values.dtype,
                          device=self.values.device)
        out.scatter_(1, self.indices, self.values)
        return self.tiling.join(out)


def compress(t: torch.Tensor, til: Tiling, bits: int, span: float) -> Sparse:
    """``t``'s top-k per chunk, quantized at ``bits`` (0: not quantized)."""
    chunks = til.split(t)
    idx = select(chunks, til.k)
    vals = chunks.gather(1, idx)
    if bits == 0:
        return Sparse(til, idx, vals, None)
    q = quantize(vals, bits, span)
    return Sparse(til, idx, q.values(t.dtype).reshape(vals.shape), q)


def tensor_nbytes(til: Tiling, bits: int, element_size: int) -> int:
    """Bytes one tensor's part of the payload takes (module docstring)."""
    kept = til.kept
    out = packed_nbytes(kept, til.index_bits)
    if bits == 0:
        return out + kept * element_size
    return out + packed_nbytes(kept, bits) + 4 * (1 + (1 << bits))


def payload_nbytes(tilings: list[Tiling], bits: int, element_sizes: list[int]) -> int:
    """Bytes of the whole payload: :func:`tensor_nbytes` summed."""
    return sum(tensor_nbytes(t, bits, e) for t, e in zip(tilings, element_sizes))


def encode(items: list[Sparse], bits: int) -> torch.Tensor:
    """The uint8 payload of ``items`` (module docstring)."""
    parts = []
    for s in items:
        parts.append(pack_bits(s.indices, s.tiling.index_bits))
        if bits == 0:
            parts.append(s.values.contiguous().reshape(-1).view(torch.uint8))
        else:
            q = s.quantized
            parts.append(pack_bits(q.codes, bits))
            parts.append(torch.cat([q.shift, q.lookup]).view(torch.uint8))
    return torch.cat([p.reshape(-1).cpu() for p in parts])


def decode(payload: torch.Tensor, tilings: list[Tiling], bits: int, dtypes: list[torch.dtype],
           device: torch.device | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Inverse of :func:`encode`: per tensor ``(indices [chunks, k], values [chunks, k])``."""
    out, offset = [], 0
    payload = payload.reshape(-1).cpu()
    for til, dtype in zip(tilings, dtypes):
        kept = til.kept
        n = packed_nbytes(kept, til.index_bits)
        idx = unpack_bits(payload[offset:offset + n], til.index_bits, kept)
        offset += n
        if bits == 0:
            size = torch.empty((), dtype=dtype).element_size()
            vals = payload[offset:offset + kept * size].clone().view(dtype)
            offset += kept * size
        else:
            n = packed_nbytes(kept, bits)
            codes = unpack_bits(payload[offset:offset + n], bits, kept)
            offset += n
            n = 4 * (1 + (1 << bits))
            scales = payload[offset:offset + n].clone().view(torch.float32)
            offset += n
            vals = Quantized(codes, scales[:1], scales[1:]).values(dtype)
        out.append((idx.reshape(til.chunks, til.k).to(device), vals.reshape(til.chunks, til.k).to(device)))
    if offset != payload.numel():
        raise ValueError(f"payload of {payload.numel()} bytes, the tensors take {offset}")
    return out


__all__ = ["Quantized", "Sparse", "Tiling", "compress", "decode", "encode", "largest_divisor", "payload_nbytes",
           "quantize", "select", "tensor_nbytes", "tiling"]
