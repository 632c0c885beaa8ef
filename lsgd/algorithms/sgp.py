"""``sgp``: Stochastic Gradient Push, Assran, Loizou, Ballas and Rabbat, "Stochastic Gradient Push
for Distributed Deep Learning", ICML 2019 (papers.md section 3).

Push-sum over a directed graph. Node ``i`` keeps a numerator ``x_i`` and a weight ``w_i`` (initially
1) and computes its gradients at the de-biased model ``z_i = x_i / w_i`` (what the model's
parameters hold between steps). Each step:

    x_i <- x_i + d_i                 d_i: the optimizer's step computed at z_i (-lr g, or -lr m)
    send (p_i x_i, p_i w_i) to each out-neighbour, p_i = 1 / (out-degree_i + 1), keep the same share
    x_i <- sum of the received and kept shares; w_i likewise;  z_i = x_i / w_i

The mixing is column stochastic, so ``sum_i x_i`` and ``sum_i w_i = n`` are kept (push-sum's mass
conservation) on any directed graph; on a strongly connected graph the de-biased models reach the
network mean. The default topology is the paper's directed exponential graph with one peer per
iteration, rotating: ``one_peer_exponential`` (peer ``i + 2^(t mod log2 n)``, ``p = 1/2``).
``algo.weights`` is not used (the out-degree fixes the shares). The exchange is blocking (the
paper's overlap variant, 1-OSGP, is not built yet); one round per step. BatchNorm buffers, with
``algo.average_buffers``, are push-summed with the parameters.
"""

from __future__ import annotations

import torch

from lsgd.algorithms.gossip import Gossip, flat_of, write_flat


class SGP(Gossip):
    """SGP. Config keys: ``topology``, ``average_buffers``, ``seed``."""

    name = "sgp"

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        self.weight = 1.0   # w_i, the push-sum weight
        self.step = 0

    def optimizer_step(self) -> None:
        tensors = self.mixed_tensors()
        z = flat_of(tensors)
        self.optimizer.step()
        d = flat_of(tensors) - z
        x = z.double() * self.weight + d.double()  # the numerator after the local step
        outs = self.topology.out_neighbors(self.node, self.step)
        share = 1.0 / (len(outs) + 1)
        message = torch.cat([x * share, torch.tensor([self.weight * share], dtype=torch.float64, device=x.device)])
        mix = self.post(message.to(z.dtype), self.step, async_op=False)
        kept = mix.own.double()  # the share kept, rounded as the sent ones are
        total, weight = kept[:-1], float(kept[-1])
        for received in mix.recvs.values():
            total += received[:-1].double()
            weight += float(received[-1])
        self.weight = weight
        write_flat(total / weight, tensors)
        self.step += 1

    def metrics(self) -> dict:
        return {"push_sum_weight": self.weight}

    def state_dict(self) -> dict:
        return {"step": self.step, "rounds": self.rounds, "weight": self.weight}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.rounds, self.weight = state["step"], state["rounds"], state["weight"]
