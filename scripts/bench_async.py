"""Asynchronous Local-SGD's parameter server: pseudo-gradients applied per second, and the server's
time per update against one all-reduce of the same model, side by side in one run (issue 13).

    python scripts/bench_async.py [--workers 4 8] [--model gpt20m|flat20m] [--repeats 5] [--quick]

On 1 + W gloo ranks (spawned, one thread each; rank 0 the server, ranks 1..W the workers), for the
GPT ``20m`` model of ``model=gpt`` (byte vocabulary: 19,177,984 float32 parameters in 76 tensors)
or one flat float32 tensor of 20M elements (``--model flat20m``):

* the algorithm is the real :class:`lsgd.algorithms.asynchronous.async_local_sgd.AsyncLocalSGD`, set up by its
  own :meth:`setup` (one 2-rank process group per (server, worker) pair, the virtual-time plan of
  W equally fast workers with H = 1, outer optimizer delayed Nesterov with N = W); the server calls
  :meth:`serve_step` (receive the pseudo-gradient on the worker's pair group, :meth:`apply` =
  :class:`DelayedNesterov` step, send the model back) for every planned arrival, each worker
  :meth:`before_step` (push theta_start - theta_end, pull) at its planned pushes, after changing its
  parameters as a local step would (not timed);
* ``update_ms``: the server's wall time per arrival, over a block of W arrivals (one per worker),
  from a barrier of all ranks to the server's last send; ``updates/s`` = 1000 / update_ms: the
  server's throughput when workers push back to back (no local compute: an upper bound);
* ``apply_ms``: :meth:`AsyncLocalSGD.apply` alone (the DN outer step on a flat pseudo-gradient), on
  the server while the others wait;
* ``allreduce_ms``: ``Communicator.average_`` of the same parameters over the W workers (a 2-rank
  ... W-rank gloo ring, the transport of sync DiLoCo's round; the server waits at a barrier);
* ``ratio`` = update_ms / allreduce_ms: one asynchronous server update against one synchronous
  round; ``round_ratio`` = W x update_ms / allreduce_ms: the server's time for the W updates that
  carry as much local compute as one synchronous round.
* ``MB/update``: bytes the server sends per arrival (``comm_bytes``: the model back; it receives as
  much, the pseudo-gradient).

Block and all-reduce repeats alternate; the table shows medians of ``--repeats``. All ranks share
this machine's cores and loopback: the times are this machine's, not a cluster's (the cluster
clock, ``modeled_time_s``, prices the messages: ``lsgd.clock``).

Measured once (25 Nov 2026; 2 CPU cores shared with other jobs, load average ~10; 1m45s)::

    workers     params update_ms updates/s apply_ms allreduce_ms  ratio round_ratio MB/update
          4 19,177,984     230.8      4.33     24.0        327.2   0.71        2.82      76.7
          8 19,177,984     215.1      4.65     27.7        609.7   0.35        2.82      76.7

The server's throughput does not depend on the number of workers (one arrival at a time: receive
77 MB, the outer step, send 77 MB); the all-reduce grows with it. Per unit of local compute the
asynchronous server moves W models each way where a ring all-reduce moves about 2 per worker, so
on this loopback its W updates cost 2.8x one synchronous round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lsgd.algorithms.asynchronous.async_local_sgd import AsyncLocalSGD
from lsgd.algorithms.base import RunContext
from lsgd.comm.communicator import Communicator
from lsgd.launch.spawn import free_port

GPT20M = {"name": "gpt", "size": "20m", "dropout": 0.0, "bias": True, "n_layer": None, "n_head": None, "n_embd": None}
FLAT = 20_000_000


def build_model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)  # every rank starts from the same model, as the trainer's ranks do
    if kind == "flat20m":
        model = torch.nn.Module()
        model.weight = torch.nn.Parameter(torch.randn(FLAT) * 0.02)
        return model
    from lsgd.data import dataset_info
    from lsgd.models import build_model as build

    return build(GPT20M, dataset_info({"name": "c4", "tokenizer": "byte", "seq_len": 256}))


def worker(rank: int, world: int, port: int, kind: str, repeats: int, queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=900))
    try:
        n = world - 1
        model = build_model(kind)
        params = list(model.parameters())
        comm = Communicator()
        cfg = {"name": "async_local_sgd", "timing": "virtual", "local_steps": 1, "dylu": False,
               "outer_optimizer": "delayed_nesterov", "outer_lr": 0.7, "outer_momentum": 0.9, "dn_buffer": n,
               "dn_c": 0.0, "staleness_exponent": 0.0, "staleness_avg": 0.0, "max_staleness": None, "fedbuff": None}
        alg = AsyncLocalSGD(cfg, comm)
        # 1 + repeats blocks of one arrival per worker (block 0 warms connections and allocators)
        ctx = RunContext(rank=rank, world_size=world, role="server" if rank == 0 else "worker",
                         worker_index=None if rank == 0 else rank - 1, num_workers=n, total_steps=repeats + 1,
                         worker_step_s=tuple([0.1] * n), seed=0)
        alg.setup(model, torch.optim.AdamW(params, lr=1e-3), ctx)
        workers = comm.subgroup(list(range(1, world)))  # sync DiLoCo's all-reduce group (after the pairs)
        plan = alg.plan
        assert len(plan.arrivals) == n * (repeats + 1), len(plan.arrivals)
        update_ms, allreduce_ms, nbytes = [], [], []
        gen = torch.Generator().manual_seed(rank)
        for block in range(repeats + 1):
            lo, hi = block * n, (block + 1) * n
            if rank != 0:  # a local step's change (untimed)
                with torch.no_grad():
                    for p in params:
                        p.add_(torch.randn(p.shape, generator=gen), alpha=1e-4)
            dist.barrier()
            before = comm.stats.comm_bytes
            t0 = time.perf_counter()
            if rank == 0:
                for i in range(lo, hi):
                    alg.serve_step(i)
            else:
                mine = plan.workers[rank - 1]
                for k, index in mine.push.items():
                    if lo <= index < hi:
                        alg.before_step(k)
            dt = time.perf_counter() - t0
            if block > 0 and rank == 0:
                update_ms.append(dt / n * 1e3)
                nbytes.append((comm.stats.comm_bytes - before) / n)
            # one all-reduce of the same parameters over the workers (the server waits)
            dist.barrier()
            if rank != 0:
                t0 = time.perf_counter()
                workers.average_(params)
                dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=workers.group)
                if rank == 1 and block > 0:
                    allreduce_ms.append(float(dt) * 1e3)
            dist.barrier()
        if rank == 1:
            queue.put(("allreduce", allreduce_ms))
        dist.barrier()
        if rank == 0:
            total = sum(p.numel() for p in params)
            g = torch.randn(total, generator=gen) * 1e-3
            apply_ms = []
            for i in range(repeats + 1):
                t0 = time.perf_counter()
                alg.apply(g, staleness=n - 1, index=alg.served + i)
                apply_ms.append((time.perf_counter() - t0) * 1e3)
            queue.put(("server", total, len(params), update_ms, apply_ms[1:], nbytes))
        dist.barrier()  # nobody tears the group down while a peer's last messages are in flight
    finally:
        dist.destroy_process_group()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--model", default="gpt20m", choices=["gpt20m", "flat20m"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="4 workers, 2 repeats")
    args = ap.parse_args(argv)
    if args.quick:
        args.workers, args.repeats = [4], 2
    ctx = mp.get_context("spawn")
    rows = []
    for n in args.workers:
        queue = ctx.SimpleQueue()
        mp.spawn(worker, args=(n + 1, free_port(), args.model, args.repeats, queue), nprocs=n + 1, join=True)
        got = {}
        while not queue.empty():
            item = queue.get()
            got[item[0]] = item[1:]
        total, tensors, update, apply, nbytes = got["server"]
        rows.append((n, total, tensors, statistics.median(update), statistics.median(apply),
                     statistics.median(got["allreduce"][0]), statistics.median(nbytes)))
    print(f"{'workers':>7} {'params':>10} {'update_ms':>9} {'updates/s':>9} {'apply_ms':>8} {'allreduce_ms':>12} "
          f"{'ratio':>6} {'round_ratio':>11} {'MB/update':>9}")
    for n, total, tensors, upd, app, ar, nb in rows:
        print(f"{n:>7} {total:>10,} {upd:>9.1f} {1e3 / upd:>9.2f} {app:>8.1f} {ar:>12.1f} {upd / ar:>6.2f} "
              f"{n * upd / ar:>11.2f} {nb / 1e6:>9.1f}")
    print(f"(medians of {args.repeats} repeats; model {args.model}: {rows[0][2]} tensors; update: the server's "
          f"recv + delayed Nesterov apply + send per arrival, workers pushing back to back; allreduce: the W "
          f"workers' gloo all-reduce of the same parameters; ratio = update / allreduce, round_ratio = W x update "
          f"/ allreduce; {os.cpu_count()} CPU cores shared by all ranks, one thread each)")


if __name__ == "__main__":
    main()
