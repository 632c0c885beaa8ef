"""Adasum's per-tensor float64 dot products and its combination of float32 buffers, one compiled pass
each, with numba (``@njit(cache=True)``): :func:`partial_dots` and :func:`combine`, the CPU paths of
:func:`lsgd.algorithms.adasum.adasum._partial_dots` and ``_combine_`` for float32, in one fixed order: on this
project's AMD EPYC machines (MKL 2024.2, ATen's AVX2 / AVX512 kernels) bit for bit what their torch
paths compute (the combination's rounding is described at :func:`combine`); elsewhere the same bits
as here, which the torch path there may not give (it adds in its BLAS's order for that CPU).

The torch path converts each 64K-element chunk of a region to float64 (two copies), then asks the
BLAS for ``[a; b] a`` (``dgemv``: ``|a|^2`` and ``a.b``) and ``b.b`` (``ddot``), and sums the chunks'
values per tensor (``index_add_``); the short pieces (biases, BatchNorm vectors) are gathered and
summed by ``segment_reduce``. Measured on the 1M list's level-0 region (475K floats, one process):
0.52 ms, of which the float64 copies 0.18 ms and the BLAS 0.27 ms; here 0.35 ms, each element read
as float32 and never stored in float64.

Why the bits are the same. A product of two float32 (or narrower) numbers is exact in float64 (24 +
24 significand bits < 53, exponents within float64's normal range), so multiplying with or without a
fused multiply-add, before or after converting, gives the same float64 product. Only the order of
the float64 additions matters, and this module reproduces, addition for addition, the order of the
library calls the torch path makes on this project's torch build (MKL 2024.2, the BLAS torch links;
on this machine kind's CPU, AMD EPYC with AVX-512, where MKL takes the code paths below; the orders
were read off the library by probing, the idea of FPRev (Xie et al., 2024): a sum of ones with
``+M`` and ``-M`` at positions ``i`` and ``j`` returns the number of ones outside the subtree that
joins ``i`` and ``j``):

* ``ddot`` over ``n`` elements: four two-lane accumulators (an SSE2 pattern): element ``8 k + 2 r + l``
  of the blocks of 8 goes to accumulator ``r``, lane ``l``, one after another; the remaining pairs
  into accumulator 0 (both lanes), a last odd element into its lane 0; then per lane ``((acc0 +
  acc1) + acc2) + acc3``, and lane 0 + lane 1. When the data sit 8 bytes off a 16-byte boundary (the
  torch path's second row, for an odd chunk-buffer length), the first product is taken alone into
  accumulator 0, lane 0, and the rest as above.
* ``dgemv`` (transposed, two columns: the rows of the float64 chunk buffer, 64-byte aligned as torch
  allocates it), vector = row 0: the first two products are added first (``p0 + p1``: a peel, from the
  vector's alignment); then ``8 floor((n - 2) / 8)`` elements from index 2, where row 0 (``|a|^2``) goes
  to four lanes ``i mod 4`` (lane 0 starting from the peel) reduced as ``(l0 + l2) + (l1 + l3)``, and row
  1 (``a.b``) to two lanes ``i mod 2`` (lane 0 starting from the peel) reduced as ``l0 + l1``; then the
  rest one by one.
* ``index_add_`` of the chunks' values per tensor and ``segment_reduce``'s sums: one after another
  from 0.

``tests/unit/test_adasum_fused.py`` checks the kernels against exact sums (``math.fsum`` of the
exact products) on every machine, and against the torch path bit for bit (every length modulo 8 and
the layouts the reduction makes) where :func:`lsgd.algorithms.adasum.adasum.torch_order_matches` (a
probe: the orders are those of MKL's code paths on this machine kind; on another CPU or BLAS the torch
path's can differ, and the kernels keep theirs, so a run gives the same bits on every machine);
``LSGD_ADASUM_FUSED=0`` turns them off.

Why numba: see :mod:`lsgd.compression.lattice_fused` (the same pattern: cached machine code, a
fallback to the torch path when numba is missing or the module fails to compile). Its cost is per
process, on the first float32 reduction on CPU: importing numba (about 1.3 s here, none where the
lattice quantizer has imported it) and loading the cached kernels (0.3 s; compiling them, once per
machine, 2.4 s: ``make install`` does it, :func:`warm_up`). The additions
are chains (each sum's order is fixed), so the loop is bound by the float64 add latency of its
longest chain (``a.b``: two lanes); two chunks of equal length are walked together, so that their
independent chains overlap.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

_OPTS = dict(cache=True, nogil=True, error_model="numpy", boundscheck=False)


@njit(inline="always")
def _gemv_head(a, b, c0, n):
    """dgemv's peel: ``(|a|^2, a.b)`` of the first ``min(n, 2)`` elements (added first) and the
    length of the lanes' part that follows (``8 floor((n - 2) / 8)``, from ``c0 + 2``)."""
    if n == 0:
        return 0.0, 0.0, 0
    x = np.float64(a[c0])
    y = np.float64(b[c0])
    aa = x * x
    ab = y * x
    if n == 1:
        return aa, ab, 0
    x = np.float64(a[c0 + 1])
    y = np.float64(b[c0 + 1])
    return aa + x * x, ab + y * x, 8 * ((n - 2) // 8)


@njit(inline="always")
def _gemv_tail(a, b, c0, c1, main, aa0, aa1, aa2, aa3, ab0, ab1):
    """dgemv's lane reduction, then the elements after the lanes' part one by one."""
    aa = (aa0 + aa2) + (aa1 + aa3)
    ab = ab0 + ab1
    for i in range(c0 + min(c1 - c0, 2) + main, c1):
        x = np.float64(a[i])
        aa += x * x
        ab += np.float64(b[i]) * x
    return aa, ab


@njit(inline="always")
def _step(a, b, g, d, s):
    """Eight elements of one chunk: dgemv's lanes over ``g .. g + 7`` (two steps of four) and one
    ``ddot`` block ``d .. d + 7``; ``s`` = (aa0, aa1, aa2, aa3, ab0, ab1, d00, d01, d10, d11, d20,
    d21, d30, d31)."""
    aa0, aa1, aa2, aa3, ab0, ab1, d00, d01, d10, d11, d20, d21, d30, d31 = s
    for h in range(2):
        i = g + 4 * h
        x = np.float64(a[i])
        y = np.float64(b[i])
        aa0 += x * x
        ab0 += y * x
        x = np.float64(a[i + 1])
        y = np.float64(b[i + 1])
        aa1 += x * x
        ab1 += y * x
        x = np.float64(a[i + 2])
        y = np.float64(b[i + 2])
        aa2 += x * x
        ab0 += y * x
        x = np.float64(a[i + 3])
        y = np.float64(b[i + 3])
        aa3 += x * x
        ab1 += y * x
    y = np.float64(b[d])
    d00 += y * y
    y = np.float64(b[d + 1])
    d01 += y * y
    y = np.float64(b[d + 2])
    d10 += y * y
    y = np.float64(b[d + 3])
    d11 += y * y
    y = np.float64(b[d + 4])
    d20 += y * y
    y = np.float64(b[d + 5])
    d21 += y * y
    y = np.float64(b[d + 6])
    d30 += y * y
    y = np.float64(b[d + 7])
    d31 += y * y
    return aa0, aa1, aa2, aa3, ab0, ab1, d00, d01, d10, d11, d20, d21, d30, d31


@njit(inline="always")
def _start(a, b, c0, c1, peel):
    """A chunk's state before its lanes: (state, dgemv's lane length, ddot's first block start)."""
    aa0, ab0, main = _gemv_head(a, b, c0, c1 - c0)
    d00 = 0.0
    d = c0
    if peel and c1 > c0:
        y = np.float64(b[c0])
        d00 = y * y
        d = c0 + 1
    return (aa0, 0.0, 0.0, 0.0, ab0, 0.0, d00, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0), main, d


@njit(inline="always")
def _finish(a, b, c0, c1, main, d, t, s, vals, k):
    """A chunk after ``t`` elements of its fused lanes: the rest of its dgemv lanes (``t .. main``),
    of ``ddot``'s blocks, both tails; ``vals[k] = (|a|^2, a.b, |b|^2)``."""
    g = c0 + 2
    while t < main:
        s = _step(a, b, g + t, d + t, s)
        t += 8
    aa0, aa1, aa2, aa3, ab0, ab1, d00, d01, d10, d11, d20, d21, d30, d31 = s
    aa, ab = _gemv_tail(a, b, c0, c1, main, aa0, aa1, aa2, aa3, ab0, ab1)
    i = d + t
    blocks = d + 8 * ((c1 - d) // 8)
    while i < blocks:
        y = np.float64(b[i])
        d00 += y * y
        y = np.float64(b[i + 1])
        d01 += y * y
        y = np.float64(b[i + 2])
        d10 += y * y
        y = np.float64(b[i + 3])
        d11 += y * y
        y = np.float64(b[i + 4])
        d20 += y * y
        y = np.float64(b[i + 5])
        d21 += y * y
        y = np.float64(b[i + 6])
        d30 += y * y
        y = np.float64(b[i + 7])
        d31 += y * y
        i += 8
    while i + 2 <= c1:
        y = np.float64(b[i])
        d00 += y * y
        y = np.float64(b[i + 1])
        d01 += y * y
        i += 2
    if i < c1:
        y = np.float64(b[i])
        d00 += y * y
    vals[k, 0] = aa
    vals[k, 1] = ab
    vals[k, 2] = (((d00 + d10) + d20) + d30) + (((d01 + d11) + d21) + d31)


@njit(**_OPTS)
def _chunk_values(a, b, lo, hi, order, peel, vals):
    """``vals[k] = (|a|^2, a.b, |b|^2)`` of chunk ``[lo[k], hi[k])``. One loop per chunk does its
    dgemv lanes and its ``ddot`` blocks, eight elements a step, and two chunks (``order[2 j]`` and
    ``order[2 j + 1]``) are walked together over their common length: every sum keeps its order, and
    the independent chains (up to 28) overlap their add latencies (``a.b`` alone has two lanes)."""
    m = order.shape[0]
    for j in range(0, m, 2):
        # each chunk as its own slices, indexed from 0 (numba's index checks then fold away)
        k = order[j]
        xa = a[lo[k]:hi[k]]
        ya = b[lo[k]:hi[k]]
        na = hi[k] - lo[k]
        sa, main_a, da = _start(xa, ya, 0, na, peel)
        if j + 1 < m:
            kb = order[j + 1]
            xb = a[lo[kb]:hi[kb]]
            yb = b[lo[kb]:hi[kb]]
            nb = hi[kb] - lo[kb]
            sb, main_b, db = _start(xb, yb, 0, nb, peel)
            common = min(main_a, main_b)
            t = 0
            while t < common:
                sa = _step(xa, ya, 2 + t, da + t, sa)
                sb = _step(xb, yb, 2 + t, db + t, sb)
                t += 8
            _finish(xb, yb, 0, nb, main_b, db, t, sb, vals, kb)
        else:
            t = 0
        _finish(xa, ya, 0, na, main_a, da, t, sa, vals, k)


@njit(**_OPTS)
def partial_dots(a, b, chunk_lo, chunk_hi, chunk_id, chunk_order, small_lo, small_hi, small_id, peel, out):
    """Per tensor ``[a.b, |a|^2, |b|^2]`` into ``out`` (float64, shape ``(3, num)``, zeros on entry).

    ``a``, ``b``: float32 regions (1-D, same length); the long pieces' chunks ``[chunk_lo[k],
    chunk_hi[k])`` of tensor ``chunk_id[k]`` (region coordinates, in the torch path's order), whose
    values are added to the tensor's sums one after another (``chunk_order``: the chunks sorted by
    length, paired in the loop); the short pieces ``[small_lo[k], small_hi[k])``, each summed one
    product after another from 0 (``segment_reduce``). ``peel``: the torch path's float64 chunk
    buffer has an odd row length (its second row is 8 bytes off a 16-byte boundary, which changes
    ``ddot``'s order: module docstring)."""
    vals = np.empty((chunk_lo.shape[0], 3))
    _chunk_values(a, b, chunk_lo, chunk_hi, chunk_order, peel, vals)
    for k in range(chunk_lo.shape[0]):
        t = chunk_id[k]
        out[0, t] += vals[k, 1]
        out[1, t] += vals[k, 0]
        out[2, t] += vals[k, 2]
    for k in range(small_lo.shape[0]):
        s0 = 0.0
        s1 = 0.0
        s2 = 0.0
        for i in range(small_lo[k], small_hi[k]):
            x = np.float64(a[i])
            y = np.float64(b[i])
            s0 += x * y
            s1 += x * x
            s2 += y * y
        t = small_id[k]
        out[0, t] = s0
        out[1, t] = s1
        out[2, t] = s2


@intrinsic
def _fma32(typingctx, x, y, z):
    """``fma(x, y, z)`` in float32, one rounding (LLVM's ``llvm.fma.f32``; numba has no fma of its own)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32, f32, f32]), "llvm.fma.f32")
        return builder.call(fn, args)

    return sig, codegen


@njit(**_OPTS)
def combine(own, other, big_lo, big_hi, big_id, small_lo, small_hi, small_id, c_own, c_other):
    """``own <- c_own[t] own + c_other[t] other`` over the pieces of a region (float32, in place),
    rounded as the torch path rounds: a long piece ``[big_lo[k], big_hi[k])`` of tensor ``big_id[k]``
    as ``own.mul_(c).add_(other, alpha=d)`` (ATen's multiply, then its add with alpha, a fused
    multiply-add: ``fma(other, d, fl(own c))``), a short one as ``own c + other d`` (three roundings).
    ``c_own``, ``c_other``: the float32 coefficients per tensor (the float64 ones rounded once, as
    ATen rounds a Python scalar for a float32 tensor). Each piece is a slice walked from 0 (indices
    that numba knows are in range: LLVM vectorizes the loop; 42 against 149 us for the torch path on
    the 1M list's level-0 region, 475K floats)."""
    for k in range(big_lo.shape[0]):
        c = c_own[big_id[k]]
        d = c_other[big_id[k]]
        x = own[big_lo[k]:big_hi[k]]
        y = other[big_lo[k]:big_hi[k]]
        for i in range(x.shape[0]):
            x[i] = _fma32(y[i], d, x[i] * c)
    for k in range(small_lo.shape[0]):
        c = c_own[small_id[k]]
        d = c_other[small_id[k]]
        x = own[small_lo[k]:small_hi[k]]
        y = other[small_lo[k]:small_hi[k]]
        for i in range(x.shape[0]):
            x[i] = x[i] * c + y[i] * d


def warm_up() -> None:
    """Compile :func:`partial_dots` (or load it from numba's cache) now, on tiny inputs: ``make
    install`` calls it so that worker processes find the cache (about 1.5 s to compile, once)."""
    a = np.ones(16, dtype=np.float32)
    idx = np.array([0], dtype=np.int64)
    partial_dots(a, a, idx, np.array([16], dtype=np.int64), idx, idx, idx, np.array([1], dtype=np.int64), idx,
                 False, np.zeros((3, 1)))
    c = np.ones(1, dtype=np.float32)
    combine(a, a, idx, np.array([8], dtype=np.int64), idx, np.array([8], dtype=np.int64),
            np.array([16], dtype=np.int64), idx, c, c)
