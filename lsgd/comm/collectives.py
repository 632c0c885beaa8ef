"""The collectives of a communicator: all-reduce, averaging, broadcast, all-gather, reduce-scatter,
barrier and the gathering of metrics, and the collectives torch issues itself (a DDP comm hook's
all-reduce, :meth:`Collectives.issued`, :meth:`Collectives.overlap`).

:class:`Collectives` is the communicator's part that carries them out (a base of
:class:`lsgd.comm.communicator.Communicator`): every counted collective is counted
(:mod:`lsgd.comm.accounting`) and queued for the clock's settlement (:mod:`lsgd.comm.settlement`);
``count=False`` runs it uncounted and unclocked (measurement). Tensors of several dtypes go one
coalesced collective per dtype (:func:`copy_back` writes the flat result back).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist

from lsgd.comm.accounting import tensor_bytes
from lsgd.comm.handles import Done, Handle, Many
from lsgd.comm.process_group import ALL_GATHER_INTO, REDUCE_SCATTER
from lsgd.comm.shared_memory import GATHER

if TYPE_CHECKING:
    from lsgd.comm.communicator import _Shared


def _by_dtype(tensors: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``tensors`` grouped by dtype, in first-seen order."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    return list(by_dtype.values())


def _coalesced(tensors: Sequence[torch.Tensor]):
    """Yield (tensors of one dtype, their concatenation as one flat buffer), in first-seen order."""
    for group in _by_dtype(tensors):
        yield group, torch.cat([t.detach().reshape(-1) for t in group])


@torch.no_grad()
def copy_back(flat: torch.Tensor, group: Sequence[torch.Tensor]) -> None:
    """Copy consecutive slices of the 1-D ``flat`` into the tensors of ``group`` (the inverse of
    concatenating their flattened views)."""
    offset = 0
    for t in group:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


class Collectives:
    """The collectives of a :class:`lsgd.comm.communicator.Communicator` over its group (see the
    module docstring)."""

    # provided by the Communicator
    _s: _Shared
    _pending: list[Handle]
    group: object
    world_size: int
    device: torch.device

    def issued(self, kind: str, nbytes: float, *, issue_at: np.ndarray | Callable[[], np.ndarray] | None = None,
               overlapped: bool = True) -> Handle:
        """Count and clock a collective that torch issued itself (a DDP comm hook's all-reduce).

        The returned handle carries no work: the clock is settled by :meth:`settle` (or a later
        handle's wait), once per step, on the main thread, by every rank in the same order.

        Args:
            issue_at: the clock time the operation was issued (an array, or a callable evaluated at
                settle time, e.g. ``lambda: clock.backward_point(f)`` for a bucket ready at
                fraction ``f`` of backward); None: the enclosing :meth:`overlap`'s, else now.
        """
        handle = Handle(self)
        handle.cost = self.count(kind, nbytes)
        handle.overlapped = overlapped
        if issue_at is None:
            issue_at = getattr(self._s.local, "issue_at", None)
        handle.issue = issue_at if issue_at is not None else self._now()
        if self._s.clock is not None and self.world_size > 1:
            with self._s.lock:
                self._pending.append(handle)
        return handle

    @contextlib.contextmanager
    def overlap(self, issue_at: np.ndarray | Callable[[], np.ndarray] | None) -> Iterator[None]:
        """Within the block, counted collectives are clocked as asynchronous operations issued at
        ``issue_at`` (see :meth:`issued`), although the data moves synchronously: a DDP comm hook
        that exchanges a bucket in place (compression) is priced as on a cluster, where the exchange
        overlaps the rest of backward. Settle with :meth:`settle` after backward."""
        local = self._s.local
        previous = getattr(local, "issue_at", None)
        local.issue_at = issue_at
        try:
            yield
        finally:
            local.issue_at = previous

    def _collective(self, kind: str, nbytes: int, op: Callable[[], object], async_op: bool, count: bool,
                    finish: Callable[[], object] | None = None, root: int = 0) -> Handle:
        """Run ``op`` (a torch.distributed call with ``async_op=True``) as a counted, clocked operation."""
        t0 = time.perf_counter()
        with self._s.blocked.region():  # issuing is communication too (lsgd.comm.blocked_time)
            work = op()
        handle = Handle(self, [work] if work is not None else [], finish, t0)
        if count:
            deferred = getattr(self._s.local, "issue_at", None)
            # measured time: an async caller computes while it is in flight; a synchronous call
            # (also inside overlap(), whose data moves synchronously) is communication time
            handle.overlapped = async_op
            handle.deferred = deferred is not None
            handle.cost = self.count(kind, nbytes, root=root)
            handle.issue = deferred if deferred is not None else self._now()
            if self._s.clock is not None and self.world_size > 1:
                with self._s.lock:
                    self._pending.append(handle)
        else:
            handle.overlapped = None  # neither timed nor clocked
        if not async_op:
            handle.wait()
        return handle

    def all_reduce(self, tensor: torch.Tensor, op=None, count: bool = True, async_op: bool = False,
                   nbytes: int | None = None):
        """In-place all-reduce (default SUM) of ``tensor``.

        ``nbytes``: the payload counted and clocked instead of ``tensor``'s size, where ``tensor``
        carries a simulated encoding (values a low-precision format represents, moved as floats) and
        ``nbytes`` is what that encoding would send: its bits and scales
        (:func:`lsgd.compression.rowwise.encoded_nbytes`, Streaming DiLoCo's outer gradients).

        Returns ``tensor``, or a :class:`Handle` (whose ``wait()`` returns ``tensor``) with ``async_op``.
        """
        if self.world_size == 1:
            return Done(self, tensor) if async_op else tensor
        red = op if op is not None else dist.ReduceOp.SUM
        h = self._collective(
            "all_reduce", tensor_bytes(tensor) if nbytes is None else int(nbytes),
            lambda: dist.all_reduce(tensor, op=red, group=self.group, async_op=True), async_op, count, lambda: tensor,
        )
        return h if async_op else tensor

    def average_(self, tensors: Sequence[torch.Tensor], count: bool = True, async_op: bool = False):
        """Replace each tensor by its mean over the group, in place, one all-reduce per dtype.

        The tensors are flattened into one contiguous buffer per dtype (a coalesced collective, as
        torch's model averagers do), so a round of parameter averaging costs one all-reduce of the
        model size. Integer tensors are averaged with floor division. With ``async_op`` returns a
        :class:`Handle`; the tensors hold the average only after its ``wait()``.
        """
        if self.world_size == 1 or not tensors:
            return Done(self) if async_op else None
        p = self.world_size
        handles = []
        for group, flat in _coalesced(tensors):
            def finish(group=group, flat=flat):
                if flat.is_floating_point() or flat.is_complex():
                    flat.div_(p)
                else:
                    flat.floor_divide_(p)
                copy_back(flat, group)

            # issued without waiting (one all-reduce per dtype in flight together), but a
            # synchronous average_ is communication time, not time in flight during compute
            handle = self._collective(
                "all_reduce", tensor_bytes(flat),
                lambda flat=flat: dist.all_reduce(flat, group=self.group, async_op=True), True, count, finish,
            )
            if handle.overlapped is not None:
                handle.overlapped = bool(async_op)
            handles.append(handle)
        if not async_op:
            for h in handles:
                h.wait()
            return None
        return handles[0] if len(handles) == 1 else Many(self, handles)

    def broadcast_(self, tensors: Sequence[torch.Tensor], src: int = 0, count: bool = True) -> None:
        """Broadcast ``tensors`` from group rank ``src`` in place, one coalesced broadcast per dtype."""
        if self.world_size == 1:
            return
        pg = self.group if self.group is not None else dist.distributed_c10d._get_default_group()
        for group in _by_dtype(tensors):
            nbytes = tensor_bytes(group)
            # torch's C++ coalesced broadcast (DDP's buffer broadcast): it flattens, broadcasts from
            # group rank src and copies back in place, with no Python step per tensor; synchronous.
            # A buffer of the group's size makes it one broadcast, as counted.
            self._collective(
                "broadcast", nbytes, lambda group=group, size=max(nbytes, 1): dist._broadcast_coalesced(pg, group, size, src),
                False, count, root=src,
            )

    def all_gather(self, tensor: torch.Tensor, count: bool = True, async_op: bool = False):
        """All-gather equally shaped tensors; returns the list ordered by group rank (or a Handle)."""
        p = self.world_size
        if p == 1:
            return Done(self, [tensor]) if async_op else [tensor]
        out = [torch.empty_like(tensor) for _ in range(p)]
        h = self._collective(
            "all_gather", tensor_bytes(tensor),
            lambda: dist.all_gather(out, tensor, group=self.group, async_op=True), async_op, count, lambda: out,
        )
        return h if async_op else out

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, count: bool = True, async_op: bool = False):
        """SUM reduce-scatter: ``output`` (``input.numel() / p`` elements) receives this rank's
        slice of the sum of ``input`` over the group. Counted with ``n`` = ``input`` bytes.
        Returns ``output`` (or a Handle)."""
        return self._into("reduce_scatter", REDUCE_SCATTER, output, input, count, async_op)

    def all_gather_into(self, output: torch.Tensor, input: torch.Tensor, count: bool = True, async_op: bool = False):
        """All-gather into one tensor: ``output`` (``p * input.numel()`` elements) holds every rank's
        ``input`` in group-rank order. Returns ``output`` (or a Handle)."""
        return self._into("all_gather", ALL_GATHER_INTO, output, input, count, async_op)

    def _into(self, kind: str, fn, output: torch.Tensor, input: torch.Tensor, count: bool, async_op: bool):
        if self.world_size == 1:
            output.copy_(input.reshape(output.shape))
            return Done(self, output) if async_op else output
        h = self._collective(kind, tensor_bytes(input), lambda: fn(output, input, group=self.group, async_op=True),
                             async_op, count, lambda: output)
        return h if async_op else output

    def barrier(self) -> None:
        """Uncounted barrier (checkpointing, shutdown)."""
        if self.world_size > 1:
            with self._s.blocked.region():
                dist.barrier(group=self.group)

    def gather_values(self, values: Sequence[float]) -> np.ndarray:
        """Uncounted all-gather of one float64 vector per rank: an array ``[world, len(values)]``
        (metrics of every worker at a record point); through the group's shared-memory board where
        it has one (:meth:`board`: no message, the same values)."""
        if self.world_size > 1 and (board := self.board()) is not None and board.fits(len(values)):
            mine = np.asarray(values, dtype=np.float64).reshape(-1)
            n = board.post(GATHER, mine)
            with self._s.blocked.region():
                return board.gather(GATHER, n, mine.size, own=mine)
        vec = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        if self.world_size == 1:
            return vec.cpu().numpy()[None, :]
        return torch.stack(self.all_gather(vec, count=False)).cpu().numpy()
