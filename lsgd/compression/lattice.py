"""The lattice (reference-point) quantizer of SwarmSGD: Davies, Gurunathan, Moshrefi, Ashkboos and
Alistarh, "New Bounds for Distributed Mean Estimation and Variance Reduction", ICLR 2021, as used by
Nadiradze et al. 2021 (papers.md section 3).

A tensor ``x`` is sent as the *colours* of its lattice points: with side ``s`` and modulus
``q = 2**bits``,

    k   = floor(x / s + u),  u ~ U[0, 1)      (randomized rounding: E[s k] = x, unbiased)
    enc = k mod q                             (``bits`` bits per element, packed)

and read back against the receiver's *reference* ``y`` (its own model, or its snapshot):

    dec(c, y) = s c + q s round((y - s c) / (q s))

the lattice point of colour ``c`` nearest ``y``. That is ``s k`` exactly while
``|x - y| < q s / 2 - s`` in every coordinate (the safe radius, minus one rounding step); beyond it the
decode is off by multiples of ``q s``, silently. To catch that, the sender adds a checksum of ``k``
(:func:`lattice_checksum`: three sums modulo the prime 65521, 24 bytes per tensor) and the receiver
compares it with the checksum of its decoded integers: an error (a change of ``k`` by non-zero
multiples of ``q`` in some coordinates) changes the plain sum unless the errors cancel, and then the
two sums weighted by powers of primitive roots (the error polynomial evaluated at a root) miss it
with probability about 65521**-2. A caught tensor is resent at full precision by the caller
(:mod:`lsgd.algorithms.swarm_sgd`, :mod:`lsgd.compression.exchange`).

Bytes of one tensor of ``n`` elements: ``ceil(bits n / 8)`` (codes packed 8 / bits per byte for
bits 1, 2, 4, 8; two bytes per element for 16) + 24 (checksum).

Written here: no library implements this quantizer (torch's quantization is affine, with no
reference-point decoding). The arithmetic runs in float64 / int64, so ``x / s`` is exact enough for
any float32 model and side.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

#: allowed ``algo.bits``: codes pack evenly into bytes
BITS = (1, 2, 4, 8, 16)
#: the checksum's modulus (the largest prime below 2**16: products of residues and weights stay
#: below 2**32, so int64 sums of up to 2**31 elements cannot overflow)
CHECKSUM_PRIME = 65521
CHECKSUM_BYTES = 3 * 8


def check_params(bits: int, side: float) -> None:
    """Raises ValueError naming ``algo.bits`` / ``algo.side`` and the allowed values."""
    if isinstance(bits, bool) or bits not in BITS:
        raise ValueError(f"algo.bits={bits!r} is not allowed; allowed: {', '.join(map(str, BITS))}")
    if isinstance(side, bool) or not isinstance(side, (int, float)) or not side > 0:
        raise ValueError(f"algo.side must be a number > 0, got {side!r}")


def lattice_integers(x: torch.Tensor, side: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """int64 lattice coordinates ``k`` of ``x`` (any shape; returned flat, shape ``[n]``):
    ``floor(x / side + u)`` with ``u ~ U[0, 1)`` from ``generator`` (unbiased), or ``round(x / side)``
    when ``generator`` is None (deterministic nearest point)."""
    scaled = x.detach().reshape(-1).double() / side
    if generator is None:
        return torch.round(scaled).long()
    u = torch.rand(scaled.shape, dtype=torch.float64, device=scaled.device, generator=generator)
    return torch.floor(scaled + u).long()


def pack(colours: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack colours (int64 in ``[0, 2**bits)``, shape ``[n]``) into a uint8 tensor of
    ``ceil(bits n / 8)`` bytes (bits 1, 2, 4, 8) or an int16 tensor of ``n`` elements (bits 16)."""
    if bits == 16:
        return colours.to(torch.int32).to(torch.int16)  # 0 .. 65535 wraps to the int16 bit pattern
    per = 8 // bits
    n = colours.numel()
    padded = torch.zeros(-(-n // per) * per, dtype=torch.uint8, device=colours.device)
    padded[:n] = colours.to(torch.uint8)
    lanes = padded.view(-1, per)
    out = torch.zeros(lanes.shape[0], dtype=torch.uint8, device=colours.device)
    for j in range(per):
        out |= lanes[:, j] << (bits * j)
    return out


def unpack(payload: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Inverse of :func:`pack`: int64 colours of shape ``[n]``."""
    if bits == 16:
        return payload.to(torch.int32).long() & 0xFFFF
    per = 8 // bits
    mask = (1 << bits) - 1
    lanes = torch.stack([(payload >> (bits * j)) & mask for j in range(per)], dim=1)
    return lanes.reshape(-1)[:n].long()


#: primitive roots of 65521: element weights g^i (i in a block of 65521) and block weights h^j
_ELEMENT_ROOTS = (17, 29)
_BLOCK_ROOTS = (41, 46)


@lru_cache(maxsize=8)
def _checksum_weights(device: torch.device) -> torch.Tensor:
    """int64 ``[2, 65521]``: ``g^i mod 65521`` for the two element roots, i = 0 .. 65520."""
    rows = []
    for g in _ELEMENT_ROOTS:
        w, x = [], 1
        for _ in range(CHECKSUM_PRIME):
            w.append(x)
            x = x * g % CHECKSUM_PRIME
        rows.append(w)
    return torch.tensor(rows, dtype=torch.int64, device=device)


def lattice_checksum(k: torch.Tensor) -> torch.Tensor:
    """int64 tensor of shape ``[3]``, modulo 65521, of ``r = k mod 65521`` (flat, split in blocks
    ``j`` of 65521 elements ``i``): ``sum(r)`` and, for two pairs of primitive roots ``(g, h)``,
    ``sum_j h^j sum_i r_ji g^i``: the residues of polynomials in ``g`` and ``h``, zero for an error
    pattern only if ``(g, h)`` is a root of its error polynomial (probability about 1 / 65521 each
    for an error not made to fool it). Weights linear in the index (an earlier version) passed
    every error with zero first and second moments, e.g. ``+q, -2q, +q`` at evenly spaced indices,
    a pattern gradients produce."""
    r = torch.remainder(k.reshape(-1), CHECKSUM_PRIME)
    n = r.numel()
    periods = torch.nn.functional.pad(r, (0, -n % CHECKSUM_PRIME)).view(-1, CHECKSUM_PRIME)  # zeros add nothing
    w = _checksum_weights(r.device)
    blocks = periods.shape[0]
    sums = [r.sum()]
    for row, root in zip(w, _BLOCK_ROOTS):
        per_block = torch.remainder((periods * row).sum(dim=1), CHECKSUM_PRIME)  # < 65521^2 * 65521: fits int64
        h = torch.tensor([pow(root, j, CHECKSUM_PRIME) for j in range(blocks)], dtype=torch.int64, device=r.device)
        sums.append((per_block * h).sum())
    return torch.remainder(torch.stack(sums), CHECKSUM_PRIME)


@dataclass
class LatticeCode:
    """One tensor's message: packed colours and the checksum of the lattice integers.

    Attributes:
        payload: uint8 (bits <= 8) or int16 (bits 16) codes.
        checksum: int64, shape ``[3]``.
        numel: elements of the original tensor.
    """

    payload: torch.Tensor
    checksum: torch.Tensor
    numel: int

    @property
    def nbytes(self) -> int:
        return self.payload.numel() * self.payload.element_size() + CHECKSUM_BYTES


class LatticeQuantizer:
    """``algo.quantizer=lattice`` with ``bits`` = log2 q and ``side`` = s.

    Raises:
        ValueError: bits not in :data:`BITS`, or side not > 0.
    """

    def __init__(self, bits: int, side: float):
        check_params(bits, side)
        self.bits, self.side = int(bits), float(side)
        self.q = 2 ** self.bits

    @property
    def radius(self) -> float:
        """``q s / 2``: the decode is exact while ``||x - y||_inf`` stays below this minus ``s``."""
        return self.q * self.side / 2

    def encode(self, x: torch.Tensor, generator: torch.Generator | None = None) -> tuple[LatticeCode, torch.Tensor]:
        """Encode ``x``; returns the message and the sender's own lattice point ``s k`` (float64,
        flat, shape ``[n]``: what the receiver decodes to when the decode is exact)."""
        k = lattice_integers(x, self.side, generator)
        code = LatticeCode(pack(torch.remainder(k, self.q), self.bits), lattice_checksum(k), k.numel())
        return code, k.double() * self.side

    def decode(self, code: LatticeCode, reference: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """Decode against ``reference`` (same number of elements as the sent tensor); returns
        ``(s k_hat`` as float64, flat, shape ``[n])`` and whether the checksum matched (False: the
        sender's tensor lay outside the safe radius of ``reference``; the values are wrong)."""
        c = unpack(code.payload, self.bits, code.numel)
        y = reference.detach().reshape(-1).double() / self.side
        k_hat = c + self.q * torch.round((y - c) / self.q).long()
        ok = bool(torch.equal(lattice_checksum(k_hat), code.checksum.to(k_hat.device)))
        return k_hat.double() * self.side, ok

    def payload_like(self, x: torch.Tensor) -> torch.Tensor:
        """An empty receive buffer for the packed codes of a tensor shaped like ``x``."""
        n = x.numel()
        if self.bits == 16:
            return torch.empty(n, dtype=torch.int16, device=x.device)
        return torch.empty(-(-n * self.bits // 8), dtype=torch.uint8, device=x.device)
