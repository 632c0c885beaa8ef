"""``post_local_sgd``: fully synchronous for ``algo.warmup_steps`` steps, then local SGD
(Lin, Stich, Patel, Jaggi 2020, "Don't Use Large Mini-Batches, Use Local SGD"; torch's
PostLocalSGDOptimizer + post_localSGD_hook).

During warm-up gradients are averaged every step (one coalesced all-reduce of the gradients, a
round) and buffers are averaged after the step, so all replicas stay identical. After warm-up,
parameters are averaged every ``algo.local_steps`` steps counted from the end of warm-up.
"""

from __future__ import annotations

from dataclasses import dataclass

from lsgd.algorithms.averaging.local_sgd import LocalSGD, LocalSGDConfig
from lsgd.algorithms.base import float_buffers
from lsgd.core.typed_config import option


@dataclass
class PostLocalSGDConfig(LocalSGDConfig):
    """``algo=post_local_sgd``'s keys: :class:`LocalSGDConfig`'s and the warm-up."""

    name: str = "post_local_sgd"
    warmup_steps: int = option(200, at_least=0, doc="fully synchronous steps before local SGD starts",
                               symbol="warm-up steps")


class PostLocalSGD(LocalSGD):
    """Post-local SGD: fully synchronous steps, then local SGD."""

    name = "post_local_sgd"
    Config = PostLocalSGDConfig
    label = "post-local SGD"
    paper = "docs/papers.md#post-local-sgd"

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        self.warmup_steps = int(self.config.warmup_steps)

    def after_backward(self, step: int) -> None:
        if step < self.warmup_steps:
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            self.comm.average_(grads)

    def is_sync_step(self, step: int) -> bool:
        return step > self.warmup_steps and (step - self.warmup_steps) % self.local_steps == 0

    def after_step(self, step: int) -> None:
        if step <= self.warmup_steps:
            self.comm.round()
            buffers = float_buffers(self.model)
            if buffers:
                self.comm.average_(buffers)
            self._in_sync = True
            return
        super().after_step(step)
