"""Uniform random bits in bulk for the compressors' fast paths (random-k's indices, QSGD's and the
lattice's randomized rounding), from numpy's PCG64 bit generator.

Why not torch's generator: on CPU it is an mt19937 behind a lock, and ``torch.rand`` /
``torch.randint`` cost 10-12 ns per element on this project's 2-core machine (measured 25 Nov 2026,
torch 2.14.1, one thread, 1M elements), more than the whole budget of the paths that use them (the
lattice quantizer's 5 ns per element; QSGD on 25M floats within one all-reduce). numpy's
``PCG64.random_raw`` (O'Neill, "PCG: A Family of Simple Fast Space-Efficient Statistically Good
Algorithms for Random Number Generation", 2014; numpy's default bit generator) fills 64 bits in
about 1 ns, i.e. 0.5 ns per 32-bit word, and its raw stream for a given seed is fixed by numpy's
stream-compatibility policy for bit generators (NEP 19), so it is the same on every machine and
rank. A well-kept library rather than own code: numpy is already installed with torch and pandas.

Seeds: :func:`random_int32` takes an integer seed (e.g. :func:`lsgd.core.seeding.derive_seed` of the
purpose, seed, step, key, ...); :func:`seed_from` draws one from a ``torch.Generator`` (advancing it),
for callers that hand a generator down (SwarmSGD's lattice encode).
"""

from __future__ import annotations

import numpy as np
import torch


def seed_from(generator: torch.Generator) -> int:
    """One 62-bit seed drawn from ``generator`` (advances it by one draw; any device)."""
    return int(torch.randint(0, 1 << 62, (1,), generator=generator, device=generator.device))


def random_int32(n: int, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """int32 tensor of shape ``[n]``, each element uniform over all 2**32 bit patterns and
    independent: the first ``ceil(n / 2)`` 64-bit outputs of ``PCG64(seed)`` viewed as 32-bit words
    (little-endian). On ``device`` (made on the CPU and copied there)."""
    raw = np.random.PCG64(int(seed)).random_raw(-(-int(n) // 2))
    words = torch.from_numpy(raw.view(np.int32)[: int(n)])
    return words if torch.device(device).type == "cpu" else words.to(device)


def random_int64(n: int, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """int64 tensor of shape ``[n]``, uniform over all 2**64 bit patterns: ``PCG64(seed)``'s first
    ``n`` outputs."""
    words = torch.from_numpy(np.random.PCG64(int(seed)).random_raw(int(n)).view(np.int64))
    return words if torch.device(device).type == "cpu" else words.to(device)


def random_float32(n: int, seed: int, low: float = 1.0, bits: int = 23,
                   device: torch.device | str = "cpu") -> torch.Tensor:
    """float32 tensor of shape ``[n]``: ``low + m ulp``, ``m`` uniform on ``{0 .. 2**bits - 1}``,
    ``ulp = low 2**-23`` (float32's spacing on ``[low, 2 low)``), so values lie in
    ``[low, low + 2**bits ulp)``; ``low`` a power of two, ``1 <= bits <= 23``. Made by splicing
    ``low``'s exponent onto ``bits`` random bits: 32-bit words of ``PCG64(seed)`` (as
    :func:`random_int32`) for ``bits > 16``, 16-bit words for ``bits <= 16`` (half the generator's
    work; measured 2-4 ns per 64-bit output); numpy integer ops, no conversion pass, no torch
    thread pool.

    E.g. ``low=1, bits=23``: ``1 + u`` with ``u`` uniform on the 2**-23 grid of ``[0, 1)``;
    ``low=128, bits=16``: ``128 + u`` with ``u`` on the 2**-16 grid of ``[0, 1)``.

    Raises:
        ValueError: ``low`` not a positive power of two, or ``bits`` outside 1 .. 23.
    """
    import math

    mant, exp = math.frexp(low)
    if not (low > 0 and mant == 0.5) or not 1 <= bits <= 23:
        raise ValueError(f"random_float32 needs low a power of two and 1 <= bits <= 23, got low={low!r}, bits={bits!r}")
    pattern = int(np.float32(low).view(np.uint32))
    n = int(n)
    mask = (1 << bits) - 1
    if bits <= 16:  # 16-bit words (half the generator's work), widened by the OR itself
        words = np.random.PCG64(int(seed)).random_raw(-(-n // 4)).view(np.uint16)[:n]
        if bits < 16:
            words &= np.uint16(mask)
        out = np.bitwise_or(words, np.uint32(pattern), dtype=np.uint32)
    else:
        raw = np.random.PCG64(int(seed)).random_raw(-(-n // 2))
        raw &= np.uint64(mask | (mask << 32))
        raw |= np.uint64(pattern | (pattern << 32))
        out = raw.view(np.uint32)[:n]
    t = torch.from_numpy(out.view(np.float32))
    return t if torch.device(device).type == "cpu" else t.to(device)
