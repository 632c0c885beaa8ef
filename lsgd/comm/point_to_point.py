"""Point-to-point messages of a communicator: the neighbour exchange (:meth:`PointToPoint.exchange`,
the gossip primitive), a paired exchange with one peer, non-blocking sends and receives, and receives
posted ahead of their exchange (:meth:`PointToPoint.post_recv`).

:class:`PointToPoint` is the communicator's part that sends them (a base of
:class:`lsgd.comm.communicator.Communicator`). Each message is counted as one ``p2p`` and clocked on
this worker's ports (:mod:`lsgd.clock.ports`): its sender's start travels with it as an uncounted
float64 message after the payload. Point-to-point uses neither tags nor any-source receives; on NCCL
the sends and receives of one exchange go in one ``batch_isend_irecv``; on gloo receives are posted
before sends (neither blocks; gloo sends a message's data only once its receive is announced).
``LSGD_TRACE_P2P`` traces each exchange (:mod:`lsgd.comm.p2p_trace`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist

from lsgd.comm import p2p_trace
from lsgd.comm.accounting import tensor_bytes
from lsgd.comm.handles import Done, Handle, PostedRecv
from lsgd.comm.process_group import UNBATCHED_BACKENDS, initialized

if TYPE_CHECKING:
    from lsgd.comm.communicator import _Shared


class PointToPoint:
    """The point-to-point messages of a :class:`lsgd.comm.communicator.Communicator` between ranks
    of its group (see the module docstring)."""

    # provided by the Communicator
    _s: _Shared
    _rank: int
    group: object
    global_ranks: list[int]
    world_size: int
    device: torch.device

    def _warm_up(self) -> None:
        # NCCL: a batched P2P call that is the first operation on a group must involve every rank
        # of the group (torch's rule); one uncounted 1-element all-reduce per group first.
        if self._batched and id(self.group) not in self._s.warm:
            dist.all_reduce(torch.zeros(1, device=self.device), group=self.group)
            self._s.warm.add(id(self.group))

    @property
    def _batched(self) -> bool:
        return initialized() and dist.get_backend(self.group) not in UNBATCHED_BACKENDS

    def post_recv(self, tensor: torch.Tensor, peer: int, count: bool = True) -> PostedRecv:
        """Post the transport receive of ``tensor`` from group rank ``peer`` now, ahead of the
        :meth:`exchange` (or :meth:`sendrecv`) that consumes it: pass the returned
        :class:`PostedRecv` in that call's ``recvs`` in place of the tensor, with the same
        ``count``. Nothing is counted, timed or clocked here: the exchange that consumes it is
        clocked and timed as if it had posted the receive itself (the receive is posted at the
        exchange's issue on the cluster clock), so counts and modeled time do not depend on it.

        Why: gloo sends a message's data only once its receive is announced (:meth:`exchange`), so
        a receive posted late costs a round trip on the critical path; posted early, the
        announcement has arrived when the peer sends (measured with Adasum: 4 gloo ranks on 2
        cores, 1M floats, 13-15 ms -> 9-11 ms for the message pattern alone).

        Every receive from one peer must be posted (here or by an exchange) in the order that peer
        sends (point-to-point matches messages between a pair in order), and ``tensor`` must not be
        touched until the exchange completes. On NCCL nothing is posted here (an exchange is one
        ``batch_isend_irecv``); the exchange posts the receive as usual.

        Raises:
            ValueError: a peer outside the group or equal to this rank.
        """
        peer = int(peer)
        if not 0 <= peer < self.world_size or peer == self._rank:
            raise ValueError(f"peer {peer} must be another rank of this group of {self.world_size}")
        posted = PostedRecv(tensor, peer, count)
        if tensor.numel() and not self._batched:
            src = self.global_ranks[peer]
            with self._s.blocked.region():  # posting is communication too (lsgd.comm.blocked_time)
                posted.works = [dist.irecv(tensor, src, group=self.group)]
                if count and self._s.clock is not None:
                    posted.stamp = torch.empty(self._s.network.k, dtype=torch.float64, device=self.device)
                    posted.works.append(dist.irecv(posted.stamp, src, group=self.group))
        return posted

    def exchange(self, sends: Mapping[int, torch.Tensor] | None = None,
                 recvs: Mapping[int, torch.Tensor | PostedRecv] | None = None,
                 count: bool = True, async_op: bool = False):
        """Neighbour exchange: send ``sends[peer]`` to and receive into ``recvs[peer]`` from group
        ranks, all at once (the gossip primitive). Empty tensors are skipped.

        Both ends must post matching calls (same sizes, and, between one pair, the same order of
        messages). Counted as one ``p2p`` per non-empty send. Clock: each send completes at
        ``start + cost``, ``start = max(issue, egress free)``, the sends taking this worker's egress
        one after another in the order ``(peer - rank) mod p``; each receive at
        ``max(sender's start, receive posted, ingress free) + cost`` (:mod:`lsgd.clock.ports`), the sender's start
        travelling as an uncounted float64 message after the payload.

        A receive may be a :class:`PostedRecv` (:meth:`post_recv`) posted earlier with the same
        ``count``: its transport receive is already under way and is waited here; it is clocked
        and timed as a receive posted by this call.

        Returns None, or a :class:`Handle` with ``async_op`` (the received tensors are valid after
        its ``wait()``).

        Raises:
            ValueError: a peer outside the group or equal to this rank; a :class:`PostedRecv` from
                another peer, with another ``count``, or already consumed.
        """
        sends = {int(k): v for k, v in (sends or {}).items() if v is not None and v.numel()}
        recvs = {int(k): v for k, v in (recvs or {}).items() if v is not None and v.numel()}
        for peer in list(sends) + list(recvs):
            if not 0 <= peer < self.world_size or peer == self._rank:
                raise ValueError(f"peer {peer} must be another rank of this group of {self.world_size}")
        for peer, t in recvs.items():
            if isinstance(t, PostedRecv) and (t.peer != peer or t.count != count or t.used):
                raise ValueError(f"a posted receive from {t.peer} (count={t.count}, used={t.used}) cannot be "
                                 f"consumed as a receive from {peer} with count={count}")
        if not sends and not recvs:
            return Done(self) if async_op else None
        clock = self._s.clock if count else None
        t0 = time.perf_counter()
        handle = Handle(self, t0=t0)
        # measured time: an asynchronous caller computes while the messages travel
        handle.overlapped = bool(async_op) if count else None
        handle.issue = self._now()
        send_ops, recv_ops = [], []
        p = self.world_size
        # the egress takes the sends one after another, in the shift order of pairwise exchanges
        for peer in sorted(sends, key=lambda q: (q - self._rank) % p):
            t = sends[peer]
            dst = self.global_ranks[peer]
            send_ops.append((dist.isend, t, dst))
            if count:
                cost = self._p2p_cost(peer, tensor_bytes(t))
            if clock is not None:
                link = self._pair_link(self._rank, peer)
                start, end = clock.ports.occupy(link, "egress", handle.issue, cost)
                send_ops.append((dist.isend, torch.from_numpy(start).to(self.device), dst))
                handle.messages.append(("send", end, None, link, peer))
        posted_works = []
        for peer, t in recvs.items():
            if isinstance(t, PostedRecv):
                t.used = True
                if t.works is not None:
                    posted_works += t.works
                    if clock is not None:
                        handle.messages.append(("recv", self._p2p_link_cost(peer, tensor_bytes(t.tensor)), t.stamp,
                                                self._pair_link(self._rank, peer), peer))
                    continue
                t = t.tensor
            src = self.global_ranks[peer]
            recv_ops.append((dist.irecv, t, src))
            if clock is not None:
                buf = torch.empty(self._s.network.k, dtype=torch.float64, device=self.device)
                recv_ops.append((dist.irecv, buf, src))
                handle.messages.append(("recv", self._p2p_link_cost(peer, tensor_bytes(t)), buf,
                                        self._pair_link(self._rank, peer), peer))
        trace = p2p_trace.tracer() if count and not self._batched else None
        if trace is not None:
            handle.trace = trace.start([self.global_ranks[q] for q in sorted({*sends, *recvs})],
                                       [tensor_bytes(t) for t in sends.values()], t0)
        with self._s.blocked.region():  # posting is communication too (lsgd.comm.blocked_time)
            if self._batched:
                self._warm_up()
                handle.works = dist.batch_isend_irecv([dist.P2POp(f, t, r, self.group) for f, t, r in recv_ops + send_ops])
            else:
                # receives first: gloo's tcp transport sends a message's data only after the receiver
                # has announced the receive (a small notification on the same connection); posted after
                # the sends, that notification queues behind this rank's own outgoing data on a slow
                # link, and both ends wait. Measured on the emulated cluster (4 ranks, 0.86 MB to
                # each ring neighbour at 50 Mbit/s): 3.5 message times with sends first, 2.3 with
                # receives first, 2 by the clock (issue 23)
                posted = [f(t, r, group=self.group) for f, t, r in recv_ops + send_ops]
                handle.works = posted_works + posted
                if handle.trace is not None:  # receives posted ahead (post_recv) are not traced
                    handle.trace.watch(posted, _trace_labels(recv_ops + send_ops))
        if not async_op:
            handle.wait()
            return None
        return handle

    def sendrecv(self, send: torch.Tensor | None, recv: torch.Tensor | None, peer: int, count: bool = True,
                 async_op: bool = False):
        """Paired exchange with one peer: send ``send`` and receive ``recv`` at the same time
        (either may be None or empty). See :meth:`exchange`."""
        return self.exchange({peer: send} if send is not None else {}, {peer: recv} if recv is not None else {},
                             count=count, async_op=async_op)

    def isend(self, tensor: torch.Tensor, dst: int, count: bool = True) -> Handle:
        """Non-blocking send to group rank ``dst``; the peer posts :meth:`irecv`."""
        return self.exchange({dst: tensor}, None, count=count, async_op=True)

    def irecv(self, tensor: torch.Tensor, src: int, count: bool = True) -> Handle:
        """Non-blocking receive from group rank ``src`` into ``tensor``."""
        return self.exchange(None, {src: tensor}, count=count, async_op=True)

    def pair_cost(self, i: int, j: int, nbytes: float) -> np.ndarray:
        """Modeled seconds (shape ``[k]``, one per clock entry) of one message of ``nbytes``
        between group ranks ``i`` and ``j`` on their link (a paired exchange costs the same: both
        directions travel at once); nothing is counted."""
        return self._s.network.costs(self._pair_link(i, j), "p2p", nbytes, 2)

    def _pair_link(self, i: int, j: int) -> str:
        return self._s.network.link([self.global_ranks[i], self.global_ranks[j]])

    def _settle_messages(self, handle: Handle) -> np.ndarray:
        """The end (shape ``[k]``) of ``handle``'s messages, computed once (its transfer complete:
        the senders' stamps are in), moving no clock: a send ends where its egress lane let it
        (:meth:`exchange`); the receives take this worker's ingress in order of the senders'
        stamps, then peer rank, each clock entry on its own (:meth:`lsgd.clock.ports.Ports.occupy`), each
        no earlier than this worker posted it (rendezvous)."""
        if handle.message_end is None:
            handle.complete_data()
            ports = self._s.clock.ports
            ends = [end for d, end, _, _, _ in handle.messages if d == "send"]
            recvs = [(buf.cpu().numpy(), cost, link, peer)
                     for d, cost, buf, link, peer in handle.messages if d == "recv"]
            if recvs:
                k = self._s.network.k
                end = np.zeros(k)
                for e in range(k):
                    for stamp, cost, link, _ in sorted(recvs, key=lambda m: (m[0][e], m[3])):
                        # rendezvous: the data moves once the receive is posted (gloo announces each
                        # receive to the sender; MPI's and NCCL's large messages wait for it too)
                        ready = np.maximum(stamp[e : e + 1], handle.issue[e : e + 1])
                        _, done = ports.occupy(link, "ingress", ready, cost[e : e + 1], entries=[e])
                        end[e] = max(end[e], done[0])
                ends.append(end)
            handle.message_end = np.maximum.reduce(ends)
        return handle.message_end

    def _p2p_link_cost(self, peer: int, nbytes: int) -> np.ndarray:
        return self.pair_cost(self._rank, peer, nbytes)

    def _p2p_cost(self, peer: int, nbytes: int) -> np.ndarray:
        """Count one p2p send of ``nbytes`` to ``peer``; its cost on the pair's link."""
        self.count("p2p", nbytes, p=2)
        return self._p2p_link_cost(peer, nbytes)


def _trace_labels(ops) -> list[tuple[str, int]]:
    """``(kind, peer)`` of each posted op for :mod:`lsgd.comm.p2p_trace`: the payload, then (with a
    clock) the start stamp (float64, ``[k]``), per peer."""
    out, seen = [], set()
    for f, _t, r in ops:
        kind = "recv" if f is dist.irecv else "send"
        if (kind, r) in seen:
            kind += "_stamp"
        seen.add((kind, r))
        out.append((kind, r))
    return out
