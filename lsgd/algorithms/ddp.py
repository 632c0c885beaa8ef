"""``ddp``: fully synchronous minibatch SGD through torch's DistributedDataParallel.

Gradients are all-reduced every step in DDP's buckets (``algo.bucket_cap_mb``, overlapped with
backward) by torch's own ``allreduce_hook`` (gradients divided by the world size, then summed);
this module only wraps the hook to count each bucket's payload (``bucket.buffer()`` bytes) and
its time in flight. One step = one round.

Buffers (BatchNorm running statistics) follow DDP's ``broadcast_buffers`` semantics: they are
broadcast from rank 0 after every step (before the next forward), through the communicator so they
are counted. DDP's own broadcast is disabled (``forward_sync_buffers=False``) to avoid doing it twice.

Timing: a bucket's in-flight time goes to ``comm_time_s`` but is not subtracted from the step's
``compute_time_s`` (it overlaps backward); the modeled time adds the alpha-beta cost of every bucket
on top of the measured compute, i.e. it assumes no overlap (a conservative model).
"""

from __future__ import annotations

import inspect
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from lsgd.algorithms.base import Algorithm


class DDP(Algorithm):
    """Minibatch SGD with bucketed, overlapped gradient all-reduce (the baseline)."""

    name = "ddp"

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> nn.Module:
        super().setup(model, optimizer)
        if not dist.is_initialized():
            return model
        device_ids = [model_device.index] if (model_device := next(model.parameters()).device).type == "cuda" else None
        # DDP's own per-forward buffer broadcast is off (we broadcast through the communicator);
        # newer torch names the switch forward_sync_buffers, older torch broadcast_buffers.
        no_buffer_sync = (
            {"forward_sync_buffers": False}
            if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
            else {"broadcast_buffers": False}
        )
        self.ddp = DistributedDataParallel(
            model, device_ids=device_ids, bucket_cap_mb=float(self.cfg.get("bucket_cap_mb", 25)), **no_buffer_sync
        )
        self.register_hook(self.ddp)
        return self.ddp

    def register_hook(self, ddp: DistributedDataParallel) -> None:
        """Register the DDP comm hook (subclasses replace it: compression, PowerSGD)."""
        ddp.register_comm_hook(None, self._counting_allreduce_hook)

    def _counting_allreduce_hook(self, state, bucket):
        nbytes = bucket.buffer().numel() * bucket.buffer().element_size()
        t0 = time.perf_counter()
        fut = allreduce_hook(self.comm.group, bucket)

        def _done(f):
            self.comm.record("all_reduce", nbytes, time.perf_counter() - t0, overlapped=True)
            return f.value()

        return fut.then(_done)

    def after_step(self, step: int) -> None:
        self.comm.round()
        self.broadcast_buffers()

    @property
    def models_in_sync(self) -> bool:
        return True
