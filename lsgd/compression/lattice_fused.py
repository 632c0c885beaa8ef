"""The lattice quantizer's fused loops (:mod:`lsgd.compression.lattice`'s float32 fast path on CPU):
one compiled loop per side, with numba (``@njit(cache=True)``), for every ``bits`` (1, 2, 4, 8, 16).

Why compiled loops: the torch fast path is a dozen elementwise passes over each tensor (divide,
min / max, floor, subtract / add / floor, a float64 copy for the checksum's matrix product, an int32
copy for the payload, the lattice points...), and each pass over a multi-megabyte tensor costs
0.3-0.6 ns per element in memory traffic alone: 6.7 ns per element for encode + decode. Here each
side walks the tensor once, in stages of :data:`CHUNK` elements: the float32 arithmetic writes the
integers ``k`` into a 4 KiB scratch that stays in L1, and the next stages read them back to write
the payload and the points and to add up the checksum's sums. Each stage is a simple loop that LLVM
vectorizes (AVX-512 on this project's machines); one loop doing all of it at once was not vectorized
(too many arrays for LLVM's runtime alias checks) and ran 3x slower (1.9 against 0.6 ns per element
for the encode's arithmetic, measured 26 Nov 2026). Measured with ``scripts/bench_gossip.py
--lattice``: 2.2 ns per element (encode 1.5, of which PCG64's random words 0.86; decode 0.6).

Why numba: it compiles plain Python loops through LLVM for the machine it runs on and caches the
machine code on disk (next to this file, in ``__pycache__``; numba's cache is its own, written also
under ``PYTHONDONTWRITEBYTECODE``), and it is a well-kept library. The alternatives need more: a C
extension a compiler at install, torch.compile's C++ code generation a compiler at run time (and it
does not fuse the random words or the modular block sums). Its cost is per process: compiling both
loops for both point dtypes at import takes 2.7 s the first time on a machine, loading them from
the cache 0.4 s (numba's own start-up, measured after ``import lsgd.training.trainer``), paid on the first
float32 encode or decode of a process, not at ``import lsgd``. :func:`lsgd.compression.lattice.fused_kernels`
imports this module and falls back to the torch path (same results, a warning) when numba is
missing or this module fails to compile. The random words stay numpy's PCG64 (drawn into an array
first, as :func:`lsgd.compression.fastrand.random_float32` draws them), not a reimplementation.

Every kernel computes exactly what the torch path of :mod:`lsgd.compression.lattice` computes, in
the same float32 operations (one IEEE operation each, no fused multiply-add: numba compiles without
fast-math, so LLVM does not contract), so the payload, checksum and points are the same bit for bit
(``tests/unit/test_lattice_fused.py`` checks it against the torch path):

encode, per element ``i`` with ``u'_i = 1 + m_i 2**-23`` (``m_i``: the low 23 bits of the ``i``-th
32-bit word of the random stream, :func:`lsgd.compression.fastrand.random_float32`'s definition):

    z = fl32(x / s32),  f = fl32(z - floor(z)),  k = floor(z) + floor(fl32(f + u')) - 1,

the colour ``k mod 2**bits`` into the payload, ``s k`` (float64 product, rounded to float32 if
asked) into the points, and ``k`` into the checksum's sums. ``1 + m 2**-23`` is exact in float32 (the
same value as splicing the bits under the exponent of 1). A tensor with ``|z| >= 2**20`` or a NaN
anywhere sets the return flag False (outputs garbage; the caller takes the float64 path).

decode, with ``t = fl32(y / fl32(s q))``, ``k_hat = fl32(c + q rint(fl32(t - c / q)))`` (``c / q``
exact, ``rint`` rounding half to even as torch.round), the flag False where ``|t| >=
(2**20 - q) / q`` somewhere.

Checksum (:func:`lsgd.compression.lattice.lattice_checksum`): per block of 65521 elements the plain
sum of ``k`` and the sums of ``k g^i`` for ``g`` = 17, 29, in int64 (``|k| < 2**20``, ``g^i < 2**16``:
a block's sum is below 2**52, exact), each reduced modulo 65521 at the end of its block and weighted
by ``h^j`` (``h`` = 41, 46) for block ``j``.
"""

