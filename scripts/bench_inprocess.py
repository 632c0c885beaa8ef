"""The in-process cluster against worker processes, side by side in one run (issue 38).

    python scripts/bench_inprocess.py [--workers 4 8 16] [--steps 70] [--scale 64 128 256] [--repeats 1]

Throughput: the same run (the Fashion-MNIST CNN, local SGD with H = 4, batch 16 per worker, no
evaluation inside the run) through the real ``lsgd train``, once with ``launcher=local`` (gloo
processes) and once with ``launcher=inprocess launcher.threads_per_worker=1``, for each ``--workers`` count (``--repeats`` times,
alternating which mode goes first). A run's records (``log_every`` = 10) cut it into intervals of
10 steps; each interval after the first record is one repeat of the figure, worker-steps per second
from the records' ``wall_time_s`` (starting processes, importing torch and building the model do
not count), and a mode's figure is the median over its intervals (6 with the defaults). The
speedup is in-process over processes at each count. Goal: >= 2 at n = 16.

Memory: in-process runs of the same config for a few steps at each ``--scale`` count, the peak
resident memory of the ``lsgd train`` process (``/usr/bin/time``'s maximum RSS; where it is missing,
``getrusage`` of the children), and the largest count within 8 GiB. Goal: n = 256 within 8 GiB.
Memory per worker is the slope between the smallest and largest count (the process's torch,
data set and code are shared).

The last lines follow the bench convention (``BENCH <name> <now> <op> <goal>``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

LSGD = [sys.executable, "-m", "lsgd.cli", "train"]
#: the in-process side runs on one torch thread (launcher.threads_per_worker=1): for this model one thread
#: is faster than two (docs/benchmarks.md); the processes get the local launch's cores // n (1 here)
INPROCESS_THREADS = ["launcher.threads_per_worker=1"]
CONFIG = ["model=cnn", "dataset=fashion_mnist", "algo=local_sgd", "algo.local_steps=4", "batch_size=16",
          "eval_unit=step", "eval_every=100000", "checkpoint_every=0", "log_every=10", "logger=[jsonl]"]
LIMIT_BYTES = 8 * 1024**3


def _run(args: list[str], results: Path) -> tuple[Path, int]:
    """One ``lsgd train``; returns its run folder and its peak RSS in bytes."""
    timer = Path("/usr/bin/time").exists()
    results.mkdir(parents=True, exist_ok=True)
    stats = results.with_suffix(".rss")
    cmd = (["/usr/bin/time", "-f", "%M", "-o", str(stats)] if timer else []) + LSGD + args + [f"results_dir={results}"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, WANDB_MODE="disabled"))
    if res.returncode != 0:
        raise RuntimeError(f"lsgd train {' '.join(args)} failed:\n{res.stderr[-3000:]}")
    rss = int(stats.read_text().split()[-1]) * 1024 if timer else resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    (run,) = [p.parent for p in results.rglob("metrics.jsonl")]
    return run, rss


def worker_steps_per_s(run: Path, workers: int) -> list[float]:
    """Worker-steps per second of each interval between consecutive records of ``run``."""
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [(b["step"] - a["step"]) * workers / (b["wall_time_s"] - a["wall_time_s"]) for a, b in zip(recs, recs[1:])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--steps", type=int, default=70)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--scale", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--scale-steps", type=int, default=4)
    args = ap.parse_args(argv)
    print(f"load average before: {os.getloadavg()}", flush=True)
    speedups = {}
    with tempfile.TemporaryDirectory() as tmp:
        print("workers | processes worker-steps/s | in-process worker-steps/s | speedup", flush=True)
        for n in args.workers:
            rates: dict[str, list[float]] = {"local": [], "inprocess": []}
            for rep in range(args.repeats):
                order = ["local", "inprocess"] if rep % 2 == 0 else ["inprocess", "local"]
                for mode in order:
                    out = Path(tmp, f"t{n}-{mode}-{rep}")
                    run, _ = _run([*CONFIG, f"launcher={mode}", f"launcher.nproc_per_node={n}",
                                   f"max_steps={args.steps}", *(INPROCESS_THREADS if mode == "inprocess" else [])], out)
                    rates[mode] += worker_steps_per_s(run, n)
            procs, inproc = statistics.median(rates["local"]), statistics.median(rates["inprocess"])
            speedups[n] = inproc / procs
            print(f"{n:7d} | {procs:24.1f} | {inproc:25.1f} | {speedups[n]:.2f}", flush=True)
        print("\nin-process workers | peak RSS (GiB) | within 8 GiB", flush=True)
        memory = {}
        for n in args.scale:
            out = Path(tmp, f"m{n}")
            _, rss = _run([*CONFIG, "launcher=inprocess", *INPROCESS_THREADS, f"launcher.nproc_per_node={n}",
                           f"max_steps={args.scale_steps}", "log_every=2"], out)
            memory[n] = rss
            print(f"{n:18d} | {rss / 1024**3:14.2f} | {'yes' if rss <= LIMIT_BYTES else 'no'}", flush=True)
            if rss > LIMIT_BYTES:
                break
    fitting = [n for n, rss in memory.items() if rss <= LIMIT_BYTES]
    lo, hi = min(memory), max(memory)
    if hi > lo:
        print(f"memory per worker: {(memory[hi] - memory[lo]) / (hi - lo) / 1024**2:.1f} MiB "
              f"(slope between {lo} and {hi} workers)")
    print(f"load average after: {os.getloadavg()}")
    key = 16 if 16 in speedups else max(speedups)
    print(f"BENCH inprocess_speedup_n{key} {speedups[key]:.3f} >= 2")
    print(f"BENCH inprocess_workers_within_8GiB {max(fitting) if fitting else 0} >= 256")
    return 0


if __name__ == "__main__":
    sys.exit(main())
