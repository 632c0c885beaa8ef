"""The target cluster's workers: each one's relative speed and its node.

``cluster.speeds`` gives the speeds (a list, or a heterogeneity preset: :func:`resolve_speeds`),
``cluster.gpus_per_node`` the nodes (:func:`node_of`).

Speeds and heterogeneity
------------------------
A worker with speed ``v`` takes ``t / v`` seconds for a step that takes ``t`` at speed 1.0.
Presets are normalised so that the fastest worker has speed exactly 1.0: the profile (the device
peak and mfu, or ``step_time_s``) is the time of the fastest worker, and the others are slower.
This is the convention of Liu et al. 2024's dynamic local updates (H_w = floor(v(w) / max v * H),
the fastest worker runs the full H) and of the HALoS simulator (utnslab/halos,
``simulation/common.py``: ``worker_speeds /= worker_speeds.max()``, compute time =
steps x local_step_time / speed).

The preset names none / slight / moderate / very are the heterogeneity levels of Liu, Douillard
et al. 2024, "Asynchronous Local-SGD Training for Language Modeling" (arXiv 2401.09135). Their
exact per-level speed distribution could not be recovered from the sources available here (the
paper's text was not reachable; the DeepMind toy notebook, google-deepmind/asyncdiloco
``AsyncLocalSGDToyExample.ipynb``, uses one fixed set of seconds per step,
[0.58, 0.75, 1.51, 3.33] for 4 workers, i.e. a slowest/fastest ratio of 5.74, and no levels;
HALoS takes speeds from a file). lsgd therefore defines each level by its spread ``r`` =
(fastest speed) / (slowest speed), :data:`HETEROGENEITY_SPREAD`:

===========  ======  ==================================================================
level        r       4 workers (before the seeded shuffle)
===========  ======  ==================================================================
none         1       1, 1, 1, 1
slight       1.5     1, 0.874, 0.763, 0.667
moderate     3       1, 0.693, 0.481, 0.333
very         6       1, 0.550, 0.303, 0.167   (the toy notebook's 4 workers: 1, 0.77, 0.38, 0.17)
===========  ======  ==================================================================

The spreads double from level to level, and ``very`` is anchored on the only published numbers
(the notebook's ratio 5.74). The ``n`` workers' speeds are spaced geometrically between 1 and
1/r (``r ** (-k / (n - 1))``, k = 0 .. n-1), so every level has exactly its spread whatever the
number of workers (independent draws would give 2 workers an arbitrary spread), and are then
assigned to ranks by a permutation drawn from ``seed`` (the same permutation for every level, so
the slowest rank of ``slight`` is the slowest of ``very``). The result depends only on
(preset, world_size, seed): every rank computes the same list.

Nodes
-----
Rank ``r`` lives on node ``r // gpus_per_node`` (:func:`node_of`). ``world_size`` need not be a
multiple of ``gpus_per_node``: the last node is then partial (``num_nodes`` rounds up), as when
a job takes the spare GPUs of a node; ``gpus_per_node`` > ``world_size`` is one partial node.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from lsgd.compute.config import is_number
from lsgd.core.errors import ConfigError

HETEROGENEITY: tuple[str, ...] = ("none", "slight", "moderate", "very")

# fastest / slowest worker speed of each heterogeneity level (see the module docstring)
HETEROGENEITY_SPREAD: dict[str, float] = {"none": 1.0, "slight": 1.5, "moderate": 3.0, "very": 6.0}


def _speeds_error(world_size: int, got: Any, why: str = "") -> ConfigError:
    return ConfigError(
        f"cluster.speeds must be null, a preset ({' | '.join(HETEROGENEITY)}) or a list of "
        f"{world_size} positive numbers (one relative speed per worker){why}, got {got!r}"
    )


def resolve_speeds(speeds: Any, world_size: int, seed: int = 0) -> list[float]:
    """``cluster.speeds`` -> one relative speed per worker (1.0 = nominal).

    Args:
        speeds: ``None`` or ``"none"``: every worker 1.0. A preset of :data:`HETEROGENEITY`: the
            level's speeds (module docstring), fastest 1.0, slowest ``1 / HETEROGENEITY_SPREAD``,
            assigned to ranks by a permutation drawn from ``seed``. A list or tuple of
            ``world_size`` positive numbers: returned as given (as floats, not normalised).
        world_size: number of workers.
        seed: the run's seed; with the preset and ``world_size`` it fixes the result.

    Returns:
        ``world_size`` floats; the same on every rank.

    Raises:
        ConfigError: naming ``cluster.speeds`` and the allowed values.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    if speeds is None:
        return [1.0] * world_size
    if isinstance(speeds, str):
        if speeds not in HETEROGENEITY:
            raise _speeds_error(world_size, speeds)
        spread = HETEROGENEITY_SPREAD[speeds]
        if world_size == 1 or spread == 1.0:
            return [1.0] * world_size
        ladder = [spread ** (-k / (world_size - 1)) for k in range(world_size)]
        ranks = list(range(world_size))
        random.Random(seed).shuffle(ranks)  # a private generator: the global RNGs are untouched
        out = [0.0] * world_size
        for k, rank in enumerate(ranks):
            out[rank] = ladder[k]
        return out
    if isinstance(speeds, Sequence) and not isinstance(speeds, (bytes, bytearray)):
        values = list(speeds)
        if len(values) != world_size:
            raise _speeds_error(world_size, speeds, f" (world_size={world_size}, got {len(values)} values)")
        if not all(is_number(v) and v > 0 for v in values):
            raise _speeds_error(world_size, speeds)
        return [float(v) for v in values]
    raise _speeds_error(world_size, speeds)


def node_of(rank: int, gpus_per_node: int) -> int:
    """The node of ``rank``: ranks ``[k * gpus_per_node, (k + 1) * gpus_per_node)`` share node k."""
    return rank // gpus_per_node


def num_nodes(world_size: int, gpus_per_node: int) -> int:
    """Nodes used by ``world_size`` workers; the last one is partial when it does not divide."""
    return -(-world_size // gpus_per_node)
