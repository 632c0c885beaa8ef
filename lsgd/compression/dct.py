"""DeMo's transform and selection: a tensor cut into chunks, each chunk's orthonormal DCT-II, the
``k`` largest coefficients of each chunk, and the average of several workers' selections
(Peng, Quesnelle and Kingma 2024, "DeMo: Decoupled Momentum Optimization", arXiv 2411.19870; the
authors' code github.com/bloc97/DeMo ``demo.py``: ``TransformDCT``, ``CompressDCT``). Used by
:mod:`lsgd.algorithms.gradient_compression.demo`.

Chunks (``demo.py``'s ``_get_smaller_split``): a dimension of size ``n`` is cut into chunks of
:func:`chunk_size` ``(n, s)``, the largest divisor of ``n`` not above the target ``s`` (``n`` itself
when ``n <= s``; 1 for a prime ``n > s``). A 1-D tensor is a row of chunks; a 2-D tensor ``[r, c]``
a grid of ``chunk_size(r, s) x chunk_size(c, s)`` blocks, each transformed by the separable 2-D DCT
(rows and columns). A tensor of more dimensions is transformed as its matrix view
``[shape[0], prod(shape[1:])]`` (a convolution's ``[out, in * kh * kw]``), a 0-d tensor as a 1-D
tensor of one element: ``demo.py`` handles 1-D and 2-D tensors only (its ``einops`` patterns fail on
a 4-D convolution weight).

Coefficients are laid out as ``demo.py`` lays them out, ``[chunks, chunk elements]``: chunks in
row-major order of the grid, a chunk's coefficients row-major (``b * n2 + d`` for frequency ``b``
along the rows and ``d`` along the columns), so an index this module selects is the index
``demo.py`` sends.

The DCT is a matrix product with the orthonormal DCT-II basis ``C`` (``C[k, i] = sqrt(2 / n)
cos(pi (2 i + 1) k / (2 n))``, row 0 scaled by ``1 / sqrt(2)``; ``C^T`` inverts it), as ``demo.py``
applies it (``einsum`` with precomputed basis matrices): torch has no DCT of its own (``torch.fft``
has none), and the chunks are small (64 by default), so the product is one batched matmul per
dimension. The basis is written from the cosine formula in float64 and cast to the tensor's dtype;
``demo.py`` derives it by an FFT of the identity in torch's default dtype (float32 unless set
otherwise), which agrees to float32 rounding.
"""

from __future__ import annotations

import functools
import math

import torch


def chunk_size(n: int, target: int) -> int:
    """The chunk length of a dimension of size ``n`` for target ``target`` (``demo.py``'s
    ``_get_smaller_split``): ``n`` when ``n <= target``, else the largest divisor of ``n`` that is
    at most ``target``.

    Raises:
        ValueError: ``n`` or ``target`` below 1.
    """
    if n < 1 or target < 1:
        raise ValueError(f"chunk_size needs n >= 1 and target >= 1, got n={n}, target={target}")
    if n <= target:
        return n
    return next(d for d in range(target, 0, -1) if n % d == 0)


@functools.lru_cache(maxsize=None)
def _dct_basis64(n: int) -> torch.Tensor:
    k = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(n, dtype=torch.float64)[None, :]
    basis = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    basis[0] /= math.sqrt(2.0)
    return basis


def dct_matrix(n: int, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None) -> torch.Tensor:
    """The orthonormal DCT-II matrix ``C`` of size ``n x n`` (``C @ x`` is the DCT of ``x``,
    ``C.T @ X`` its inverse), computed in float64 and cast to ``dtype``."""
    return _dct_basis64(n).to(dtype=dtype, device=device)


class ChunkedDCT:
    """The chunked DCT of tensors of one shape (module docstring).

    Attributes:
        shape: the tensor's shape.
        chunks: the chunk lengths, ``(n1,)`` for a 1-D view or ``(n1, n2)`` for a matrix view.
        num_chunks: the number of chunks.
        chunk_numel: coefficients per chunk (``n1`` or ``n1 * n2``).
    """

    def __init__(self, shape: torch.Size | tuple[int, ...], target: int, dtype: torch.dtype,
                 device: torch.device | str | None = None):
        self.shape = torch.Size(shape)
        if len(self.shape) >= 2:
            rows, cols = self.shape[0], math.prod(self.shape[1:])
            self.view = (rows, cols)
            self.chunks = (chunk_size(rows, target), chunk_size(cols, target))
        else:
            self.view = (max(1, math.prod(self.shape)),)
            self.chunks = (chunk_size(self.view[0], target),)
        self.num_chunks = math.prod(v // c for v, c in zip(self.view, self.chunks))
        self.chunk_numel = math.prod(self.chunks)
        self.bases = [dct_matrix(c, dtype, device) for c in self.chunks]

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The DCT coefficients of ``x`` (of :attr:`shape`), ``[num_chunks, chunk_numel]``."""
        if len(self.view) == 2:
            (rows, cols), (n1, n2) = self.view, self.chunks
            blocks = x.reshape(rows // n1, n1, cols // n2, n2)
            coeffs = torch.einsum("yhxw,bh,dw->yxbd", blocks, *self.bases)
        else:
            coeffs = x.reshape(-1, self.chunks[0]) @ self.bases[0].T
        return coeffs.reshape(self.num_chunks, self.chunk_numel)

    def decode(self, coeffs: torch.Tensor) -> torch.Tensor:
        """The tensor (of :attr:`shape`) whose :meth:`encode` is ``coeffs`` (the inverse DCT)."""
        if len(self.view) == 2:
            (rows, cols), (n1, n2) = self.view, self.chunks
            grid = coeffs.reshape(rows // n1, cols // n2, n1, n2)
            x = torch.einsum("yxbd,bh,dw->yhxw", grid, *self.bases)
        else:
            x = coeffs.reshape(-1, self.chunks[0]) @ self.bases[0]
        return x.reshape(self.shape)


def topk_per_chunk(coeffs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``min(k, chunk_numel)`` largest-magnitude coefficients of each chunk of ``coeffs``
    (``[chunks, chunk_numel]``): ``(indices, values)``, each ``[chunks, k']``, the indices int64 (what
    ``torch.topk`` returns and ``demo.py`` sends), in ``torch.topk``'s order (``sorted=False``, as
    ``demo.py``)."""
    k = max(1, min(int(k), coeffs.shape[-1]))
    idx = torch.topk(coeffs.abs(), k=k, dim=-1, largest=True, sorted=False).indices
    return idx, torch.gather(coeffs, -1, idx)


def scatter_mean(idx: torch.Tensor, val: torch.Tensor, chunk_numel: int) -> torch.Tensor:
    """Dense coefficients ``[chunks, chunk_numel]`` from (indices, values) ``[chunks, m]``: at each
    position the mean of the values sent for it, 0 where none was (``demo.py``'s ``decompress``:
    ``scatter_reduce_(..., reduce="mean", include_self=False)``). The columns of several workers'
    selections concatenated give the mean over the workers that selected a coefficient, not over
    all workers (``demo.py``'s ``batch_decompress``)."""
    out = torch.zeros(idx.shape[0], chunk_numel, dtype=val.dtype, device=val.device)
    return out.scatter_reduce_(-1, idx, val, reduce="mean", include_self=False)


__all__ = ["ChunkedDCT", "chunk_size", "dct_matrix", "scatter_mean", "topk_per_chunk"]
