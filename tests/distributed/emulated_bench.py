"""Timed gloo transfers between two workers on an emulated cluster (lsgd.launch.emulate), for the
calibration test and by hand (``python tests/distributed/emulated_bench.py [CAP_MBIT ...]``).

:func:`measure` builds a 2-node emulated cluster, starts 2 processes (one per namespace, gloo bound
to its veth) once, and for each cap (``lsgd.launch.emulate.set_rate`` between caps) times ``repeats``
point-to-point transfers of ``nbytes`` (rank 0 -> rank 1, rank 1 answering with one element) and
``repeats`` all-reduces of ``nbytes`` (float32; after a change of cap, after one untimed), as rank 0 sees them. Around each phase it reads the
byte counter of the tbf on rank 1's ingress (the bridge-side veth): bytes as tbf meters them (frames
with their Ethernet, IP and TCP headers, ACKs included) per payload byte.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import subprocess
import time
from dataclasses import asdict
from datetime import timedelta


def _sent(dev: str) -> int:
    """Bytes the root qdisc (tbf) of ``dev`` (host namespace) has sent, from ``tc -s qdisc``."""
    out = subprocess.run(["tc", "-s", "qdisc", "show", "dev", dev, "root"], capture_output=True, text=True,
                         check=True).stdout
    return int(re.search(r"Sent (\d+) bytes", out).group(1))


def _phases(schedule: list[tuple], nbytes: int) -> list[tuple[float, int, int]]:
    """``(cap_mbit, repeats, nbytes)`` of each entry of ``schedule`` (``nbytes``: where it names none)."""
    return [(entry[0], entry[1], entry[2] if len(entry) > 2 else nbytes) for entry in schedule]


def _worker(rank: int, plan: dict, port: int, nbytes: int, schedule: list, queue) -> None:
    import torch
    import torch.distributed as dist

    from lsgd.launch.emulate import Plan, enter_node

    p = Plan(**plan)
    enter_node(p, rank)
    # the calibration measures the links, not the scheduler of a shared machine: the ring all-reduce
    # needs this process to run between segments (at load average 8-12 on 2 cores it ran up to 12%
    # over the cap's time at normal priority)
    os.setpriority(os.PRIO_PROCESS, 0, -15)
    torch.set_num_threads(1)
    store = dist.TCPStore(p.master_addr, port, 3, is_master=False, timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=120))
    ack = torch.zeros(1)
    for i, (_, repeats, n) in enumerate(_phases(schedule, nbytes)):
        x = torch.ones(n // 4)
        times = {"p2p": [], "allreduce": []}
        store.wait([f"p2p{i}"])
        for _ in range(repeats):
            dist.barrier()
            t = time.perf_counter()
            if rank == 0:
                dist.send(x, 1)
                dist.recv(ack, 1)
            else:
                dist.recv(x, 0)
                dist.send(ack, 0)
            times["p2p"].append(time.perf_counter() - t)
        dist.barrier()
        if rank == 0:
            queue.put(("p2p", i))
        store.wait([f"allreduce{i}"])
        if i:  # untimed, after a change of cap: TCP settles at it (the first exchange ran up to 12% slower)
            dist.all_reduce(x)
        for _ in range(repeats):
            dist.barrier()
            t = time.perf_counter()
            dist.all_reduce(x)
            times["allreduce"].append(time.perf_counter() - t)
        dist.barrier()
        if rank == 0:
            queue.put(("done", i, times))
    dist.destroy_process_group()


def measure(schedule: list[tuple], nbytes: int = 16 * 2**20, gpus_per_node: int = 1) -> list[dict]:
    """For each ``(cap_mbit, repeats)`` of ``schedule`` (or ``(cap_mbit, repeats, nbytes)``: a size of
    its own): rank 0's times (s) of each repeat of a
    point-to-point transfer and of an all-reduce of ``nbytes``, and the wire bytes per payload byte
    of each phase (through the second node's ingress; 0 with ``gpus_per_node=2``: one node).

    Returns one dict per cap: ``cap_mbit``, ``nbytes``, ``p2p``, ``allreduce`` (lists of seconds),
    ``p2p_wire_factor``, ``allreduce_wire_factor``, ``run`` (the cluster's id).
    """
    import torch.distributed as dist

    from lsgd.launch.emulate import cluster, set_rate

    cfg = {"network": {"bandwidth_gbps": schedule[0][0] / 1000, "latency_us": 0}, "cluster": {"gpus_per_node": gpus_per_node}}
    ctx = mp.get_context("spawn")
    out = []
    with cluster(cfg, 2) as plan:
        store = dist.TCPStore("0.0.0.0", 0, 3, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=120))
        queue = ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(r, asdict(plan), store.port, nbytes, schedule, queue))
                 for r in range(2)]
        for p in procs:
            p.start()
        h1 = plan.host_if(plan.nodes - 1)
        try:
            for i, (cap, repeats, n) in enumerate(_phases(schedule, nbytes)):
                set_rate(plan, int(cap * 1e6))
                before = _sent(h1)
                store.set(f"p2p{i}", "go")
                assert queue.get(timeout=300) == ("p2p", i)
                mid = _sent(h1)
                store.set(f"allreduce{i}", "go")
                _, j, times = queue.get(timeout=300)
                end = _sent(h1)
                # p2p: rank 0 -> rank 1 enters rank 1's node through h1 (the 4-byte answer goes the
                # other way); all-reduce of 2 ranks (repeats, + 1 untimed after a change): rank 0 sends nbytes to rank 1
                # each time (n/2 + n/2)
                out.append(dict(times, cap_mbit=cap, nbytes=n, run=plan.run, p2p_wire_factor=(mid - before) / (repeats * n),
                                allreduce_wire_factor=(end - mid) / ((repeats + bool(i)) * n)))
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
            del store
    return out


if __name__ == "__main__":
    import statistics
    import sys

    from lsgd.launch.emulate import WIRE_FACTOR

    caps = [float(a) for a in sys.argv[1:]] or [50, 200, 1000]
    for r in measure([(c, 3) for c in caps]):
        pred = 16 * 2**20 * 8 * WIRE_FACTOR / (r["cap_mbit"] * 1e6)
        for op in ("p2p", "allreduce"):
            m = statistics.median(r[op])
            print(f"{r['cap_mbit']:6g} Mbit/s {op:9s} predicted {pred:.3f} s measured {m:.3f} s "
                  f"({', '.join(f'{t:.3f}' for t in r[op])}) err {m / pred - 1:+.1%} wire factor "
                  f"{r[op + '_wire_factor']:.4f}", flush=True)
