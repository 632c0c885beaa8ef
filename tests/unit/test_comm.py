"""Alpha-beta cost model, byte counts and schedules against closed forms."""

from __future__ import annotations

import importlib.resources
import math

import numpy as np
import pytest
import torch

from lsgd.clock.network import Network, NetworkModel, cost_terms, wire_bytes
from lsgd.clock.worker_clock import Clock
from lsgd.comm.accounting import tensor_bytes
from lsgd.comm.communicator import Communicator
from lsgd.training.optim import lr_factor_fn


def test_ring_formulas():
    net = NetworkModel(bandwidth_gbps=10, latency_us=5)
    n, p = 4_000_000, 4
    alpha, beta = 5e-6, 8 / 10e9
    assert net.all_reduce(n, p) == pytest.approx(2 * 3 * alpha + 2 * 3 / 4 * n * beta)
    assert net.all_gather(n, p) == pytest.approx(3 * alpha + 3 * n * beta)
    # MPICH broadcast (Thakur et al. 2005, 4.1): binomial tree below 8 ranks or 12288 bytes,
    # else binomial scatter + ring all-gather
    assert net.broadcast(n, p) == pytest.approx(2 * (alpha + n * beta))
    assert net.broadcast(1000, 16) == pytest.approx(4 * (alpha + 1000 * beta))
    assert net.broadcast(n, 16) == pytest.approx((4 + 15) * alpha + 2 * 15 / 16 * n * beta)
    assert net.all_reduce(n, 1) == 0.0
    # 100 MB all-reduced on 1 Gbps between 2 workers: the payload crosses the link once: 0.8 s
    assert NetworkModel(1, 0).all_reduce(100_000_000, 2) == pytest.approx(0.8)


def test_wire_bytes():
    assert wire_bytes("all_reduce", 1000, 4) == 1500
    assert wire_bytes("all_gather", 1000, 4) == 3000
    assert wire_bytes("reduce_scatter", 1000, 4) == 750
    # binomial tree on 4 ranks from root 0: 0 -> 2, 0 -> 1, 2 -> 3
    assert [wire_bytes("broadcast", 1000, 4, rank=r) for r in range(4)] == [2000, 0, 1000, 0]
    assert [wire_bytes("broadcast", 1000, 4, rank=r, root=1) for r in range(4)] == [0, 2000, 0, 1000]
    # 5 ranks: 0 -> 4, 0 -> 2, 0 -> 1, 2 -> 3: every non-root rank receives n once
    assert sum(wire_bytes("broadcast", 1000, 5, rank=r) for r in range(5)) == 4000
    # long message on 8 ranks: binomial scatter of 8 chunks (root sends 4 + 2 + 1 chunks) then a
    # ring all-gather (7 chunks from every rank)
    n = 80_000
    sent = [wire_bytes("broadcast", n, 8, rank=r) for r in range(8)]
    assert sent[0] == pytest.approx(7 / 8 * n + 7 / 8 * n)
    assert sent[4] == pytest.approx(3 / 8 * n + 7 / 8 * n) and sent[7] == pytest.approx(7 / 8 * n)
    # a binomial scatter forwards chunks down the tree: (p/2) log2 p chunk sends in all
    assert sum(sent) == pytest.approx(4 * 3 / 8 * n + 8 * 7 / 8 * n)
    assert wire_bytes("all_reduce", 1000, 1) == 0
    with pytest.raises(ValueError, match="allowed"):
        wire_bytes("scatter", 1, 2)


def test_world_of_one_counts_nothing():
    comm = Communicator()
    t = torch.ones(10)
    comm.average_([t])
    comm.all_reduce(t)
    assert comm.stats.comm_bytes == 0 and torch.equal(t, torch.ones(10))
    assert tensor_bytes([torch.zeros(3, dtype=torch.float64), torch.zeros(5, dtype=torch.float16)]) == 3 * 8 + 5 * 2


