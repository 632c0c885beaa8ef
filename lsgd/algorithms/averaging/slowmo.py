"""``slowmo``: Slow Momentum (Wang, Tantia, Ballas, Rabbat, ICLR 2020, Algorithm 1), with local SGD
as the base algorithm (docs/papers.md#slowmo).

Every tau = ``algo.local_steps`` base steps, after exact averaging x_avg = mean_i x_i:

    u      <- beta * u + (x_prev - x_avg) / gamma        (gamma: the round's base learning rate)
    x      <- x_prev - alpha * gamma * u
    x_prev <- x                                           (every worker starts the round from x)

gamma is the learning rate the round's last local step used, read in :meth:`optimizer_step`
(before the trainer's ``scheduler.step()``), per parameter group of the base optimizer: each group
gets its own gamma in both the pseudo-gradient and the slow learning rate. The paper's schedules
change the learning rate only between rounds, so this is the rate of every step of the round; a
decay that lands on a sync step takes effect in the next round, not in this round's
pseudo-gradient (reading the rate after ``scheduler.step()`` would divide the round's progress
by the new, smaller rate). Under a continuous schedule (warm-up, cosine) the rate of the round's
last step is used. A round whose gamma is 0 (a warm-up from 0) moves nothing: its pseudo-gradient
and slow step are taken as 0.

with alpha = ``algo.slow_lr`` and beta = ``algo.slow_momentum``. This is heavy-ball SGD on the
pseudo-gradient (x_prev - x_avg) / gamma with learning rate alpha * gamma, so it is implemented with
``torch.optim.SGD(momentum=beta, dampening=0)`` over a copy of x_prev (its momentum buffer is u).
alpha = 1, beta = 0 gives x = x_avg: plain local SGD. Base optimizer buffers follow
``algo.buffer_policy`` (the paper resets Nesterov momentum on CIFAR/ImageNet).
"""

from __future__ import annotations

import torch

from dataclasses import dataclass

from lsgd.algorithms.averaging.local_sgd import LocalSGD, LocalSGDConfig
from lsgd.core.typed_config import option


@dataclass
class SlowMoConfig(LocalSGDConfig):
    """``algo=slowmo``'s keys: :class:`LocalSGDConfig`'s and the slow step's."""

    name: str = "slowmo"
    local_steps: int = option(12, at_least=1, doc="tau: base steps between averagings", symbol="H")
    slow_lr: float = option(1.0, above=0, doc="alpha: the slow learning rate", symbol="alpha")
    slow_momentum: float = option(0.6, at_least=0, below=1, doc="beta: the slow momentum (the paper tunes 0.4-0.8)",
                                  symbol="beta")
    buffer_policy: str = option("reset", choices=("reset", "maintain", "average"),
                                doc="the base optimizer's state at a sync (the paper resets Nesterov momentum)",
                                symbol="buffers")


class SlowMo(LocalSGD):
    """SlowMo: local SGD with an outer (slow) momentum step."""

    name = "slowmo"
    Config = SlowMoConfig
    label = "SlowMo"
    paper = "docs/papers.md#slowmo"

    def setup(self, model, optimizer, ctx=None):
        model = super().setup(model, optimizer, ctx)
        # x_prev: the model every worker started the current round from (float32 copy).
        self.x_prev = [p.detach().clone() for p in self.model.parameters()]
        self.group_index = parameter_groups(self.model, optimizer)
        self.round_lrs: list[float] | None = None
        self.outer_optimizer = self.build_outer_optimizer(
            [{"params": [self.x_prev[i] for i in idx]} for idx in self.group_index])
        return model

    def build_outer_optimizer(self, groups: list[dict]) -> torch.optim.Optimizer:
        """The slow optimizer over ``groups`` (one per base parameter group): SGD with momentum
        beta (each group's lr is set at every round to alpha * gamma of that group)."""
        return torch.optim.SGD(groups, lr=1.0, momentum=float(self.config.slow_momentum))

    def pseudo_gradient_scale(self, gamma: float) -> float:
        """Factor applied to (x_prev - x_avg) of a group whose round learning rate is ``gamma``:
        1 / gamma for SlowMo (0 when gamma is 0)."""
        return 1.0 / gamma if gamma > 0 else 0.0

    def outer_lr(self, gamma: float) -> float:
        """Slow learning rate of a group whose round learning rate is ``gamma``: alpha * gamma."""
        return float(self.config.slow_lr) * gamma

    def optimizer_step(self) -> None:
        """The local step; remembers each group's learning rate (gamma of the round so far)."""
        self.round_lrs = [float(g["lr"]) for g in self.optimizer.param_groups]
        super().optimizer_step()

    @torch.no_grad()
    def outer_step(self) -> None:
        gammas = self.round_lrs or [float(g["lr"]) for g in self.optimizer.param_groups]
        params = [p.detach() for p in self.model.parameters()]
        for idx, group, gamma in zip(self.group_index, self.outer_optimizer.param_groups, gammas):
            scale = self.pseudo_gradient_scale(gamma)
            for i in idx:
                self.x_prev[i].grad = (self.x_prev[i] - params[i]) * scale
            group["lr"] = self.outer_lr(gamma)
        self.outer_optimizer.step()
        for x_prev, p in zip(self.x_prev, params):
            p.copy_(x_prev)
            x_prev.grad = None

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["x_prev"] = [t.clone() for t in self.x_prev]
        state["outer_optimizer"] = self.outer_optimizer.state_dict()
        state["round_lrs"] = self.round_lrs
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        with torch.no_grad():
            for t, s in zip(self.x_prev, state["x_prev"]):
                t.copy_(s)
        self.outer_optimizer.load_state_dict(state["outer_optimizer"])
        self.round_lrs = state.get("round_lrs")


def parameter_groups(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[list[int]]:
    """For each parameter group of ``optimizer``, the indices of its parameters in
    ``model.parameters()``.

    Raises:
        ValueError: a parameter of the model is in no group or in several, or a group holds a
            tensor that is not a parameter of the model.
    """
    index = {id(p): i for i, p in enumerate(model.parameters())}
    groups, seen = [], set()
    for g, group in enumerate(optimizer.param_groups):
        idx = []
        for p in group["params"]:
            if id(p) not in index:
                raise ValueError(f"optimizer param group {g} holds a tensor that is not a parameter of the model")
            if index[id(p)] in seen:
                raise ValueError(f"model parameter {index[id(p)]} is in several optimizer param groups")
            seen.add(index[id(p)])
            idx.append(index[id(p)])
        groups.append(idx)
    missing = sorted(set(index.values()) - seen)
    if missing:
        raise ValueError(f"model parameters {missing} are in no optimizer param group: the slow step needs "
                         "every parameter's learning rate")
    return groups
