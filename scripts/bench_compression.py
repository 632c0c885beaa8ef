"""Cost of the compressors, measured side by side in one run.

    python scripts/bench_compression.py [--sizes 1000000 25000000] [--reps 7] [--workers 4]
                                        [--threads N] [--device cpu|cuda] [--quick] [--figures]

Prints three tables (times are medians over ``--reps`` repetitions after one warm-up, in ms):

(a) per compressor (none, fp16, topk@10, topk@1000, randomk@10, dgc@10, dgc@1000, redsync@1000,
    qsgd) and tensor size (float32 elements): encode+decode time, the payload bytes, and the ratio
    (encode+decode) / (dense all-reduce of the same tensor on ``--workers`` gloo ranks, spawned with
    torch.multiprocessing in the same run, one thread each; the compressors run on rank 0 with the
    main process's thread count);
(b) DGC's sampled-threshold top-k vs exact top-k at CF 1000 on the largest size (encode only):
    the speedup (goal >= 8x; Lin et al., ICLR 2018, Sec. 3 motivates the sampling by this cost);
(c) GraVAC's multi-level compression (docs/papers.md#gravac): ``compress_further(topk@10 output, 100)``
    vs top-k from scratch at 1000 on the raw tensor, and the same for dgc: time ratio
    scratch / multi-level for the candidate alone, and for one GraVAC iteration, which needs both
    CFs: (theta_min from scratch + candidate from scratch) / (theta_min + candidate from the
    theta_min output), the comparison of the paper's Table 3 (1.4-1.8x for Top-k).

``--quick`` uses sizes 100000 and 1000000 and 3 repetitions (a smoke run). ``--figures`` (what
``make bench`` runs) measures only the issue's figures on the largest size: random-k@10, QSGD and
none against the dense all-reduce, and (b).

The dense all-reduce and the compressors are interleaved repetition by repetition in the same
processes (an all-reduce on all ranks, then each compressor's encode+decode on rank 0 while the
others wait), so drifting load on a shared machine hits both sides alike. The run
ends with one line per goal (``BENCH <figure> <now> <op> <goal>``, collected by
``scripts/bench_all.py``): ``randomk_vs_allreduce`` <= 0.5 and ``qsgd_vs_allreduce`` <= 1
(encode+decode / dense all-reduce, largest size) and ``dgc_speedup_vs_topk`` >= 8 (b).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from lsgd.compression import build
from lsgd.launch.spawn import free_port

CONFIGS = [
    ("none", "none", {}),
    ("fp16", "fp16", {}),
    ("topk@10", "topk", {"cf": 10}),
    ("topk@1000", "topk", {"cf": 1000}),
    ("randomk@10", "randomk", {"cf": 10}),
    ("dgc@10", "dgc", {"cf": 10}),
    ("dgc@1000", "dgc", {"cf": 1000}),
    ("redsync@1000", "redsync", {"cf": 1000}),
    ("qsgd", "qsgd", {}),
]
#: the configurations ``--figures`` times (none: the floor of any decompress, for reference)
FIGURE_CONFIGS = ("none", "randomk@10", "qsgd")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_time(fn, reps: int, device: torch.device) -> float:
    """Median seconds of ``fn()`` over ``reps`` calls after one warm-up call."""
    fn()
    _sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def paired_times(fa, fb, reps: int, device: torch.device) -> tuple[float, float]:
    """Median seconds of ``fa()`` and of ``fb()``, called alternately (a, b, a, b, ...) after one
    warm-up each, so drifting load on a shared machine hits both alike."""
    fa()
    fb()
    _sync(device)
    ta, tb = [], []
    for _ in range(reps):
        for fn, times in ((fa, ta), (fb, tb)):
            t0 = time.perf_counter()
            fn()
            _sync(device)
            times.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb)


# -- dense all-reduce on gloo ranks, interleaved with the compressors on rank 0 ------------------------
def _interleaved_worker(rank, world, port, sizes, reps, configs, threads, device, queue):
    """Every repetition: one dense all-reduce on all ranks (one thread each), then, while the others
    wait at a barrier, one encode+decode of each compressor on rank 0 with ``threads`` threads."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=900))
    try:
        out = {}
        for n in sizes:
            buf = torch.randn(n)
            x = torch.randn(n, generator=torch.Generator().manual_seed(0)).to(device)
            comps = {label: build(name, **params) for label, name, params in configs} if rank == 0 else {}

            def enc_dec(label):
                comp = comps[label]
                comp.decompress(comp.compress(x, step=1, key=0))
                _sync(torch.device(device))

            dist.all_reduce(buf)  # warm-up
            if rank == 0:
                torch.set_num_threads(threads)
                for label in comps:
                    enc_dec(label)
                torch.set_num_threads(1)
            ar, enc = [], {label: [] for label in comps}
            for _ in range(reps):
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(buf)
                ar.append(time.perf_counter() - t0)
                dist.barrier()
                if rank == 0:
                    torch.set_num_threads(threads)
                    for label in comps:
                        t0 = time.perf_counter()
                        enc_dec(label)
                        enc[label].append(time.perf_counter() - t0)
                    torch.set_num_threads(1)
                dist.barrier()
            if rank == 0:
                nbytes = {label: comps[label].compress(x, step=1, key=0).nbytes for label in comps}
                out[n] = (ar, enc, nbytes)
        if rank == 0:
            queue.put(out)
    finally:
        dist.destroy_process_group()


