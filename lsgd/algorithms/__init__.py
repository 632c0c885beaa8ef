"""Distributed training algorithms: one module per method, all communication through lsgd.comm.

``build_algorithm(cfg, comm)`` maps ``algo.name`` to its class (:data:`ALGORITHMS`).
"""

from __future__ import annotations

from lsgd.algorithms.accordion import Accordion
from lsgd.algorithms.adasum import Adasum
from lsgd.algorithms.base import Algorithm
from lsgd.algorithms.compressed import Compressed
from lsgd.algorithms.ddp import DDP
from lsgd.algorithms.diloco import DiLoCo
from lsgd.algorithms.gravac import GraVAC
from lsgd.algorithms.local_sgd import LocalSGD
from lsgd.algorithms.post_local_sgd import PostLocalSGD
from lsgd.algorithms.slowmo import SlowMo
from lsgd.comm import Communicator
from lsgd.errors import ConfigError

ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls for cls in (DDP, LocalSGD, PostLocalSGD, SlowMo, DiLoCo, Compressed, GraVAC, Accordion, Adasum)
}


def build_algorithm(cfg: dict, comm: Communicator) -> Algorithm:
    """Instantiate the algorithm named ``cfg['name']``.

    Raises:
        ConfigError: unknown ``algo.name`` (the message lists the allowed names).
    """
    name = cfg.get("name")
    if name not in ALGORITHMS:
        raise ConfigError(f"algo.name={name!r} is unknown; allowed: {', '.join(sorted(ALGORITHMS))}")
    return ALGORITHMS[name](cfg, comm)


__all__ = ["ALGORITHMS", "Algorithm", "build_algorithm"]
