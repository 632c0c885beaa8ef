"""The lattice (reference-point) quantizer of SwarmSGD: Davies, Gurunathan, Moshrefi, Ashkboos and
Alistarh, "New Bounds for Distributed Mean Estimation and Variance Reduction", ICLR 2021, as used by
Nadiradze et al. 2021 (docs/papers.md#lattice-quantizer).

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
(:mod:`lsgd.algorithms.gossip.swarm_sgd`, :mod:`lsgd.compression.exchange`).

Bytes of one tensor of ``n`` elements: ``ceil(bits n / 8)`` (codes packed 8 / bits per byte for
bits 1, 2, 4, 8; two bytes per element for 16) + 24 (checksum).

Written here: no library implements this quantizer (torch's quantization is affine, with no
reference-point decoding).

Two paths, picked by the tensor's dtype
---------------------------------------
*float64 / other tensors* (the reference path; the goldens' float64 runs): ``x / s`` in float64,
``u`` from ``torch.rand(..., dtype=float64, generator=...)``, ``k`` in int64; exact for any model
and side.

*float32 tensors with* ``|x / s| < 2**20`` (the fast path; ``scripts/bench_gossip.py --lattice``): the
random bits come from numpy's PCG64 (:mod:`lsgd.compression.fastrand`, seeded by one draw from the
generator) and the arithmetic runs in float32, with ``k`` held as float32 integers; ``s32 = fl32(s)``
(the side as float32, as torch divides a float32 tensor by a Python float):

    z = fl32(x / s32);  f = z - floor(z);  k = floor(z) + floor(fl32(f + u')) - 1,
    u' = 1 + m 2**-23,  m uniform on {0 .. 2**23 - 1}   (random bits with float32's exponent of 0)

On CPU it runs as one compiled loop per side (:mod:`lsgd.compression.lattice_fused`, numba), else
(another device, or numba missing or failing to compile: :func:`fused_kernels`) as torch passes
(:func:`_integers_float32`, :meth:`LatticeQuantizer.decode`). Both compute the same float32
operations in the same order, so payload, checksum, points and random stream agree bit for bit
(``tests/unit/test_lattice_fused.py``).

Exactness argument: (1) every integer of magnitude below 2**24 is a float32, so ``floor(z)``, ``k``
and every intermediate integer are exact; ``f = z - floor(z)`` is exact (Sterbenz: both have the
same sign and lie within a factor 2, or ``floor(z)`` is 0) except for ``-1 < z < 0``, where it is
rounded by at most 2**-24. (2) ``f + u'`` lies in ``[1, 3)``, where float32's spacing is 2**-23 or
2**-22, so its rounding moves it by at most 2**-23 and changes ``floor`` (1 or 2: rounding down or
up) only for ``f`` within 2**-23 of a grid point of ``u``; with ``u = u' - 1`` uniform on a 2**-23
grid, ``P(k = floor(z) + 1)`` is the fractional part of ``z`` within ``3 * 2**-23``, so
``E[s k] = s z`` within ``2**-21 s``; ``z`` itself is within about ``2**-23 |x / s|`` of ``x / s``
(``s32`` within a relative 2**-24 of ``s``, then one correctly rounded division), so ``E[s k] - x`` is
at most about ``2**-21 s + 2**-23 |x|``: an ulp of ``x`` itself plus a 2**-21 fraction of one
lattice step (the float64 path: about 2**-53).
(3) The decode, ``t = fl32(y / s32)``, ``k_hat = c + q round(fl32(t - c) / q)`` (``/ q`` exact, a
power of two; computed as ``fl32(y / fl32(s q))``, which is ``t / q`` exactly), errs only if
``|fl32(t - c) - (k - c)| >= q / 2``; sender and receiver divide by the same ``s32``, so with
``|z - k| < 1`` and the roundings above that needs ``|x - y| >= (q / 2 - 1) s - 2**-23 (|x| + |y| + 2 q s)``:
the safe radius shrinks by at most ``2**-23 (|x| + |y| + 2 q s)`` (about 3e-7 for weights of
magnitude 1 at s = 1e-3, q = 256, against a radius of 0.127), and a decode beyond it is caught by
the checksum as before. (4) The checksum of ``|k| < 2**20`` is exact either way: the torch path takes
one float64 matrix product (:func:`lattice_checksum`: weights below 2**16 keep every partial sum of a
65521-element block below 2**52, exact in any summation order), the fused loops sum ``k``, ``k g^i``
in int64 per block (the same integers, below 2**52 < 2**63) and reduce each block modulo 65521; both
equal the int64 definition bit for bit. Tensors with ``|x / s| >= 2**20`` somewhere (or not finite)
take the float64 path (the fused loop notices as it goes, puts the generator back as it was and
hands over); references with ``|y / s| >= 2**20 - q`` decode in float64. (5) The lattice points
``s k`` come back in float64 by default, or in float32 on request (``dtype=torch.float32``: the
float64 ``s k`` rounded to float32, the precision of the float32 model they go back into; SwarmSGD
asks for it for float32 parameters, and both ends of a pair compute the same ``(a + b) / 2``). The
fast path draws other random numbers than the float64 path, so float32 runs round differently from
before this path existed (same law); float64 runs, the goldens among them, are unchanged bit for bit.

Where the time went (26 Nov 2026, one core, 8M floats in 1M-element tensors, 8 bits, load average
2.9; ``bench_gossip.py --lattice``): the float64 path (63 ns per element here, 26-85 ns as glibc
maps its buffers afresh or not) in fresh multi-megabyte allocations, torch's mt19937 (about 10 ns
per float64 draw under load), the int64 ``remainder`` and padded copy of the checksum, and the
Python lane loop of the packing. The torch fast path (6.7 ns: encode 4.1, decode 2.5) keeps its
scratch in reused buffers (:class:`_Workspace`) and draws 32 bits per element from PCG64, but makes
a dozen passes over each tensor (divide, min / max, floor, subtract / add / floor, a float64 copy and
matrix product for the checksum, an int32 copy and a cast for the payload, the points), each
0.3-0.6 ns per element in memory traffic. The fused loops (2.2 ns: encode 1.5, decode 0.6) make one
pass per side in 1024-element stages that stay in L1 (vectorized to AVX-512 by LLVM); what is left
is PCG64 itself (0.86 ns per element: 32 of its 64 bits per element, its 128-bit multiply a serial
chain) and writing the outputs (a byte of payload and 4 bytes of points per element). numba's
price is per process: 2.7 s to compile both loops the first time on a machine (then cached on disk
next to :mod:`lsgd.compression.lattice_fused`, also under ``PYTHONDONTWRITEBYTECODE``), 0.4 s to load
them in every later process (measured after ``import lsgd.training.trainer``).
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from lsgd.compression import alloc
from lsgd.compression.fastrand import random_float32, seed_from

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


#: the fast path's bound on ``|x / s|`` (and on ``|k|``): integers stay exact in float32 (< 2**24),
#: and the checksum's float64 block sums stay below 2**52 (< 2**53: exact)
FAST_LIMIT = float(1 << 20)


def lattice_integers(x: torch.Tensor, side: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """int64 lattice coordinates ``k`` of ``x`` (any shape; returned flat, shape ``[n]``):
    ``floor(x / side + u)`` with ``u ~ U[0, 1)`` from ``generator`` (unbiased), or ``round(x / side)``
    when ``generator`` is None (deterministic nearest point). float32 ``x`` with ``|x / side| <
    2**20`` takes the float32 path of the module docstring (same distribution, bias at most
    ``2**-21 side + 2**-24 |x|``)."""
    if generator is not None:
        fast = _integers_float32(x, side, generator)
        if fast is not None:
            return fast.long()
    return _integers_float64(x, side, generator)


def _integers_float64(x: torch.Tensor, side: float, generator: torch.Generator | None) -> torch.Tensor:
    scaled = x.detach().reshape(-1).double() / side
    if generator is None:
        return torch.round(scaled).long()
    u = torch.rand(scaled.shape, dtype=torch.float64, device=scaled.device, generator=generator)
    return torch.floor(scaled + u).long()


def _integers_float32(x: torch.Tensor, side: float, generator: torch.Generator,
                      work: "_Workspace | None" = None) -> torch.Tensor | None:
    """float32 ``k`` (flat) by the fast path, or None (not float32, or ``|x / side| >= 2**20`` or
    not finite somewhere: the caller takes the float64 path; the generator has then advanced).
    With ``work`` the result and the intermediates live in its buffers (valid until its next use)."""
    if x.dtype != torch.float32:
        return None
    flat = x.detach().reshape(-1)
    n = flat.numel()
    z = torch.div(flat, side, out=work.get("a", n, torch.float32, flat.device)) if work else torch.div(flat, side)
    if n == 0:
        return z
    lo, hi = torch.aminmax(z)
    if not (float(hi) < FAST_LIMIT and float(lo) > -FAST_LIMIT):  # also False for NaN
        return None
    # u' = 1 + m 2^-23, m 23 random bits under an exponent of 0 (no conversion pass)
    u1 = random_float32(n, seed_from(generator), 1.0, 23, z.device)
    k = torch.floor(z, out=work.get("b", n, torch.float32, z.device)) if work else torch.floor(z)
    z.sub_(k).add_(u1).floor_()                          # floor(frac + u'): 1 + [u < frac], u = u' - 1
    return k.add_(z).sub_(1.0)


def point_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype callers ask :meth:`LatticeQuantizer.encode` / ``decode`` for the lattice points of
    a tensor like ``t``: float32 for a float32 tensor (no float64 copies on the fast path), else
    float64."""
    return torch.float32 if t.dtype == torch.float32 else torch.float64


