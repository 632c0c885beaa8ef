"""``post_local_sgd``: fully synchronous for ``algo.warmup_steps`` steps, then local SGD
(Lin, Stich, Patel, Jaggi 2020, "Don't Use Large Mini-Batches, Use Local SGD"; torch's
PostLocalSGDOptimizer + post_localSGD_hook).

During warm-up gradients are averaged every step (one coalesced all-reduce of the gradients, a
round) and buffers are averaged after the step, so all replicas stay identical. After warm-up,
parameters are averaged every ``algo.local_steps`` steps counted from the end of warm-up.
"""

from __future__ import annotations

from lsgd.algorithms.base import float_buffers
from lsgd.algorithms.averaging.local_sgd import LocalSGD
from lsgd.core.checks import int_at_least


class PostLocalSGD(LocalSGD):
    """Config keys: ``warmup_steps`` (>= 0) plus those of :class:`LocalSGD`."""

    name = "post_local_sgd"

    @classmethod
    def validate_config(cls, algo: dict, world_size: int) -> None:
        super().validate_config(algo, world_size)
        int_at_least(algo, "warmup_steps", 0, "algo.")

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        self.warmup_steps = int(cfg.get("warmup_steps", 0))

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