def test_record_accumulates_and_overlapped_time_is_not_step_time():
    comm = Communicator(NetworkModel(10, 10))
    comm.record("all_reduce", 100, 0.5, overlapped=True)
    assert comm.stats.comm_time_s == 0.5 and comm.pop_step_time() == 0.0


def test_network_links_and_what_if_entries():
    net = Network(NetworkModel(10, 10), NetworkModel(1000, 1), gpus_per_node=4, report_gbps=(1, 100, 3))
    assert net.k == 4
    assert net.link([0, 1, 2, 3]) == "intra" and net.link([3, 4]) == "inter"
    assert [m.bandwidth_gbps for m in net.models("inter")] == [10, 1, 100, 3]
    # a what-if bandwidth with a network preset takes its latency too (conf/network/1gbps.yaml 50 us,
    # 100gbps.yaml 2 us); 3 Gbps has no preset: the configured latency
    assert [m.latency_us for m in net.models("inter")] == [10, 50, 2, 10]
    assert [m.bandwidth_gbps for m in net.models("intra")] == [1000] * 4  # what-ifs are inter-node
    assert [m.latency_us for m in net.models("intra")] == [1] * 4


def test_what_if_entries_are_the_network_presets():
    """issue 22 item 6: a 10 Gbps run's 1 Gbps column is the network=1gbps preset. The presets'
    links as the config files give them, and a two-worker all-reduce of 1 MB priced by hand:
    2 (p - 1) alpha + 2 (p - 1) / p n beta = 2 alpha + n beta on each what-if entry."""
    from omegaconf import OmegaConf

    from lsgd.clock.network import preset_latencies_us, what_if_latency_us

    conf = {}
    for name in ("1gbps", "10gbps", "100gbps"):
        preset = OmegaConf.to_container(OmegaConf.load(importlib.resources.files("lsgd.conf") / "network" / f"{name}.yaml"))
        conf[float(preset["bandwidth_gbps"])] = float(preset["latency_us"])
    assert conf == {1.0: 50.0, 10.0: 10.0, 100.0: 2.0} == preset_latencies_us()
    assert what_if_latency_us(1, 10.0) == 50.0 and what_if_latency_us(2.5, 7.0) == 7.0
    net = Network.from_config({"bandwidth_gbps": 10, "latency_us": 10, "report_gbps": [1, 10, 100, 0.5]})
    n = 1_000_000
    costs = [m.all_reduce(n, 2) for m in net.models("inter")]
    assert costs == pytest.approx([2 * 10e-6 + n * 8 / 10e9,    # the configured 10 Gbps link
                                   2 * 50e-6 + n * 8 / 1e9,     # network=1gbps: 8.1 ms, not 8.02 ms
                                   2 * 10e-6 + n * 8 / 10e9,    # network=10gbps
                                   2 * 2e-6 + n * 8 / 100e9,    # network=100gbps
                                   2 * 10e-6 + n * 8 / 0.5e9],  # no preset: the configured 10 us
                                  rel=1e-12)
    assert costs[1] == pytest.approx(0.0081, rel=1e-12)


