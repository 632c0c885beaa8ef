"""A shared-memory all-gather for the simulator's own bookkeeping, where every rank of a group
shares one host's ``/dev/shm``.

The cluster clock's settlement of a step (every rank's issue times, port free times and the stop
code; :meth:`lsgd.comm.communicator.Communicator.settle`), the stop agreement of the methods whose workers
drift apart (:meth:`lsgd.training.preemption.PreemptionWatch.agreed`) and the per-worker figures of a record
(:meth:`lsgd.comm.communicator.Communicator.gather_values`) need every rank's few float64 values: an all-gather. They are the simulation's messages, not the method's (never counted, never clocked),
yet on gloo each one is a real collective: p - 1 messages through TCP loopback per rank, two
thread hand-offs per message, about 0.4-0.5 ms of CPU per rank and exchange on a 2-core host with 4
ranks, 3-4% of the demo CNN's DDP step (``scripts/bench_overhead.py``).

:class:`Board` does that all-gather without a message: a table in one shared-memory file (created
by the group's rank 0, mapped by every rank, then unlinked, so nothing is left in ``/dev/shm``
even when a worker is killed), with ``slots`` rows per rank and channel. Rank ``r`` posts its values
for exchange ``n`` into row ``(r, n mod slots)``; a reader of exchange ``n`` takes every rank's row
once it holds ``n``, waiting (yielding the core) for a rank that has not posted yet. The exchanges of
one channel are numbered in program order, which is the same on every rank (the same lockstep the
collective it replaces needs). The values read are the ones the all-gather would have delivered,
bit for bit: the modeled times do not change (tests/distributed/test_board.py against gloo).

Each row is a seqlock: the writer stores ``n`` in the row's first word, then the values, then ``n``
in its last word; a reader that finds ``n`` in the last word copies the values and accepts them when
the first word still holds ``n`` (a later exchange overwriting the row would have changed it first).
A row holding a later exchange than the one read raises (a reader more than ``slots`` exchanges
behind: a bug, never a silent wrong value). Ranks in one process group on one host read each
other's stores in order on x86-64 (total store order); the exchanges that use it are further
ordered by the gloo collectives of the step between them.

Why our own code: torch.distributed's CPU backends (gloo, MPI) have no shared-memory transport
(gloo's loopback is TCP); ``multiprocessing.shared_memory`` would register the segment with a
resource tracker process per rank (Python 3.11 cannot opt out) and warn about segments the
creator unlinks, so the file is mapped with :mod:`mmap` directly. Where some rank cannot open the
file (another host, no ``/dev/shm``), :meth:`Board.create` returns None on every rank and the
callers keep the gloo all-gather. ``LSGD_BOARD=0`` turns it off; the in-process cluster
(:mod:`lsgd.comm.inprocess`) needs none (and a reader spinning on the board would hold its baton).
"""

from __future__ import annotations

import mmap
import os
import secrets
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

SHM_DIR = "/dev/shm"
#: channels of a board: the clock's settlements, the stop agreement, the records' per-worker figures
SETTLE, AGREE, GATHER = 0, 1, 2
CHANNELS = 3
HEADER = 64  # bytes before the table: rank 0's token (the file is the one rank 0 created)


def enabled() -> bool:
    """False when ``LSGD_BOARD=0`` (the gloo all-gather everywhere)."""
    return os.environ.get("LSGD_BOARD", "1") != "0"


