"""``param_server``: the classic synchronous parameter server (a baseline, and the proof of roles).

Rank 0 is the server, ranks 1..N the workers (``launcher.nproc_per_node`` = N + 1; data shards go
to the N workers, so ``param_server`` with N + 1 processes trains like ``ddp`` with N). Every step:

1. each worker computes its gradient g_i on its batch and sends it to the server (one message of
   the model's size n; worker 0 also sends its floating buffers, BatchNorm's running statistics,
   as DDP broadcasts rank 0's);
2. the server averages g = sum_i g_i / N (in worker order), takes the optimizer step with the
   scheduled learning rate, and sends the parameters (and those buffers) back to every worker;
3. the workers take no optimizer step of their own: they load what the server sent.

So every replica equals the server's model after each step (``models_in_sync``) and the run
equals DDP's minibatch SGD up to the summation order of the gradient average.

Bytes (``comm_bytes``, all ``p2p``): a worker sends n (+ b for worker 0) per step; the server sends
N (n + b) per step, n = parameter bytes, b = floating-buffer bytes. Clock: messages follow the
point-to-point rules of :mod:`lsgd.clock.worker_clock`, with ports (LogGP): the N gradients serialize on the
server's ingress (the incast of N messages of cost c = alpha + n beta ends N c after they start,
taken in order of their senders' start, then worker rank) and the N models on its egress (worker
``j`` of ``1..N`` has its model ``j c`` after the server starts sending), so a step costs more as N
grows, as on one server NIC.

Source: Li et al., "Scaling Distributed Machine Learning with the Parameter Server", OSDI 2014
(synchronous mode); torchft's ``ParameterServer`` for the pattern of a server rank.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from lsgd.algorithms.base import AlgoConfig, ServerAlgorithm, float_buffers
from lsgd.comm.collectives import copy_back

SERVER = 0


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors]) if tensors else torch.zeros(0)


@dataclass
class ParameterServerConfig(AlgoConfig):
    """``algo=param_server``'s keys: none beyond ``name``."""

    name: str = "param_server"


class ParameterServer(ServerAlgorithm):
    """Synchronous parameter server: workers push gradients, the server steps and pushes the model.

    Raises:
        ConfigError: fewer than 2 processes (one server and at least one worker).
    """

    name = "param_server"
    Config = ParameterServerConfig
    label = "parameter server"
    paper = "docs/papers.md#parameter-server"

    def setup(self, model, optimizer, ctx=None):
        model = super().setup(model, optimizer, ctx)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.buffers = float_buffers(model)
        dtypes = {t.dtype for t in self.params + self.buffers}
        if len(dtypes) > 1:
            raise ValueError(f"param_server moves one flat buffer per message: all parameters and buffers must share a dtype, got {dtypes}")
        self.workers = [r for r in range(self.comm.world_size) if r != SERVER]
        self.is_server = self.comm.rank == SERVER
        # integer buffers (BatchNorm's num_batches_tracked) count training forward passes, the
        # same on every worker; the server, which runs none, mirrors them (+1 per step)
        self.counters = [b for name, b in model.named_buffers() if name.endswith("num_batches_tracked")]
        if not self.is_server:
            # workers step the schedule but never their optimizer: torch's ordering warning is moot
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step()` before `optimizer.step()`")
        return model

    def _grad_flat(self) -> torch.Tensor:
        return _flat([p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params])

    @torch.no_grad()
    def after_backward(self, step: int) -> None:
        """Worker: push the gradient (worker 0: and its buffers), then load the server's model."""
        first = self.comm.rank == self.workers[0]
        send = _flat([self._grad_flat()] + (self.buffers if first else []))
        self.comm.sendrecv(send, None, SERVER)
        model = torch.empty(sum(t.numel() for t in self.params + self.buffers), dtype=send.dtype, device=send.device)
        self.comm.sendrecv(None, model, SERVER)
        copy_back(model, self.params + self.buffers)

    def optimizer_step(self) -> None:
        """Workers take no step of their own (the server did)."""

    def after_step(self, step: int) -> None:
        self.comm.round()

    @torch.no_grad()
    def serve_step(self, step: int) -> None:
        """Server: gather the N gradients, average in worker order, step, push the model back."""
        n_params = sum(p.numel() for p in self.params)
        n_buffers = sum(b.numel() for b in self.buffers)
        like = self.params[0]
        recvs = {w: torch.empty(n_params + (n_buffers if w == self.workers[0] else 0), dtype=like.dtype, device=like.device)
                 for w in self.workers}
        self.comm.exchange(recvs=recvs)
        n = len(self.workers)
        grad = torch.zeros(n_params, dtype=like.dtype, device=like.device)
        for w in self.workers:  # DDP's allreduce_hook divides by the world size, then sums
            grad += recvs[w][:n_params] / n
        offset = 0
        for p in self.params:
            p.grad = grad[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        self.optimizer.step()
        copy_back(recvs[self.workers[0]][n_params:], self.buffers)
        for counter in self.counters:
            counter.add_(1)
        model = _flat(self.params + self.buffers)
        self.comm.exchange(sends={w: model for w in self.workers})
        self.comm.round()

    @property
    def models_in_sync(self) -> bool:
        return True
