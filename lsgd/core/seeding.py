"""The one seed mixer of lsgd: stable 63-bit seeds derived from a tuple of ints and strings.

Every source of randomness that must agree across processes (the data partition and batch order,
synthetic data, the compressors' random indices, threshold samples and rounding) draws from a
generator seeded by :func:`derive_seed` of a tuple naming its purpose, e.g.
``derive_seed("iid", seed, epoch)`` or ``derive_seed("randomk", seed, step, key, level)``.
"""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    """A 63-bit seed (an int in ``[0, 2**63)``) derived from ``parts`` (ints or strings), stable
    across processes, runs and machines: the first 8 bytes (little-endian) of the BLAKE2b digest
    of ``repr(parts)``, with the top bit cleared.

    Unlike ``hash()``, the value does not depend on ``PYTHONHASHSEED``, so all ranks agree; the
    strings name the purpose, so two consumers of the same run seed draw unrelated streams.
    Example: ``derive_seed("iid", seed, epoch)``.
    """
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)
