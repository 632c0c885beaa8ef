"""The point-to-point trace (lsgd.comm.p2p_trace, ``LSGD_TRACE_P2P``) on 2 real gloo ranks: one row per
exchange and rank, times in causal order, and the clock's view beside them."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
from gloo import run_gloo

from lsgd.analysis.p2p_trace import load_p2p_trace
from lsgd.comm import p2p_trace
from lsgd.clock.network import Network, NetworkModel
from lsgd.clock.worker_clock import Clock
from lsgd.comm.communicator import Communicator

LINK = NetworkModel(bandwidth_gbps=1, latency_us=5)
N = 100_000          # float32 elements per message
LATE_S = 0.2         # rank 1 posts its first exchange this much after rank 0


def _exchange(rank, world, folder):
    os.environ[p2p_trace.ENV] = str(folder)  # read at the first exchange (the forkserver's env lacks it)
    p2p_trace._checked = False
    comm = Communicator(Network(LINK), clock=Clock(1))
    peer = 1 - rank
    if rank == 1:
        time.sleep(LATE_S)
    handle = comm.sendrecv(torch.full((N,), float(rank)), recv := torch.zeros(N), peer, async_op=True)
    handle.wait()
    assert recv[0].item() == peer
    comm.sendrecv(torch.ones(N), torch.zeros(N), peer)  # a blocking one
    comm.sendrecv(torch.ones(1), torch.zeros(1), peer, count=False)  # uncounted: not traced
    # written at interpreter exit (atexit), which a forked child skips (os._exit): by hand here
    p2p_trace.tracer().network_counters(rank)


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    folder = tmp_path_factory.mktemp("p2p_trace")
    run_gloo(_exchange, 2, folder)
    return folder


def test_one_row_per_counted_exchange_and_rank(trace):
    df = load_p2p_trace(trace)
    assert sorted(zip(df["rank"], df["seq"])) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    for row in df.itertuples():
        assert row.peers == [1 - row.rank] and row.bytes == [4 * N]


def test_times_are_in_causal_order(trace):
    """Per rank: posted, then every work ends, then the wait returns; across ranks: a message is
    received no earlier than its sender began posting it (one time base for both processes), so rank 0's
    first receive ends at least LATE_S after its own post."""
    rows = {}
    for r in (0, 1):
        for line in (trace / f"p2p_rank{r}.jsonl").read_text().splitlines():
            row = json.loads(line)
            rows[r, row["seq"]] = row
    for row in rows.values():
        assert row["post"] <= row["posted"] <= row["waited"]
        assert {k for k, _, _ in row["works"]} == {"recv", "recv_stamp", "send", "send_stamp"}
        for _, _, t in row["works"]:
            assert row["posted"] <= t <= row["waited"]
    for seq in (1, 2):
        for r in (0, 1):
            recv = max(t for k, _, t in rows[r, seq]["works"] if k == "recv")
            assert recv >= rows[1 - r, seq]["post"]
    first_recv = max(t for k, _, t in rows[0, 1]["works"] if k == "recv")
    assert first_recv - rows[0, 1]["post"] >= LATE_S


def test_the_clock_view_is_the_exchange_cost(trace):
    """Both ranks issue at clock 0 (no compute between), so each exchange ends one message cost
    alpha + n beta after the other (a paired exchange costs one message, lsgd.clock.ports)."""
    cost = 5e-6 + 4 * N * 8 / 1e9
    df = load_p2p_trace(trace).sort_values(["rank", "seq"])
    for row in df.itertuples():
        assert row.issue_model == pytest.approx((row.seq - 1) * cost, abs=1e-12)
        assert row.end_model == pytest.approx(row.seq * cost, rel=1e-12)


def test_network_counters_at_exit(trace):
    for r in (0, 1):
        net = json.loads((trace / f"p2p_rank{r}_net.json").read_text())
        assert net["Tcp.OutSegs"] > 0 and "TcpExt.TCPTimeouts" in net
