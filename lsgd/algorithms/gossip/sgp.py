"""``sgp``: Stochastic Gradient Push, Assran, Loizou, Ballas and Rabbat, "Stochastic Gradient Push
for Distributed Deep Learning", ICML 2019 (docs/papers.md#sgp), and its overlap variant.

Push-sum over a directed graph. Node ``i`` keeps a numerator ``x_i`` and a weight ``w_i`` (initially
1) and computes its gradients at the de-biased model ``z_i = x_i / w_i`` (what the model's
parameters hold between steps). Step ``k`` (``p_i = 1 / (out-degree_i + 1)`` on round ``k``'s graph):

    x_i <- x_i + d_i                 d_i: the optimizer's step computed at z_i (-lr g, or -lr m)
    send (p_i x_i, p_i w_i) to each out-neighbour, keep the same share
    x_i <- kept share + the shares received;  w_i likewise;  z_i = x_i / w_i

The mixing is column stochastic, so ``sum_i x_i`` and ``sum_i w_i = n`` are kept (push-sum's mass
conservation) on any directed graph; on a strongly connected graph the de-biased models reach the
network mean. The default topology is the paper's directed exponential graph with one peer per
iteration, rotating: ``one_peer_exponential`` (peer ``i + 2^(t mod log2 n)``, ``p = 1/2``).
``algo.weights`` is not used (the out-degree fixes the shares). One round per step. BatchNorm
buffers, with ``algo.average_buffers``, are push-summed with the parameters.

``algo.overlap`` picks how the shares travel:

* ``false`` (SGP, the paper's synchronous algorithm): a blocking exchange; the shares sent at step
  ``k`` are added at step ``k``.
* ``true`` (Overlap SGP, "OSGP", with at most ``tau = 1`` iteration of staleness: the paper's
  1-OSGP): the shares sent at step ``k`` are added at step ``k + 1``. Step ``k`` computes
  ``x_i^{k+1/2} = x_i^k + d_i``, posts the non-blocking send of ``(p_i x_i^{k+1/2}, p_i w_i^k)``, keeps
  ``x_i^{k+1} = p_i x_i^{k+1/2}``, ``w_i^{k+1} = p_i w_i^k`` and adds what its in-neighbours sent at
  step ``k - 1`` (waited for here, after step ``k``'s forward and backward pass: the exchange
  overlaps one step's compute on the cluster clock). Nothing is lost: at every step ``sum_i w_i``
  plus the weight in flight is ``n``, and the numerators likewise keep the network sum. The last
  step of a run waits for its own shares at once (nothing follows to hide them), so a run ends with
  every message delivered and ``sum_i w_i = n``. The de-biased models mix with a one-step delay
  and still reach the network mean on a strongly connected graph. Between steps (evaluation) each
  node's model is its own ``z_i``, without the shares in flight.
  The weight bookkeeping follows the authors' code (facebookresearch/stochastic_gradient_push,
  ``gossip/distributed.py``, ``GossipDataParallel(overlap=True)``: ``transfer_params`` scales the
  kept numerator and weight by ``p_i`` as the message leaves, ``_query_gossip_queue`` adds the
  received numerators and weights at the next iteration, before the next de-biasing). That code
  sends in the forward pre-hook, before the local step, and adds the step to the numerator after;
  here the share sent includes the step just taken (``x^{k+1/2}``). Both keep every message at
  most one iteration old and conserve the mass. The paper's own text (its Algorithm 2) was not
  available where this was written: the order of its lines is not checked here.

Checkpoints (``overlap``): :meth:`SGP.state_dict` saves the exchange in flight as it stands: the
shares received (the transfer is completed, :meth:`lsgd.comm.handles.Handle.complete_data`) and the
exchange's end on the cluster clock, moving no clock; the next step waits for it and adds the shares
as it would have, so an uninterrupted run, one with checkpoints and a resumed one take the same
steps with the same numbers at the same modeled times.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lsgd.algorithms.gossip.mixing import Gossip, GossipConfig, Mix, flat_of, load_mix, save_mix, write_flat
from lsgd.comm.topology import TOPOLOGIES, WEIGHTS
from lsgd.core.typed_config import option


@dataclass
class SGPConfig(GossipConfig):
    """``algo=sgp``'s keys: :class:`GossipConfig`'s and the overlap."""

    name: str = "sgp"
    topology: str = option("one_peer_exponential", choices=TOPOLOGIES, doc="G: the paper's rotating directed "
                           "exponential graph (one peer per step); any topology works", symbol="")
    weights: str = option("uniform", choices=WEIGHTS, doc="unused: the out-degree fixes the push-sum shares "
                          "1/(out-degree+1)")
    average_buffers: bool = option(True, doc="BatchNorm buffers push-summed with the parameters (false: kept local)")
    overlap: bool = option(False, doc="true: Overlap SGP, the shares sent at step k are added at step k + 1 "
                           "(the exchange overlaps a step's compute)")


class SGP(Gossip):
    """SGP: push-sum gossip on a directed graph, gradients at the de-biased model."""

    name = "sgp"
    Config = SGPConfig
    label = "SGP"
    paper = "docs/papers.md#sgp"
    defining_keys = ("algo.topology",)

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        self.overlap = bool(self.config.overlap)
        self.weight = 1.0   # w_i, the push-sum weight
        self.step = 0
        self.pending: Mix | None = None                       # overlap: the shares sent last step, in flight
        self.arrived: tuple[torch.Tensor, float] | None = None  # overlap: their sum, from an older checkpoint

    def optimizer_step(self) -> None:
        tensors = self.mixed_tensors()
        z = flat_of(tensors)
        self.optimizer.step()
        d = flat_of(tensors) - z
        x = z.double() * self.weight + d.double()  # the numerator after the local step
        outs = self.topology.out_neighbors(self.node, self.step)
        share = 1.0 / (len(outs) + 1)
        message = torch.cat([x * share, torch.tensor([self.weight * share], dtype=torch.float64, device=x.device)])
        message = message.to(z.dtype)
        total = message.double()  # the share kept, rounded as the sent ones are
        if self.overlap:
            total += self._arrived(like=message)  # the shares sent to this node at step k - 1
            mix = self.post(message, self.step, async_op=True)
            last = self.ctx.total_steps is not None and self.step + 1 >= self.ctx.total_steps
            if last:  # nothing follows to overlap: deliver this step's shares now (module docstring)
                total += self._received(mix)
            else:
                self.pending = mix
        else:
            self._received(self.post(message, self.step, async_op=False), into=total)
        self.weight = float(total[-1])
        write_flat(total[:-1] / self.weight, tensors)
        self.step += 1

    def _received(self, mix: Mix, into: torch.Tensor | None = None) -> torch.Tensor:
        """Wait for ``mix`` and add the shares received to ``into`` (default: zeros; float64,
        weight last), in order; returns it."""
        if mix.handle is not None:
            mix.handle.wait()
        out = into if into is not None else torch.zeros(mix.own.numel(), dtype=torch.float64, device=mix.own.device)
        for received in mix.recvs.values():
            out += received.double()
        return out

    def _arrived(self, like: torch.Tensor) -> torch.Tensor:
        """The sum of the shares sent to this node at the previous step (zero at the first)."""
        if self.arrived is not None:
            (numerators, weight), self.arrived = self.arrived, None
            return torch.cat([numerators.to(like.device), torch.tensor([weight], dtype=torch.float64, device=like.device)])
        if self.pending is None:
            return torch.zeros(like.numel(), dtype=torch.float64, device=like.device)
        mix, self.pending = self.pending, None
        return self._received(mix)

    def metrics(self) -> dict:
        return {"push_sum_weight": self.weight}

    def state_dict(self) -> dict:
        arrived = None if self.arrived is None else {"numerators": self.arrived[0], "weight": self.arrived[1]}
        return {"step": self.step, "rounds": self.rounds, "weight": self.weight, "arrived": arrived,
                "pending": save_mix(self.pending)}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.rounds, self.weight = state["step"], state["rounds"], state["weight"]
        arrived = state.get("arrived")  # absent in checkpoints written before algo.overlap
        self.arrived = None if arrived is None else (arrived["numerators"], float(arrived["weight"]))
        self.pending = load_mix(state.get("pending"), self.comm)