class _Workspace:
    """Scratch buffers of a quantizer, reused across calls (no page faults from fresh multi-MB
    allocations, which cost more than the arithmetic: measured 3-4 ns per element). Kept only for
    tensors of up to :data:`WORKSPACE_MAX` elements (16 bytes each); larger ones allocate per call."""

    def __init__(self):
        self._buffers: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}

    def get(self, name: str, n: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
        key = (name, dtype, torch.device(device))
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < n:
            buf = torch.empty(n, dtype=dtype, device=device)
            if n <= WORKSPACE_MAX:
                self._buffers[key] = buf
        return buf[:n]


#: the largest tensor (elements) whose scratch buffers a quantizer keeps between calls
WORKSPACE_MAX = 1 << 22

_UNSET = object()
_FUSED = _UNSET


def fused_kernels():
    """The compiled encode / decode loops (:mod:`lsgd.compression.lattice_fused`), or None when numba
    is missing or they fail to compile (a warning, once per process; the quantizer then takes its
    torch path, same results). Imported on first use: the first process on a machine compiles them
    (about 2 s), later ones load numba's on-disk cache."""
    global _FUSED
    if _FUSED is _UNSET:
        try:
            lattice_fused = importlib.import_module("lsgd.compression.lattice_fused")
        except Exception as exc:  # ImportError (no numba), numba's typing / lowering errors
            warnings.warn(f"lattice quantizer: numba's fused loops unavailable ({type(exc).__name__}: {exc}); "
                          "using the slower torch path (same results)", RuntimeWarning, stacklevel=2)
            _FUSED = None
        else:
            _FUSED = lattice_fused
    return _FUSED


def _fused_for(t: torch.Tensor):
    """The fused kernels if ``t`` can take them (a non-empty float32 CPU tensor), else None."""
    if t.dtype != torch.float32 or t.device.type != "cpu" or t.numel() == 0:
        return None
    return fused_kernels()


def pack(colours: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack colours (integers in ``[0, 2**bits)``, or any integers / integral float32 values,
    taken modulo ``2**bits``; shape ``[n]``) into a uint8 tensor of ``ceil(bits n / 8)`` bytes
    (bits 1, 2, 4, 8) or an int16 tensor of ``n`` elements (bits 16, the bit pattern of the colour).
    Lane ``j`` of a byte holds element ``per * i + j`` in bits ``bits j .. bits (j + 1) - 1``."""
    c = colours if not colours.is_floating_point() else colours.to(torch.int32)
    if bits == 16:
        return c.to(torch.int32).to(torch.int16)  # 0 .. 65535 (or k mod 2^16) wraps to the int16 bit pattern
    if bits == 8:
        return c.to(torch.int32).to(torch.uint8)  # modulo 256
    per = 8 // bits
    n = c.numel()
    lanes = torch.zeros(-(-n // per) * per, dtype=torch.uint8, device=c.device)
    lanes[:n] = torch.bitwise_and(c, (1 << bits) - 1)
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=c.device)
    # disjoint bit fields: their sum is their OR; one broadcast shift and one row sum (no lane loop)
    return torch.sum(lanes.view(-1, per) << shifts, dim=1, dtype=torch.uint8)


def unpack(payload: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Inverse of :func:`pack`: int64 colours of shape ``[n]``."""
    return _unpack(payload, bits, n).long()


def _unpack(payload: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Colours of shape ``[n]``: uint8 (bits <= 8) or int32 (bits 16), the cheapest exact dtype."""
    if bits == 16:
        return payload.to(torch.int32) & 0xFFFF
    if bits == 8:
        return payload[:n]
    per = 8 // bits
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=payload.device)
    lanes = (payload.view(-1, 1) >> shifts) & ((1 << bits) - 1)
    return lanes.reshape(-1)[:n]


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


@lru_cache(maxsize=1)
def _element_weights_numpy() -> tuple[np.ndarray, np.ndarray]:
    """The two rows of :func:`_checksum_weights` as contiguous int64 numpy arrays (the fused loops')."""
    w = _checksum_weights(torch.device("cpu")).numpy()
    return np.ascontiguousarray(w[0]), np.ascontiguousarray(w[1])


@lru_cache(maxsize=8)
def _checksum_matrix(device: torch.device) -> torch.Tensor:
    """float64 ``[3, 65521]``: rows 1, ``17^i``, ``29^i`` (mod 65521): one matrix product gives
    a block's plain sum and both weighted sums."""
    w = _checksum_weights(device)
    return torch.cat([torch.ones(1, CHECKSUM_PRIME, dtype=torch.int64, device=device), w]).double().contiguous()


@lru_cache(maxsize=64)
def _block_weights(blocks: int, device: torch.device) -> torch.Tensor:
    """int64 ``[blocks, 3]``: 1, ``41^j``, ``46^j`` (mod 65521) for block j."""
    rows = [[1] * blocks] + [[pow(root, j, CHECKSUM_PRIME) for j in range(blocks)] for root in _BLOCK_ROOTS]
    return torch.tensor(rows, dtype=torch.int64, device=device).t().contiguous()


def lattice_checksum(k: torch.Tensor) -> torch.Tensor:
    """int64 tensor of shape ``[3]``, modulo 65521, of ``r = k mod 65521`` (flat, split in blocks
    ``j`` of 65521 elements ``i``): ``sum(r)`` and, for two pairs of primitive roots ``(g, h)``,
    ``sum_j h^j sum_i r_ji g^i``: the residues of polynomials in ``g`` and ``h``, zero for an error
    pattern only if ``(g, h)`` is a root of its error polynomial (probability about 1 / 65521 each
    for an error not made to fool it). Weights linear in the index (an earlier version) passed
    every error with zero first and second moments, e.g. ``+q, -2q, +q`` at evenly spaced indices,
    a pattern gradients produce.

    ``k``: integers (any integer dtype) or integral float values (float32 / float64). When every
    ``|k| <= 2**20`` it is one float64 matrix product over the blocks (exact: each block sum is at
    most 2**20 * 65520 * 65521 < 2**52, in any summation order; ``k`` is not reduced first since
    the result is taken modulo 65521 anyway); otherwise the int64 reduction. Both give the same
    value."""
    flat = k.reshape(-1)
    if flat.numel() == 0:
        return torch.zeros(3, dtype=torch.int64, device=flat.device)
    lo, hi = torch.aminmax(flat)
    if not (float(hi) <= FAST_LIMIT and float(lo) >= -FAST_LIMIT):
        if flat.is_floating_point():
            flat = flat.to(torch.int64)
        return _checksum_int64(flat)
    return _checksum_float64(flat if flat.dtype == torch.float64 else flat.double())


def _checksum_float64(kd: torch.Tensor) -> torch.Tensor:
    """:func:`lattice_checksum` of float64 integers ``kd`` (flat, all ``|k| <= 2**20``)."""
    n = kd.numel()
    full = n - n % CHECKSUM_PRIME
    w = _checksum_matrix(kd.device)  # [3, 65521]
    parts = []
    if full:  # [3, P] @ [P, blocks] (2.5x faster in MKL than [blocks, P] @ [P, 3], measured)
        parts.append(w @ kd[:full].view(-1, CHECKSUM_PRIME).t())  # exact integers < 2^52
    if full < n:
        parts.append((w[:, : n - full] @ kd[full:]).view(3, 1))
    per_block = torch.remainder(torch.cat(parts, dim=1).t().to(torch.int64), CHECKSUM_PRIME)
    weighted = per_block * _block_weights(per_block.shape[0], kd.device)  # < 65521^2
    return torch.remainder(weighted.sum(dim=0), CHECKSUM_PRIME)


def _checksum_int64(k: torch.Tensor) -> torch.Tensor:
    """:func:`lattice_checksum` in int64 (any ``k``)."""
    r = torch.remainder(k.reshape(-1).long(), CHECKSUM_PRIME)
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
        self._work = _Workspace()

    @property
    def radius(self) -> float:
        """``q s / 2``: the decode is exact while ``||x - y||_inf`` stays below this minus ``s``."""
        return self.q * self.side / 2

    def encode(self, x: torch.Tensor, generator: torch.Generator | None = None, *,
               dtype: torch.dtype = torch.float64) -> tuple[LatticeCode, torch.Tensor]:
        """Encode ``x``; returns the message and the sender's own lattice point ``s k`` (flat,
        shape ``[n]``: what the receiver decodes to when the decode is exact) in ``dtype``
        (float64, or float32: the float64 ``s k`` rounded to float32, the precision of a float32 model
        it goes back into, and no 8-byte-per-element output). float32 ``x`` with a generator takes
        the fast path (module docstring), anything else the float64 path."""
        n = x.numel()
        dev = x.device
        kernels = _fused_for(x) if generator is not None else None
        if kernels is not None:
            fused = self._encode_fused(kernels, x, generator, dtype)
            if fused is not None:
                return fused
        k32 = _integers_float32(x, self.side, generator, self._work) if generator is not None else None
        if k32 is not None and n:  # |k| <= 2^20: the checksum's float64 product is exact
            kd = self._work.get("d", n, torch.float64, dev).copy_(k32)
            sums = _checksum_float64(kd)
            payload = pack(self._work.get("i", n, torch.int32, dev).copy_(k32), self.bits)
            return LatticeCode(payload, sums, n), self._points(k32, kd, dtype)
        k = _integers_float64(x, self.side, generator)
        return LatticeCode(pack(k, self.bits), lattice_checksum(k), n), (k.double() * self.side).to(dtype)

    def decode(self, code: LatticeCode, reference: torch.Tensor, *,
               dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, bool]:
        """Decode against ``reference`` (same number of elements as the sent tensor); returns
        ``(s k_hat`` in ``dtype`` (float64 or float32), flat, shape ``[n])`` and whether the
        checksum matched (False: the sender's tensor lay outside the safe radius of
        ``reference``; the values are wrong). A float32 reference with ``|y / s| < 2**20 - q``
        decodes in float32 (module docstring), anything else in float64."""
        kernels = _fused_for(reference)
        if kernels is not None:
            fused = self._decode_fused(kernels, code, reference, dtype)
            if fused is not None:
                return fused
        c = _unpack(code.payload, self.bits, code.numel)
        ref = reference.detach().reshape(-1)
        n = ref.numel()
        if ref.dtype == torch.float32 and n:
            # t = y / (s q) = fl32(y / s) / q exactly (q a power of two), so fl32(t - c / q) is
            # fl32(fl32(y / s) - c) / q: the docstring's decode, one pass shorter
            t = torch.div(ref, self.side * self.q, out=self._work.get("a", n, torch.float32, ref.device))
            lo, hi = torch.aminmax(t)
            bound = (FAST_LIMIT - self.q) / self.q
            if float(hi) < bound and float(lo) > -bound:  # then |k_hat| < 2^20
                t.sub_(c, alpha=1.0 / self.q).round_()
                k_hat = torch.add(c, t, alpha=self.q, out=t)
                kd = self._work.get("d", n, torch.float64, ref.device).copy_(k_hat)
                ok = self._matches(_checksum_float64(kd), code)
                return self._points(k_hat, kd, dtype), ok
        y = ref.double() / self.side
        cl = c.long()
        k_hat = cl + self.q * torch.round((y - cl) / self.q).long()
        return (k_hat.double() * self.side).to(dtype), self._matches(lattice_checksum(k_hat), code)

    def _payload_out(self, n: int) -> tuple[torch.Tensor, np.ndarray]:
        """A fresh payload tensor for ``n`` elements (as :func:`pack` returns it) and its bytes as
        a numpy array (zeroed for bits 1, 2, 4, whose lanes are OR-ed in)."""
        if self.bits == 16:
            payload = alloc.empty(n, torch.int16)
        elif self.bits == 8:
            payload = alloc.empty(n, torch.uint8)
        else:
            payload = alloc.zeros(-(-n * self.bits // 8), torch.uint8)
        return payload, payload.view(torch.uint8).numpy()

    def _encode_fused(self, kernels, x: torch.Tensor, generator: torch.Generator,
                      dtype: torch.dtype) -> tuple[LatticeCode, torch.Tensor] | None:
        """:meth:`encode`'s fast path as one compiled loop (:mod:`lsgd.compression.lattice_fused`):
        the same random stream, payload, checksum and points as the torch fast path, or None
        (``|x / s| >= 2**20`` or NaN somewhere: the generator is put back as it was, and the caller
        takes the float64 path as the torch fast path would)."""
        xs = x.detach().reshape(-1).contiguous().numpy()
        n = xs.shape[0]
        state = generator.get_state()
        # the 32-bit words random_float32(n, seed, 1.0, 23) draws (their low 23 bits are m)
        words = np.random.PCG64(seed_from(generator)).random_raw(-(-n // 2)).view(np.uint32)
        payload, pay = self._payload_out(n)
        points = alloc.empty(n, torch.float32 if dtype == torch.float32 else torch.float64)
        sums = np.empty(3, dtype=np.int64)
        w1, w2 = _element_weights_numpy()
        if not kernels.encode(xs, np.float32(self.side), words, self.bits, self.side, w1, w2, pay,
                              points.numpy(), sums):
            generator.set_state(state)
            return None
        return LatticeCode(payload, torch.from_numpy(sums), n), points

    def _decode_fused(self, kernels, code: LatticeCode, reference: torch.Tensor,
                      dtype: torch.dtype) -> tuple[torch.Tensor, bool] | None:
        """:meth:`decode`'s float32 path as one compiled loop, or None (``|y / s| >= 2**20 - q``
        or NaN somewhere, or a payload too short: the caller's float64 / torch path)."""
        ys = reference.detach().reshape(-1).contiguous().numpy()
        n = ys.shape[0]
        payload = code.payload.reshape(-1).contiguous().view(torch.uint8)
        if payload.numel() < -(-n * self.bits // 8):
            return None
        points = alloc.empty(n, torch.float32 if dtype == torch.float32 else torch.float64)
        sums = np.empty(3, dtype=np.int64)
        w1, w2 = _element_weights_numpy()
        bound = (FAST_LIMIT - self.q) / self.q
        if not kernels.decode(payload.numpy(), self.bits, ys, np.float32(self.side * self.q), bound, self.side,
                              w1, w2, points.numpy(), sums):
            return None
        return points, self._matches(torch.from_numpy(sums), code)

    def _points(self, k32: torch.Tensor, kd: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``s k`` from the float64 copy ``kd`` of ``k``: float64 as the float64 path computes it,
        or that value rounded to float32 (one pass, no float64 allocation)."""
        out = alloc.empty(kd.numel(), torch.float32 if dtype == torch.float32 else torch.float64, kd.device)
        return torch.mul(kd, self.side, out=out)  # computed in float64, rounded on the way out

    @staticmethod
    def _matches(sums: torch.Tensor, code: LatticeCode) -> bool:
        return bool(torch.equal(sums, code.checksum.to(sums.device)))

    def payload_like(self, x: torch.Tensor) -> torch.Tensor:
        """An empty receive buffer for the packed codes of a tensor shaped like ``x``."""
        n = x.numel()
        if self.bits == 16:
            return torch.empty(n, dtype=torch.int16, device=x.device)
        return torch.empty(-(-n * self.bits // 8), dtype=torch.uint8, device=x.device)