from __future__ import annotations

import numpy as np
from numba import boolean, float32, float64, int64, njit, uint8, uint32

P = 65521
#: elements per stage: each stage is a simple loop over a chunk (vectorized by LLVM), its
#: integers kept in a 4 KiB scratch that stays in L1 between the stages
CHUNK = 1024
_LIMIT = float(1 << 20)
_ONE = np.float32(1.0)
_ULP = np.float32(2.0**-23)
_MANT = np.uint32((1 << 23) - 1)

_OPTS = dict(cache=True, nogil=True, error_model="numpy", boundscheck=False)


@njit(inline="always")
def _put_colours(payload, ks, g0, m, bits):
    """``k mod 2**bits`` of ``ks[:m]`` (global elements ``g0 ..``) into the packed payload: bits 8
    one byte each; 16 two bytes, little-endian (the int16 bit pattern); 1, 2, 4 OR-ed into lane
    ``g % per`` of byte ``g // per`` of a zeroed payload (:func:`lsgd.compression.lattice.pack`)."""
    if bits == 8:
        out = payload[g0:g0 + m]
        for i in range(m):
            out[i] = np.uint8(ks[i] & 255)
    elif bits == 16:
        for i in range(m):
            payload[2 * (g0 + i)] = np.uint8(ks[i] & 255)
            payload[2 * (g0 + i) + 1] = np.uint8((ks[i] >> 8) & 255)
    else:
        per = 8 // bits
        mask = (1 << bits) - 1
        for i in range(m):
            g = g0 + i
            payload[g // per] |= np.uint8((ks[i] & mask) << (bits * (g % per)))


@njit(inline="always")
def _get_colours(payload, cs, g0, m, bits):
    """Inverse of :func:`_put_colours`: the colours of elements ``g0 .. g0 + m - 1`` into ``cs``."""
    if bits == 8:
        src = payload[g0:g0 + m]
        for i in range(m):
            cs[i] = np.int32(src[i])
    elif bits == 16:
        for i in range(m):
            cs[i] = np.int32(payload[2 * (g0 + i)]) | (np.int32(payload[2 * (g0 + i) + 1]) << 8)
    else:
        per = 8 // bits
        mask = (1 << bits) - 1
        for i in range(m):
            g = g0 + i
            cs[i] = (np.int32(payload[g // per]) >> (bits * (g % per))) & mask


@njit(inline="always")
def _points_and_sums(ks, m, side, points, g0, w1, w2, j0):
    """``s k`` (float64 product, rounded to the points' dtype) into ``points[g0:]`` and the block's
    three sums of ``k``, ``k g1^j``, ``k g2^j`` (j = j0 ..) for ``ks[:m]``."""
    out = points[g0:g0 + m]
    for i in range(m):
        out[i] = np.float64(ks[i]) * side
    a = w1[j0:j0 + m]
    b = w2[j0:j0 + m]
    s0 = np.int64(0)
    s1 = np.int64(0)
    s2 = np.int64(0)
    for i in range(m):
        k = np.int64(ks[i])
        s0 += k
        s1 += k * a[i]
        s2 += k * b[i]
    return s0, s1, s2


@njit(inline="always")
def _fold_block(acc, b0, b1, b2):
    """Fold one checksum block's sums into ``acc`` (int64 ``[5]``: the three running sums and the
    block weights ``41^j``, ``46^j`` of the next block, all mod 65521)."""
    acc[0] += b0 % P
    acc[1] += (b1 % P) * acc[3]
    acc[2] += (b2 % P) * acc[4]
    acc[3] = acc[3] * 41 % P
    acc[4] = acc[4] * 46 % P


@njit(inline="always")
def _new_acc():
    """The running sums of :func:`_fold_block` before the first block."""
    acc = np.zeros(5, np.int64)
    acc[3] = 1
    acc[4] = 1
    return acc


@njit(inline="always")
def _finish(acc, sums):
    """The three checksum sums, mod 65521, into ``sums``."""
    for i in range(3):
        sums[i] = acc[i] % P


def _encode(x, s32, words, bits, side, w1, w2, payload, points, sums):
    n = x.shape[0]
    ks = np.empty(CHUNK, np.int32)
    ok = True
    acc = _new_acc()
    for start in range(0, n, P):  # checksum blocks
        end = min(n, start + P)
        b0 = np.int64(0)
        b1 = np.int64(0)
        b2 = np.int64(0)
        bad = False
        for g0 in range(start, end, CHUNK):
            m = min(CHUNK, end - g0)
            xs = x[g0:g0 + m]
            ws = words[g0:g0 + m]
            for i in range(m):
                z = xs[i] / s32
                bad |= not (abs(z) < _LIMIT)  # also True for NaN
                fz = np.floor(z)
                u1 = _ONE + np.float32(ws[i] & _MANT) * _ULP  # 1 + m 2^-23, exact
                ks[i] = np.int32((fz + np.floor((z - fz) + u1)) - _ONE)
            _put_colours(payload, ks, g0, m, bits)
            s0, s1, s2 = _points_and_sums(ks, m, side, points, g0, w1, w2, g0 - start)
            b0 += s0
            b1 += s1
            b2 += s2
        ok = ok and not bad
        _fold_block(acc, b0, b1, b2)
    _finish(acc, sums)
    return ok


def _decode(payload, bits, ref, sq32, bound, side, w1, w2, points, sums):
    n = ref.shape[0]
    qf = np.float32(1 << bits)
    inv_q = np.float32(1.0) / qf  # a power of two: exact, and c / q exact
    cs = np.empty(CHUNK, np.int32)
    ks = np.empty(CHUNK, np.int32)
    ok = True
    acc = _new_acc()
    for start in range(0, n, P):
        end = min(n, start + P)
        b0 = np.int64(0)
        b1 = np.int64(0)
        b2 = np.int64(0)
        bad = False
        for g0 in range(start, end, CHUNK):
            m = min(CHUNK, end - g0)
            _get_colours(payload, cs, g0, m, bits)
            ys = ref[g0:g0 + m]
            for i in range(m):
                t = ys[i] / sq32
                bad |= not (abs(np.float64(t)) < bound)
                c = np.float32(cs[i])
                ks[i] = np.int32(c + np.rint(t - c * inv_q) * qf)
            s0, s1, s2 = _points_and_sums(ks, m, side, points, g0, w1, w2, g0 - start)
            b0 += s0
            b1 += s1
            b2 += s2
        ok = ok and not bad
        _fold_block(acc, b0, b1, b2)
    _finish(acc, sums)
    return ok


_F1 = float32[::1]
_I1 = int64[::1]
#: ``encode(x, fl32(s), words, bits, s, w1, w2, payload, points, sums) -> bool`` (False: some
#: ``|x / s| >= 2**20`` or NaN; outputs then unusable). ``x`` float32 ``[n]``; ``words`` uint32, at
#: least ``n``; ``payload`` uint8 (``n`` bytes for bits 8, ``2 n`` for 16, ``ceil(bits n / 8)``
#: zeroed bytes for 1, 2, 4); ``points`` float32 or float64 ``[n]``; ``sums`` int64 ``[3]``; ``w1``,
#: ``w2`` int64 ``[65521]``: the element weights ``17^i``, ``29^i`` mod 65521. Compiled at import for
#: both point dtypes (cached on disk).
encode = njit(
    [boolean(_F1, float32, uint32[::1], int64, float64, _I1, _I1, uint8[::1], pts, _I1)
     for pts in (float32[::1], float64[::1])], **_OPTS)(_encode)
#: ``decode(payload, bits, y, fl32(s q), (2**20 - q) / q, s, w1, w2, points, sums) -> bool`` (False:
#: some ``|y / (s q)|`` beyond the bound or NaN; outputs unusable). Arguments as :data:`encode`'s.
decode = njit(
    [boolean(uint8[::1], int64, _F1, float32, float64, float64, _I1, _I1, pts, _I1)
     for pts in (float32[::1], float64[::1])], **_OPTS)(_decode)
