"""``dpsgd``: decentralized parallel SGD, Lian, Zhang, Zhang, Hsieh, Zhang and Liu, "Can
Decentralized Algorithms Outperform Centralized Algorithms?", NeurIPS 2017 (docs/papers.md#d-psgd).

Each step every node mixes with its neighbours on ``algo.topology`` (weights ``W``, doubly
stochastic for the undirected graphs) and takes its local optimizer step. Two orders
(``algo.variant``):

* ``awc`` (adapt-with-combine, the paper's Algorithm 1): ``x_i <- x_i + d_i + (sum_j W_ij x_j - x_i)``
  (= ``sum_j W_ij x_j + d_i``) where
  ``d_i`` is the optimizer's step (``-lr g``, or with momentum ``-lr m``) computed at the
  *pre-averaging* model ``x_i``. The exchange of ``x(t)`` is posted as soon as ``x(t)`` exists (after
  step ``t - 1``) and waited for at step ``t``'s optimizer step, so it overlaps step ``t``'s forward
  and backward pass (the clock prices the overlap). Step 0's exchange is blocking.
* ``atc`` (adapt-then-combine): ``x_i <- sum_j W_ij (x_j + d_j)``: the local step first, then a
  blocking exchange of the result.

Every step is one communication round (each node sends its model to each out-neighbour). A
checkpoint saves the exchange in flight (``awc``) as it stands: the snapshot sent, what was received
(the transfer is completed, :meth:`lsgd.comm.handles.Handle.complete_data`) and the exchange's end on the
cluster clock, moving no clock; the next optimizer step waits for it as in an uninterrupted run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lsgd.algorithms.gossip.mixing import Gossip, GossipConfig, Mix, flat_of, load_mix, save_mix, write_flat
from lsgd.core.typed_config import option

VARIANTS = ("awc", "atc")


@dataclass
class DPSGDConfig(GossipConfig):
    """``algo=dpsgd``'s keys: :class:`GossipConfig`'s and the order of step and mixing."""

    name: str = "dpsgd"
    variant: str = option("awc", choices=VARIANTS, doc="awc: mix x(t) while computing the gradient at x(t) "
                          "(overlapped); atc: the local step, then mix (module docstring)")


class DPSGD(Gossip):
    """D-PSGD: every step, mix the model with the neighbours on the topology."""

    name = "dpsgd"
    Config = DPSGDConfig
    label = "D-PSGD"
    paper = "docs/papers.md#d-psgd"
    defining_keys = ("algo.topology",)

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        self.variant = self.config.variant
        self.pending: Mix | None = None        # awc: the exchange of x(t) in flight
        self.mixed: torch.Tensor | None = None  # awc: its correction, from an older checkpoint that waited for it
        self.step = 0

    def optimizer_step(self) -> None:
        tensors = self.mixed_tensors()
        if self.variant == "atc":
            self.optimizer.step()
            write_flat(self.combine(self.post(flat_of(tensors), self.step, async_op=False)), tensors)
        else:
            correction = self._correction(tensors)
            self.optimizer.step()
            write_flat(flat_of(tensors) + correction, tensors)
        self.step += 1

    def _correction(self, tensors) -> torch.Tensor:
        """``sum_j W_ij x_j(t) - x_i(t)`` for this step: the exchange posted after the last step
        (x_i(t) its own snapshot, so the running statistics this step's forward pass added to the
        buffers are kept, as the parameters' optimizer step is)."""
        if self.mixed is not None:
            out, self.mixed = self.mixed, None
            return out
        mix = self.pending or self.post(flat_of(tensors), self.step, async_op=False)  # step 0: blocking
        self.pending = None
        return self.combine(mix) - mix.own

    def after_step(self, step: int) -> None:
        total = self.ctx.total_steps
        if self.variant == "awc" and (total is None or step < total):
            self.pending = self.post(flat_of(self.mixed_tensors()), step)

    def state_dict(self) -> dict:
        return {"step": self.step, "rounds": self.rounds, "mixed": self.mixed, "pending": save_mix(self.pending)}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.rounds, self.mixed = state["step"], state["rounds"], state["mixed"]
        self.pending = load_mix(state.get("pending"), self.comm)
