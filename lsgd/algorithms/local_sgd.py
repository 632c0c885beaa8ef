"""``local_sgd``: H local steps, then exact parameter averaging (Stich 2019; Lin et al. 2020;
Ortiz et al. 2021, papers.md section 1).

Every ``algo.local_steps`` (H) completed local steps all workers replace their parameters by
x_avg = mean_i x_i (one coalesced all-reduce of the model, counted as one round). With
``algo.average_buffers`` the model buffers (BatchNorm running statistics) are averaged in the same
round. ``algo.buffer_policy`` decides what happens to the base optimizer's state at a sync:

* ``maintain``: keep each worker's state (torch's PeriodicModelAverager behaviour),
* ``reset``: clear it, as if the optimizer were freshly constructed (SlowMo's choice for
  Nesterov SGD; the first step after a reset rebuilds momentum buffers from the gradient),
* ``average``: average every floating tensor of the state (momentum buffers, Adam moments)
  across workers in the same round (counted).

Subclasses (SlowMo, DiLoCo, post-local SGD) reuse :meth:`LocalSGD.sync` and add an outer step.
"""

from __future__ import annotations

import torch

from lsgd.algorithms.base import Algorithm, float_buffers, model_tensors
from lsgd.config import choice, int_at_least

BUFFER_POLICIES = ("reset", "maintain", "average")


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Floating-point state tensors of ``optimizer`` (momentum buffers, moments), excluding 'step'."""
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in sorted(optimizer.state.get(p, {}).items()):
                if key != "step" and torch.is_tensor(value) and value.is_floating_point():
                    out.append(value)
    return out


class LocalSGD(Algorithm):
    """Local SGD with exact periodic averaging.

    Config keys: ``local_steps`` (H >= 1), ``average_buffers`` (bool), ``buffer_policy``.
    """

    name = "local_sgd"
    grad_scaler = "flag"  # workers step on their own gradients (lsgd.accel); SlowMo, DiLoCo, post-local SGD inherit it

    @classmethod
    def validate_config(cls, algo: dict, world_size: int) -> None:
        int_at_least(algo, "local_steps", 1, "algo.")
        choice(algo, "buffer_policy", BUFFER_POLICIES, "algo.")

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        self.local_steps = int(cfg.get("local_steps", 1))
        self.average_buffers = bool(cfg.get("average_buffers", True))
        self.buffer_policy = cfg.get("buffer_policy", "maintain")
        self.rounds = 0
        self._in_sync = True

    def is_sync_step(self, step: int) -> bool:
        """Whether a sync follows completed local step ``step`` (1-based)."""
        return step % self.local_steps == 0

    def after_step(self, step: int) -> None:
        self._in_sync = False
        if self.is_sync_step(step):
            self.sync()

    def sync(self) -> None:
        """One round: average parameters (+ buffers, + optimizer state), apply the policy and
        the outer step."""
        tensors = model_tensors(self.model, buffers=self.average_buffers)
        if self.buffer_policy == "average":
            tensors += optimizer_state_tensors(self.optimizer)
        self.comm.average_(tensors)
        self.comm.round()
        self.rounds += 1
        if self.buffer_policy == "reset":
            self.optimizer.state.clear()
        self.outer_step()
        self._in_sync = True

    def outer_step(self) -> None:
        """Hook after averaging (SlowMo / DiLoCo); plain local SGD does nothing."""

    @property
    def models_in_sync(self) -> bool:
        return self._in_sync and (self.average_buffers or not float_buffers(self.model))

    def state_dict(self) -> dict:
        return {"rounds": self.rounds, "in_sync": self._in_sync}

    def load_state_dict(self, state: dict) -> None:
        self.rounds = state["rounds"]
        self._in_sync = state["in_sync"]