class Board:
    """Every rank's ``width`` float64 values per exchange, in shared memory (see the module).

    Layout: ``[channels, p, slots, width + 2]`` float64; a row's first and last words are its
    exchange number (as float64: exact below 2**53), the values lie between.

    Args (of the constructor; use :meth:`create`): the mapped buffer, this rank, the group's size.
    """

    def __init__(self, buffer: mmap.mmap, rank: int, size: int, slots: int, width: int, timeout_s: float):
        self._map = buffer
        self.rank, self.size, self.slots, self.width = rank, size, slots, width
        self.timeout_s = float(timeout_s)
        self._table = np.frombuffer(buffer, dtype=np.float64, offset=HEADER).reshape(CHANNELS, size, slots, width + 2)
        self._next = [0] * CHANNELS  # the next exchange number to post, per channel

    @staticmethod
    def nbytes(size: int, slots: int, width: int) -> int:
        return HEADER + CHANNELS * size * slots * (width + 2) * 8

    @classmethod
    def create(cls, group=None, slots: int = 8, width: int = 64, timeout_s: float = 1800.0,
               device: torch.device | str = "cpu") -> Board | None:
        """A board for ``group`` (None: the default group), or None on every rank where some rank
        cannot map it (no shared ``/dev/shm``), where ``LSGD_BOARD=0`` or torch.distributed is not
        initialized. Collective: every rank of the group calls it at the same point (it makes one
        ``broadcast_object_list`` and two all-reduces on the group). The mapping lives as long as
        the process (a few KB: ``3 * p * slots * (width + 2)`` float64).

        Args:
            slots: rows per rank and channel (how many exchanges a reader may lag behind the
                fastest writer; more raises at the read).
            width: float64 values per row at most (:meth:`fits`).
            timeout_s: how long a read waits for a rank's row before raising RuntimeError.
            device: where the group's collectives take tensors (``cuda`` for NCCL); the board
                itself is host memory either way.
        """
        if not (dist.is_available() and dist.is_initialized()) or not enabled():
            return None
        if dist.get_backend(group) == "lsgd_inprocess":  # one process: its all-gather is a copy already
            return None
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        src = dist.get_global_rank(group, 0) if group is not None else 0
        nbytes = cls.nbytes(size, slots, width)
        box: list = [None]
        fd = -1
        if rank == 0:
            name = f"lsgd-board-{os.getpid()}-{secrets.token_hex(8)}"
            try:
                fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                os.ftruncate(fd, nbytes)
                box = [(name, secrets.token_hex(8))]
            except OSError:
                if fd >= 0:
                    os.close(fd)
                    os.unlink(os.path.join(SHM_DIR, name))
                fd = -1
        dist.broadcast_object_list(box, src=src, group=group)
        buffer = None
        if box[0] is not None:
            name, token = box[0]
            try:
                if rank != 0:
                    fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
                buffer = mmap.mmap(fd, nbytes)
            except (OSError, ValueError):
                buffer = None
            finally:
                if fd >= 0:
                    os.close(fd)
            if buffer is not None and rank == 0:  # no exchange in any row yet, then the token
                np.frombuffer(buffer, dtype=np.float64, offset=HEADER).fill(-1.0)
                buffer[: len(token)] = token.encode()
        ok = torch.tensor([0 if buffer is None else 1], dtype=torch.int32, device=device)
        # rank 0 cleared the rows and wrote the token before this all-reduce; the others check the
        # token after it (a file of the same name on another host's /dev/shm would not hold it)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
        if buffer is not None and ok.item() and rank != 0 and bytes(buffer[: len(box[0][1])]) != box[0][1].encode():
            ok.zero_()
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
        if rank == 0 and box[0] is not None:
            try:
                os.unlink(os.path.join(SHM_DIR, box[0][0]))  # every rank has it mapped, or gave up
            except OSError:
                pass
        if not ok.item():
            if buffer is not None:
                buffer.close()
            return None
        return cls(buffer, rank, size, slots, width, timeout_s)

    def fits(self, n: int) -> bool:
        """Whether ``n`` values fit a row (the same answer on every rank for the same ``n``)."""
        return n <= self.width

    def post(self, channel: int, values: np.ndarray) -> int:
        """Post this rank's ``values`` (float64, at most ``width``) as the channel's next exchange;
        returns its number (for :meth:`gather`)."""
        n = self._next[channel]
        self._next[channel] = n + 1
        row = self._table[channel, self.rank, n % self.slots]
        m = values.size
        row[0] = n
        row[1 : m + 1] = values.reshape(-1)
        row[-1] = n
        return n

    def gather(self, channel: int, n: int, m: int, own: np.ndarray | None = None) -> np.ndarray:
        """Every rank's values of exchange ``n`` (``m`` each), ``[p, m]`` float64, in rank order,
        waiting for ranks that have not posted it.

        ``own``: read while an exception is handled (a failing rank writing its summary), this
        rank's values ``[1, m]`` are returned instead of waiting for peers that have not posted.

        Raises:
            RuntimeError: a rank's row holds a later exchange (this reader lagged more than
                ``slots`` exchanges), or a rank did not post within ``timeout_s`` seconds.
        """
        rows = self._table[channel, :, n % self.slots]
        # every row posted (a lockstep reader, most reads): three vectorized reads of the seqlock
        if (rows[:, -1] == n).all():
            out = rows[:, 1 : m + 1].copy()
            if (rows[:, 0] == n).all():
                return out
        out = np.empty((self.size, m))
        pending = list(range(self.size))
        spins, start = 0, None
        while True:
            still = []
            for q in pending:
                row = rows[q]
                last = row[-1]
                if last == n:
                    values = row[1 : m + 1].copy()
                    if row[0] == n:
                        out[q] = values
                        continue
                elif last > n:
                    raise RuntimeError(f"shared-memory board: rank {q}'s row of channel {channel} holds "
                                       f"exchange {int(last)}, read for exchange {n} (more than {self.slots} behind)")
                still.append(q)
            if not still:
                return out
            pending = still
            if own is not None and sys.exc_info()[0] is not None:
                return own.reshape(1, -1)
            spins += 1
            if spins <= 64:
                os.sched_yield()
                continue
            now = time.monotonic()
            if start is None:
                start = now
            elif now - start > self.timeout_s:
                raise RuntimeError(f"shared-memory board: rank(s) {pending} did not post exchange {n} of "
                                   f"channel {channel} within {self.timeout_s:g} s")
            time.sleep(min(1e-3, 2e-5 * (spins - 64)))