def test_wire_overhead_multiplies_beta_of_the_inter_node_links():
    """network.wire_overhead w: every byte term costs w times more (beta = 8 w / bandwidth), the
    latency terms do not; the what-if links share the inter-node link's w, the intra-node link has
    its own (default 1). Closed form: TCP/IPv4 with timestamps over Ethernet at MTU 1500 carries
    1448 payload bytes in a 1514-byte frame (20 IP + 32 TCP + 14 Ethernet header bytes)."""
    w = (1500 + 14) / (1500 - 20 - 20 - 12)
    assert w == pytest.approx(1514 / 1448, rel=1e-15)
    n, p = 3_000_000, 4
    link = NetworkModel(0.05, 100, wire_overhead=w)
    assert link.beta == pytest.approx(8 * 1514 / 1448 / 50e6, rel=1e-15)
    assert link.all_reduce(n, p) == pytest.approx(2 * 3 * 100e-6 + 1.5 * n * 8 * w / 50e6, rel=1e-13)
    assert link.p2p(n) == pytest.approx(100e-6 + n * 8 * w / 50e6, rel=1e-13)
    assert NetworkModel(0.05, 100).p2p(n) == pytest.approx(100e-6 + n * 8 / 50e6, rel=1e-13)  # default 1
    net = Network.from_config({"bandwidth_gbps": 0.05, "latency_us": 100, "wire_overhead": w, "report_gbps": [1],
                               "intra_node": {"bandwidth_gbps": 100, "latency_us": 1}}, gpus_per_node=2)
    assert [m.wire_overhead for m in net.models("inter")] == [w, w]
    assert net.models("intra")[0].wire_overhead == 1.0
    assert net.costs("inter", "p2p", n, 2) == pytest.approx([100e-6 + n * 8 * w / 50e6, 50e-6 + n * 8 * w / 1e9], rel=1e-13)
    with pytest.raises(ValueError, match="wire_overhead"):
        NetworkModel(1, 1, wire_overhead=0.9)


def test_overhead_adds_two_o_per_message_step():
    """network.overhead_us = o (LogGP's per-message overhead: Culler et al. 1993; Alexandrov et al.
    1995): every message step on an operation's critical path pays o at its sender and o at its
    receiver, so each latency term of cost_terms costs alpha + 2 o. Closed forms with p = 4,
    alpha = 5 us, o = 500 us, through Network.costs (what the communicator charges: Accounting.count,
    PointToPoint.pair_cost) and NetworkModel's own methods; the what-if links keep the configured o,
    the intra-node link takes its own where set."""
    alpha, o, beta = 5e-6, 500e-6, 8 / 10e9
    n, p = 4000, 4
    link = NetworkModel(bandwidth_gbps=10, latency_us=5, overhead_us=500)
    assert link.message_s == pytest.approx(alpha + 2 * o, rel=1e-15)
    step = alpha + 2 * o
    closed = {
        "p2p": step + n * beta,                                     # one message: o + alpha + o + n beta
        "all_reduce": 2 * (p - 1) * step + 2 * (p - 1) / p * n * beta,  # ring: 2 (p-1) steps
        "all_gather": (p - 1) * step + (p - 1) * n * beta,
        "reduce_scatter": (p - 1) * step + (p - 1) / p * n * beta,
        "broadcast": 2 * (step + n * beta),                         # binomial tree: ceil(log2 4) = 2 steps
    }
    net = Network(link, report_gbps=(1, 3))
    for kind, cost in closed.items():
        got = net.costs("inter", kind, n, 2 if kind == "p2p" else p)
        assert got[0] == pytest.approx(cost, rel=1e-13), kind
    assert link.p2p(n) == pytest.approx(closed["p2p"], rel=1e-13)
    assert link.all_reduce(n, p) == pytest.approx(closed["all_reduce"], rel=1e-13)
    assert link.all_gather(n, p) == pytest.approx(closed["all_gather"], rel=1e-13)
    assert link.broadcast(n, p) == pytest.approx(closed["broadcast"], rel=1e-13)
    # long broadcast on 16 ranks: binomial scatter + ring all-gather, (log2 16 + 15) steps
    assert link.broadcast(80_000, 16) == pytest.approx((4 + 15) * step + 2 * 15 / 16 * 80_000 * beta, rel=1e-13)
    # what-if links: their preset's latency and bandwidth, the same o (the host's)
    assert net.costs("inter", "p2p", n, 2)[1] == pytest.approx(50e-6 + 2 * o + n * 8 / 1e9, rel=1e-13)
    assert net.costs("inter", "p2p", n, 2)[2] == pytest.approx(5e-6 + 2 * o + n * 8 / 3e9, rel=1e-13)
    # the overhead is one more term per message: model_alpha_terms x 2 o on top of the o = 0 cost
    plain = NetworkModel(bandwidth_gbps=10, latency_us=5)
    comm = Communicator(plain)
    comm.count("all_reduce", n, p=p)
    comm.count("p2p", n, p=2)
    comm.count("broadcast", n, p=p)
    a, b = comm.stats.model_alpha_terms, comm.stats.model_beta_bytes
    assert a == 2 * (p - 1) + 1 + 2
    assert link.cost(a, b) - plain.cost(a, b) == pytest.approx(a * 2 * o, rel=1e-12)
    # o = 0 (every preset's default) leaves every cost bit for bit as before: a alpha + b beta
    for kind in closed:
        for q in (2, 3, 8, 17):
            ta, tb = cost_terms(kind, 12_345, q)
            assert plain.cost(ta, tb) == ta * plain.alpha + tb * plain.beta
    # config: network.overhead_us for every link, intra_node.overhead_us instead inside a node
    cfg = {"bandwidth_gbps": 10, "latency_us": 5, "overhead_us": 500, "report_gbps": [1],
           "intra_node": {"bandwidth_gbps": 100, "latency_us": 1}}
    net = Network.from_config(cfg, gpus_per_node=2)
    assert [m.overhead_us for m in net.models("inter")] == [500, 500]
    assert net.models("intra")[0].overhead_us == 500
    cfg["intra_node"]["overhead_us"] = 20
    assert Network.from_config(cfg, gpus_per_node=2).models("intra")[0].overhead_us == 20
    assert Network.from_config({"bandwidth_gbps": 10, "latency_us": 5}).inter.overhead_us == 0.0
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="overhead_us"):
            NetworkModel(10, 5, overhead_us=bad)


