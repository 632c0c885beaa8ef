"""The in-process cluster's torch.distributed backend: ``"lsgd_inprocess"``, registered with
``torch.distributed.Backend.register_backend``.

Every worker of an in-process cluster (:mod:`lsgd.comm.inprocess.cluster`) calls
``dist.init_process_group("lsgd_inprocess", ...)`` as a process calls it with ``"gloo"``; torch then
builds each group (the default one, ``dist.new_group``'s subgroups) through this module's creator,
and everything above torch.distributed, torch's DDP reducer and its comm hooks included, runs
unchanged. The workers of one cluster share a :class:`Fabric`: the collectives in progress and the
point-to-point mailboxes.

Semantics (those of gloo's CPU backend, as lsgd uses it):

* **Collectives** (all-reduce, all-gather, broadcast, reduce-scatter, reduce, gather, scatter,
  all-to-all, barrier) match by order: the k-th collective a worker issues on a group meets the
  k-th of every other member. A worker's contribution is read when it issues the call (the tensor
  is copied, or added into the running result); the results are written into every member's
  output tensors when the last member arrives. ``wait()`` on an operation whose peers have not all
  arrived gives the scheduler's baton away until they have.
* **Reductions add in rank order**, ``((x_0 + x_1) + x_2) + ...``, whatever order the members
  arrive in, each addition in the tensor's own dtype, as gloo's are; gloo's ring adds each chunk in
  a different order, so the two agree to the rounding of a float sum (the goldens' 1e-9 relative in
  float64), not bit for bit.
* **Point-to-point** sends are buffered (``isend`` copies the tensor and completes at once);
  ``irecv`` completes when a send with the same source, group and tag arrives, messages between
  one pair on one tag in the order sent (MPI's and gloo's non-overtaking rule); receives from any
  source take the earliest message of the lowest-ranked sender.
* **Futures** (``work.get_future()``, which DDP's reducer and its comm hooks wait on from C++) are
  returned completed: asking for one waits, through the scheduler, for the operation. A hook's
  ``then`` callbacks so run on their own worker's thread, with its groups and random state.

Errors: a member that leaves (its run ended or failed) while others wait on a collective stops the
cluster (:class:`lsgd.comm.inprocess.scheduler.Deadlock` or the failure itself).
"""

from __future__ import annotations

from collections import deque
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from lsgd.comm.inprocess import world
from lsgd.comm.inprocess.scheduler import Scheduler

BACKEND = "lsgd_inprocess"


class Fabric:
    """What the workers of one in-process cluster share: the scheduler, each group's collectives in
    progress (by group and sequence number) and the point-to-point mailboxes.

    Counters (the simulation's own, for tests and the benchmark): ``collectives`` completed,
    ``messages`` delivered."""

    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self.pending: dict[tuple, _Collective] = {}
        self.mail: dict[tuple, deque] = {}      # (group, src, dst, tag) -> sent tensors not yet received
        self.posted: dict[tuple, deque] = {}    # (group, src, dst, tag) -> receives waiting for a send
        self.posted_any: dict[tuple, deque] = {}  # (group, dst, tag) -> receives from any source
        self.collectives = 0
        self.messages = 0


class _Collective:
    """One collective across a group: each member's part as it arrives, the result once all have."""

    __slots__ = ("kind", "size", "parts", "arrived", "done", "finish", "state")

    def __init__(self, kind: str, size: int, finish):
        self.kind, self.size, self.finish = kind, size, finish
        self.parts: list = [None] * size
        self.arrived = 0
        self.done = False
        self.state = None  # a running reduction


class InProcessWork(dist.Work):
    """A collective or message of the in-process cluster (torch's ``Work``).

    ``wait()`` gives the baton away until the operation completed; ``get_future()`` does the same,
    then returns a completed ``torch.futures.Future`` of ``result``."""

    def __init__(self, fabric: Fabric, rank: int, is_done, result: list[torch.Tensor]):
        super().__init__()
        self._fabric, self._rank, self._is_done, self._result = fabric, rank, is_done, result

    def is_completed(self) -> bool:
        if self._is_done():
            return True
        self._fabric.scheduler.pause(self._rank)  # a poller lets the others move
        return self._is_done()

    def is_success(self) -> bool:
        return self._is_done()

    def exception(self):
        return None

    def wait(self, timeout: timedelta | None = None) -> bool:
        self._fabric.scheduler.block(self._rank, self._is_done)
        return True

    def result(self) -> list[torch.Tensor]:
        return self._result

    def _source_rank(self) -> int:
        """The group rank that sent the message a receive from any source got."""
        source = getattr(self, "_source", None)
        if source is None:
            raise RuntimeError("source_rank() is only for the work of a receive from any source")
        self.wait()
        return source.source

    source_rank = _source_rank

    def get_future(self) -> torch.futures.Future:
        self.wait()
        future = torch.futures.Future(devices=sorted({t.device for t in self._result if t.device.type == "cuda"}) or None)
        future.set_result(self._result)
        return future


