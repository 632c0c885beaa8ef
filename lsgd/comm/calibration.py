"""This host's per-message overhead (LogGP's ``o``), measured by ``lsgd calibrate --network``
(:func:`measure_overhead`) and kept beside the ``cpu`` profile in ``$XDG_CACHE_HOME/lsgd/network.json``
(:func:`network_profile_path`), from which ``network.overhead_us=measured`` reads it
(:func:`read_network_profile`).

What is measured
----------------
``nproc`` local gloo processes (``--nproc``, default 2; one torch thread each, rendezvous through a
file store, gloo's default interface as a local ``lsgd train`` uses it) time small messages (default
1, 64 and 1024 bytes, ``repeats`` of each after a warm-up) in two ways, on rank 0 with
``time.perf_counter``:

* **all-reduces of every rank** (:meth:`lsgd.comm.communicator.Communicator.all_reduce`,
  uncounted): the figure ``network.overhead_us=measured`` reads. The clock prices an all-reduce of
  ``p`` ranks as a ring, ``2 (p - 1)`` message steps of ``alpha + 2 o`` each (and bytes, negligible
  here), so ``o = time / (2 (p - 1)) / 2``, the latency folded in (``o + L / 2``): the ``o`` that
  makes the clock's count of a small all-reduce equal its measured time on this host. Measured
  with as many ranks as the runs it is for, because on a host with fewer cores than ranks a
  message waits for its receiver to get a core: on the 2-core VM these docs were written on, 2
  ranks give about 75 us, 4 ranks 360-400 us, 8 ranks 690-760 us (gloo's reduction and collective
  bookkeeping are in the figure too; they are per message step as the clock counts them).
* **ping-pong between ranks 0 and 1** (the others wait at a barrier), through lsgd's own
  point-to-point path (:meth:`lsgd.comm.communicator.Communicator.exchange`: receives posted before
  sends, gloo's ``isend`` / ``irecv``): recorded (``pingpong_overhead_us``) as the host's bare
  figure. By LogP (Culler et al., PPoPP 1993) a round trip is two messages, each ``o`` at its
  sender, the latency ``L`` on the way and ``o`` at its receiver (the bytes' time on loopback,
  ``n G``, is below 1 us at 1 KB and left in), so one way = round trip / 2 = ``2 o + L`` and the
  figure is round trip / 4 = ``o + L / 2``.

``L`` is not separated: loopback TCP has no wire, its latency is itself the kernel's software
(the clock-validation study measured an 18 us TCP round trip between two emulated nodes, so
``L`` <= 9 us); nor are the sender's and the receiver's shares (LogP has them equal). The median
over all sizes and repeats is the figure to use (:func:`overhead_line`); the 90th percentile and the
mean show the tail (this host's scheduler: a 4 ms tick, CONFIG_HZ=250, on a shared 2-core VM).

What is not in it: a clocked lsgd message sends its start stamp (a float64 message) after the
payload, and a collective's clock settlement exchanges start times: both are the harness's, not the
modeled cluster's, and are not counted as messages of the cluster. The load of the machine is (the
figure belongs to this host under its load at the time: ``loadavg`` is recorded).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from queue import Empty

from lsgd.core.errors import ConfigError
from lsgd.core.files import write_atomic

#: the network calibration file's format
NETWORK_PROFILE_FORMAT = 1

#: message sizes (bytes) of the ping-pong
DEFAULT_SIZES = (1, 64, 1024)

#: the key of the figure ``network.overhead_us=measured`` reads
OVERHEAD_KEY = "overhead_us"


def network_profile_path() -> Path:
    """Where ``lsgd calibrate --network`` writes this host's per-message overhead and
    ``network.overhead_us=measured`` reads it: ``$XDG_CACHE_HOME/lsgd/network.json``
    (``~/.cache/lsgd/network.json`` when unset), beside the ``cpu`` profile
    (:func:`lsgd.compute.calibration.cpu_profile_path`)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "lsgd" / "network.json"