def interleaved_times(sizes, reps, world, configs, threads, device):
    """{n: (all-reduce seconds per rep, {label: enc+dec seconds per rep}, {label: payload bytes})}."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_interleaved_worker, args=(world, free_port(), sizes, reps, configs, threads, str(device), queue),
                       nprocs=world, join=True, start_method="spawn")
    return queue.get()


# -- tables -------------------------------------------------------------------------------------------
def table(headers: list[str], rows: list[list]) -> str:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths))
    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line, sep] + ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 25_000_000],
                        help="tensor sizes in float32 elements")
    parser.add_argument("--reps", type=int, default=7, help="timed repetitions per measurement")
    parser.add_argument("--workers", type=int, default=4, help="gloo ranks of the dense all-reduce")
    parser.add_argument("--threads", type=int, default=None, help="torch threads for the compressors")
    parser.add_argument("--device", default="cpu", help="device of the compressor timings")
    parser.add_argument("--quick", action="store_true", help="sizes 100000 and 1000000, 3 repetitions")
    parser.add_argument("--figures", action="store_true",
                        help="only the issue's figures (random-k@10, qsgd, none and (b)) on the largest size")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.reps = [100_000, 1_000_000], 3
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sizes = sorted(args.sizes)

    t_start = time.perf_counter()
    configs = [c for c in CONFIGS if c[0] in FIGURE_CONFIGS] if args.figures else CONFIGS
    if args.figures:
        sizes = sizes[-1:]
    threads = torch.get_num_threads()
    res = interleaved_times(sizes, args.reps, args.workers, configs, threads, device)
    print(f"device {device}, {threads} torch threads for compression; dense all-reduce on {args.workers} gloo "
          f"ranks (1 thread each), interleaved with the compressors rep by rep; medians of {args.reps} reps; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores\n")
    ar = {n: statistics.median(res[n][0]) for n in sizes}
    enc_dec = {(label, n): statistics.median(res[n][1][label]) for n in sizes for label, _, _ in configs}
    rows = []
    for n in sizes:
        for label, _, _ in configs:
            t = enc_dec[label, n]
            rows.append([label, f"{n:,}", f"{t * 1e3:.1f}", f"{res[n][2][label]:,}", f"{ar[n] * 1e3:.1f}",
                         f"{t / ar[n]:.2f}"])
    print("(a) encode+decode vs dense all-reduce")
    print(table(["compressor", "size", "enc+dec ms", "payload B", "allreduce ms", "ratio"], rows))

    n = sizes[-1]
    x = torch.randn(n, generator=torch.Generator().manual_seed(1)).to(device)
    topk, dgc = build("topk", cf=1000), build("dgc", cf=1000)
    t_topk, t_dgc = paired_times(lambda: topk.compress(x), lambda: dgc.compress(x, step=1), args.reps, device)
    print(f"\n(b) sampled vs exact top-k at CF 1000 on {n:,} floats (encode)")
    print(table(["exact topk ms", "dgc ms", "speedup"],
                [[f"{t_topk * 1e3:.1f}", f"{t_dgc * 1e3:.1f}", f"{t_topk / t_dgc:.2f}x"]]))
    figures = [("randomk_vs_allreduce", enc_dec["randomk@10", n] / ar[n], "<=", 0.5),
               ("qsgd_vs_allreduce", enc_dec["qsgd", n] / ar[n], "<=", 1),
               ("dgc_speedup_vs_topk", t_topk / t_dgc, ">=", 8)]
    if args.figures:
        print(f"\ntotal {time.perf_counter() - t_start:.0f} s; load average {os.getloadavg()[0]:.2f}")
        for name, now, op, goal in figures:
            print(f"BENCH {name} {now:.3f} {op} {goal:g}")
        return

    rows = []
    for label, name in (("topk", "topk"), ("dgc", "dgc")):
        comp = build(name, cf=10)
        first = comp.compress(x, step=1)
        t_further, t_scratch = paired_times(lambda comp=comp, first=first: comp.compress_further(first, 100, step=1),
                                            lambda comp=comp: comp.compress(x, step=1, cf=1000), args.reps, device)
        t_first = median_time(lambda comp=comp: comp.compress(x, step=1), args.reps, device)
        rows.append([label, f"{t_first * 1e3:.1f}", f"{t_further * 1e3:.1f}", f"{t_scratch * 1e3:.1f}",
                     f"{t_scratch / t_further:.2f}x", f"{(t_first + t_scratch) / (t_first + t_further):.2f}x"])
    print(f"\n(c) GraVAC multi-level on {n:,} floats: compress_further(@10 output, 100) vs from scratch @1000")
    print(table(["compressor", "@10 ms", "further ms", "scratch@1000 ms", "scratch/further",
                 "both CFs: separate/multi-level"], rows))
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s; load average {os.getloadavg()[0]:.2f}")
    for name, now, op, goal in figures:
        print(f"BENCH {name} {now:.3f} {op} {goal:g}")


if __name__ == "__main__":
    main()