def _done(work_done: bool = True):
    return lambda: work_done


# --- reductions ---------------------------------------------------------------------------------
def _reduce_into(acc: torch.Tensor, value: torch.Tensor, op) -> None:
    if op in (ReduceOp.SUM, ReduceOp.AVG):
        acc.add_(value)
    elif op == ReduceOp.PRODUCT:
        acc.mul_(value)
    elif op == ReduceOp.MIN:
        torch.minimum(acc, value, out=acc)
    elif op == ReduceOp.MAX:
        torch.maximum(acc, value, out=acc)
    elif op == ReduceOp.BAND:
        acc.bitwise_and_(value)
    elif op == ReduceOp.BOR:
        acc.bitwise_or_(value)
    elif op == ReduceOp.BXOR:
        acc.bitwise_xor_(value)
    else:
        raise NotImplementedError(f"in-process backend: reduce op {op} is not supported")


def _finish_reduction(acc: torch.Tensor, op, size: int) -> torch.Tensor:
    if op == ReduceOp.AVG:
        if acc.is_floating_point():
            acc.div_(size)
        else:
            acc.floor_divide_(size)
    return acc


class _RankOrderSum:
    """A reduction over a group in rank order, ``((x_0 op x_1) op x_2) ...``, whatever order the
    members arrive in: the running result holds ranks ``0..k-1``; a member that arrives before its
    turn is copied and added when its turn comes (so the bits do not depend on where the
    scheduler's round began, which differs with what ran before)."""

    __slots__ = ("op", "acc", "next", "early")

    def __init__(self, op):
        self.op, self.acc, self.next, self.early = op, None, 0, {}

    def add(self, rank: int, part: list[torch.Tensor]) -> None:
        if rank != self.next:
            self.early[rank] = [t.detach().clone() for t in part]
            return
        self._fold(part)
        while self.next in self.early:
            self._fold(self.early.pop(self.next))

    def _fold(self, part: list[torch.Tensor]) -> None:
        if self.acc is None:
            self.acc = [t.detach().clone() for t in part]
        else:
            for acc, t in zip(self.acc, part):
                _reduce_into(acc, t.detach(), self.op)
        self.next += 1


