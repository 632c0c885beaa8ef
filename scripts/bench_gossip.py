"""SwarmSGD's pairwise exchange vs an all-reduce of the same model, and the lattice quantizer's cost
vs the exchange it saves, side by side in one run (issue 12).

    python scripts/bench_gossip.py [--workers 4 8 16] [--floats 1M 25M] [--repeats 3] [--quick]
    python scripts/bench_gossip.py --lattice [--repeats 7]      # the quantizer alone (make bench)

On ``--workers`` gloo ranks (spawned, one thread each), for a flat float32 model of ``--floats``
elements, through :class:`lsgd.comm.communicator.Communicator` (counted as training counts, no clock), alternating
the order every repeat:

(a) ``pair``: one SwarmSGD interaction: every rank swaps its model with its partner in a perfect
    matching of the complete graph (``lsgd.algorithms.gossip.swarm_sgd.round_partners``), one
    ``sendrecv`` each way;
(b) ``allreduce``: ``Communicator.average_`` of the same model (a ring all-reduce on gloo);
(c) ``pair8``: the same interaction sending 8-bit lattice codes (``n`` bytes + checksums) instead.

A repeat's time is the slowest rank's; the table shows medians (ms), bytes per node of one
operation (``comm_bytes``: payload handed over; ``wire``: what the rank puts on the wire, ring
all-reduce 2 (p-1)/p x payload) and, measured on rank 0 alone while the others wait (one core,
no contention), the lattice encode + decode time of the model in 1M-element tensors
(``lattice_ms``) next to the time the 8-bit codes save on the exchange (``pair - pair8``). The
pairwise bytes per node must not grow with the number of ranks; the all-reduce's wire bytes
approach 2x the model. ``--quick``: 4 and 8 ranks, 1M floats, 2 repeats.

All ranks share this machine's cores and loopback: the times are this machine's, not a cluster's
(the cluster clock, ``modeled_time_s``, prices those).

``--lattice`` times only the 8-bit quantizer (side 1e-3) on one core (one torch thread): encode +
decode + both checksums of a float32 model of ``--lattice-floats`` elements (default 8M) in
1M-element tensors, decoded against the model plus noise, side by side (alternating, median of
``--repeats``) with :func:`reference_encode_decode`, the quantizer as it was before its fast path
(float64 / int64 throughout), and with the quantizer's torch fast path (numba's fused loops switched
off: the dozen torch passes the fused loops replace). Time is this process's CPU time
(``time.process_time``): what one core spends, not inflated by waiting for a core on a shared machine
(wall time is printed too); the fast paths' encode and decode separately, and PCG64's random words
alone (drawn by the encode). It prints ``BENCH lattice_ns_per_element`` (goal <= 5) and ``BENCH lattice_speedup_vs_float64``
(goal >= 10).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lsgd.algorithms.gossip.swarm_sgd import round_partners
from lsgd.comm.communicator import Communicator
from lsgd.launch.spawn import free_port
from lsgd.compression.lattice import LatticeQuantizer
from lsgd.comm.topology import Topology

CHUNK = 1 << 20
SIZES = {"1M": 1 << 20, "25M": 25 * (1 << 20)}


def slowest(fn) -> float:
    """Wall seconds of ``fn()`` on the slowest rank."""
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    return float(dt)


def lattice_seconds(model: torch.Tensor, quant: LatticeQuantizer, repeats: int) -> float:
    """Median seconds to encode ``model`` in CHUNK-element tensors and decode it against itself + noise."""
    ref = model + 1e-3 * torch.randn_like(model)
    times = []
    for rep in range(repeats):
        g = torch.Generator().manual_seed(rep)
        t0 = time.perf_counter()
        for a, b in zip(model.split(CHUNK), ref.split(CHUNK)):
            code, _ = quant.encode(a, g, dtype=torch.float32)
            quant.decode(code, b, dtype=torch.float32)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# -- the quantizer before its fast path (float64 / int64 throughout), the comparator of --lattice ------
def _reference_checksum(k: torch.Tensor) -> torch.Tensor:
    p = 65521
    r = torch.remainder(k, p)
    n = r.numel()
    periods = torch.nn.functional.pad(r, (0, -n % p)).view(-1, p)
    sums = [r.sum()]
    for g, root in zip((17, 29), (41, 46)):
        w = _reference_weights(g)
        per_block = torch.remainder((periods * w).sum(dim=1), p)
        h = torch.tensor([pow(root, j, p) for j in range(periods.shape[0])], dtype=torch.int64)
        sums.append((per_block * h).sum())
    return torch.remainder(torch.stack(sums), p)


_REF_WEIGHTS: dict[int, torch.Tensor] = {}


def _reference_weights(g: int) -> torch.Tensor:
    if g not in _REF_WEIGHTS:
        w, x = [], 1
        for _ in range(65521):
            w.append(x)
            x = x * g % 65521
        _REF_WEIGHTS[g] = torch.tensor(w, dtype=torch.int64)
    return _REF_WEIGHTS[g]


def reference_encode_decode(x: torch.Tensor, y: torch.Tensor, side: float, gen: torch.Generator) -> bool:
    """8-bit encode of ``x`` and decode against ``y`` as lsgd.compression.lattice did before its
    fast path (commit 071c3de): float64 division and random numbers, int64 integers, a Python loop
    over lanes when packing, the checksum in int64 with a padded copy."""
    q = 256
    scaled = x.reshape(-1).double() / side
    k = torch.floor(scaled + torch.rand(scaled.shape, dtype=torch.float64, generator=gen)).long()
    colours = torch.remainder(k, q)
    padded = torch.zeros(colours.numel(), dtype=torch.uint8)
    padded[:] = colours.to(torch.uint8)
    payload = torch.zeros(colours.numel(), dtype=torch.uint8)
    payload |= padded.view(-1, 1)[:, 0] << 0
    sums = _reference_checksum(k)
    point = k.double() * side
    c = torch.stack([(payload >> 0) & 255], dim=1).reshape(-1).long()
    yy = y.reshape(-1).double() / side
    k_hat = c + q * torch.round((yy - c) / q).long()
    ok = bool(torch.equal(_reference_checksum(k_hat), sums))
    (k_hat.double() * side + point)  # the decoded and own points, as the averaging uses them
    return ok


def lattice_bench(floats: int, repeats: int) -> dict[str, dict[str, float]]:
    """Medians over ``repeats`` alternating repeats of encode + decode of ``floats`` float32 elements
    in CHUNK-element tensors: ``{path: {"cpu": s, "wall": s, "encode": s, "decode": s}}`` for
    ``fused`` (the quantizer as it runs: numba's fused loops), ``torch`` (its torch fast path, numba's
    loops switched off: what the fused loops replace) and ``reference`` (float64 / int64
    throughout); ``{"bits": {"cpu": s}}``: PCG64's random words alone (what the encode draws)."""
    from lsgd.compression import lattice as L

    torch.set_num_threads(1)
    model = torch.randn(floats, generator=torch.Generator().manual_seed(0)) * 0.05
    ref = model + 1e-3 * torch.randn(floats, generator=torch.Generator().manual_seed(1))
    quant = LatticeQuantizer(8, 1e-3)
    fused = L.fused_kernels()

    def new(rep, kernels):
        L._FUSED = kernels  # None: the torch path
        g = torch.Generator().manual_seed(rep)
        enc = dec = 0.0
        for a, b in zip(model.split(CHUNK), ref.split(CHUNK)):
            c0 = time.process_time()
            code, own = quant.encode(a, g, dtype=torch.float32)  # as SwarmSGD asks for a float32 model
            c1 = time.process_time()
            dec_points, ok = quant.decode(code, b, dtype=torch.float32)
            dec += time.process_time() - c1
            enc += c1 - c0
            assert ok
        L._FUSED = fused
        return enc, dec

    def old(rep):
        g = torch.Generator().manual_seed(rep)
        for a, b in zip(model.split(CHUNK), ref.split(CHUNK)):
            assert reference_encode_decode(a, b, 1e-3, g)
        return 0.0, 0.0

    def bits(rep):
        for a in model.split(CHUNK):
            np.random.PCG64(rep).random_raw(-(-a.numel() // 2))
        return 0.0, 0.0

    runs = {"fused": lambda rep: new(rep, fused), "torch": lambda rep: new(rep, None), "reference": old,
            "bits": bits}
    for fn in runs.values():  # warm-up (allocator, caches, the checksum weights, numba's cache)
        fn(0)
    out = {name: {"cpu": [], "wall": [], "encode": [], "decode": []} for name in runs}
    for rep in range(repeats):
        for name in (list(runs) if rep % 2 == 0 else list(reversed(runs))):
            c0, w0 = time.process_time(), time.perf_counter()
            enc, dec = runs[name](rep)
            out[name]["cpu"].append(time.process_time() - c0)
            out[name]["wall"].append(time.perf_counter() - w0)
            out[name]["encode"].append(enc)
            out[name]["decode"].append(dec)
    return {name: {k: statistics.median(v) for k, v in d.items()} for name, d in out.items()}


def one_size(rank: int, peer: int, n: int, repeats: int, quant: LatticeQuantizer):
    """(median seconds per operation, (comm_bytes, wire_bytes) of one operation, lattice seconds)."""
    model = torch.randn(n, generator=torch.Generator().manual_seed(rank))
    recv = torch.empty_like(model)
    codes = torch.randint(0, 256, (n + 24 * -(-n // CHUNK),), dtype=torch.uint8)
    recv8 = torch.empty_like(codes)
    work = model.clone()
    comm = Communicator()
    ops = {
        "pair": lambda: comm.sendrecv(model, recv, peer),
        "allreduce": lambda: comm.average_([work]),
        "pair8": lambda: comm.sendrecv(codes, recv8, peer),
    }
    per_op_bytes = {}
    for name, fn in ops.items():  # warm-up (connections, allocator) and bytes of one operation
        before = (comm.stats.comm_bytes, comm.stats.wire_bytes)
        slowest(fn)
        per_op_bytes[name] = (comm.stats.comm_bytes - before[0], comm.stats.wire_bytes - before[1])
    times = {name: [] for name in ops}
    for rep in range(repeats):
        for name in (list(ops) if rep % 2 == 0 else list(reversed(ops))):
            work.copy_(model)
            times[name].append(slowest(ops[name]))
    dist.barrier()
    lattice = lattice_seconds(model, quant, repeats) if rank == 0 else 0.0
    dist.barrier()
    return {k: statistics.median(v) for k, v in times.items()}, per_op_bytes, lattice


def worker(rank: int, world: int, port: int, sizes: list[str], repeats: int, queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=900))
    try:
        peer = round_partners(Topology("complete", world, "uniform", 0), 0, 0)[rank]
        quant = LatticeQuantizer(8, 1e-3)
        for size in sizes:
            times, per_op_bytes, lattice = one_size(rank, peer, SIZES[size], repeats, quant)
            if rank == 0:
                queue.put((world, size, SIZES[size], times, per_op_bytes, lattice))
        dist.barrier()  # nobody tears the group down while a peer's last messages are in flight
    finally:
        dist.destroy_process_group()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--floats", nargs="+", default=["1M", "25M"], choices=list(SIZES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="4 and 8 ranks, 1M floats, 2 repeats")
    ap.add_argument("--lattice", action="store_true", help="time the quantizer alone (one core) vs its float64 reference")
    ap.add_argument("--lattice-floats", type=int, default=8 * CHUNK, help="elements of --lattice's model")
    args = ap.parse_args(argv)
    if args.lattice:
        reps = max(5, args.repeats if args.repeats != 3 else 7)
        r = lattice_bench(args.lattice_floats, reps)
        n = args.lattice_floats
        ns = 1e9 / n
        print(f"lattice 8-bit, side 1e-3, {n:,} float32 elements in {CHUNK:,}-element tensors, one torch thread, "
              f"median of {reps} alternating repeats; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
        print(f"{'':>28} {'cpu ns/el':>10} {'wall ns/el':>11} {'encode':>7} {'decode':>7}")
        for name, label in (("fused", "fast path (numba, fused)"), ("torch", "fast path, torch passes"),
                            ("reference", "reference (float64)")):
            t = r[name]
            split = f"{t['encode'] * ns:>7.2f} {t['decode'] * ns:>7.2f}" if name != "reference" else ""
            print(f"{label:>28} {t['cpu'] * ns:>10.2f} {t['wall'] * ns:>11.2f} {split}")
        print(f"{'of which PCG64 random words':>28} {r['bits']['cpu'] * ns:>10.2f}   (in the encode)")
        t_new, t_old = r["fused"]["cpu"], r["reference"]["cpu"]
        print(f"BENCH lattice_ns_per_element {t_new * ns:.2f} <= 5")
        print(f"BENCH lattice_speedup_vs_float64 {t_old / t_new:.2f} >= 10")
        return
    if args.quick:
        args.workers, args.floats, args.repeats = [4, 8], ["1M"], 2
    ctx = mp.get_context("spawn")
    rows = []
    for world in args.workers:
        queue = ctx.SimpleQueue()
        mp.spawn(worker, args=(world, free_port(), args.floats, args.repeats, queue), nprocs=world, join=True)
        while not queue.empty():
            rows.append(queue.get())
    print(f"{'ranks':>5} {'floats':>6} {'pair_ms':>9} {'allreduce_ms':>12} {'ratio':>6} {'pair_MB':>8} "
          f"{'allreduce_MB':>12} {'allreduce_wire_MB':>17} {'pair8_ms':>9} {'pair8_MB':>8} {'lattice_ms':>10} "
          f"{'saved_ms':>9}")
    for world, size, n, t, b, lat in rows:
        print(f"{world:>5} {size:>6} {t['pair'] * 1e3:>9.1f} {t['allreduce'] * 1e3:>12.1f} "
              f"{t['allreduce'] / t['pair']:>6.2f} {b['pair'][0] / 1e6:>8.2f} {b['allreduce'][0] / 1e6:>12.2f} "
              f"{b['allreduce'][1] / 1e6:>17.2f} {t['pair8'] * 1e3:>9.1f} {b['pair8'][0] / 1e6:>8.2f} "
              f"{lat * 1e3:>10.1f} {(t['pair'] - t['pair8']) * 1e3:>9.1f}")
    print(f"(medians of {args.repeats} repeats, slowest rank per repeat; MB per node of one operation; "
          f"lattice_ms: rank 0 alone, encode + decode in {CHUNK}-element tensors; {os.cpu_count()} CPU cores "
          "shared by all ranks)")


if __name__ == "__main__":
    main()
