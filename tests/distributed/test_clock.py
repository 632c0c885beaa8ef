"""The cluster clock against closed forms, on real gloo groups.

Algorithm cases run the real trainer (hook order, learning-rate schedule) with a fixed compute
profile (``cluster.step_time_s`` = S: forward S/3, backward 2S/3) and zero-latency links, so every
step's modeled time is a closed form of S, the bucket sizes and beta = 8 / bandwidth (s/byte).
Communicator cases drive the clock directly: a chain of point-to-point messages and an
asynchronous all-reduce overlapping local steps.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
from gloo import run_gloo
from trainer_runs import TINY, compose_cfg, records, train

from lsgd.clock.network import Network, NetworkModel
from lsgd.clock.worker_clock import Clock
from lsgd.comm.communicator import Communicator
from lsgd.comm.handles import PostedRecv

S = 0.03  # compute seconds per step at speed 1.0
CNN_PARAMS = 215_418  # SmallCNN on 1x28x28: see lsgd/models/cnn.py
CNN_FLOAT_BUFFERS = 2 * (16 + 32)  # BatchNorm running mean and var


def train_records(tmp_path, overrides: list[str]) -> list[dict]:
    """Run the trainer on 2 gloo workers for 12 steps with the fixed profile; every step's record."""
    recs, _ = train(tmp_path, ["max_steps=12", "network.latency_us=0", f"cluster.step_time_s={S}", *overrides])
    return recs


def step_times(recs: list[dict], key: str = "modeled_time_s") -> np.ndarray:
    return np.diff([0.0] + [r[key] for r in recs])


# DDP with bucket_cap_mb=0.5: buckets fill in reverse parameter order; the first closes once it
# holds fc1.weight (fc2.bias, fc2.weight, fc1.bias, fc1.weight: 202,122 floats), the second holds
# the rest (13,296 floats) and is ready at the end of backward.
BUCKET0 = 10 + 1280 + 128 + 200_704
BUCKET1 = CNN_PARAMS - BUCKET0
# Backward FLOPs per sample (2 per multiply-add; weight and input gradients are one matmul or
# convolution each, the first conv has no input gradient): conv1 1->16 5x5 on 28x28, conv2 16->32
# 5x5 on 14x14, fc1 1568->128, fc2 128->10. Bucket 0 (fc2, fc1) is final after fc2's and fc1's
# backward: 7.0% of the backward FLOPs, though it holds 94% of the parameters.
MACS = {"conv1": 16 * 28 * 28 * 1 * 25, "conv2": 32 * 14 * 14 * 16 * 25, "fc1": 1568 * 128, "fc2": 128 * 10}
BACKWARD_FLOPS = 2 * MACS["conv1"] + 4 * (MACS["conv2"] + MACS["fc1"] + MACS["fc2"])
BUCKET0_READY = 4 * (MACS["fc2"] + MACS["fc1"]) / BACKWARD_FLOPS


def test_ddp_overlap_hidden_and_exposed(tmp_path):
    """One run, two networks: the clock's entry 0 at 100 Gbps and its what-if entry at 0.1 Gbps.

    Fast network: bucket 0's all-reduce ends before backward does; only the last bucket (ready at
    the end of backward) and the BatchNorm broadcast are exposed:
    step = S + C(bucket 1) + C(broadcast); on 2 workers a ring all-reduce of n bytes costs n beta
    and a broadcast n beta (binomial tree, one step).

    Slow network: bucket 0 is ready at fraction BUCKET0_READY of backward (its layers' share of
    the backward FLOPs, not of the parameters: issue 22), then the two
    all-reduces run back to back: step = forward + ready point + C(bucket 0) + C(bucket 1)
    + C(broadcast) = forward + backward + exposed communication.

    DDP's first iteration uses buckets in parameter order (bucket 0 holds the first layers, ready
    last), so nothing overlaps then; from the second on, the buckets follow the gradients' arrival.
    """
    fast, slow = 8 / 100e9, 8 / 0.1e9
    forward, backward = S / 3, 2 * S / 3
    ready0 = backward * BUCKET0_READY
    assert 0.07 < BUCKET0_READY < 0.071 and BUCKET0 / CNN_PARAMS > 0.93
    assert BUCKET0 * 4 * fast < backward - ready0  # bucket 0 hides on the fast network
    assert ready0 + BUCKET0 * 4 * slow > backward  # and outlasts backward on the slow one
    recs = train_records(tmp_path, ["algo=ddp", "algo.bucket_cap_mb=0.5", "network.bandwidth_gbps=100",
                                    "network.report_gbps=[0.1]"])
    for beta, key, want in (
        (fast, "modeled_time_s", S + (BUCKET1 + CNN_FLOAT_BUFFERS) * 4 * fast),
        (slow, "modeled_time_0.1gbps_s", forward + ready0 + (BUCKET0 + BUCKET1 + CNN_FLOAT_BUFFERS) * 4 * slow),
    ):
        steps = step_times(recs, key)
        assert steps[0] == pytest.approx(S + (CNN_PARAMS + CNN_FLOAT_BUFFERS) * 4 * beta, rel=1e-9), key
        assert steps[1:] == pytest.approx(np.full(len(recs) - 1, want), rel=1e-9), key
    # the old model charged every bucket on top of the compute; exposed part on the slow network:
    assert S + (BUCKET1 + CNN_FLOAT_BUFFERS) * 4 * fast < S + CNN_PARAMS * 4 * fast
    exposed = forward + ready0 + (CNN_PARAMS + CNN_FLOAT_BUFFERS) * 4 * slow - S
    assert exposed == pytest.approx(ready0 + BUCKET0 * 4 * slow - backward + (BUCKET1 + CNN_FLOAT_BUFFERS) * 4 * slow)


