"""``overlap_local_sgd``: Overlap-Local-SGD, Wang, Liang and Joshi, "Overlap Local-SGD: An
Algorithmic Approach to Hide Communication Delays in Distributed SGD", ICASSP 2020 (docs/papers.md#overlap-local-sgd; the authors' code, JYWa/Overlap_Local_SGD, ``OverlapLocalSGD.average``).

Workers take local (momentum) SGD steps. Besides its model ``x`` each keeps an *anchor* ``z``
(initially the shared initial model) whose all-reduce runs in the background. Every
``algo.local_steps`` (tau) steps:

    wait for the anchor's all-reduce started at the previous sync      (z = its mean)
    x <- (1 - a) x + a z                                               a = ``algo.pull``
    v <- gmf v + (z - x) / lr      (the first time: v = (z - x) / lr)   gmf = ``algo.anchor_momentum``
    z <- z - lr v
    start the all-reduce (mean) of z; it overlaps the next tau local steps

``lr`` is the learning rate the round's last local step used (per parameter group, read before the
schedule steps, as SlowMo's gamma); a round at ``lr = 0`` leaves ``v`` and ``z`` as they are. The
sync at the run's last step starts no all-reduce (nothing would use it). One round per sync. The
clock shows the overlap: an all-reduce costing less than tau steps of compute is hidden entirely.
A checkpoint saves the all-reduce in flight without waiting for it on the clock: its result (the
transfer is completed, :meth:`lsgd.comm.handles.Handle.complete_data`) and its end on the cluster clock;
the resumed run waits for it at the next sync, as the uninterrupted run does, so both take the same
steps at the same modeled times. BatchNorm buffers are not pulled (each worker keeps its own).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lsgd.algorithms.base import DRIFT_AGREEMENT_LAG, AlgoConfig, Algorithm
from lsgd.algorithms.gossip.mixing import flat_of, write_flat
from lsgd.core.typed_config import option


@dataclass
class OverlapLocalSGDConfig(AlgoConfig):
    """``algo=overlap_local_sgd``'s keys (module docstring)."""

    name: str = "overlap_local_sgd"
    local_steps: int = option(2, at_least=1, doc="tau: local steps between pulls", symbol="H")
    pull: float = option(0.6, above=0, at_most=1, doc="a: x <- (1 - a) x + a z")
    anchor_momentum: float = option(0.7, at_least=0, at_most=1, doc="gmf: the anchor's momentum")


class OverlapLocalSGD(Algorithm):
    """Overlap-Local-SGD: local steps, pulled every tau steps towards an anchor averaged in the background."""

    name = "overlap_local_sgd"
    Config = OverlapLocalSGDConfig
    label = "Overlap-Local-SGD"
    paper = "docs/papers.md#overlap-local-sgd"
    defining_keys = ("algo.local_steps",)
    agreement_lag = DRIFT_AGREEMENT_LAG  # workers drift apart for tau steps (Algorithm.agreement_lag)

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        self.tau = int(self.config.local_steps)
        self.pull = float(self.config.pull)
        self.gmf = float(self.config.anchor_momentum)
        self.anchor: torch.Tensor | None = None    # z (flat parameters); the all-reduce runs on it in place
        self.velocity: torch.Tensor | None = None  # v
        self.handle = None                         # the anchor's all-reduce in flight
        self.round_lr: torch.Tensor | None = None  # per element: the learning rate of the round's last step
        self.rounds = 0

    def _params(self) -> list[torch.Tensor]:
        return [p.data for p in self.model.parameters()]

    def setup(self, model, optimizer, ctx=None):
        out = super().setup(model, optimizer, ctx)
        self.anchor = flat_of(self._params()).clone()
        return out

    def optimizer_step(self) -> None:
        by_param = {p: float(g["lr"]) for g in self.optimizer.param_groups for p in g["params"]}
        x = self.anchor
        self.round_lr = torch.cat([torch.full((p.numel(),), by_param.get(p, 0.0), dtype=x.dtype, device=x.device)
                                   for p in self.model.parameters()])
        self.optimizer.step()

    def after_step(self, step: int) -> None:
        if step % self.tau:
            return
        self._wait()
        params = self._params()
        x = (1 - self.pull) * flat_of(params) + self.pull * self.anchor
        write_flat(x, params)
        lr = self.round_lr
        moving = lr > 0
        safe = torch.where(moving, lr, torch.ones_like(lr))
        pulled = (self.anchor - x) / safe
        if self.velocity is None:
            self.velocity = torch.where(moving, pulled, torch.zeros_like(pulled))
        else:
            self.velocity = torch.where(moving, self.gmf * self.velocity + pulled, self.velocity)
        self.anchor = self.anchor - lr * self.velocity
        self.comm.round()
        self.rounds += 1
        total = self.ctx.total_steps
        if total is None or step < total:
            self.handle = self.comm.average_([self.anchor], async_op=True)

    def _wait(self) -> None:
        if self.handle is not None:
            self.handle.wait()
            self.handle = None

    @property
    def models_in_sync(self) -> bool:
        return False

    def state_dict(self) -> dict:
        in_flight = None
        if self.handle is not None:  # the all-reduce in flight: its result and its end (module docstring)
            self.handle.complete_data()  # the anchor holds the mean; the clock waits at the next sync
            in_flight = self.handle.state_dict()
        return {"anchor": self.anchor.clone(), "velocity": self.velocity, "rounds": self.rounds, "in_flight": in_flight}

    def load_state_dict(self, state: dict) -> None:
        self.anchor, self.velocity, self.rounds = state["anchor"], state["velocity"], state["rounds"]
        in_flight = state.get("in_flight")  # absent in checkpoints that waited for it
        self.handle = self.comm.resumed(in_flight) if in_flight is not None else None
