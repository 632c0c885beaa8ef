"""Adasum reduction time vs a plain SUM all-reduce of the same tensors, side by side in one run.

    python scripts/bench_adasum.py [--workers 4 8] [--repeats 7] [--quick]

On ``--workers`` gloo ranks (spawned, one thread each) it times, alternating the order every repeat,

(a) :func:`lsgd.algorithms.adasum.adasum.adasum_reduce_` of a parameter-shaped tensor list (vector halving,
    distance doubling, per-tensor float64 dot products) through an :class:`lsgd.comm.communicator.Communicator`
    of the default group without a clock (as training runs it, counting included; no clock
    messages), and
(b) ``dist.all_reduce`` (SUM) of the same tensors coalesced the same way (one flat buffer per dtype,
    kept between calls as Adasum keeps its own and Horovod its fusion buffer: ``torch.cat`` into
    it, all-reduce, copy back), the cheapest exact reduction, called directly,

for two lists: ResNet-50's parameter shapes (``torchvision.models.resnet50()``, 161 tensors, 25.6M
float32) and the leading ResNet-50 shapes up to 1M floats. A repeat's time is the slowest rank's
(max over ranks); the table shows medians over repeats (ms) and the ratio adasum / all-reduce: the
median over repeats of each repeat's ratio of its two adjacent timings (as bench_overhead.py does;
robust to the machine's load drifting during the run), with the 1M list repeated
:data:`SMALL_REPEATS` x ``--repeats`` times (a repeat takes ~30 ms: the all-reduce of it swung
7-13 ms at 4 ranks between runs of 7 repeats) (goals: <= 1.3 for ResNet-50's list, <= 1.8 for the 1M list, whose small tensors pay per-tensor
and per-level overheads; Maleki et al. 2021: "almost as efficient as simply summing"), and the CPU time
(user + system, all threads of the process, mean over ranks and repeats, ms) each method costs one
rank: when ranks x CPU per rank exceeds cores x wall time the run is CPU-bound (more ranks than
cores), and the wall ratio is the CPU ratio rather than the network's. ``--quick``: 3 repeats and
the 1M list only. The load average before and after is printed (a shared machine), and the last
lines follow the bench convention, one per (list, workers): ``BENCH adasum_<list>_w<workers>_ratio
<now> <= <goal>``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lsgd.algorithms.adasum.adasum import adasum_reduce_
from lsgd.comm.communicator import Communicator
from lsgd.launch.spawn import free_port


#: goal of the adasum / all-reduce wall ratio per list
GOALS = {"resnet50": 1.3, "1m": 1.8}
#: the 1M list's repeats per ``--repeats`` (its repeats are cheap, its timings noisy)
SMALL_REPEATS = 5


def shapes(which: str) -> list[torch.Size]:
    import torchvision

    all_shapes = [p.shape for p in torchvision.models.resnet50().parameters()]
    if which == "resnet50":
        return all_shapes
    out, total = [], 0
    for s in all_shapes:
        if total + s.numel() > 1 << 20:
            break
        out.append(s)
        total += s.numel()
    return out


_FLAT: dict = {}  # the comparator's fusion buffer, kept between calls as Adasum keeps its own


def coalesced_all_reduce(tensors: list[torch.Tensor]) -> None:
    n = sum(t.numel() for t in tensors)
    key = (tensors[0].dtype, tensors[0].device)
    flat = _FLAT.get(key)
    if flat is None or flat.numel() < n:
        flat = _FLAT[key] = torch.empty(n, dtype=tensors[0].dtype, device=tensors[0].device)
    flat = flat[:n]
    torch.cat([t.reshape(-1) for t in tensors], out=flat)
    dist.all_reduce(flat)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def cpu_seconds() -> float:
    """User + system CPU seconds of this process (all threads: gloo's transport thread too)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fn, tensors) -> tuple[float, float]:
    """(wall seconds of the slowest rank, CPU seconds of this rank) of ``fn(tensors)``."""
    dist.barrier()
    c0, t0 = cpu_seconds(), time.perf_counter()
    fn(tensors)
    dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    cpu = cpu_seconds() - c0
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    return float(dt), cpu


def worker(rank: int, world: int, port: int, lists: list[str], repeats: int, queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))
    try:
        for which in lists:
            g = torch.Generator().manual_seed(rank)
            ref = [torch.randn(s, generator=g) for s in shapes(which)]
            work = [t.clone() for t in ref]
            times = {"adasum": [], "all_reduce": []}
            cpu = {"adasum": [], "all_reduce": []}
            comm = Communicator()

            def adasum(tensors, comm=comm):
                adasum_reduce_(tensors, comm)

            fns = {"adasum": adasum, "all_reduce": coalesced_all_reduce}
            timed(adasum, work)  # warm-up (connections, allocator)
            timed(coalesced_all_reduce, work)
            for rep in range(repeats * (SMALL_REPEATS if which == "1m" else 1)):
                order = ["adasum", "all_reduce"] if rep % 2 == 0 else ["all_reduce", "adasum"]
                for name in order:
                    for w, r in zip(work, ref):
                        w.copy_(r)
                    wall, cpu_s = timed(fns[name], work)
                    times[name].append(wall)
                    cpu[name].append(cpu_s)
            mean_cpu = torch.tensor([statistics.mean(cpu["adasum"]), statistics.mean(cpu["all_reduce"])],
                                    dtype=torch.float64)
            dist.all_reduce(mean_cpu)
            mean_cpu /= world
            if rank == 0:
                n = sum(t.numel() for t in ref)
                ratio = statistics.median(a / r for a, r in zip(times["adasum"], times["all_reduce"]))
                queue.put((world, which, len(ref), n, statistics.median(times["adasum"]),
                           statistics.median(times["all_reduce"]), ratio, *mean_cpu.tolist()))
        # every rank is done with the group before any tears it down (a rank destroying its gloo
        # context while a peer's last messages are in flight can abort: tests/distributed/gloo.py)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--lists", nargs="+", default=["resnet50", "1m"], choices=["resnet50", "1m"])
    ap.add_argument("--quick", action="store_true", help="3 repeats, 1M list only")
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats, args.lists = 3, ["1m"]
    ctx = mp.get_context("spawn")
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = []
    for world in args.workers:
        queue = ctx.SimpleQueue()
        mp.spawn(worker, args=(world, free_port(), args.lists, args.repeats, queue), nprocs=world, join=True)
        while not queue.empty():
            rows.append(queue.get())
    print(f"{'workers':>7} {'list':>9} {'tensors':>7} {'floats':>10} {'adasum_ms':>10} {'allreduce_ms':>12} "
          f"{'ratio':>6} {'adasum_cpu_ms':>13} {'allreduce_cpu_ms':>16}")
    for world, which, k, n, ta, tr, ratio, ca, cr in rows:
        print(f"{world:>7} {which:>9} {k:>7} {n:>10} {ta * 1e3:>10.1f} {tr * 1e3:>12.1f} {ratio:>6.2f} "
              f"{ca * 1e3:>13.1f} {cr * 1e3:>16.1f}")
    print(f"(medians of {args.repeats} repeats ({args.repeats * SMALL_REPEATS} for the 1M list), slowest rank per repeat; {os.cpu_count()} CPU cores shared by all ranks; "
          f"load average before {load_before}, after " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + ")")
    for world, which, k, n, ta, tr, ratio, ca, cr in rows:
        print(f"BENCH adasum_{which}_w{world}_ratio {ratio:.3f} <= {GOALS[which]}")


if __name__ == "__main__":
    main()