def _percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, linear between order statistics (numpy's default)."""
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _summary_us(seconds: list[float], scale: float) -> dict:
    """Median, 90th percentile, mean, least and most of ``seconds * scale``, in microseconds."""
    us = [s * scale * 1e6 for s in seconds]
    return {"median": statistics.median(us), "p90": _percentile(us, 90), "mean": statistics.fmean(us),
            "min": min(us), "max": max(us), "n": len(us)}


def _worker(rank: int, world: int, store_path: str, sizes: tuple[int, ...], repeats: int, warmup: int,
            queue) -> None:
    """One of the ``world`` ranks (a spawned process): join a gloo group, time the ping-pongs of
    ranks 0 and 1 (the others wait at a barrier) and the all-reduces of every rank, on rank 0, and
    put ``{"pingpong": {size: [round trip s, ...]}, "allreduce": {...}}`` (rank 0) or None (the
    others) on ``queue``; an exception's text instead if one is raised."""
    try:
        import torch
        import torch.distributed as dist

        from lsgd.comm.communicator import Communicator

        torch.set_num_threads(1)
        store = dist.FileStore(store_path, world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=120))
        try:
            comm = Communicator()
            peer = 1 - rank
            out: dict = {"pingpong": {n: [] for n in sizes}, "allreduce": {n: [] for n in sizes}}
            # the sizes interleaved, repeat by repeat: a phase of load on the machine falls on every size alike
            bufs = {n: (torch.zeros(n, dtype=torch.uint8), torch.zeros(n, dtype=torch.uint8)) for n in sizes}
            for i in range(warmup + repeats if rank < 2 else 0):
                for n in sizes:
                    buf, back = bufs[n]
                    if rank == 0:
                        t0 = time.perf_counter()
                        comm.exchange({peer: buf}, {peer: back}, count=False)
                        if i >= warmup:
                            out["pingpong"][n].append(time.perf_counter() - t0)
                    else:
                        comm.exchange(None, {peer: buf}, count=False)
                        comm.exchange({peer: buf}, None, count=False)
            comm.barrier()
            # all-reduces of the same bytes on every rank (float32 elements: gloo reduces numbers)
            flats = {n: torch.zeros(max(1, n // 4), dtype=torch.float32) for n in sizes}
            for i in range(warmup + repeats):
                for n in sizes:
                    t0 = time.perf_counter()
                    comm.all_reduce(flats[n], count=False)
                    if i >= warmup:
                        out["allreduce"][n].append(time.perf_counter() - t0)
            comm.barrier()
            queue.put(out if rank == 0 else None)
        finally:
            dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 (reported to the parent, which raises)
        queue.put(f"rank {rank}: {type(exc).__name__}: {exc}")
        raise


def measure_overhead(sizes: tuple[int, ...] = DEFAULT_SIZES, repeats: int = 200, warmup: int = 20,
                     timeout_s: float = 300.0, nproc: int = 2) -> dict:
    """Measure this host's per-message overhead ``o`` with ``nproc`` local gloo processes (module
    docstring): ``repeats`` ping-pongs of each size in ``sizes`` (bytes) between ranks 0 and 1 after
    ``warmup`` untimed ones, then as many all-reduces of every rank.

    Returns the record: ``overhead_us`` (the median over every size and repeat of all-reduce time /
    (2 (nproc - 1)) / 2: a ring all-reduce's message steps, each ``2 o + L``: the clock's own count),
    ``overhead_us_p90``, ``overhead_us_mean``, ``allreduce_us`` (``{median, p90, mean, min, max, n}``
    of one all-reduce), ``pingpong_overhead_us`` (round trip / 4, ranks 0 and 1 alone: LogP's ``o``
    with half the loopback latency in) with ``pingpong_overhead_us_p90``, ``one_way_us`` and
    ``by_size`` (``{size: one-way median us}``), and the facts: ``nproc``, ``sizes``, ``repeats``,
    ``backend``, ``cpu``, ``torch``, ``loadavg`` (before, after), ``measured_at``.

    Raises:
        ValueError: ``nproc`` < 2, ``repeats`` < 1, ``warmup`` < 0 or a size < 1 byte.
        RuntimeError: a rank failed or did not answer within ``timeout_s``.
    """
    import multiprocessing as mp

    import torch

    if nproc < 2 or repeats < 1 or warmup < 0 or not sizes or any(int(n) < 1 for n in sizes):
        raise ValueError(f"need nproc >= 2, repeats >= 1, warmup >= 0 and sizes >= 1 byte; got {nproc}, {repeats}, "
                         f"{warmup}, {sizes}")
    sizes = tuple(int(n) for n in sizes)
    ctx = mp.get_context("spawn")  # a fresh interpreter: no torch threads or process group inherited
    queue = ctx.Queue()
    load_before = _loadavg()
    with tempfile.TemporaryDirectory(prefix="lsgd-calibrate-") as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_worker, args=(r, nproc, store, sizes, repeats, warmup, queue), daemon=True)
                 for r in range(nproc)]
        for p in procs:
            p.start()
        results = []
        deadline = time.monotonic() + timeout_s
        try:
            while len(results) < nproc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"lsgd calibrate --network: no answer from the {nproc} gloo ranks within "
                                       f"{timeout_s:g} s")
                try:
                    results.append(queue.get(timeout=min(left, 1.0)))
                except Empty:  # check the ranks are alive
                    dead = [p for p in procs if p.exitcode not in (None, 0)]
                    if dead:
                        raise RuntimeError(f"lsgd calibrate --network: a gloo rank exited with {dead[0].exitcode}") from None
                    continue
                if isinstance(results[-1], str):
                    raise RuntimeError(f"lsgd calibrate --network: {results[-1]}")
            for p in procs:
                p.join(timeout=30)
        finally:
            for p in procs:
                if p.is_alive():
                    p.terminate()
                    p.join(timeout=5)
    out = next(r for r in results if r is not None)
    one_way = [t for n in sizes for t in out["pingpong"][n]]
    allreduce = [t for n in sizes for t in out["allreduce"][n]]
    o = _summary_us(allreduce, 0.5 / (2 * (nproc - 1)))  # 2 (p - 1) steps of 2 o (+ L)
    pp = _summary_us(one_way, 0.25)                      # round trip / 4: o + L/2 per message end
    return {
        OVERHEAD_KEY: o["median"],
        "overhead_us_p90": o["p90"],
        "overhead_us_mean": o["mean"],
        "allreduce_us": _summary_us(allreduce, 1.0),
        "pingpong_overhead_us": pp["median"],
        "pingpong_overhead_us_p90": pp["p90"],
        "one_way_us": _summary_us(one_way, 0.5),
        "by_size": {str(n): statistics.median(t * 0.5e6 for t in out["pingpong"][n]) for n in sizes},
        "nproc": int(nproc),
        "sizes": list(sizes),
        "repeats": int(repeats),
        "backend": "gloo",
        "cpu": _cpu_name(),
        "hostname": platform.node(),
        "torch": torch.__version__,
        "loadavg": [load_before, _loadavg()],
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def overhead_line(record: dict) -> str:
    """The override to paste: ``network.overhead_us=<median, 1 decimal>``."""
    return f"network.overhead_us={record[OVERHEAD_KEY]:.1f}"


def write_network_profile(record: dict, path: Path | None = None) -> Path:
    """Store ``record`` (:func:`measure_overhead`) as the network calibration file (replacing the
    previous one), atomically (a temporary file, then ``os.replace``)."""
    path = network_profile_path() if path is None else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"format": NETWORK_PROFILE_FORMAT, "record": record}, indent=2, sort_keys=True) + "\n"
    write_atomic(path, text)
    return path


def read_network_profile(path: Path | None = None) -> dict | None:
    """The network calibration record (:func:`measure_overhead`), or None when there is none (or
    one of another format).

    Raises:
        ConfigError: the file exists but cannot be read.
    """
    path = network_profile_path() if path is None else Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"the network calibration file {path} is unreadable ({exc}); "
                          "run `lsgd calibrate --network` to rewrite it") from None
    if not isinstance(data, dict) or data.get("format") != NETWORK_PROFILE_FORMAT or not isinstance(data.get("record"), dict):
        return None
    return data["record"]
