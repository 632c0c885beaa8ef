"""Overhead of lsgd's training loop, measured side by side in one run on the same processes.

    python scripts/bench_overhead.py [--workers 4] [--rounds 8] [--block 15] [overrides...]

On ``--workers`` gloo workers (the demo configuration by default: cnn on Fashion-MNIST, local
batch 32) it times, in alternating blocks of ``--block`` steps over the same batches:

(a) lsgd ``ddp`` (Trainer.train_step + its bookkeeping) vs a plain hand-written torch DDP
    loop (forward, backward, SGD step): target ratio <= 1.05;
(b) lsgd ``local_sgd`` with H = 10**9 (no sync inside the run) vs a plain single-process loop on each
    worker: target ratio <= 1.05;
(c) samples/s (all workers) of the demo configuration under lsgd ddp and local_sgd.

Ratios are medians over blocks of per-step times (seconds), printed by rank 0.
"""

from __future__ import annotations

import argparse
import os
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

from lsgd.launch import free_port


def compose(overrides: list[str]) -> dict:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from omegaconf import OmegaConf

    from lsgd.cli import _register_resolvers

    _register_resolvers()
    with initialize_config_module(config_module="lsgd.conf", version_base="1.3"):
        cfg = hydra_compose("config", overrides=overrides)
    cfg = OmegaConf.to_container(cfg, resolve=True)
    cfg.update(run_id="bench", eval_unit="step", eval_every=10**9, checkpoint_every=0, epochs=1000, max_steps=None)
    return cfg


def make_trainer(cfg: dict, algo: dict, run_dir: str):
    from lsgd.trainer import Trainer

    cfg = dict(cfg, algo=algo)
    trainer = Trainer(cfg, run_dir, "cpu")
    trainer.start_time = time.perf_counter()
    trainer.recorder.start(trainer.samples)
    return trainer


def timed_block(fn, batches) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    for x, y in batches:
        fn(x, y)
    dist.barrier()
    return (time.perf_counter() - t0) / len(batches)


def worker(rank: int, world: int, port: int, args, overrides: list[str]) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    from lsgd.models import build_model
    from lsgd.optim import build_optimizer

    cfg = compose(overrides)
    run_dir = tempfile.mkdtemp(prefix=f"lsgd-bench-{rank}-") if rank == 0 else tempfile.mkdtemp()
    lsgd_ddp = make_trainer(cfg, {"name": "ddp", "bucket_cap_mb": 25}, run_dir)
    lsgd_local = make_trainer(cfg, {"name": "local_sgd", "local_steps": 10**9, "average_buffers": True,
                                    "buffer_policy": "maintain"}, run_dir)
    n = args.block * (args.rounds + 1)
    it = lsgd_ddp.loader.batches(0)
    batches = [next(it) for _ in range(n)]

    def plain_model():
        torch.manual_seed(cfg["seed"])
        model = build_model(cfg["model"], lsgd_ddp.info)
        return model, build_optimizer(model.parameters(), cfg["optim"])

    ddp_model, ddp_opt = plain_model()
    ddp_model = DistributedDataParallel(ddp_model, bucket_cap_mb=25)
    single_model, single_opt = plain_model()

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
    for name, fn in cases.items():  # warm-up block, not timed
        timed_block(fn, batches[: args.block])
    for r in range(args.rounds):
        block = batches[(r + 1) * args.block : (r + 2) * args.block]
        order = list(cases) if r % 2 == 0 else list(reversed(cases))
        for name in order:
            times[name].append(timed_block(cases[name], block))
    if rank == 0:
        med = {k: statistics.median(v) for k, v in times.items()}
        ratios_a = [a / b for a, b in zip(times["lsgd_ddp"], times["plain_ddp"])]
        ratios_b = [a / b for a, b in zip(times["lsgd_local"], times["plain_single"])]
        gb = world * cfg["batch_size"]
        print(f"workers={world} model={cfg['model']['name']} dataset={cfg['dataset']['name']} local batch={cfg['batch_size']}")
        for k, v in med.items():
            print(f"  {k:13s} median step {v * 1e3:8.2f} ms")
        print(f"(a) lsgd ddp / plain DDP loop        : {statistics.median(ratios_a):.3f} (median of per-block ratios; "
              f"min {min(ratios_a):.3f}, max {max(ratios_a):.3f}; target <= 1.05)")
        print(f"(b) lsgd local_sgd(H=1e9) / plain loop: {statistics.median(ratios_b):.3f} (min {min(ratios_b):.3f}, "
              f"max {max(ratios_b):.3f}; target <= 1.05)")
        print(f"(c) demo samples/s (all workers)     : ddp {gb / med['lsgd_ddp']:.0f}, local_sgd {gb / med['lsgd_local']:.0f}")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--block", type=int, default=15)
    parser.add_argument("overrides", nargs="*", default=["experiment=fmnist_demo"])
    args = parser.parse_args()
    mp.spawn(worker, args=(args.workers, free_port(), args, args.overrides), nprocs=args.workers, join=True)


if __name__ == "__main__":
    sys.exit(main())