class InProcessGroup(dist.ProcessGroup):
    """One worker's view of one group of the in-process cluster (see the module).

    Args:
        fabric: the cluster's shared state.
        name: the group's name (torch's, the same on every member), with ``ranks`` its identity.
        rank: this worker's rank in the group; ``size``: the group's size.
        ranks: the members' global ranks, in group-rank order.
    """

    def __init__(self, fabric: Fabric, name: str, rank: int, size: int, ranks: tuple[int, ...]):
        super().__init__(rank, size)
        self._fabric, self._key, self._rank, self._size = fabric, (name, ranks), rank, size
        self._global_rank = ranks[rank]
        self._seq = 0

    # --- torch's ProcessGroup interface -----------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND

    def _get_backend_name(self) -> str:
        return BACKEND

    def size(self) -> int:
        return self._size

    def _get_backend(self, device=None):  # torch asks the device's backend for its features
        return self

    supports_coalescing = False  # batch_isend_irecv: one isend / irecv after another, as with gloo

    def rank(self) -> int:
        return self._rank

    def __repr__(self) -> str:
        return f"InProcessGroup(rank={self._rank}, size={self._size}, ranks={list(self._key[1])})"

    # --- collectives ----------------------------------------------------------------------------
    def _join(self, kind: str, part, finish, result: list[torch.Tensor], reduce=None) -> InProcessWork:
        """Add this member's ``part`` to the group's next collective (created by its first member);
        ``reduce(coll, part)`` folds a part into ``coll.state`` as it arrives; the last member's
        arrival calls ``finish(coll)``."""
        fabric = self._fabric
        key = (self._key, self._seq)
        self._seq += 1
        coll = fabric.pending.get(key)
        if coll is None:
            coll = fabric.pending[key] = _Collective(kind, self._size, finish)
        elif coll.kind != kind:
            raise RuntimeError(f"in-process backend: collective #{key[1]} of group {list(self._key[1])} is {coll.kind} "
                               f"on another member but {kind} on rank {self._global_rank} (mismatched calls)")
        with torch.no_grad():
            if reduce is not None:
                reduce(coll, part)
            else:
                coll.parts[self._rank] = part
            coll.arrived += 1
            if coll.arrived == coll.size:
                del fabric.pending[key]
                coll.finish(coll)
                coll.done = True
                fabric.collectives += 1
        return InProcessWork(fabric, self._global_rank, lambda: coll.done, result)

    def allreduce(self, tensors, opts=None):
        op = (opts or dist.AllreduceOptions()).reduceOp.op
        return self._allreduce(list(tensors), op, "allreduce")

    def allreduce_coalesced(self, tensors, opts=None):
        op = (opts or dist.AllreduceCoalescedOptions()).reduceOp.op
        return self._allreduce(list(tensors), op, "allreduce_coalesced")

    def _allreduce(self, tensors: list[torch.Tensor], op, kind: str, root: int | None = None) -> InProcessWork:
        """All-reduce (``root`` None) or reduce to group rank ``root``, in place."""
        size = self._size

        def finish(coll):
            results = [_finish_reduction(acc, op, size) for acc in coll.state.acc]
            for q, outputs in enumerate(coll.parts):
                if root is None or q == root:
                    for out, res in zip(outputs, results):
                        out.detach().copy_(res)

        def reduce(coll, part):
            coll.parts[self._rank] = tensors  # the outputs
            if coll.state is None:
                coll.state = _RankOrderSum(op)
            coll.state.add(self._rank, part)

        return self._join(kind, tensors, finish, tensors, reduce)

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        return self._allreduce(list(tensors), opts.reduceOp.op, "reduce", root=opts.rootRank)

    def broadcast(self, tensors, opts=None):
        root = (opts or dist.BroadcastOptions()).rootRank
        tensors = list(tensors)
        part = (tensors, [t.detach().clone() for t in tensors] if self._rank == root else None)

        def finish(coll):
            source = coll.parts[root][1]
            for q, (outputs, _) in enumerate(coll.parts):
                if q != root:
                    for out, src in zip(outputs, source):
                        out.detach().copy_(src)

        return self._join("broadcast", part, finish, tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        outputs = [list(o) for o in output_tensors]
        part = (outputs, [t.detach().clone() for t in input_tensors])

        def finish(coll):
            for outs, _ in coll.parts:
                for i, out_list in enumerate(outs):
                    for q in range(coll.size):
                        out_list[q].detach().copy_(coll.parts[q][1][i])

        return self._join("allgather", part, finish, [t for o in outputs for t in o])

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        return self.allgather(output_lists, input_list, opts)

    def _allgather_base(self, output, input, opts=None):
        part = (output, input.detach().clone())

        def finish(coll):
            for out, _ in coll.parts:
                chunks = out.detach().view(coll.size, -1) if out.dim() else out
                for q in range(coll.size):
                    chunks[q].copy_(coll.parts[q][1].reshape(-1))

        return self._join("allgather_base", part, finish, [output])

    all_gather_single = _allgather_base  # torch >= 2.13's name

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._allgather_base(o, i) for o, i in zip(outputs, inputs)]
        return works[-1] if works else InProcessWork(self._fabric, self._global_rank, _done(), [])

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        op = (opts or dist.ReduceScatterOptions()).reduceOp.op
        outputs = list(output_tensors)
        inputs = [[t.detach().clone() for t in lst] for lst in input_lists]

        def finish(coll):
            for i in range(len(outputs)):
                for q in range(coll.size):
                    acc = coll.parts[0][1][i][q].clone()
                    for s in range(1, coll.size):
                        _reduce_into(acc, coll.parts[s][1][i][q], op)
                    coll.parts[q][0][i].detach().copy_(_finish_reduction(acc, op, coll.size))

        return self._join("reduce_scatter", (outputs, inputs), finish, outputs)

    def _reduce_scatter_base(self, output, input, opts=None):
        chunks = list(input.detach().reshape(self._size, -1).clone())
        flat_out = output.detach().view(-1)
        return self.reduce_scatter([flat_out], [chunks], opts)

    reduce_scatter_single = _reduce_scatter_base  # torch >= 2.13's name

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1] if works else InProcessWork(self._fabric, self._global_rank, _done(), [])

    def gather(self, output_lists, input_tensors, opts=None):
        root = (opts or dist.GatherOptions()).rootRank
        outputs = [list(o) for o in output_lists]
        part = (outputs, [t.detach().clone() for t in input_tensors])

        def finish(coll):
            for i, out_list in enumerate(coll.parts[root][0]):
                for q in range(coll.size):
                    out_list[q].detach().copy_(coll.parts[q][1][i])

        return self._join("gather", part, finish, [t for o in outputs for t in o])

    def scatter(self, output_tensors, input_lists, opts=None):
        root = (opts or dist.ScatterOptions()).rootRank
        outputs = list(output_tensors)
        part = (outputs, [[t.detach().clone() for t in lst] for lst in input_lists] if self._rank == root else None)

        def finish(coll):
            source = coll.parts[root][1]
            for q in range(coll.size):
                for i, out in enumerate(coll.parts[q][0]):
                    out.detach().copy_(source[i][q])

        return self._join("scatter", part, finish, outputs)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        def splits(t, sizes):
            sizes = list(sizes) if sizes else [t.shape[0] // self._size] * self._size
            return list(torch.split(t, sizes))

        part = (splits(output.detach(), output_split_sizes), [c.clone() for c in splits(input.detach(), input_split_sizes)])

        def finish(coll):
            for q in range(coll.size):
                for s in range(coll.size):
                    coll.parts[q][0][s].copy_(coll.parts[s][1][q])

        return self._join("alltoall", part, finish, [output])

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, opts=None):
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        outputs = list(output_tensors)
        part = (outputs, [t.detach().clone() for t in input_tensors])

        def finish(coll):
            for q in range(coll.size):
                for s in range(coll.size):
                    coll.parts[q][0][s].detach().copy_(coll.parts[s][1][q])

        return self._join("alltoall", part, finish, outputs)

    def barrier(self, opts=None):
        return self._join("barrier", None, lambda coll: None, [])

    # --- point-to-point ---------------------------------------------------------------------------
    def send(self, tensors, dst: int, tag: int = 0):
        fabric = self._fabric
        key = (self._key, self._rank, dst, tag)
        for t in tensors:
            waiting = fabric.posted.get(key)
            any_key = (self._key, dst, tag)
            if waiting:
                recv = waiting.popleft()
                recv.deliver(t.detach(), self._rank)
            elif fabric.posted_any.get(any_key):
                fabric.posted_any[any_key].popleft().deliver(t.detach(), self._rank)
            else:
                fabric.mail.setdefault(key, deque()).append(t.detach().clone())
        return InProcessWork(fabric, self._global_rank, _done(), list(tensors))

    def recv(self, tensors, src: int, tag: int = 0):
        tensors = list(tensors)
        if len(tensors) != 1:
            raise NotImplementedError("in-process backend: recv of several tensors at once")
        recv = _Recv(tensors[0], self._fabric)
        box = self._fabric.mail.get((self._key, src, self._rank, tag))
        if box:
            recv.deliver(box.popleft(), src)
        else:
            self._fabric.posted.setdefault((self._key, src, self._rank, tag), deque()).append(recv)
        return InProcessWork(self._fabric, self._global_rank, lambda: recv.done, tensors)

    def recv_anysource(self, tensors, tag: int = 0):
        tensors = list(tensors)
        recv = _Recv(tensors[0], self._fabric)
        for src in range(self._size):
            box = self._fabric.mail.get((self._key, src, self._rank, tag))
            if box:
                recv.deliver(box.popleft(), src)
                break
        else:
            self._fabric.posted_any.setdefault((self._key, self._rank, tag), deque()).append(recv)
        work = InProcessWork(self._fabric, self._global_rank, lambda: recv.done, tensors)
        work._source = recv
        return work


