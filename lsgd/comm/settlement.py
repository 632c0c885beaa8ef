"""The cluster clock's settlement of a communicator's collectives: when each ends.

A collective ends for all its participants at ``max_i(start_i) + cost`` on the group's stream
(:mod:`lsgd.clock.worker_clock`), so settling it needs every participant's issue time (and its
ports' free times): an uncounted exchange, made one of three ways, the values the same on each:

* an all-gather, the MAX taken locally (:meth:`ClockSettlement.settle`);
* through the group's shared-memory board where its ranks share one host
  (:mod:`lsgd.comm.shared_memory`, :meth:`ClockSettlement.board`): no message;
* carried in a SUM all-reduce the step makes anyway (DDP's next gradient bucket,
  :class:`CarriedSettlement`): each rank's float64 values travel bit for bit as unsigned-integer
  pieces in float32 / float16 / bfloat16 chunks (:func:`chunk_type`, :func:`split_float64`,
  :func:`join_float64`), in a one-hot block whose SUM over the ranks is the all-gather.

:class:`ClockSettlement` is the communicator's part that settles (a base of
:class:`lsgd.comm.communicator.Communicator`): it queues the settlement on the clock
(:meth:`lsgd.clock.worker_clock.Clock.defer`) and moves the clock where the algorithm waits
(:meth:`ClockSettlement.settle`, a handle's wait); :meth:`ClockSettlement.quiesce` settles without
moving it (measurement), and :meth:`ClockSettlement.resumed` gives a resumed run the wait its
checkpoint saved.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from lsgd.clock.worker_clock import stream_end
from lsgd.comm.handles import Handle
from lsgd.comm.process_group import ALL_GATHER_INTO, initialized
from lsgd.comm.shared_memory import SETTLE, Board

if TYPE_CHECKING:
    from lsgd.comm.communicator import Communicator, _Shared


@functools.lru_cache(maxsize=None)
def chunk_type(dtype: torch.dtype) -> np.dtype:
    """The unsigned integer type whose pieces of a float64 :func:`split_float64` sends in a
    tensor of ``dtype``: the widest of 32, 16 and 8 bits not above its significand digits (float64
    53: uint32; float32 24: uint16; float16 11 and bfloat16 8: uint8), so every piece is exactly
    representable in ``dtype``.

    Raises:
        ValueError: ``dtype`` is not a real floating-point type.
    """
    if not dtype.is_floating_point or dtype.is_complex:
        raise ValueError(f"a carried settlement needs a real floating-point tensor, got {dtype}")
    digits = 1 - int(round(math.log2(torch.finfo(dtype).eps)))
    return np.dtype(next(f"uint{w}" for w in (32, 16, 8) if w <= digits))


def split_float64(values: np.ndarray, chunk: np.dtype) -> np.ndarray:
    """The bytes of each float64 of ``values`` (shape ``[m]``) as ``c = 8 / chunk.itemsize``
    unsigned integers of type ``chunk`` (:func:`chunk_type`), in memory order: shape ``[m, c]``
    (a view). :func:`join_float64` inverts it exactly.

    Why exact through a SUM all-reduce in a floating type whose significand has at least
    ``8 * chunk.itemsize`` digits: every piece is an integer below ``2**(8 * itemsize)``, so it
    converts to that type and back without rounding; a slot that one rank writes and every other
    rank fills with +0.0 sums to the piece itself, in any order and association (``c + 0.0 == c``
    and ``0.0 + 0.0 == +0.0`` exactly in IEEE 754 arithmetic). The bit pattern is split, not the
    value, so there is no condition on the magnitude: zeros of both signs, subnormals, infinities
    and NaNs come back bit for bit (a ``hi + mid + lo`` split of the value into three float32
    would lose bits below float32's subnormal range, |x| < 2**-97, and overflow above its largest
    float). The ranks share a byte order (one architecture)."""
    values = np.ascontiguousarray(values, dtype=np.float64)
    return values.view(chunk).reshape(values.size, -1)


def join_float64(chunks: np.ndarray, chunk: np.dtype) -> np.ndarray:
    """Inverse of :func:`split_float64`: pieces ``[..., c]`` (integers representable in
    ``chunk``, any numeric type) -> float64 ``[...]``.

    Raises:
        ValueError: a piece is not an integer in ``chunk``'s range (the carrier changed it).
    """
    with np.errstate(invalid="ignore"):  # a negative, fractional, huge or NaN piece changes: caught below
        ints = np.ascontiguousarray(chunks).astype(chunk)
    if not (ints == chunks).all():
        raise ValueError("a carried settlement arrived changed: its pieces are not integers of its chunk type")
    return ints.view(np.float64).reshape(ints.shape[:-1])


class CarriedSettlement:
    """One clock settlement's exchange (the payload every rank contributes: issue times and port
    free times, then the codes, float64 ``[m]``), made by whichever comes first:

    * :meth:`write` (:meth:`block`) + :meth:`ride`: it travels inside a SUM all-reduce the step makes anyway (DDP's
      gradient bucket; :meth:`lsgd.comm.communicator.Communicator.take_carried`): rank ``r`` writes its payload's
      pieces (:func:`split_float64`) into slot ``r`` of a ``[p, m, c]`` block and +0.0 elsewhere,
      so the SUM is exactly the all-gather of the payloads;
    * :meth:`gathered` before it was shipped: the explicit exchange, an uncounted all-gather (what
      an uncarried settlement does at once).

    Every rank of the group must take the same path at the same point (lockstep: the same
    settlements, carriers and clock reads on every rank)."""

    __slots__ = ("comm", "payload", "_gathered", "_carrier", "_chunk")

    #: exchanges made since the process started, explicit (all-gather) and carried (a test's
    #: witness of which path ran)
    explicit = 0
    carried = 0

    def __init__(self, comm: Communicator, payload: np.ndarray):
        self.comm = comm
        self.payload = payload
        self._gathered: np.ndarray | None = None
        self._carrier: tuple[torch.Tensor, object] | None = None
        self._chunk = np.dtype(np.uint16)

    @property
    def shipped(self) -> bool:
        return self._carrier is not None

    @property
    def exchanged(self) -> bool:
        return self._gathered is not None or self._carrier is not None

    def block(self, dtype: torch.dtype) -> torch.Tensor:
        """This rank's contribution, flat, ``p * m * c`` elements of ``dtype`` (see the class)."""
        self._chunk = chunk_type(dtype)
        block = np.zeros((self.comm.world_size, self.payload.size * 8 // self._chunk.itemsize))
        block[self.comm.rank] = split_float64(self.payload, self._chunk).reshape(-1)
        return torch.from_numpy(block.reshape(-1)).to(dtype)

    def write(self, tail: torch.Tensor) -> None:
        """Put :meth:`block` into ``tail`` (``p * m * c`` elements of its dtype), before the
        all-reduce that carries it is issued (on CPU through a numpy view: two numpy operations,
        no temporary tensor)."""
        if tail.device.type == "cpu" and tail.dtype != torch.bfloat16:  # numpy has no bfloat16
            self._chunk = chunk_type(tail.dtype)
            view = tail.numpy()
            view.fill(0)
            c = self.payload.size * 8 // self._chunk.itemsize
            view[self.comm.rank * c : (self.comm.rank + 1) * c] = self.payload.view(self._chunk)
        else:
            tail.copy_(self.block(tail.dtype))

    def ride(self, tail: torch.Tensor, future) -> None:
        """The block (:meth:`write`) travels as ``tail`` of the tensor whose SUM all-reduce
        ``future`` completes."""
        self._carrier = (tail, future)
        CarriedSettlement.carried += 1

    def gathered(self) -> np.ndarray:
        """Every rank's payload, ``[p, m]`` float64 (the all-gather): from the carrier (waiting for
        it if needed), else by the explicit all-gather now.

        Read while an exception is handled (a failing rank writing its summary), it starts no
        collective its peers are not in and waits for no carrier that has not completed or that
        failed: this rank's own values, ``[1, m]`` (a lower bound of the settlement)."""
        if self._gathered is None:
            comm = self.comm
            failing = sys.exc_info()[0] is not None
            if self._carrier is not None:
                tail, future = self._carrier
                if failing and not future.done():
                    return self.payload[None, :]
                try:
                    with comm._s.blocked.region():
                        future.wait()  # done by now on gloo; on CUDA it also orders this stream after NCCL's
                except Exception:
                    if failing:
                        return self.payload[None, :]
                    raise
                summed = tail.numpy() if tail.device.type == "cpu" and tail.dtype != torch.bfloat16 else \
                    tail.detach().to("cpu", torch.float64).numpy()
                self._gathered = join_float64(summed.reshape(comm.world_size, self.payload.size, -1), self._chunk)
            elif failing:
                return self.payload[None, :]
            else:
                CarriedSettlement.explicit += 1
                self._gathered = comm._all_gather_payload(self.payload)
        return self._gathered


class ClockSettlement:
    """The cluster clock's side of a :class:`lsgd.comm.communicator.Communicator`: collectives issued
    wait in a FIFO (``_pending``) until they are settled through the group's stream
    (``_stream_free``), their ends computed from the exchange of the participants' issue times; a
    wait moves the clock to an end (see the module docstring)."""

    # provided by the Communicator
    _s: _Shared
    _pending: list[Handle]
    _stream_free: np.ndarray
    _carried: CarriedSettlement | None
    _board: Board | None | bool
    group: object
    link: str
    world_size: int
    device: torch.device

    def _now(self) -> np.ndarray:
        clock = self._s.clock
        return clock.now.copy() if clock is not None else np.zeros(self._s.network.k)

    def settle(self, codes: Sequence[int] = (), on_codes: Callable[[list[int]], None] | None = None,
               carried: bool = False) -> bool:
        """Wait for every collective issued so far on the clock: settle them (their issue times'
        MAX over the group: one uncounted all-gather, the MAX taken locally; through the group's
        shared-memory board where it has one, :meth:`board`) and move the clock to
        the end of the last (the group's stream). Every rank of the group must call it at the same
        point.

        ``codes`` (integers in [0, 2**53), as many on every rank) travel in the same exchange:
        their MAX over the group is handed to ``on_codes`` when the settlement applies (the next
        clock read, :class:`lsgd.clock.worker_clock.Clock`), so a per-step agreement (the stop agreement,
        :attr:`carry`) costs no message of its own. Returns whether they were sent (False: nothing
        to settle, so no exchange).

        ``carried``: the exchange is not issued here; it waits (:meth:`take_carried`) for a SUM
        all-reduce the algorithm makes anyway before the next clock read (DDP's next gradient
        bucket), and is made explicitly (the all-gather) only where the clock is read before one
        took it (records, evaluation, checkpoints, :meth:`quiesce`). The values are the same
        either way (:class:`CarriedSettlement`); the ranks must then read the clock at the same
        points (lockstep: every rank makes the same records at the same step)."""
        sent = self._settle_ends(codes, on_codes, carried)
        clock = self._s.clock
        if clock is not None:
            clock.defer(lambda: clock._advance_to(self._stream_free))
        return sent

    def _settle_ends(self, codes: Sequence[int] = (), on_codes: Callable[[list[int]], None] | None = None,
                     carried: bool = False) -> bool:
        """Compute the end of every collective issued so far, moving no clock; True when some were
        (and ``codes`` went with them, :meth:`settle`)."""
        with self._s.lock:
            last = self._pending[-1] if self._pending else None
        if last is None:
            return False
        self._settle_ends_through(last, codes, on_codes, carried)
        return True

    def _settle_ends_through(self, handle: Handle, codes: Sequence[int] = (),
                             on_codes: Callable[[list[int]], None] | None = None, carried: bool = False) -> None:
        """Compute the ends of the collectives issued up to ``handle`` (FIFO), moving no clock;
        ``codes``, ``carried``: see :meth:`settle`."""
        with self._s.lock:
            if handle not in self._pending:
                return
            i = self._pending.index(handle)
            batch, self._pending = self._pending[: i + 1], self._pending[i + 1 :]
        clock = self._s.clock
        # a collective also waits for this member's ports (lsgd.clock.ports): their earliest-free
        # lanes, read after every earlier settlement, travel in the same exchange
        ports = clock.ports
        busy = np.maximum(ports.free_at(self.link, "egress"), ports.free_at(self.link, "ingress"))
        issues = np.stack([np.maximum(h.issue() if callable(h.issue) else h.issue, busy) for h in batch])
        if self.world_size == 1:
            self._apply_settled(batch, issues)
            if on_codes is not None:
                on_codes([int(c) for c in codes])
            return
        # the codes after the issue times, as float64 (exact below 2**53). Gathered, then the MAX
        # taken here (exact: the same values as a MAX all-reduce): a gloo all-gather of a few
        # elements takes (p - 1) messages per rank, a ring all-reduce up to 2 (p - 1) per element
        # up to 2 p elements (4 ranks, 7 float64: 1.8 ms against 2.5 ms on this 2-core host)
        payload = np.concatenate([issues.reshape(-1), np.asarray(codes, dtype=np.float64)])
        board = None if carried else self.board()
        if carried:
            exchange = self._carried = CarriedSettlement(self, payload)
            gathered = exchange.gathered
        elif board is not None and board.fits(payload.size):  # (the same size on every rank)
            n = board.post(SETTLE, payload)

            def gathered():
                with self._s.blocked.region():
                    return board.gather(SETTLE, n, payload.size, own=payload)
        else:
            buf = torch.from_numpy(payload).to(self.device)
            out = torch.empty(self.world_size * buf.numel(), dtype=buf.dtype, device=buf.device)
            work = ALL_GATHER_INTO(out, buf, group=self.group, async_op=True)

            def gathered():
                with self._s.blocked.region():
                    work.wait()
                return out.cpu().numpy().reshape(self.world_size, -1)

        def apply():
            out = gathered().max(axis=0)
            if carried and self._carried is exchange:
                self._carried = None
            self._apply_settled(batch, out[: issues.size].reshape(issues.shape))
            if on_codes is not None:
                on_codes([int(c) for c in out[issues.size :]])

        clock.defer(apply)

    def _apply_settled(self, batch: list[Handle], issues: np.ndarray) -> None:
        """Run the settled operations through this group's stream: their ends (no clock moves)."""
        ports = self._s.clock._ports  # inside Clock.resolve: not through the resolving property
        for h, issue in zip(batch, issues):
            self._stream_free = stream_end(self._stream_free, issue, h.cost)
            h.end = self._stream_free.copy()
            ports.hold(self.link, h.end)

    def board(self) -> Board | None:
        """The group's shared-memory board (:class:`lsgd.comm.shared_memory.Board`: the settlement's, the stop
        agreement's and the records' figures' all-gather without a message, where the group's
        ranks share one host's
        ``/dev/shm``), made at the first call; None where it cannot be (another host,
        ``LSGD_BOARD=0``, a world of one). The first call is collective: every rank of the group
        makes it at the same point (the first settlement or stop agreement, in lockstep)."""
        if self._board is False:
            self._board = Board.create(self.group, device=self.device) if self.world_size > 1 and initialized() else None
        return self._board

    def take_carried(self) -> CarriedSettlement | None:
        """The settlement made with ``carried=True`` (:meth:`settle`) whose exchange is still to be
        made, for the caller to ship in a SUM all-reduce (:meth:`CarriedSettlement.block`,
        :meth:`CarriedSettlement.ride`); None when there is none. Every rank gets the same answer
        at the same point of a lockstep method."""
        carried = self._carried
        return carried if carried is not None and not carried.exchanged else None

    def flush_carried(self) -> None:
        """Make the exchange of a carried settlement not yet shipped (the explicit all-gather;
        every rank calls it at the same point: :meth:`quiesce`)."""
        if self._carried is not None:
            self._carried.gathered()

    def _all_gather_payload(self, payload: np.ndarray) -> np.ndarray:
        """Uncounted, blocking all-gather of one float64 vector per rank: ``[p, len(payload)]``."""
        buf = torch.from_numpy(payload).to(self.device)
        out = torch.empty(self.world_size * buf.numel(), dtype=buf.dtype, device=buf.device)
        with self._s.blocked.region():
            ALL_GATHER_INTO(out, buf, group=self.group)
        return out.cpu().numpy().reshape(self.world_size, -1)

    def _complete(self, handle: Handle) -> None:
        """Clock and measured time of a finished handle: the wait moves the clock to its end."""
        if handle.overlapped is not None:
            done = handle.t_done if handle.t_done is not None else time.perf_counter()
            self.add_time(done - handle.t0, overlapped=handle.overlapped)
        clock = self._s.clock
        if clock is None:
            return
        if handle.restored is not None:
            clock.wait_until(handle.restored)
            return
        if handle.cost is not None and not handle.deferred:
            self._settle_ends_through(handle)
            # in order after the settlement that computes the end (Clock.defer)
            clock.defer(lambda: handle.end is not None and clock._advance_to(handle.end))
        if handle.messages:
            clock.wait_until(self._settle_messages(handle))

    def quiesce(self) -> None:
        """Settle every collective issued on this communicator and its subgroups, in their
        creation order (a global order, so ranks in several subgroups cannot deadlock): compute
        their ends, moving no clock (measurement never moves modeled time; the algorithm's own
        waits do); a carried settlement still waiting for its carrier makes its exchange here
        (:meth:`flush_carried`). Before evaluation, checkpoint and exit; every rank calls it at the
        same point."""
        for comm in self._s.comms:
            comm.flush_carried()
            comm._settle_ends()

    def resumed(self, state: dict | None) -> Handle:
        """A handle for an operation that was in flight at a checkpoint (its
        :meth:`Handle.state_dict`): its data is the algorithm's (restored with the checkpoint), and
        its :meth:`Handle.wait` moves the clock to the saved end, as the uninterrupted run's wait
        does. Nothing is counted again (the counters were saved)."""
        handle = Handle(self)
        handle.overlapped = None  # no measured time
        handle.data_done = handle.works_done = True
        end = None if state is None else state.get("end")
        if end is not None:
            handle.restored = np.asarray(end, dtype=np.float64)
        else:
            handle.done = True
        return handle
