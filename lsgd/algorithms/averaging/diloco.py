"""``diloco``: DiLoCo (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of
Language Models", Algorithm 1; docs/papers.md#diloco).

Inner optimizer: the run's ``optim`` (AdamW, lr 4e-4, weight decay 0.1, betas 0.9/0.95 in the
paper; ``experiment`` bundles and ``algo=diloco`` docs select ``optim=adamw``), H =
``algo.local_steps`` (500) inner steps. Outer step on the averaged pseudo-gradient
Delta = x_prev - x_avg with ``algo.outer_optimizer``:

* ``nesterov``: torch SGD with Nesterov momentum mu = ``outer_momentum`` (0.9), lr = ``outer_lr``
  (0.7): b <- mu b + Delta; x <- x_prev - lr (Delta + mu b)
* ``sgd``: x <- x_prev - lr Delta (outer_lr = 1 is local SGD).

Inner optimizer state is kept across rounds by default (``buffer_policy: maintain``).
"""

from __future__ import annotations

import torch

from dataclasses import dataclass

from lsgd.algorithms.averaging.local_sgd import LocalSGDConfig
from lsgd.algorithms.averaging.slowmo import SlowMo
from lsgd.core.typed_config import option

OUTER_OPTIMIZERS = ("sgd", "nesterov")


@dataclass
class DiLoCoConfig(LocalSGDConfig):
    """``algo=diloco``'s keys: :class:`LocalSGDConfig`'s and the outer optimizer's."""

    name: str = "diloco"
    local_steps: int = option(500, at_least=1, doc="H: inner steps per round", symbol="H")
    outer_optimizer: str = option("nesterov", choices=OUTER_OPTIMIZERS, doc="the outer step on the averaged pseudo-gradient")
    outer_lr: float = option(0.7, above=0, doc="the outer learning rate")
    outer_momentum: float = option(0.9, doc="mu: the outer Nesterov momentum")


class DiLoCo(SlowMo):
    """DiLoCo: inner AdamW steps, an outer Nesterov step on the averaged pseudo-gradient."""

    name = "diloco"
    Config = DiLoCoConfig
    label = "DiLoCo"
    paper = "docs/papers.md#diloco"

    def build_outer_optimizer(self, groups):
        lr = float(self.config.outer_lr)
        if self.config.outer_optimizer == "nesterov":
            return torch.optim.SGD(groups, lr=lr, momentum=float(self.config.outer_momentum), nesterov=True)
        return torch.optim.SGD(groups, lr=lr)

    def metrics(self) -> dict:
        """``server_updates``: outer steps so far (one per round), the x axis it shares with
        ``async_local_sgd``'s server."""
        return {**super().metrics(), "server_updates": self.rounds}

    def pseudo_gradient_scale(self, gamma: float) -> float:
        """DiLoCo's outer gradient is x_prev - x_avg itself (no division by the inner rate)."""
        return 1.0

    def outer_lr(self, gamma: float) -> float:
        """``outer_lr``, independent of the inner learning rate."""
        return float(self.config.outer_lr)
