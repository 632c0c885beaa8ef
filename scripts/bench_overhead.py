"""Overhead of lsgd's training loop, measured side by side in one run on the same processes.

    python scripts/bench_overhead.py [--workers 4] [--rounds 24] [--block 15] [overrides...]

On ``--workers`` gloo workers (the demo configuration by default: cnn on Fashion-MNIST, local
batch 32) it times, in alternating blocks of ``--block`` steps over the same batches (each round
runs the four cases, in reversed order every other round, so each lsgd block has its comparator
next to it in time):

(a) lsgd ``ddp`` (Trainer.train_step + its bookkeeping) vs a plain hand-written torch DDP
    loop (forward, backward, SGD step): goal ratio <= 1.03;
(b) lsgd ``local_sgd`` with H = 10**9 (no sync inside the run) vs a plain single-process loop on each
    worker: goal ratio <= 1.03. The plain loop trains the lsgd trainer's own model (its own SGD
    optimizer, the same hyperparameters): the parameters' place in memory alone moved two plain
    loops of two copies of the model by up to 10% against each other here (one process, the same
    code, alternating blocks), more than the overhead measured;
(c) samples/s (all workers) of the demo configuration under lsgd ddp and local_sgd.

A figure is the ratio of the two cases' total times over all ``--rounds`` rounds (at least 5): the
mean step time of lsgd over the mean step time of its comparator, each a block's slowest rank
(every block ends in a barrier). Why a ratio of sums: lsgd's costs that fall on some steps only
(a record every ``log_every`` steps: a loss all-reduce and a figures all-gather; the stop
agreement's message every 8th step) land in some blocks and not others; the median of per-round
ratios, which this script printed before, takes the middle block and so leaves out the blocks
that hold a record (a third of them at 15-step blocks and records every 50 steps); the ratio of
sums charges every step what it cost, as a run pays it. Pairing blocks in time (alternating order)
cancels the machine's drift; the many rounds average the blocks' jitter. Beside it: the 90%
interval of the figure over rounds resampled with replacement (bootstrap, 2000 draws; how far
another run of the same length may land), the median, min and max of the per-round ratios, and
the same ratio of CPU seconds (user + system of the worker process, all its threads, summed over
ranks): on a loaded machine the wall ratio also holds the time a worker waited for a core, the
CPU ratio not. The load average before and after the run is printed (the machine is shared:
ratios are only comparable within one run). The last lines follow the bench convention:
``BENCH <name> <now> <op> <goal>``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from lsgd.launch.spawn import free_port


def compose(overrides: list[str]) -> dict:
    from lsgd.config.validation import compose_config

    cfg = compose_config(overrides, check=False)
    cfg.update(run_id="bench", eval_unit="step", eval_every=10**9, checkpoint_every=0, epochs=1000, max_steps=None)
    return cfg


def make_trainer(cfg: dict, algo: dict, run_dir: str, watch: bool = True):
    from lsgd.training.preemption import PreemptionWatch
    from lsgd.training.trainer import Trainer

    cfg = dict(cfg, algo=algo)
    # as `lsgd train` runs (lsgd.training.trainer.train: launcher.interrupts defaults to true): Ctrl-C is
    # watched, so the ranks agree on a step to stop at (lsgd.training.preemption); no handler is installed
    trainer = Trainer(cfg, run_dir, "cpu", PreemptionWatch("off", interrupts=True) if watch else None)
    trainer.start_time = time.perf_counter()
    trainer.recorder.start(trainer.samples)
    return trainer


GOAL = 1.03


def cpu_seconds() -> float:
    """User + system CPU seconds of this process (all threads: gloo's too)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed_block(fn, batches) -> tuple[float, float]:
    """(wall seconds per step, this rank's CPU seconds per step) of ``fn`` over ``batches``."""
    dist.barrier()
    c0, t0 = cpu_seconds(), time.perf_counter()
    for x, y in batches:
        fn(x, y)
    dist.barrier()
    return (time.perf_counter() - t0) / len(batches), (cpu_seconds() - c0) / len(batches)


def bootstrap_interval(a: list[float], b: list[float], draws: int = 2000, level: float = 0.9) -> tuple[float, float]:
    """The central ``level`` interval of ``sum(a) / sum(b)`` over the rounds resampled with
    replacement (pairs ``(a[i], b[i])`` kept together; a fixed seed, so a run prints one answer)."""
    rng = random.Random(0)
    n = len(a)
    ratios = []
    for _ in range(draws):
        idx = [rng.randrange(n) for _ in range(n)]
        ratios.append(sum(a[i] for i in idx) / sum(b[i] for i in idx))
    ratios.sort()
    return ratios[int((1 - level) / 2 * draws)], ratios[int((1 + level) / 2 * draws) - 1]


def worker(rank: int, world: int, port: int, args, overrides: list[str]) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    from lsgd.models import build_model
    from lsgd.training.optim import build_optimizer

    cfg = compose(overrides)
    run_dir = tempfile.mkdtemp(prefix=f"lsgd-bench-{rank}-") if rank == 0 else tempfile.mkdtemp()
    lsgd_ddp = make_trainer(cfg, {"name": "ddp", "bucket_cap_mb": 25}, run_dir, not args.no_watch)
    lsgd_local = make_trainer(cfg, {"name": "local_sgd", "local_steps": 10**9, "average_buffers": True,
                                    "buffer_policy": "maintain"}, run_dir, not args.no_watch)
    n = args.block * (args.rounds + 1)
    it = itertools.chain.from_iterable(lsgd_ddp.loader.batches(epoch) for epoch in itertools.count())
    batches = [next(it) for _ in range(n)]  # (over epochs: 468 steps per epoch of a 4-worker shard)

    def plain_model():
        torch.manual_seed(cfg["seed"])
        model = build_model(cfg["model"], lsgd_ddp.info)
        return model, build_optimizer(model.parameters(), cfg["optim"])

    ddp_model, ddp_opt = plain_model()
    ddp_model = DistributedDataParallel(ddp_model, bucket_cap_mb=25)
    # the plain loop trains lsgd local_sgd's own model (module docstring: memory placement)
    single_model = lsgd_local.model
    single_opt = build_optimizer(single_model.parameters(), cfg["optim"])

    def plain_step(model, opt):
        def step(x, y):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return step

    def lsgd_step(trainer):
        def step(x, y):
            trainer.train_step(x, y)
            trainer.bookkeeping()
        return step

    cases = {
        "lsgd_ddp": lsgd_step(lsgd_ddp),
        "plain_ddp": plain_step(ddp_model, ddp_opt),
        "lsgd_local": lsgd_step(lsgd_local),
        "plain_single": plain_step(single_model, single_opt),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    cpus: dict[str, list[float]] = {k: [] for k in cases}
    for name, fn in cases.items():  # warm-up block, not timed
        timed_block(fn, batches[: args.block])
    for r in range(args.rounds):
        block = batches[(r + 1) * args.block : (r + 2) * args.block]
        order = list(cases) if r % 2 == 0 else list(reversed(cases))
        for name in order:
            wall, cpu = timed_block(cases[name], block)
            times[name].append(wall)
            cpus[name].append(cpu)
    cpu_sum = torch.tensor([cpus[k] for k in cases], dtype=torch.float64)
    dist.all_reduce(cpu_sum)  # CPU seconds per step, summed over ranks
    cpus = {k: cpu_sum[i].tolist() for i, k in enumerate(cases)}
    if rank == 0:
        mean = {k: statistics.fmean(v) for k, v in times.items()}
        gb = world * cfg["batch_size"]
        print(f"workers={world} model={cfg['model']['name']} dataset={cfg['dataset']['name']} local batch={cfg['batch_size']} "
              f"rounds={args.rounds} block={args.block} steps, stop agreement {'off' if args.no_watch else 'on'}; "
              f"load average before {args.load_before}")
        print(f"  {'case':13s} {'mean step ms':>14s} {'CPU ms/step (all ranks)':>24s}")
        for k, v in mean.items():
            print(f"  {k:13s} {v * 1e3:14.2f} {statistics.fmean(cpus[k]) * 1e3:24.2f}")
        figures = {}
        for label, name, a, b in (("(a) lsgd ddp / plain DDP loop        ", "ddp_overhead_ratio", "lsgd_ddp", "plain_ddp"),
                                  ("(b) lsgd local_sgd(H=1e9) / plain loop", "local_sgd_overhead_ratio", "lsgd_local", "plain_single")):
            wall = [x / y for x, y in zip(times[a], times[b])]
            figures[name] = sum(times[a]) / sum(times[b])
            low, high = bootstrap_interval(times[a], times[b])
            print(f"{label}: wall {figures[name]:.3f} (90% {low:.3f}-{high:.3f}; per round median {statistics.median(wall):.3f}, "
                  f"min {min(wall):.3f}, max {max(wall):.3f}), CPU {sum(cpus[a]) / sum(cpus[b]):.3f}; "
                  f"ratios of sums over {len(wall)} rounds; goal <= {GOAL}")
        print(f"(c) demo samples/s (all workers)     : ddp {gb / mean['lsgd_ddp']:.0f}, local_sgd {gb / mean['lsgd_local']:.0f}")
        print("load average after " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
        for name, value in figures.items():
            print(f"BENCH {name} {value:.3f} <= {GOAL}")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--block", type=int, default=15)
    parser.add_argument("--no-watch", action="store_true",
                        help="lsgd without the stop agreement (launcher.interrupts=false)")
    parser.add_argument("overrides", nargs="*", default=["experiment=fmnist_demo"])
    args = parser.parse_args()
    if args.rounds < 5:
        parser.error(f"--rounds must be >= 5 (a ratio is taken over rounds), got {args.rounds}")
    args.load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    mp.spawn(worker, args=(args.workers, free_port(), args, args.overrides), nprocs=args.workers, join=True)


if __name__ == "__main__":
    sys.exit(main())