class _Recv:
    __slots__ = ("tensor", "fabric", "done", "source")

    def __init__(self, tensor: torch.Tensor, fabric: Fabric):
        self.tensor, self.fabric, self.done, self.source = tensor, fabric, False, -1

    def deliver(self, data: torch.Tensor, source: int) -> None:
        if data.numel() != self.tensor.numel():
            raise RuntimeError(f"in-process backend: a message of {data.numel()} elements for a receive of "
                               f"{self.tensor.numel()}")
        with torch.no_grad():
            self.tensor.detach().copy_(data.view_as(self.tensor))
        self.done, self.source = True, source
        self.fabric.messages += 1


def _create(opts, backend_options=None):
    """torch's creator of a group of this backend (``register_backend(..., extended_api=True)``):
    the group of the calling worker's cluster (:func:`lsgd.comm.inprocess.world.current_fabric`)."""
    fabric = world.current_fabric()
    if fabric is None:
        raise RuntimeError(f"the {BACKEND!r} backend runs only inside lsgd's in-process cluster (launcher.mode=inprocess)")
    ranks = tuple(opts.global_ranks_in_group) or tuple(range(opts.group_size))
    return InProcessGroup(fabric, str(opts.group_id), opts.group_rank, opts.group_size, ranks)


def register() -> None:
    """Register the backend with torch.distributed (once per process)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])
