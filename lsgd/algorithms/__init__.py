"""Distributed training algorithms: one module per method, all communication through lsgd.comm.communicator.

Every module of this package is imported here; a subclass of
:class:`~lsgd.algorithms.base.Algorithm` that sets ``name`` registers itself in :data:`ALGORITHMS`
(so adding a method touches no list). ``build_algorithm(cfg, comm)`` maps ``algo.name`` to its class.
"""

from __future__ import annotations

import importlib
import pkgutil

from lsgd.algorithms.base import ALGORITHMS, Algorithm, RunContext
from lsgd.comm.communicator import Communicator

for _module in pkgutil.walk_packages(__path__, prefix=f"{__name__}."):
    importlib.import_module(_module.name)


def build_algorithm(cfg: dict, comm: Communicator) -> Algorithm:
    """Instantiate the algorithm named ``cfg['name']``.

    Raises:
        ConfigError: unknown ``algo.name`` (the message lists the allowed names).
    """
    return ALGORITHMS[cfg.get("name")](cfg, comm)


__all__ = ["ALGORITHMS", "Algorithm", "RunContext", "build_algorithm"]
