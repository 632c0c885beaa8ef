"""``local_sgd``: H local steps, then exact parameter averaging (Stich 2019; Lin et al. 2020;
Ortiz et al. 2021, docs/papers.md#local-sgd).

Every ``algo.local_steps`` (H) completed local steps all workers replace their parameters by
x_avg = mean_i x_i (one coalesced all-reduce of the model, counted as one round). With
``algo.average_buffers`` the model buffers (BatchNorm running statistics) are averaged in the same
round. ``algo.buffer_policy`` decides what happens to the base optimizer's state at a sync:

* ``maintain``: keep each worker's state (torch's PeriodicModelAverager behaviour),
* ``reset``: clear it, as if the optimizer were freshly constructed (SlowMo's choice for
  Nesterov SGD; the first step after a reset rebuilds momentum buffers from the gradient),
* ``average``: average every floating tensor of the state (momentum buffers, Adam moments)
  across workers in the same round (counted).

``algo.comm_dtype`` (``fp32``, the default, | ``bf16`` | ``fp16``) is the dtype the parameters
travel in. At fp32 the round all-reduces the parameters themselves. At bf16 / fp16 it all-reduces
each worker's change since the last round, x_i - x_anchor, cast to that dtype (2 bytes per element,
counted as such), and every worker sets x = x_anchor + mean_i(x_i - x_anchor) in float32: the
parameters themselves would lose their low bits (bf16 keeps 8 significant bits of a weight),
the change of one round loses 8 bits of itself only; every worker adds the same average to the
same anchor, so the replicas stay identical. The anchor (a float32 copy of the model after the
last round, outer step included) is checkpointed. Buffers and optimizer state are averaged at
float32 as before (one more all-reduce in the round when there are any). Mixed precision
(``precision``) is a separate choice: it does not change what is sent.

Subclasses (SlowMo, DiLoCo, post-local SGD) reuse :meth:`LocalSGD.sync` and add an outer step.
"""

from __future__ import annotations

import torch

from dataclasses import dataclass

from lsgd.algorithms.base import DRIFT_AGREEMENT_LAG, AlgoConfig, Algorithm, float_buffers, model_tensors
from lsgd.core.typed_config import option

BUFFER_POLICIES = ("reset", "maintain", "average")
#: ``algo.comm_dtype``: the dtype of the parameters' all-reduce (module docstring)
COMM_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Floating-point state tensors of ``optimizer`` (momentum buffers, moments), excluding 'step'."""
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in sorted(optimizer.state.get(p, {}).items()):
                if key != "step" and torch.is_tensor(value) and value.is_floating_point():
                    out.append(value)
    return out


@dataclass
class LocalSGDConfig(AlgoConfig):
    """``algo=local_sgd``'s keys (module docstring)."""

    name: str = "local_sgd"
    local_steps: int = option(8, at_least=1, doc="H: local steps between averagings", symbol="H")
    average_buffers: bool = option(True, doc="average BatchNorm running statistics too")
    buffer_policy: str = option("maintain", choices=BUFFER_POLICIES, doc="the base optimizer's state at a sync",
                                symbol="buffers")
    comm_dtype: str = option("fp32", choices=tuple(COMM_DTYPES), doc="dtype of the parameters' all-reduce "
                             "(bf16 / fp16: the change since the last round)")


class LocalSGD(Algorithm):
    """Local SGD: H local steps, then exact parameter averaging."""

    name = "local_sgd"
    Config = LocalSGDConfig
    label = "local SGD"
    paper = "docs/papers.md#local-sgd"
    defining_keys = ("algo.local_steps",)
    agreement_lag = DRIFT_AGREEMENT_LAG  # workers drift apart for H steps (Algorithm.agreement_lag)
    grad_scaler = "flag"  # workers step on their own gradients (lsgd.training.accel); SlowMo, DiLoCo, post-local SGD inherit it

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        self.local_steps = int(self.config.local_steps)
        self.average_buffers = bool(self.config.average_buffers)
        self.buffer_policy = self.config.buffer_policy
        self.rounds = 0
        self._in_sync = True
        self.comm_dtype = COMM_DTYPES[self.config.comm_dtype]
        self.anchor: list[torch.Tensor] | None = None  # the parameters after the last round (comm_dtype only)

    def setup(self, model, optimizer, ctx=None):
        module = super().setup(model, optimizer, ctx)
        if self.comm_dtype is not None:  # every worker starts from the same initialization
            self.anchor = [p.detach().clone() for p in model.parameters()]
        return module

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
        if self.comm_dtype is None:
            self.comm.average_(tensors)
        else:
            params, rest = tensors[:len(self.anchor)], tensors[len(self.anchor):]
            deltas = [(p - a).to(self.comm_dtype) for p, a in zip(params, self.anchor)]
            self.comm.average_(deltas)
            with torch.no_grad():
                for p, a, d in zip(params, self.anchor, deltas):
                    p.copy_(a + d.to(a.dtype))
            if rest:
                self.comm.average_(rest)
        self.comm.round()
        self.rounds += 1
        if self.buffer_policy == "reset":
            self.optimizer.state.clear()
        self.outer_step()
        if self.anchor is not None:
            with torch.no_grad():
                for a, p in zip(self.anchor, self.model.parameters()):
                    a.copy_(p)
        self._in_sync = True

    def outer_step(self) -> None:
        """Hook after averaging (SlowMo / DiLoCo); plain local SGD does nothing."""

    @property
    def models_in_sync(self) -> bool:
        return self._in_sync and (self.average_buffers or not float_buffers(self.model))

    def state_dict(self) -> dict:
        state = {"rounds": self.rounds, "in_sync": self._in_sync}
        if self.anchor is not None:
            state["anchor"] = [a.clone() for a in self.anchor]
        return state

    def load_state_dict(self, state: dict) -> None:
        self.rounds = state["rounds"]
        self._in_sync = state["in_sync"]
        if self.anchor is not None:
            with torch.no_grad():
                for a, s in zip(self.anchor, state["anchor"]):
                    a.copy_(s)