def test_local_sgd_rounds_wait_for_the_straggler(tmp_path):
    """Speeds 1.0 and 0.5, H = 4: a round takes the slow worker's 4 x 2S, then the averaging
    all-reduce (parameters and BatchNorm buffers: one coalesced buffer). Between rounds the fast
    worker is ahead: the run's time (max) follows the slow worker, the mean lies between.
    Evaluations between syncs report the consensus distance."""
    H, beta = 4, 8 / 10e9
    recs = train_records(tmp_path, ["algo=local_sgd", f"algo.local_steps={H}", "cluster.speeds=[1.0,0.5]",
                                    "network.bandwidth_gbps=10", "eval_every=6", "eval_workers=true"])
    comm = (CNN_PARAMS + CNN_FLOAT_BUFFERS) * 4 * beta
    for r in recs:
        rounds, k = divmod(r["step"], H)
        base = rounds * (H * 2 * S + comm)
        assert r["modeled_time_s"] == pytest.approx(base + k * 2 * S, rel=1e-9)
        # fast worker: k steps of S since the round; slow: k steps of 2S
        assert r["modeled_time_s_mean"] == pytest.approx(base + k * 1.5 * S, rel=1e-9)
        assert r["modeled_compute_s_max"] == pytest.approx(r["step"] * 2 * S, rel=1e-9)
    # what-if entries: the same events on the network=1gbps preset's link (1 Gbps, 50 us: the
    # configured latency 0 is not carried over): 2 (p - 1) = 2 latencies per averaging all-reduce
    beta1, alpha1 = 8 / 1e9, 50e-6
    last = recs[-1]
    assert last["modeled_time_1gbps_s"] == pytest.approx(
        (last["step"] // H) * (H * 2 * S + 2 * alpha1 + (CNN_PARAMS + CNN_FLOAT_BUFFERS) * 4 * beta1), rel=1e-9)
    # step 6 lies between syncs (4, 8, 12): replicas differ
    evals = {r["step"]: r for r in recs if "test_loss" in r}
    assert evals[6]["consensus_distance"] > 0
    assert 0 <= evals[6]["test_acc_workers_min"] <= evals[6]["test_acc_workers_mean"] <= 1
    # evaluated right after a sync: replicas equal, nothing per worker
    assert "consensus_distance" not in evals[12] and "test_acc_workers_mean" not in evals[12]


# -- the communicator's clock, driven directly ------------------------------------------------------
LINK = NetworkModel(bandwidth_gbps=1, latency_us=5)
ALPHA, BETA = 5e-6, 8 / 1e9


def _chain(rank, world, out):
    """Rank r computes r * 1 ms, then receives from r - 1 (if any) and sends to r + 1 (if any)."""
    comm = Communicator(Network(LINK), clock=Clock(1))
    comm.clock.compute(rank * 1e-3)
    buf = torch.zeros(1000)
    if rank > 0:
        comm.irecv(buf, rank - 1).wait()
    if rank < world - 1:
        comm.isend(torch.full((1000,), float(rank)), rank + 1).wait()
    torch.save({"t": comm.clock.time_s, "x": buf[0].item(), "bytes": comm.stats.comm_bytes}, out / f"{rank}.pt")


def test_chain_of_messages(tmp_path):
    """A message is received at max(sender start, receive posted) + cost (rendezvous: its data
    moves once the receiver has posted the receive), cost = alpha + 4000 beta; the sender's send
    completes at its start + cost on its own clock."""
    run_gloo(_chain, 3, tmp_path)
    got = [torch.load(tmp_path / f"{r}.pt") for r in range(3)]
    c = ALPHA + 4000 * BETA
    t0 = 0.0 + c                        # rank 0 sends at 0
    t1 = max(0.0, 1e-3) + c + c         # rank 1 posts at 1 ms, receives at 1 ms + c, then sends
    t2 = max(t1 - c, 2e-3) + c          # rank 2 posts at 2 ms: rank 1's message (start 1 ms + c) moves then
    assert [g["t"] for g in got] == pytest.approx([t0, t1, t2], rel=1e-12)
    assert [g["bytes"] for g in got] == [4000, 4000, 0]
    assert got[1]["x"] == 0.0 and got[2]["x"] == 1.0


def _async_overlap(rank, world, out, steps):
    """Issue an all-reduce at t = rank ms, run `steps` local steps of 1 ms, then wait."""
    comm = Communicator(Network(LINK), clock=Clock(1))
    comm.clock.compute(rank * 1e-3)
    x = torch.full((250_000,), float(rank + 1))
    h = comm.all_reduce(x, async_op=True)
    for _ in range(steps):
        comm.clock.compute(1e-3)
    h.wait()
    torch.save({"t": comm.clock.time_s, "sum": x[0].item()}, out / f"{rank}.pt")


@pytest.mark.parametrize("steps", [1, 10])
def test_async_all_reduce_overlaps_local_steps(tmp_path, steps):
    """The all-reduce starts when the last participant issues it (rank 1 at 1 ms) and costs
    2 alpha + 1e6 beta (2 workers, 1 MB) = 8.01 ms; each worker's clock after wait() is
    max(its issue + steps ms, start + cost): 1 step leaves the communication exposed, 10 hide it."""
    out = tmp_path / str(steps)
    out.mkdir()
    run_gloo(_async_overlap, 2, out, steps)
    got = [torch.load(out / f"{r}.pt") for r in range(2)]
    cost = 2 * ALPHA + 1_000_000 * BETA
    end = 1e-3 + cost
    want = [max(r * 1e-3 + steps * 1e-3, end) for r in range(2)]
    assert [g["t"] for g in got] == pytest.approx(want, rel=1e-12)
    assert got[0]["sum"] == 3.0


# -- synchronous averaging is communication (issue 22 item 6) -----------------------------------------
DELAY = 0.3  # s: rank 1 enters each averaging this late, so rank 0 waits that long inside it


def _average_timing(rank, world, out):
    """A synchronous average_ (rank 1 DELAY late), then an asynchronous one waited on at once."""
    comm = Communicator(Network(LINK), clock=Clock(1))
    x = torch.full((250_000,), float(rank))
    if rank == 1:
        time.sleep(DELAY)
    comm.average_([x])
    sync = {"step": comm.pop_step_time(), "comm": comm.stats.comm_time_s, "clock": comm.clock.time_s,
            "compute": comm.clock.compute_s, "x": x[0].item()}
    if rank == 1:
        time.sleep(DELAY)
    comm.average_([x], async_op=True).wait()
    torch.save({"sync": sync, "async_step": comm.pop_step_time(), "comm": comm.stats.comm_time_s}, out / f"{rank}.pt")


def test_synchronous_average_is_communication_time(tmp_path):
    """A synchronous average_ is communication: its measured seconds are step communication time
    (taken out of the step's measured compute: pop_step_time), and the clock moves by the
    all-reduce's cost 2 alpha + n beta (2 workers, 1 MB) with no compute. An asynchronous one is
    time in flight during compute: counted in comm_time_s, not taken out of the step."""
    run_gloo(_average_timing, 2, tmp_path)
    got = [torch.load(tmp_path / f"{r}.pt") for r in range(2)]
    for g in got:
        sync = g["sync"]
        assert sync["x"] == 0.5
        assert sync["step"] == sync["comm"] > 0  # every second of it: not overlapped
        assert sync["clock"] == pytest.approx(2 * ALPHA + 1_000_000 * BETA, rel=1e-12) and sync["compute"] == 0.0
        assert g["async_step"] == 0.0 and g["comm"] > sync["comm"]
    assert got[0]["sync"]["comm"] >= DELAY * 0.9  # rank 0 waited for rank 1 inside the all-reduce


def _train_slow_average(rank, world, cfg, run_dir):
    """The trainer, with rank 1 entering every model-sized all-reduce DELAY late."""
    import torch.distributed as dist

    from lsgd.training.trainer import Trainer

    real = dist.all_reduce

    def late(tensor, *args, **kwargs):
        if rank == 1 and tensor.numel() >= CNN_PARAMS:
            time.sleep(DELAY)
        return real(tensor, *args, **kwargs)

    dist.all_reduce = late
    try:
        Trainer(cfg, Path(run_dir), "cpu").fit()
    finally:
        dist.all_reduce = real


def test_local_sgd_averaging_time_is_communication_not_compute(tmp_path):
    """local SGD, H = 2, 4 steps: 2 averaging rounds, each waiting DELAY for rank 1. The measured
    waiting lands in comm_time_s, not in compute_time_s (the synchronous average_ was flagged as
    overlapped, so it stayed in the step's compute); the clock charges each round its modeled
    cost, 2 alpha + n beta on 2 workers (latency 0 here), whatever the waiting."""
    H, steps, beta = 2, 4, 8 / 10e9
    cfg = compose_cfg([*TINY, "launcher.nproc_per_node=2", f"results_dir={tmp_path}", f"max_steps={steps}",
                       "network.latency_us=0", f"cluster.step_time_s={S}", "algo=local_sgd", f"algo.local_steps={H}"])
    cfg["run_id"], cfg["resume"] = "slow", False
    run_dir = tmp_path / "slow"
    run_dir.mkdir()
    run_gloo(_train_slow_average, 2, cfg, str(run_dir))
    recs = [r for r in records(run_dir) if "kind" not in r]
    last = recs[-1]
    rounds = steps // H
    assert last["comm_rounds"] == rounds
    assert last["comm_time_s"] >= rounds * DELAY * 0.9  # rank 0 waited in both averagings
    assert last["compute_time_s_max"] < DELAY  # and none of it counts as compute
    comm = (CNN_PARAMS + CNN_FLOAT_BUFFERS) * 4 * beta
    assert last["modeled_time_s"] == pytest.approx(rounds * (H * S + comm), rel=1e-9)
    assert last["modeled_compute_s"] == pytest.approx(steps * S, rel=1e-9)


# -- ports (LogGP, issue 22): a worker's sends share its egress, its receives its ingress -------------
O = 500e-6  # LogGP's per-message overhead o of LINK_O (network.overhead_us=500)
LINK_O = NetworkModel(bandwidth_gbps=1, latency_us=5, overhead_us=500)


def _ports_cases(rank, world, out):
    """On one gloo group of 4, each case with a fresh clock (no compute, 4000-byte messages):

    * ``gossip_k``: k = 1: every rank sends to its successor and receives from its predecessor
      (one peer); k = 2: both ring neighbours; k = 3: every other rank (complete graph);
    * ``incast_N``: ranks 1..N send one message each to rank 0 (a server), which then sends one
      back to each (a parameter server step without compute);
    * ``fanout_L``: rank 0 sends to ranks 1 and 2 with ``network.ports`` = L lanes;
    * ``tallies``: a sequence of blocking exchanges and collectives (no overlap).
    """
    res = {}
    x = torch.ones(1000)
    for k in (1, 2, 3):
        comm = Communicator(Network(LINK), clock=Clock(1))
        ring = [(rank + 1) % world, (rank - 1) % world]
        out_peers, in_peers = {1: ([(rank + 1) % world], [(rank - 1) % world]), 2: (ring, ring),
                               3: ([r for r in range(world) if r != rank],) * 2}[k]
        comm.exchange({q: x.clone() for q in out_peers}, {q: torch.zeros(1000) for q in in_peers})
        res[f"gossip_{k}"] = comm.clock.time_s
    for n_workers in (1, 2, 3):
        comm = Communicator(Network(LINK), clock=Clock(1))
        workers = list(range(1, n_workers + 1))
        if rank == 0:
            comm.exchange(recvs={w: torch.zeros(1000) for w in workers})
            res[f"incast_{n_workers}_server_in"] = comm.clock.time_s
            comm.exchange(sends={w: x.clone() for w in workers})
            res[f"incast_{n_workers}_server"] = comm.clock.time_s
        elif rank in workers:
            comm.sendrecv(x.clone(), None, 0)
            comm.sendrecv(None, torch.zeros(1000), 0)
            res[f"incast_{n_workers}_worker"] = comm.clock.time_s
    for lanes in (1, 2):
        comm = Communicator(Network(LINK, ports=lanes), clock=Clock(1))
        if rank == 0:
            comm.exchange(sends={1: x.clone(), 2: x.clone()})
        elif rank in (1, 2):
            comm.exchange(recvs={0: torch.zeros(1000)})
        res[f"fanout_{lanes}"] = comm.clock.time_s
    # a receive posted ahead (Communicator.post_recv) while the receiver still computes for 3 c
    for ahead in (False, True):
        comm = Communicator(Network(LINK), clock=Clock(1))
        if rank == 0:
            buf = torch.zeros(1000)
            recv = comm.post_recv(buf, 1) if ahead else buf
            comm.clock.compute(3 * C)
            comm.sendrecv(None, recv, 1)
            res[f"posted_{ahead}"] = (comm.clock.time_s, comm.stats.as_dict(), buf.sum().item())
        elif rank == 1:
            comm.sendrecv(x.clone(), None, 0)
            res[f"posted_{ahead}"] = (comm.clock.time_s, comm.stats.as_dict(), None)
        if rank == 0:  # misuse is refused before anything is posted or counted
            before = comm.stats.as_dict()
            used = PostedRecv(torch.zeros(3), 2, True)
            used.used = True
            errors = []
            for sends, recvs, count in (({}, {1: PostedRecv(torch.zeros(3), 2, True)}, True),
                                        ({}, {2: PostedRecv(torch.zeros(3), 2, True)}, False),
                                        ({3: x}, {2: used}, True)):
                try:
                    comm.exchange(sends, recvs, count=count)
                except ValueError as e:
                    errors.append(str(e))
            try:
                comm.post_recv(torch.zeros(1), 0)
            except ValueError as e:
                errors.append(str(e))
            res["posted_errors"] = (errors, before, comm.stats.as_dict())
    comm = Communicator(Network(LINK), clock=Clock(1))
    ring = [(rank + 1) % world, (rank - 1) % world]
    comm.exchange({q: x.clone() for q in ring}, {q: torch.zeros(1000) for q in ring})
    comm.all_reduce(torch.ones(250_000))
    comm.sendrecv(x.clone(), torch.zeros(1000), rank ^ 1)
    comm.broadcast_([torch.ones(5000)], src=0)
    comm.all_gather(torch.ones(300))
    everyone = [r for r in range(world) if r != rank]
    comm.exchange({q: x.clone() for q in everyone}, {q: torch.zeros(1000) for q in everyone})
    res["tallies"] = (comm.clock.time_s, LINK.cost(comm.stats.model_alpha_terms, comm.stats.model_beta_bytes))
    # LogGP's per-message overhead o (network.overhead_us): each operation alone on a fresh clock,
    # on the link without and with o
    for name, link in (("o0", LINK), ("o", LINK_O)):
        got = {}
        ops = {
            "pair": lambda c: c.sendrecv(x.clone(), torch.zeros(1000), rank ^ 1),
            "ring": lambda c: c.exchange({q: x.clone() for q in ring}, {q: torch.zeros(1000) for q in ring}),
            "all_reduce": lambda c: c.all_reduce(torch.ones(1000)),
            "broadcast": lambda c: c.broadcast_([torch.ones(1000)], src=0),
            "all_gather": lambda c: c.all_gather(torch.ones(1000)),
            "reduce_scatter": lambda c: c.reduce_scatter(torch.zeros(250), torch.ones(1000)),
        }
        for op, run in ops.items():
            comm = Communicator(Network(link), clock=Clock(1))
            run(comm)
            got[op] = (comm.clock.time_s, comm.stats.model_alpha_terms)
        res[f"overhead_{name}"] = got
    torch.save(res, out / f"{rank}.pt")


@pytest.fixture(scope="module")
def ports_cases(tmp_path_factory):
    out = tmp_path_factory.mktemp("ports")
    run_gloo(_ports_cases, 4, out)
    return [torch.load(out / f"{r}.pt") for r in range(4)]


C = ALPHA + 4000 * BETA  # one message of 1000 float32


def test_gossip_to_k_peers_costs_k_messages(ports_cases):
    """Each rank sends k messages and receives k: its egress takes the sends one after another
    (shift order: the j-th send of every rank goes to its j-th successor, so every rank's j-th
    receive has stamp (j - 1) c), its ingress the receives: the exchange ends at k (alpha + n beta)
    on every rank. Before ports (issue 22) every k gave one c: a complete graph cost one ring step."""
    for k in (1, 2, 3):
        assert [g[f"gossip_{k}"] for g in ports_cases] == pytest.approx([k * C] * 4, rel=1e-12)


def test_posted_receive_is_clocked_at_its_exchange(ports_cases):
    """A receive posted ahead (:meth:`Communicator.post_recv`, at time 0) and consumed by an
    exchange at 3 c is clocked as if that exchange had posted it: rank 1 sends at 0 (its send ends
    at c), rank 0's receive can start only at 3 c (rendezvous) and ends at 4 c; posted at 0 it
    would have ended at c. The data arrives, and counters are those of the plain exchange."""
    for ahead in (False, True):
        t0, stats0, got = ports_cases[0][f"posted_{ahead}"]
        t1, stats1, _ = ports_cases[1][f"posted_{ahead}"]
        assert t0 == pytest.approx(4 * C, rel=1e-12)
        assert t1 == pytest.approx(C, rel=1e-12)
        assert got == 1000.0
    for r in (0, 1):
        plain, ahead = (ports_cases[r][f"posted_{a}"][1] for a in (False, True))
        for key in ("comm_bytes", "wire_bytes", "model_alpha_terms", "model_beta_bytes"):
            assert plain[key] == ahead[key], key
    assert ports_cases[1]["posted_True"][1]["comm_bytes"] == 4000


def test_posted_receive_misuse_is_refused(ports_cases):
    """Consumed twice, with another count, from another peer, or posted from oneself: a ValueError
    each, raised before anything is posted or counted."""
    errors, before, after = ports_cases[0]["posted_errors"]
    assert len(errors) == 4
    assert "posted receive from 2" in errors[0] and "from 1" in errors[0]
    assert "count=True" in errors[1] and "count=False" in errors[1]
    assert "used=True" in errors[2]
    assert "another rank" in errors[3]
    assert before == after


def test_parameter_server_incast_and_broadcast_serialize(ports_cases):
    """N workers push one message each to the server at time 0: its ingress takes them one at a
    time (in worker order: equal stamps, then rank), so it has them all at N c; it then sends N
    models one after another on its egress: worker j (1..N) has its model at N c + j c, and the
    server's last send ends at 2 N c. Before ports the incast ended at c and every worker at 2c,
    whatever N."""
    srv = ports_cases[0]
    for n in (1, 2, 3):
        assert srv[f"incast_{n}_server_in"] == pytest.approx(n * C, rel=1e-12)
        assert srv[f"incast_{n}_server"] == pytest.approx(2 * n * C, rel=1e-12)
        for j in range(1, n + 1):
            assert ports_cases[j][f"incast_{n}_worker"] == pytest.approx((n + j) * C, rel=1e-12)


def test_two_lanes_halve_the_serialization_of_two_sends(ports_cases):
    """network.ports = 1: rank 0's two sends take its egress one after the other (2c; rank 2, the
    second in shift order, has its message at 2c); 2 lanes carry both at once (c everywhere)."""
    assert [ports_cases[r]["fanout_1"] for r in range(3)] == pytest.approx([2 * C, C, 2 * C], rel=1e-12)
    assert [ports_cases[r]["fanout_2"] for r in range(3)] == pytest.approx([C, C, C], rel=1e-12)


def test_clock_equals_the_tallies_without_overlap(ports_cases):
    """Blocking exchanges (ring, pairs, complete graph) and collectives (all-reduce, broadcast,
    all-gather), no compute: the clock's time equals NetworkModel.cost(model_alpha_terms,
    model_beta_bytes) on every rank. Before ports the clock priced a k-peer exchange at one
    message while the tallies counted k."""
    for g in ports_cases:
        clock_s, tallies_s = g["tallies"]
        assert clock_s == pytest.approx(tallies_s, rel=1e-12)


def test_overhead_is_paid_per_message_step_on_the_clock(ports_cases):
    """network.overhead_us = o: each message step on the critical path costs alpha + 2 o (o at its
    sender, o at its receiver; LogGP, Alexandrov et al. 1995), through the communicator and the
    clock on 4 gloo ranks, 4000-byte payloads: a paired exchange alpha + 2 o + n beta; a ring
    gossip to both neighbours 2 messages on the egress; a ring all-reduce 2 (p-1) = 6 steps;
    a binomial broadcast ceil(log2 4) = 2; an all-gather and a reduce-scatter p - 1 = 3. Without o
    each is the same minus 2 o per step: the clock moves by exactly model_alpha_terms x 2 o."""
    n, p, step = 4000, 4, ALPHA + 2 * O
    closed = {
        "pair": step + n * BETA,
        "ring": 2 * (step + n * BETA),
        "all_reduce": 2 * (p - 1) * step + 2 * (p - 1) / p * n * BETA,
        "broadcast": 2 * (step + n * BETA),
        "all_gather": (p - 1) * step + (p - 1) * n * BETA,
        "reduce_scatter": (p - 1) * step + (p - 1) / p * n * BETA,
    }
    terms = {"pair": 1, "ring": 2, "all_reduce": 6, "broadcast": 2, "all_gather": 3, "reduce_scatter": 3}
    for g in ports_cases:
        for op, t in closed.items():
            time_o, a = g["overhead_o"][op]
            time_0, a0 = g["overhead_o0"][op]
            assert a == a0 == terms[op], op
            assert time_o == pytest.approx(t, rel=1e-12), op
            assert time_o - time_0 == pytest.approx(a * 2 * O, rel=1e-9), op


def test_ports_are_part_of_the_clock_state():
    clock = Clock(2, lanes=2)
    clock.ports.occupy("inter", "egress", np.array([0.0, 0.0]), np.array([1.0, 3.0]))
    clock.ports.hold("intra", np.array([2.0, 2.0]))
    other = Clock(2)
    other.load_state_dict(clock.state_dict())
    assert other.ports.lanes == 2
    for key, free in clock.ports.free.items():
        assert other.ports.free[key].tolist() == free.tolist()
    # the other lane is still free at 0: a second message starts at once
    start, end = other.ports.occupy("inter", "egress", np.array([0.5, 0.5]), np.array([1.0, 1.0]))
    assert start.tolist() == [0.5, 0.5] and end.tolist() == [1.5, 1.5]


def test_dpsgd_gossip_is_priced_per_message_sent(tmp_path):
    """D-PSGD (atc) on 4 workers, 2 steps, 1 Gbps / 10 us: each step is S of compute, then one
    gossip exchange of the model (parameters and BatchNorm buffers, n bytes) with k neighbours:
    k (alpha + n beta) on the ports, k = 1 (one-peer exponential), 2 (ring), 3 (complete). So the
    communication times are in the ratio 1 : 2 : 3 of the messages each node sends, and the
    complete graph, which sends 3 n per step against ring all-reduce's 1.5 n, costs more than DDP.
    Before ports (issue 22) all three were one message (0.0676 s each in the issue's runs) and the
    complete graph was modeled 34% cheaper than DDP."""
    alpha, beta = 10e-6, 8 / 1e9
    n = (CNN_PARAMS + CNN_FLOAT_BUFFERS) * 4
    common = ["max_steps=2", "network.bandwidth_gbps=1", "network.latency_us=10", f"cluster.step_time_s={S}"]
    comm_s = {}
    for topology, k in (("one_peer_exponential", 1), ("ring", 2), ("complete", 3)):
        recs, _ = train(tmp_path, ["algo=dpsgd", f"algo.topology={topology}", "algo.variant=atc", *common], 4, topology)
        assert recs[-1]["comm_bytes"] == 2 * k * n  # k messages of the model per step
        for r in recs:
            assert r["modeled_time_s"] == pytest.approx(r["step"] * (S + k * (alpha + n * beta)), rel=1e-9)
        comm_s[k] = recs[-1]["modeled_time_s"] - 2 * S
    assert [comm_s[k] / comm_s[1] for k in (2, 3)] == pytest.approx([2.0, 3.0], rel=1e-9)
    ddp, _ = train(tmp_path, ["algo=ddp", *common], 4, "ddp")
    assert recs[-1]["modeled_time_s"] > ddp[-1]["modeled_time_s"]