def test_clock_backward_window_and_state():
    clock = Clock(2)
    clock.compute(1.0)
    clock.backward(2.0)
    assert clock.now.tolist() == [3.0, 3.0] and clock.compute_s == 3.0
    assert clock.backward_point(0.25).tolist() == [1.5, 1.5]
    clock.wait_until(np.array([2.0, 5.0]))
    assert clock.now.tolist() == [3.0, 5.0] and clock.time_s == 3.0
    other = Clock(2)
    other.load_state_dict(clock.state_dict())
    assert other.now.tolist() == [3.0, 5.0] and other.compute_s == 3.0


def test_clock_advances_queue_behind_a_pending_settlement():
    """Compute and backward do not wait for a queued settlement (the clock exchange in flight);
    the next read applies it first, then the advances in program order: max(now, end) + c."""
    clock = Clock(2)
    clock.compute(1.0)
    applied = []

    def settle():  # what Communicator.settle queues: wait for the exchange, move to the stream's end
        applied.append(True)
        clock._advance_to(np.array([4.0, 0.5]))

    clock.defer(settle)
    clock.compute(0.5)
    clock.backward(2.0)
    assert not applied and clock.compute_s == 3.5  # the exchange was not waited for
    assert clock.backward_point(0.5).tolist() == [5.5, 2.5]  # a read: settled, then max(1, end) + 0.5
    assert applied == [True]
    assert clock.now.tolist() == [6.5, 3.5]  # max(1, [4, 0.5]) + 0.5 + 2
    eager = Clock(2)
    eager.compute(1.0)
    eager.wait_until(np.array([4.0, 0.5]))
    eager.compute(0.5)
    eager.backward(2.0)
    assert eager.now.tolist() == clock.now.tolist()


def test_schedules_closed_form():
    step = lr_factor_fn({"name": "step", "milestones": [1, 3], "gamma": 0.1}, steps_per_epoch=10, total_steps=50)
    assert [step(s) for s in (0, 9, 10, 29, 30, 49)] == pytest.approx([1, 1, 0.1, 0.1, 0.01, 0.01])
    cos = lr_factor_fn({"name": "cosine", "warmup_epochs": 1, "warmup_start_factor": 0.0, "min_factor": 0.0}, 10, 110)
    assert cos(0) == 0 and cos(5) == pytest.approx(0.5) and cos(10) == pytest.approx(1.0)
    assert cos(60) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert cos(110) == pytest.approx(0.0, abs=1e-12)
