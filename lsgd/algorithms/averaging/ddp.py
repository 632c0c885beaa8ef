"""``ddp``: fully synchronous minibatch SGD through torch's DistributedDataParallel.

Gradients are all-reduced every step in DDP's buckets (``algo.bucket_cap_mb``, overlapped with
backward) as torch's own ``allreduce_hook`` does (gradients divided by the world size, then summed);
this module only wraps the hook to count each bucket's payload (``bucket.buffer()`` bytes) and
its time in flight. One step = one round.

The cluster clock's settlement of a step (every rank's issue times, port free times and the stop
code: :meth:`lsgd.comm.communicator.Communicator.settle`) needs an exchange, uncounted (it is the simulation's,
not the method's). With ``algo.carry_settlement=true`` (default false) it sends no message of its own: it
rides in the next step's bucket 0, appended to the gradients' SUM all-reduce as a one-hot block
(rank r's values as the 16-bit pieces of their float64 bit patterns in a float32 bucket, in slot
r, zeros elsewhere: the SUM is the all-gather, exactly;
:class:`lsgd.comm.settlement.CarriedSettlement`), and applies at the next clock read, after that step's
backward (DDP has waited for its buckets). Where the clock is read before a bucket took it (records,
evaluation, checkpoints, :meth:`lsgd.comm.communicator.Communicator.quiesce`, the same step on every rank: DDP is
in lockstep) the all-gather is made there. Both paths give the same values
(tests/distributed/test_carried_settlement.py against ``carry_settlement=false``). Why it is off by
default: the carrier is bucket 0 plus the block, and gloo's ring all-reduce cuts a buffer into
chunks by its length, so on 3 or more ranks the gradient elements near the moved chunk boundaries
are summed in another order (on 2 ranks a + b = b + a: the same bits). The gradients then differ in
their last bits from torch's DDP, and from the same run with ``log_every`` changed (a record flushes
the settlement, so that step's bucket 0 goes without the block): the demo's 4-worker DDP ends at
test accuracy 0.8995 with it against 0.8984 without. The modeled values are the same either way. Compression hooks (:mod:`lsgd.algorithms.gradient_compression.compressed`,
PowerSGD) keep the settlement's own exchange. On this 2-core host the per-step gloo all-gather cost
~0.4-0.5 ms of CPU per rank (4 gloo ranks), about 4% of the demo CNN's DDP step; where the ranks
share a host the exchange goes through the shared-memory board instead (:mod:`lsgd.comm.shared_memory`: no
message, the same values), which is why the carrier stays off by default.

Buffers (BatchNorm running statistics) follow DDP's ``broadcast_buffers`` semantics: they are
broadcast from rank 0 after every step's backward (before the next forward), through the
communicator so they are counted. DDP's own broadcast is disabled (``forward_sync_buffers=False``) to avoid doing it twice.

Timing: a bucket's in-flight time goes to ``comm_time_s`` but is not subtracted from the step's
measured ``compute_time_s`` (it overlaps backward). On the cluster clock (:mod:`lsgd.clock.worker_clock`) each
bucket is an asynchronous all-reduce issued when DDP launches it: once its last gradient is
computed, at the fraction of backward's FLOPs done by then (counted per parameter on the first
batch, :meth:`lsgd.compute.model.ComputeModel.count_grad_ready`: the demo CNN's fc layers, 94% of its
parameters, are final after 7% of its backward; by parameter share they would wait for 94%), and
never before the bucket of lower index (DDP
launches buckets in index order; its first iteration's buckets follow parameter order, so
nothing overlaps until DDP rebuilds them in arrival order). The all-reduces run one after another
and the step waits for the last one, so only the communication that outlasts backward is exposed:
``step = forward + max(backward, last bucket's end)``.

Measured compute (``cluster.compute=measured``, ``compute_time_s``): the buckets' all-reduces run
on gloo's threads while backward continues (overlap, not blocking); once autograd's graph is done,
DDP's finalize waits inside ``loss.backward()`` for the buckets still in flight. That wait is
communication (:class:`BackwardWait`: from autograd's final callback to the last bucket's
completion, :meth:`lsgd.comm.communicator.Communicator.add_blocked`), so the measured backward keeps only the
compute.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dataclasses import dataclass

from lsgd.algorithms.base import AlgoConfig, Algorithm
from lsgd.comm.settlement import chunk_type
from lsgd.core.typed_config import option


def ready_fractions(model: nn.Module, by_flops: Mapping[str, float] | None) -> dict[int, float]:
    """``{id(parameter): fraction of backward done when its gradient is final}``: from the FLOP
    count ``by_flops`` (names as ``model.named_parameters()``) where given; else (hand-driven hooks
    with no count) by parameter share, backward producing gradients in reverse parameter order
    (parameter j's once the gradients of parameters j, j+1, ... are computed). Parameters that get no
    gradient are ready at the end (1.0)."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if by_flops is not None:
        return {id(p): float(by_flops.get(n, 1.0)) for n, p in params}
    total, done, out = max(sum(p.numel() for _, p in params), 1), 0, {}
    for _, p in reversed(params):
        done += p.numel()
        out[id(p)] = done / total
    return out


class BackwardWait:
    """Times how long the end of backward waits for DDP's buckets (DDP's ``finalize_backward``
    waits on every bucket's future inside ``loss.backward()``) and adds it to the communicator's
    blocked time (:meth:`lsgd.comm.communicator.Communicator.add_blocked`).

    :meth:`begin` (from the comm hook of bucket 0, the first DDP launches in a backward) queues an
    autograd final callback: it runs when the graph's last node is done, before DDP's own (DDP
    queues its finalize once the last bucket is launched, after the hook that queued this one).
    :meth:`done` (from each bucket's future callback, on whichever thread completes it) adds the
    time from that graph end, or from the previous completion after it, to this one: in all,
    ``max(0, last completion - graph end)`` seconds. A bucket that completes while the graph is
    still running adds nothing (overlap). Outside a backward pass (a hook driven by hand) nothing is
    timed.
    """

    def __init__(self, comm):
        self.comm = comm
        self._lock = threading.Lock()
        self._counted_to: float | None = None  # graph end, then the last completion counted after it

    def begin(self, bucket) -> None:
        """Called by the comm hook of every bucket; acts on bucket 0 (a new backward pass)."""
        if bucket.index() != 0:
            return
        with self._lock:
            self._counted_to = None
        try:
            torch.autograd.Variable._execution_engine.queue_callback(self._graph_done)
        except RuntimeError:  # not inside a backward pass
            pass

    def _graph_done(self) -> None:
        now = time.perf_counter()
        with self._lock:
            self._counted_to = now

    def done(self) -> None:
        """A bucket's communication completed (any thread)."""
        now = time.perf_counter()
        with self._lock:
            if self._counted_to is None or now <= self._counted_to:
                return
            waited, self._counted_to = now - self._counted_to, now
        self.comm.add_blocked(waited)


@dataclass
class DDPConfig(AlgoConfig):
    """``algo=ddp``'s keys."""

    name: str = "ddp"
    bucket_cap_mb: float = option(25, above=0, doc="DDP's gradient bucket size, MiB")
    carry_settlement: bool = option(
        False, doc="true: the clock's per-step settlement travels in the next step's first gradient bucket (no "
        "message of its own; the same modeled values, but the longer bucket moves gloo's ring chunk boundaries, so "
        "on 3+ ranks the gradients are summed in another order: other last bits, another trajectory); false: its "
        "own uncounted all-gather after backward, gradients summed as torch's DDP does")


class DDP(Algorithm):
    """Minibatch SGD with bucketed, overlapped gradient all-reduce (the baseline)."""

    name = "ddp"
    Config = DDPConfig
    label = "DDP"
    paper = "docs/papers.md#minibatch-sgd-ddp"
    grad_scaler = "synchronized"  # DDP all-reduces the (scaled) gradients inside backward
    #: the clock settlement travels in the next step's bucket 0 (plain ``ddp``'s hook only:
    #: :meth:`register_hook` sets it from ``algo.carry_settlement``; compression hooks keep the
    #: settlement's own all-gather)
    carries_settlement = False

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, ctx=None) -> nn.Module:
        super().setup(model, optimizer, ctx)
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
            model, device_ids=device_ids, bucket_cap_mb=float(self.config.bucket_cap_mb), **no_buffer_sync
        )
        self._ready_fraction = ready_fractions(model, ctx.grad_ready_fraction if ctx is not None else None)
        self._launched = 0.0
        self._bucket_ready: dict[tuple, float] = {}  # bucket_ready_at's per-bucket readiness, by layout
        self.backward_wait = BackwardWait(self.comm)
        self.register_hook(self.ddp)
        return self.ddp

    def bucket_ready_at(self, bucket):
        """The clock time (a callable for :meth:`lsgd.comm.communicator.Communicator.issued`) at which DDP
        launches ``bucket``'s all-reduce: when its last gradient is computed (the fraction of
        backward done by then, parameters' gradients arriving in reverse parameter order), and not
        before the bucket of lower index (DDP launches buckets in index order). Called from the
        comm hook, once per bucket, in bucket order."""
        index = bucket.index()
        if index == 0:
            self._launched = 0.0
        # the bucket's own readiness depends on its parameters alone: computed once per bucket
        # layout (DDP rebuilds its buckets once, in the second forward, and flags it in
        # _has_rebuilt_buckets; the bucket's size and dtype are checked too)
        buffer = bucket.buffer()
        key = (index, getattr(self.ddp, "_has_rebuilt_buckets", None), buffer.numel(), buffer.dtype)
        ready = self._bucket_ready.get(key)
        if ready is None:
            ready = max((self._ready_fraction.get(id(p), 1.0) for p in bucket.parameters()), default=1.0)
            self._bucket_ready[key] = ready
        fraction = self._launched = max(ready, self._launched)
        clock = self.comm.clock
        return (lambda: clock.backward_point(fraction)) if clock is not None else None

    def register_hook(self, ddp: DistributedDataParallel) -> None:
        """Register the DDP comm hook (subclasses replace it: compression, PowerSGD); this one
        carries the clock settlement (``algo.carry_settlement``)."""
        self.carries_settlement = bool(self.config.carry_settlement)
        self._riding = None            # the carried settlement whose block is in the carrier buffer
        self._carrier_buffers: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        ddp.register_comm_hook(None, self._counting_allreduce_hook)

    def _counting_allreduce_hook(self, state, bucket):
        """torch's ``allreduce_hook`` (divide by the world size, then a SUM all-reduce of the
        bucket), counted and timed, with one Python callback on the completing thread instead of
        that hook's callback plus ours (each takes the GIL from the training thread). With
        ``algo.carry_settlement=true`` (default false) bucket 0 also carries the previous step's
        clock settlement (:meth:`after_backward`), when there is one: its block is appended to
        the bucket's all-reduce (:meth:`_carrier`)."""
        buffer = bucket.buffer()
        nbytes = buffer.numel() * buffer.element_size()
        self.comm.issued("all_reduce", nbytes, issue_at=self.bucket_ready_at(bucket))
        self.backward_wait.begin(bucket)
        t0 = time.perf_counter()
        group = self.comm.group if self.comm.group is not None else dist.group.WORLD
        carried = self.comm.take_carried() if self.carries_settlement and bucket.index() == 0 else None
        with self.comm.blocking():  # issuing the all-reduce is communication (lsgd.comm.blocked_time)
            if carried is None:
                buffer.div_(group.size())  # before the sum, as allreduce_hook (no fp16 overflow)
                tensor = result = buffer
            else:
                tensor, result, tail = self._carrier(buffer, carried)
                torch.div(buffer, group.size(), out=result)  # the same division, into the carrier
                carried.write(tail)  # its block, not divided
            fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()
            if carried is not None:
                carried.ride(tail, fut)

        def _done(f):
            self.comm.add_time(time.perf_counter() - t0, overlapped=True)
            self.backward_wait.done()
            f.value()  # raises the all-reduce's error, if any, into DDP's wait
            return result

        return fut.then(_done)

    def _carrier(self, buffer: torch.Tensor, carried) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(carrier, its head, its tail): one tensor of ``buffer``'s dtype holding the bucket
        (``head``, ``buffer.numel()`` elements, for ``buffer / world``: DDP copies the gradients out
        of it as out of the bucket) then the settlement's one-hot block (``tail``,
        :meth:`lsgd.comm.settlement.CarriedSettlement.ride`: a SUM of it is the all-gather, exactly), not
        divided. Kept per layout; a settlement whose block is still in it is decoded first."""
        n = buffer.numel()
        key = (n, carried.payload.size, buffer.dtype, buffer.device)
        views = self._carrier_buffers.get(key)
        if views is None:
            width = 8 // chunk_type(buffer.dtype).itemsize  # pieces per float64
            tensor = torch.empty(n + self.comm.world_size * carried.payload.size * width, dtype=buffer.dtype,
                                 device=buffer.device)
            views = self._carrier_buffers[key] = (tensor, tensor[:n], tensor[n:])
        if self._riding is not None:  # the buffer is about to be overwritten: decode what it carried
            self._riding.gathered()
        self._riding = carried
        return views

    def after_backward(self, step: int) -> None:
        """Broadcast the buffers, then settle the clock of this step's communication (one clock
        exchange for the buckets and the broadcast).

        The buffers are final once forward has run (backward and the optimizer step do not touch
        them), so broadcasting them here is DDP's broadcast before the next forward; on the clock
        it is issued at the end of backward, after the buckets on the group's stream.

        The settlement's exchange (every rank's issue times and port free times: an all-gather)
        is carried by the next step's bucket 0 (``algo.carry_settlement=true``, default false;
        :meth:`lsgd.comm.communicator.Communicator.settle`'s ``carried``): no message of its own. Its values
        apply at the next clock read, this method's in the next step (DDP's end of backward has
        waited for every bucket by then), as the separate all-gather's did. A clock read before
        that (records, evaluation, checkpoints, :meth:`lsgd.comm.communicator.Communicator.quiesce`: the same
        step on every rank) makes the all-gather there instead.

        The communicator's :attr:`~lsgd.comm.communicator.Communicator.carry` (the stop agreement) travels in
        the settlement's exchange: its answer arrives with the settlement, at the next step's
        first clock read, before that step's bookkeeping reads it (as its own all-reduce, read one
        step later, did): one message per step fewer."""
        clock = self.comm.clock
        with self.comm.overlap(clock.now.copy() if clock is not None else None):
            self.broadcast_buffers()
        # the stop agreement (lsgd.training.preemption) rides in the settlement: no message of its own
        carry = self.comm.carry
        carried = self.carries_settlement
        if carry is None:
            self.comm.settle(carried=carried)
        else:
            self.comm.settle([carry.code()], lambda codes: carry.carried(codes[0]), carried=carried)

    def after_step(self, step: int) -> None:
        self.comm.round()

    @property
    def models_in_sync(self) -> bool:
        return True
