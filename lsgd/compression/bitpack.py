"""Dense bit packing of small non-negative integers at any width from 1 to 16 bits.

``pack_bits(values, width)`` writes value ``i`` into bits ``i * width .. (i + 1) * width - 1`` of a
little-endian bit stream (bit ``k`` of the stream is bit ``k % 8`` of byte ``k // 8``; each value's
least significant bit first) and returns the ``ceil(n * width / 8)`` bytes as a uint8 tensor, the
last byte padded with zero bits. No width is rounded up to a power of two: 2^b + 1 quantization
levels (LEAD's b-bit quantizer) take exactly b + 1 bits each. Vectorized (no loop over values),
in chunks of :data:`CHUNK` values so the bit matrix stays small for large tensors.
"""

from __future__ import annotations

import torch

#: values packed per chunk (a multiple of 8, so every chunk ends on a byte boundary at any width)
CHUNK = 1 << 20


def packed_nbytes(n: int, width: int) -> int:
    """Bytes of ``n`` values packed at ``width`` bits: ``ceil(n * width / 8)``."""
    return -(-int(n) * int(width) // 8)


def _check_width(width: int) -> None:
    if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= 16:
        raise ValueError(f"width must be an integer from 1 to 16 bits, got {width!r}")


def pack_bits(values: torch.Tensor, width: int) -> torch.Tensor:
    """Pack integers in ``[0, 2**width)`` (any integer dtype, any shape; read flat) into a uint8
    tensor of :func:`packed_nbytes` bytes (module docstring).

    Raises:
        ValueError: ``width`` outside 1..16, or a value outside ``[0, 2**width)``.
    """
    _check_width(width)
    flat = values.reshape(-1)
    n = flat.numel()
    if n and (int(flat.min()) < 0 or int(flat.max()) >= 1 << width):
        raise ValueError(f"values must lie in [0, {1 << width}) to be packed at {width} bits, "
                         f"got [{int(flat.min())}, {int(flat.max())}]")
    device = flat.device
    shifts = torch.arange(width, dtype=torch.int32, device=device)
    byte_weights = (1 << torch.arange(8, dtype=torch.int32, device=device))
    out = torch.empty(packed_nbytes(n, width), dtype=torch.uint8, device=device)
    for start in range(0, n, CHUNK):
        chunk = flat[start : start + CHUNK].to(torch.int32)
        bits = ((chunk[:, None] >> shifts) & 1).reshape(-1)  # value-major, least significant bit first
        nbytes = packed_nbytes(chunk.numel(), width)
        if bits.numel() < nbytes * 8:
            bits = torch.cat([bits, bits.new_zeros(nbytes * 8 - bits.numel())])
        first = start * width // 8  # start is a multiple of 8: a byte boundary
        out[first : first + nbytes] = (bits.view(-1, 8) * byte_weights).sum(dim=1).to(torch.uint8)
    return out


def unpack_bits(payload: torch.Tensor, width: int, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: the ``n`` values (int64, shape ``[n]``) packed at ``width`` bits
    in the uint8 tensor ``payload`` (at least :func:`packed_nbytes` bytes; the rest is ignored).

    Raises:
        ValueError: ``width`` outside 1..16, or ``payload`` too short or not uint8.
    """
    _check_width(width)
    need = packed_nbytes(n, width)
    if payload.dtype != torch.uint8 or payload.numel() < need:
        raise ValueError(f"{n} values at {width} bits need {need} uint8 bytes, got {payload.numel()} {payload.dtype}")
    flat = payload.reshape(-1)
    device = flat.device
    shifts = torch.arange(8, dtype=torch.int32, device=device)
    weights = (1 << torch.arange(width, dtype=torch.int32, device=device))
    out = torch.empty(int(n), dtype=torch.int64, device=device)
    for start in range(0, int(n), CHUNK):
        count = min(CHUNK, int(n) - start)
        first = start * width // 8
        raw = flat[first : first + packed_nbytes(count, width)].to(torch.int32)
        bits = ((raw[:, None] >> shifts) & 1).reshape(-1)[: count * width]
        out[start : start + count] = (bits.view(count, width) * weights).sum(dim=1)
    return out


__all__ = ["CHUNK", "pack_bits", "packed_nbytes", "unpack_bits"]
