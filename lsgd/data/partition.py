"""Pure functions that split a training set across workers.

Everything here is deterministic in its arguments and identical on every rank, so each
worker can compute every worker's shard without communicating.
"""

from __future__ import annotations

import numpy as np
import torch

from lsgd.core.errors import ConfigError
from lsgd.core.seeding import derive_seed

__all__ = ["derive_seed", "dirichlet_partition", "generator", "iid_partition", "label_entropy"]


def generator(*parts: object) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with :func:`derive_seed` of ``parts``."""
    g = torch.Generator()
    g.manual_seed(derive_seed(*parts))
    return g


def iid_partition(n: int, world_size: int, seed: int, epoch: int) -> list[torch.Tensor]:
    """IID shards of ``range(n)`` for one epoch.

    A permutation of ``range(n)`` drawn from a generator seeded with ``(seed, epoch)`` (the same
    on every rank) is cut into ``world_size`` contiguous slices whose sizes differ by at most one.

    Returns:
        ``world_size`` int64 tensors of sample indices: disjoint, together covering ``range(n)``.
    Raises:
        ValueError: ``n < 0`` or ``world_size < 1``.
    """
    if n < 0 or world_size < 1:
        raise ValueError(f"need n >= 0 and world_size >= 1, got n={n}, world_size={world_size}")
    perm = torch.randperm(n, generator=generator("iid", seed, epoch))
    return list(torch.tensor_split(perm, world_size))


def dirichlet_partition(
    labels, world_size: int, alpha: float, seed: int, min_size: int = 1, max_tries: int = 100
) -> list[torch.Tensor]:
    """Label-skewed shards (Hsu et al. 2019, "Measuring the effects of non-identical data
    distribution"): for each class c, proportions ``p_c ~ Dir(alpha * 1_world_size)`` are drawn and
    the class's samples (shuffled) are cut into ``world_size`` pieces of sizes ``~ p_c * n_c``.

    Small ``alpha`` (0.1) gives each worker few classes; large ``alpha`` (100) approaches IID.
    The fraction of class c given to worker w has mean ``1/K`` and variance
    ``(K - 1) / (K^2 (K alpha + 1))`` with ``K = world_size``.
    Draws are repeated (same seed stream) until every worker has at least ``min_size`` samples.

    Args:
        labels: 1-D sequence / array / tensor of integer class labels, length N.
        world_size: number of workers K >= 1.
        alpha: Dirichlet concentration > 0.
        seed: the split depends only on (labels, world_size, alpha, seed).
    Returns:
        ``world_size`` sorted int64 tensors of sample indices: disjoint, together covering ``range(N)``.
    Raises:
        ConfigError: ``alpha <= 0``, or no draw in ``max_tries`` gives every worker ``min_size``
            samples (raise ``dataset.alpha`` or use fewer workers).
    """
    if not alpha > 0:
        raise ConfigError(f"dataset.alpha must be > 0 (Dirichlet concentration), got {alpha!r}")
    labels = np.asarray(torch.as_tensor(labels).cpu())
    rng = np.random.default_rng(derive_seed("dirichlet", seed))
    class_indices = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _ in range(max_tries):
        pieces: list[list[np.ndarray]] = [[] for _ in range(world_size)]
        for idx in class_indices:
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(world_size, float(alpha)))
            cuts = (np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
            for w, part in enumerate(np.split(idx, cuts)):
                pieces[w].append(part)
        shards = [np.sort(np.concatenate(p)) if p else np.zeros(0, np.int64) for p in pieces]
        if min(len(s) for s in shards) >= min_size:
            return [torch.from_numpy(s.astype(np.int64)) for s in shards]
    raise ConfigError(
        f"dataset.alpha={alpha}: no Dirichlet draw in {max_tries} tries gives each of the {world_size} workers "
        f"at least {min_size} sample(s); use a larger dataset.alpha or fewer workers"
    )


def label_entropy(labels: torch.Tensor, num_classes: int) -> float:
    """Shannon entropy (nats) of the empirical label distribution of ``labels`` (1-D int tensor)."""
    counts = torch.bincount(torch.as_tensor(labels).long(), minlength=num_classes).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())
