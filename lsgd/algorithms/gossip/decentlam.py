"""``decentlam``: DecentLaM, Yuan, Chen, Huang, Zhang, Pan, Yin and Xu, "DecentLaM: Decentralized
Momentum SGD for Large-batch Deep Training", ICCV 2021 (docs/papers.md#decentlam).

Each step (``gamma`` = the learning rate in use, per parameter group; ``beta`` = ``algo.momentum``):

    z_i     = x_i - gamma (g_i + wd x_i)             the local half step (sent to the neighbours)
    g_hat_i = (x_i - sum_j W_ij z_j) / gamma          the decentralized "gradient"
    m_i    <- beta m_i + g_hat_i
    x_i    <- x_i - gamma m_i

computed as ``x_i <- sum_j W_ij z_j - gamma beta m_i(old)``, which is the same and needs no division
(``m`` is updated only when ``gamma > 0``). ``beta = 0`` is adapt-then-combine D-PSGD with plain SGD.
DecentLaM takes over the optimizer's momentum and weight decay: it needs ``optim=sgd`` with
``optim.momentum=0`` and ``optim.nesterov=false`` (checked before any worker starts). The exchange is
blocking; one round per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lsgd.algorithms.gossip.mixing import Gossip, GossipConfig, flat_of, write_flat
from lsgd.core.errors import ConfigError
from lsgd.core.typed_config import option


@dataclass
class DecentLaMConfig(GossipConfig):
    """``algo=decentlam``'s keys: :class:`GossipConfig`'s and the momentum it applies itself."""

    name: str = "decentlam"
    momentum: float = option(0.9, at_least=0, below=1, doc="beta: the decentralized momentum "
                             "(0: adapt-then-combine D-PSGD)")
    average_buffers: bool = option(True, doc="BatchNorm buffers mixed with the half steps (false: kept local)")


class DecentLaM(Gossip):
    """DecentLaM: decentralized momentum SGD without the momentum-induced bias."""

    name = "decentlam"
    Config = DecentLaMConfig
    label = "DecentLaM"
    paper = "docs/papers.md#decentlam"
    defining_keys = ("algo.topology",)
    requires = {"optim": "sgd", "optim.momentum": 0.0, "optim.nesterov": False}  # it applies its own momentum

    @classmethod
    def validate_run(cls, cfg: dict, world_size: int) -> None:
        optim = cfg.get("optim", {})
        if optim.get("name") != cls.requires["optim"] or optim.get("momentum", 0) or optim.get("nesterov", False):
            raise ConfigError(
                "algo=decentlam applies its own momentum (algo.momentum) and needs optim=sgd with optim.momentum=0 "
                f"and optim.nesterov=false; got optim.name={optim.get('name')!r}, optim.momentum={optim.get('momentum')!r}, "
                f"optim.nesterov={optim.get('nesterov')!r}")

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        self.beta = float(self.config.momentum)
        self.momentum: torch.Tensor | None = None  # m, flat over the parameters
        self.step = 0

    def optimizer_step(self) -> None:
        params, lrs, wds = [], [], []
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                params.append(p)
                lrs.append(float(group["lr"]))
                wds.append(float(group.get("weight_decay", 0.0)))
        x = flat_of([p.data for p in params])
        grads = flat_of([p.grad if p.grad is not None else torch.zeros_like(p) for p in params])
        gamma = torch.cat([torch.full((p.numel(),), lr, dtype=x.dtype, device=x.device) for p, lr in zip(params, lrs)])
        wd = torch.cat([torch.full((p.numel(),), w, dtype=x.dtype, device=x.device) for p, w in zip(params, wds)])
        z = x - gamma * (grads + wd * x)
        buffers = self.mixed_tensors()[len(params):]
        message = torch.cat([z, flat_of(buffers)]) if buffers else z
        mixed = self.combine(self.post(message, self.step, async_op=False))
        z_bar = mixed[: x.numel()]
        if self.momentum is None:
            self.momentum = torch.zeros_like(x)
        new_x = z_bar - gamma * self.beta * self.momentum
        positive = gamma > 0
        g_hat = torch.where(positive, (x - z_bar) / torch.where(positive, gamma, torch.ones_like(gamma)), 0.0)
        self.momentum = torch.where(positive, self.beta * self.momentum + g_hat, self.momentum)
        write_flat(new_x, [p.data for p in params])
        if buffers:
            write_flat(mixed[x.numel():], buffers)
        self.step += 1

    def state_dict(self) -> dict:
        return {"step": self.step, "rounds": self.rounds, "momentum": self.momentum}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.rounds, self.momentum = state["step"], state["rounds"], state["momentum"]
