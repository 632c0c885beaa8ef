"""``diloco``: DiLoCo (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of
Language Models", Algorithm 1; papers.md section 1).

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

from lsgd.algorithms.averaging.local_sgd import LocalSGD
from lsgd.algorithms.averaging.slowmo import SlowMo
from lsgd.core.checks import choice, positive

OUTER_OPTIMIZERS = ("sgd", "nesterov")


class DiLoCo(SlowMo):
    """Keys: ``outer_optimizer`` (sgd | nesterov), ``outer_lr``, ``outer_momentum``."""

    name = "diloco"

    @classmethod
    def validate_config(cls, algo: dict, world_size: int) -> None:
        LocalSGD.validate_config(algo, world_size)
        choice(algo, "outer_optimizer", OUTER_OPTIMIZERS, "algo.")
        positive(algo, "outer_lr", "algo.")

    def build_outer_optimizer(self, groups):
        lr = float(self.cfg.get("outer_lr", 0.7))
        if self.cfg.get("outer_optimizer", "nesterov") == "nesterov":
            return torch.optim.SGD(groups, lr=lr, momentum=float(self.cfg.get("outer_momentum", 0.9)), nesterov=True)
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
        return float(self.cfg.get("outer_lr", 0.7))
