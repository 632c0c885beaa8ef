"""Low-precision formats with one float32 scale per row, simulated by a quantize-dequantize round
trip: what the DiLoCo family sends its outer gradients in (Streaming DiLoCo,
:mod:`lsgd.algorithms.averaging.streaming_diloco`).

A tensor is read as rows: a matrix's rows, a tensor of more dimensions as ``shape[0]`` rows of the
rest flattened, a vector (or a scalar) as one row. Each row travels as a float32 scale
``s = FMAX / max|row|`` (1 for a row of zeros) and its elements ``q = Q(x * s)`` in the format; the
receiver reads ``q / s``. The arithmetic is float32 whatever the tensor's dtype, as torchft's
kernels (torchft 0.2.0, ``torchft/quantization.py``: ``_kernel_calculate_scale``,
``_fused_kernel_quantize_into_fp8``, ``_fused_kernel_dequantize_from_fp8``):

=========  =====  ========================================================================
format     FMAX   Q (bits per element)
=========  =====  ========================================================================
``int8``   127    cast to int8, truncating toward zero (8): torchft's format where the GPU has
                  no native fp8 (compute capability below 9.0): Triton's float-to-int cast
``fp8``    448    float8 E4M3 (``torch.float8_e4m3fn``), round to nearest even (8): torchft's on
                  GPUs with native fp8
``fp4``    6      float4 E2M1 (OCP MX: +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}), round to nearest, ties
                  to the even encoding (4); lsgd's stand-in for the 4-bit floats of Streaming
                  DiLoCo (Douillard et al. 2025), whose tables name them "FP4" only (secondary
                  sources: E3M0, a sign and 3 exponent bits): not checked to be the paper's layout
=========  =====  ========================================================================

What travels (:func:`encoded_nbytes`): per row 4 bytes of scale and ``ceil(cols * bits / 8)``
bytes of elements. torchft also pads each row to a multiple of 4 bytes and the row count to a
multiple of the group size, and reads a vector as rows of one element (a scale per element); lsgd
counts the payload bits and scales only, and gives a vector one scale.
"""

from __future__ import annotations

import math

import torch

#: format -> (FMAX, bits per element)
FORMATS: dict[str, tuple[float, int]] = {"int8": (127.0, 8), "fp8": (448.0, 8), "fp4": (6.0, 4)}

#: the magnitudes float4 E2M1 represents, and the midpoints between neighbours
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_MID = tuple((a + b) / 2 for a, b in zip(_E2M1, _E2M1[1:]))


def rows_of(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a 2-D view ``[rows, cols]`` (module docstring)."""
    if t.dim() >= 2:
        return t.reshape(t.shape[0], -1)
    return t.reshape(1, -1)


def encoded_nbytes(t: torch.Tensor | torch.Size, fmt: str) -> int:
    """Bytes ``t`` travels in under ``fmt``: ``rows * (4 + ceil(cols * bits / 8))``."""
    shape = t.shape if isinstance(t, torch.Tensor) else torch.Size(t)
    numel = math.prod(shape)
    if numel == 0:
        return 0
    rows = shape[0] if len(shape) >= 2 else 1
    cols = numel // rows
    bits = FORMATS[fmt][1]
    return rows * (4 + -(-cols * bits // 8))


def _round_e2m1(y: torch.Tensor) -> torch.Tensor:
    """``y`` (float32, |y| <= 6 up to rounding) rounded to float4 E2M1: the nearest magnitude of
    :data:`_E2M1`, a tie to the even encoding (the even index: 0, 1, 2, 4), the sign kept."""
    a = y.abs()
    mid = torch.tensor(_E2M1_MID, dtype=a.dtype, device=a.device)
    grid = torch.tensor(_E2M1, dtype=a.dtype, device=a.device)
    idx = torch.bucketize(a, mid)  # mid[i-1] < a <= mid[i]: a tie rounds down here
    at_tie = (idx < mid.numel()) & (a == mid[idx.clamp(max=mid.numel() - 1)])
    idx = torch.where(at_tie & (idx % 2 == 1), idx + 1, idx)
    return torch.copysign(grid[idx], y)


def quantize_dequantize(t: torch.Tensor, fmt: str) -> torch.Tensor:
    """``t`` as the receiver reads it after travelling in ``fmt`` (module docstring), in ``t``'s
    dtype and shape; ``fmt`` ``none`` returns ``t`` itself.

    Raises:
        KeyError: an unknown ``fmt``.
    """
    if fmt == "none":
        return t
    fmax = FORMATS[fmt][0]
    x = rows_of(t).to(torch.float32)
    if x.numel() == 0:
        return t.clone()
    row_max = x.abs().amax(dim=1, keepdim=True)
    scale = torch.full_like(row_max, fmax) / row_max
    scale = torch.where(torch.isinf(scale), torch.ones_like(scale), scale)
    y = x * scale
    if fmt == "int8":
        q = y.to(torch.int8).to(torch.float32)
    elif fmt == "fp8":
        q = y.to(torch.float8_e4m3fn).to(torch.float32)
    else:
        q = _round_e2m1(y)
    return (q / scale).reshape(t.shape).to(t.dtype)
