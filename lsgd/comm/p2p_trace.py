"""A trace of every counted point-to-point exchange (a debugging aid, off by default).

With the environment variable ``LSGD_TRACE_P2P`` set to a folder, every worker appends one JSON
line per counted exchange (:meth:`lsgd.comm.communicator.Communicator.exchange`: gossip, SwarmSGD, D-PSGD,
the parameter server's messages) to ``<folder>/p2p_rank<r>.jsonl`` when the exchange is waited:

* ``rank``, ``seq`` (this rank's exchange number), ``peers``, ``bytes`` (payload per send);
* measured, in ``time.perf_counter`` seconds (CLOCK_MONOTONIC on Linux: one time base for every
  process of the machine, so the two ends of an exchange line up): ``post`` (before the first
  receive is posted), ``posted`` (after the last send is posted), ``works``: when each gloo work
  finished, as ``[kind, peer, seconds]`` with kind ``recv`` / ``send`` (payload) or ``recv_stamp`` /
  ``send_stamp`` (the clock's start stamp), ``wait`` (the algorithm calls ``wait()``) and ``waited``
  (it returns);
* modeled, on this worker's cluster clock: ``issue_model`` (the exchange's issue) and
  ``end_model`` (its end: the messages' end, :meth:`lsgd.comm.communicator.Communicator._settle_messages`).

At exit each process also writes its network namespace's counters (:meth:`P2PTrace.network_counters`:
TCP retransmissions, qdisc drops, the sockets' windows) to ``<folder>/p2p_rank<r>_net.json``.

How each work's end is seen: one waiting thread per work (gloo's send and receive works have no
future to hang a callback on: ``Work::getFuture not implemented`` in torch 2.14's gloo), so a
work's time is when gloo signalled it, not when the algorithm looked; the algorithm's own wait then
waits for those threads. The threads sleep in gloo's wait (no polling), so the trace takes no CPU
while the messages travel; it adds one thread start per work (tens of microseconds).

Read a trace with :func:`lsgd.analysis.p2p_trace.load_p2p_trace` (a pandas DataFrame, one row per
exchange and rank); the clock-validation notes use it on the emulated cluster. Written here, not taken from
a library: torch's profiler records gloo's send/recv as host ops on the calling thread, not when
the data arrived.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import threading
import time
from pathlib import Path

#: the environment variable that turns the trace on (a folder; unset or empty: off)
ENV = "LSGD_TRACE_P2P"


class _Record:
    """One exchange being traced: the works' end times, filled by their threads."""

    def __init__(self, tracer: P2PTrace, seq: int, post: float, peers: list[int], nbytes: list[int]):
        self.tracer, self.seq, self.post = tracer, seq, post
        self.peers, self.nbytes = peers, nbytes
        self.posted = None
        self.works: list[list] = []
        self.threads: list[threading.Thread] = []
        self.wait_t = None
        self.errors: list[BaseException] = []

    def watch(self, works, labels) -> None:
        """Wait for each of ``works`` on a thread of its own; ``labels``: ``(kind, peer)`` per work."""
        self.posted = time.perf_counter()
        for work, (kind, peer) in zip(works, labels):
            entry = [kind, peer, None]
            self.works.append(entry)

            def run(work=work, entry=entry):
                try:
                    work.wait()
                except BaseException as exc:  # re-raised on the algorithm's wait
                    self.errors.append(exc)
                entry[2] = time.perf_counter()

            t = threading.Thread(target=run, daemon=True, name="lsgd-p2p-trace")
            t.start()
            self.threads.append(t)

    def join(self) -> None:
        """Block until every work finished (the algorithm's wait); re-raises a work's error."""
        if self.wait_t is None:
            self.wait_t = time.perf_counter()
        for t in self.threads:
            t.join()
        if self.errors:
            raise self.errors[0]

    def write(self, rank: int, issue_model, end_model) -> None:
        row = {"rank": rank, "seq": self.seq, "peers": self.peers, "bytes": self.nbytes, "post": self.post,
               "posted": self.posted, "works": self.works, "wait": self.wait_t, "waited": time.perf_counter(),
               "issue_model": None if issue_model is None else float(issue_model[0]),
               "end_model": None if end_model is None else float(end_model[0])}
        self.tracer.write(rank, row)


class P2PTrace:
    """The trace of one process (see the module docstring)."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.seq = 0
        self.files: dict[int, object] = {}
        self.lock = threading.Lock()

    def start(self, peers: list[int], nbytes: list[int], post: float) -> _Record:
        with self.lock:
            self.seq += 1
            return _Record(self, self.seq, post, peers, nbytes)

    def write(self, rank: int, row: dict) -> None:
        with self.lock:
            fh = self.files.get(rank)
            if fh is None:
                fh = self.files[rank] = open(self.folder / f"p2p_rank{rank}.jsonl", "a", buffering=1)
                atexit.register(self.network_counters, rank)
            fh.write(json.dumps(row) + "\n")

    def network_counters(self, rank: int) -> None:
        """This process's network namespace's TCP counters (``/proc/net/snmp``, ``/proc/net/netstat``:
        retransmissions, timeouts, ...), its qdiscs' statistics (``tc -s qdisc``: sent, dropped,
        overlimits) and its TCP sockets (``ss -tin``: cwnd, ssthresh, rtt) to ``p2p_rank<r>_net.json``.
        Runs at interpreter exit (registered with the first row; a child that multiprocessing forked
        leaves through ``os._exit`` and skips it: call it there by hand). On the emulated cluster a
        worker's namespace is its node's, so these are its node link's counters."""
        out = {}
        for name in ("snmp", "netstat"):
            try:
                lines = Path(f"/proc/net/{name}").read_text().splitlines()
            except OSError:
                continue
            for head, vals in zip(lines[::2], lines[1::2]):
                proto, keys = head.split(":")
                out.update({f"{proto}.{k}": int(v) for k, v in zip(keys.split(), vals.split(":")[1].split())})
        for key, cmd in (("tc", ["tc", "-s", "-j", "qdisc", "show"]), ("ss", ["ss", "-tin"])):
            try:
                out[key] = subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout
            except (OSError, subprocess.SubprocessError):
                pass
        (self.folder / f"p2p_rank{rank}_net.json").write_text(json.dumps(out))


_tracer: P2PTrace | None = None
_checked = False


def tracer() -> P2PTrace | None:
    """This process's trace, or None when ``LSGD_TRACE_P2P`` is unset (read once)."""
    global _tracer, _checked
    if not _checked:
        folder = os.environ.get(ENV)
        _tracer = P2PTrace(folder) if folder else None
        _checked = True
    return _tracer

