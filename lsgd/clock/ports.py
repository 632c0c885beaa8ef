"""A worker's ports on the cluster clock: the egress and ingress of each link kind, their lanes, and
when each lane is free (:class:`Ports`). The clock (:mod:`lsgd.clock.worker_clock`) holds one per
worker; the communicator takes them for messages and collectives; the costs are
:mod:`lsgd.clock.network`'s.

Ports (LogGP)
-------------
Each worker has an egress and an ingress port per link kind (``inter``: its NIC; ``intra``: the
link inside a node of ``cluster.gpus_per_node`` > 1 workers), full duplex: sending and receiving
do not share a port. One NIC per worker (GPU) for the inter-node link: rail-optimised DGX-style
nodes give every GPU its own NIC; a NIC shared by several ranks of a node would need state shared
across processes, which the clock (one per process) does not have. ``network.ports`` (lanes,
integer >= 1, default 1) is how many messages one port carries at once; a message takes the
earliest-free lane. This is a conservative LogGP (Alexandrov, Ionescu, Schauser and Scheiman,
"LogGP: Incorporating Long Messages into the LogP Model", SPAA 1995) with gap ``g = alpha + 2 o``,
gap per byte ``G = beta`` and overhead ``o`` = ``network.overhead_us`` (default 0): a message holds
both its sender's egress and its receiver's ingress for its whole cost ``alpha + 2 o + n beta``
(:meth:`lsgd.clock.network.NetworkModel.cost`), so

* the sends of one exchange serialize on the sender's egress, in a deterministic order: by
  ``(peer - rank) mod p`` (the shift order of pairwise exchanges, so that in a regular graph the
  ``j``-th message every worker sends is the ``j``-th every worker receives and nobody's ingress
  is a hot spot); ``k`` sends cost ``k (alpha + 2 o + n beta)``;
* the receives serialize on the receiver's ingress, in order of the sender's start stamp, then
  peer rank (per clock entry), each in the order the worker completes its operations;
* the sender is not held back by a busy receiver (its send completes at ``start + cost``: the
  data waits at the receiver), and a paired exchange (both directions at once) costs
  ``alpha + 2 o + n beta`` (full duplex);
* a collective keeps its formula and occupies its members' ports of its link: it starts at the
  max over its members of ``(issue, stream free, egress free, ingress free)`` (the members'
  earliest-free lanes, folded into the settlement's exchange) and holds those lanes of
  every member until its end;
* a parameter server's incast of ``N`` messages costs ``N (alpha + 2 o + n beta)`` at its ingress,
  its broadcast the same at its egress.

The overhead ``o`` (LogGP: CPU time of the sender, and again of the receiver, per message; ``g``
the least gap between two messages of one port) is part of the message's cost, so it occupies
the ports with the rest: a sender's next message starts ``alpha + 2 o + n beta`` after its
previous one. Conservative, as ``g = alpha`` is: in LogGP the receiver's ``o`` runs on the
receiver's CPU while the sender's next message already leaves (the last of ``k`` small messages
to ``k`` peers is received at ``k o + L + o`` when ``g <= o``; here at ``k (alpha + 2 o)``). Kept
so because it is exact where it matters most (one message, a paired exchange, the steps of a
collective, each ``alpha + 2 o``) and it keeps one cost per message, so the identity below holds
with the overhead too.

So for operations that do not overlap, the clock's communication time equals the communicator's
tallies, ``NetworkModel.cost(model_alpha_terms, model_beta_bytes)`` = ``model_alpha_terms (alpha +
2 o) + model_beta_bytes beta`` (:mod:`lsgd.clock.network`). Port free times are part of the clock's
state (:meth:`lsgd.clock.worker_clock.Clock.state_dict`).

When the ports are read and taken: a send takes its egress lane when it is issued; a receive takes
its ingress lane when its operation's end is first computed (its wait, or a checkpoint's
:meth:`lsgd.comm.handles.Handle.state_dict`: the senders' stamps must have arrived); a collective reads
its members' ports when it is settled and holds them from then on. Each in this worker's program
order of those events: an approximation where an asynchronous collective stays unsettled while
later point-to-point messages of the same worker use the ports (they are not delayed by it).
"""

from __future__ import annotations

import numpy as np

LINKS = ("inter", "intra")
DIRECTIONS = ("egress", "ingress")


class Ports:
    """One worker's ports: an egress and an ingress per link kind (:data:`LINKS`), each with
    ``lanes`` lanes (``network.ports``), as the free time of every lane, shape ``[lanes, k]``
    (seconds, one column per clock entry). Every entry is its own simulation: a lane is chosen per
    entry. See the module docstring (LogGP)."""

    def __init__(self, k: int = 1, lanes: int = 1):
        self.k, self.lanes = int(k), int(lanes)
        self.free = {(link, d): np.zeros((self.lanes, self.k)) for link in LINKS for d in DIRECTIONS}

    def free_at(self, link: str, direction: str) -> np.ndarray:
        """When the earliest-free lane of a port is free (shape ``[k]``, a new array)."""
        f = self.free[(link, direction)]
        return f[0].copy() if self.lanes == 1 else f.min(axis=0)

    def occupy(self, link: str, direction: str, ready: np.ndarray, cost: np.ndarray,
               entries: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """A message of ``cost`` seconds, ready at ``ready``, takes the earliest-free lane of a port:
        returns its ``(start, end)`` = ``(max(ready, lane free), start + cost)`` and holds the lane
        until ``end``. ``entries``: only these clock entries (``ready`` and ``cost`` then have their
        length)."""
        f = self.free[(link, direction)]
        cols = np.arange(self.k) if entries is None else np.asarray(entries)
        lane = f[:, cols].argmin(axis=0)
        start = np.maximum(ready, f[lane, cols])
        end = start + cost
        f[lane, cols] = end
        return start, end

    def hold(self, link: str, until: np.ndarray) -> None:
        """A collective: the earliest-free lane of both ports of ``link`` is busy until ``until``."""
        if self.lanes == 1:  # (the same values as below: lane 0 in every column)
            for d in DIRECTIONS:
                f = self.free[(link, d)][0]
                np.maximum(f, until, out=f)
            return
        cols = np.arange(self.k)
        for d in DIRECTIONS:
            f = self.free[(link, d)]
            lane = f.argmin(axis=0)
            f[lane, cols] = np.maximum(f[lane, cols], until)

    def state_dict(self) -> dict:
        return {"lanes": self.lanes, "free": {f"{link}/{d}": v.tolist() for (link, d), v in self.free.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.lanes = int(state["lanes"])
        self.free = {tuple(key.split("/")): np.asarray(v, dtype=np.float64) for key, v in state["free"].items()}
        self.k = next(iter(self.free.values())).shape[1]
