"""The emulated cluster (lsgd.launch.emulate, issue 23): links take the time their cap predicts, and
nothing is left behind.

These tests need root and the kernel's network namespaces, veth, bridge and tbf (CI runs as root).
Where they are missing the tests FAIL with the reason (tests/conftest.py: only CUDA tests skip).

Prediction: a TCP stream at MTU 1500 carries 1448 payload bytes per frame (1500 - 20 IP - 20 TCP -
12 timestamp option) that tbf meters as 1514 bytes (the frame with its 14-byte Ethernet header,
without preamble or FCS), so ``n`` payload bytes take ``n * 8 * 1514 / 1448 / cap`` seconds
(lsgd.launch.emulate.WIRE_FACTOR = 1.0456). A 2-rank ring all-reduce of ``n`` bytes sends ``n`` bytes each
way on each link (reduce-scatter n/2, all-gather n/2; Thakur et al. 2005: 2(p-1)/p n), both
directions at once, so it takes the same time as an ``n``-byte transfer.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys

import pytest
from emulated_bench import measure

from lsgd.launch import emulate

MB16 = 16 * 2**20


def _require_root():
    if os.geteuid() != 0:
        pytest.fail("the emulated cluster needs root (network namespaces, veth, tc); CI runs as root")


#: (cap in Mbit/s, repeats[, bytes]; 16 MiB where none is named): one ~0.7 s transfer each way at
#: 50 Mbit/s (4 MiB) and at 200 Mbit/s (a slow cap's single transfer averages over thousands of
#: packets; a miss is measured again, below), 3 of ~0.14 s at 1000 Mbit/s (short transfers are where
#: scheduling noise shows: their median)
SCHEDULE = [(50, 1, MB16 // 4), (200, 1), (1000, 3)]


def _rows(r: dict) -> list[tuple[str, float, str]]:
    """(op, error, table line) of one cap's measurement."""
    predicted = r["nbytes"] * 8 * 1514 / 1448 / (r["cap_mbit"] * 1e6)
    out = []
    for op in ("p2p", "allreduce"):
        median = statistics.median(r[op])
        error = median / predicted - 1
        line = (f"{r['cap_mbit']:5g} Mbit/s {op:9s} predicted {predicted:.3f} s measured {median:.3f} s "
                f"({', '.join(f'{t:.3f}' for t in r[op])}) error {error:+.1%} "
                f"wire/payload {r[op + '_wire_factor']:.4f}")
        ok = abs(error) <= 0.10 and 1.0 < r[op + "_wire_factor"] < 1.10
        out.append((op, ok, line))
    return out


@pytest.mark.serial
def test_transfers_take_the_time_the_cap_predicts():
    """n bytes point to point and an n-byte all-reduce between 2 emulated nodes at 50, 200 and 1000
    Mbit/s (n = 4 MiB at 50, 16 MiB else; one pair of processes, the cap changed in place): the median
    of the repeats (one at 50 and 200 Mbit/s, three at 1000) is within 10% of n * 8 * 1514/1448 / cap.

    Robust on a shared machine: a cap whose medians miss is measured again (fresh processes), up to
    twice; it passes when one attempt has both medians within 10%. A wrong cap, header factor or
    layout misses every attempt; a busy CPU (measured: at load average 8-12 on 2 cores a 1000 Mbit/s
    transfer's median once ran 61% over, all-reduces up to 12% over) does not repeat itself. Every
    attempt is printed."""
    _require_root()
    emulate.preflight({"launcher": {"emulate": True, "backend": "gloo"}, "device": "cpu",
                       "network": {"bandwidth_gbps": 0.05}})
    table, failed = [], []
    for r in measure(SCHEDULE, MB16):
        rows = _rows(r)
        table += [line for _, _, line in rows]
        attempts = 1
        while not all(ok for _, ok, _ in rows) and attempts < 3:
            (r,) = measure([next(e for e in SCHEDULE if e[0] == r["cap_mbit"])], MB16)
            rows = _rows(r)
            attempts += 1
            table += [f"{line} (attempt {attempts})" for _, _, line in rows]
        failed += [line for _, ok, line in rows if not ok]
        assert not emulate.leftovers(r["run"]), emulate.leftovers(r["run"])
    print("\n" + "\n".join(table))
    assert not failed, "\n".join(["outside 10% of the cap's time (or wire bytes not payload + headers) in 3 "
                                  "attempts:", *failed, "all:", *table])


def test_workers_of_one_node_talk_unshaped():
    """cluster.gpus_per_node=2: both workers in one namespace; 16 MiB between them at a 5 Mbit/s
    cap takes far less than the cap's 28 s (intra-node traffic never crosses the shaped veth)."""
    _require_root()
    (r,) = measure([(5, 1)], MB16, gpus_per_node=2)
    at_cap = MB16 * 8 * 1514 / 1448 / 5e6
    assert max(r["p2p"] + r["allreduce"]) < at_cap / 10, (r, at_cap)
    assert r["p2p_wire_factor"] < 0.01 and r["allreduce_wire_factor"] < 0.01, r  # nothing through the link


def test_cleanup_removes_what_a_killed_launcher_left_and_keeps_live_runs():
    """A launcher killed with SIGKILL inside its cluster leaves namespaces and links;
    ``lsgd emulate --cleanup`` removes them and keeps those of a launch that still runs."""
    _require_root()
    code = ("import os, signal\nfrom lsgd.launch import emulate\n"
            "cfg = {'network': {'bandwidth_gbps': 0.1, 'latency_us': 0}, 'cluster': {'gpus_per_node': 2}}\n"
            "with emulate.cluster(cfg, 4) as plan:\n"
            "    print(plan.run, flush=True)\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n")
    killed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert killed.returncode == -9, killed.stderr
    run = killed.stdout.strip()
    left = emulate.leftovers(run)
    # 2 nodes (4 workers, 2 per node): 2 namespaces, 2 bridge-side veths, 1 bridge
    assert sorted(left) == sorted([f"lsgd-{run}-0", f"lsgd-{run}-1", f"lsgd{run}h0", f"lsgd{run}h1",
                                   f"lsgd{run}br"]), left
    with emulate.cluster({"network": {"bandwidth_gbps": 0.1, "latency_us": 0}}, 1) as live:
        out = subprocess.run([sys.executable, "-m", "lsgd.cli", "emulate", "--cleanup"], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert not emulate.leftovers(run), out.stdout
        assert sorted(emulate.leftovers(live.run)) == sorted([f"lsgd-{live.run}-0", f"lsgd{live.run}h0",
                                                              f"lsgd{live.run}br"])
    assert not emulate.leftovers(live.run)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_launcher_stopped_by_a_signal_removes_its_cluster(sig):
    """SIGTERM / SIGHUP (default action: death without cleanup, unless lsgd.launch.emulate catches them)
    and SIGINT to a process holding a cluster: it exits and nothing of its run is left."""
    _require_root()
    # SIGINT's Python handler explicitly: a test run started in the background by a shell without job
    # control inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler; SIGHUP's
    # default action explicitly: a test run started under nohup inherits SIGHUP ignored, which the
    # cluster rightly leaves alone (the process then sleeps through the signal)
    code = ("import signal, time\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "signal.signal(signal.SIGHUP, signal.SIG_DFL)\n"
            "from lsgd.launch import emulate\n"
            "with emulate.cluster({'network': {'bandwidth_gbps': 0.1, 'latency_us': 0}}, 2) as plan:\n"
            "    print(plan.run, flush=True)\n"
            "    time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run = proc.stdout.readline().strip()
    assert len(emulate.leftovers(run)) == 5  # 2 namespaces, 2 bridge-side veths, the bridge
    proc.send_signal(getattr(signal, sig))
    proc.wait(timeout=30)
    assert proc.returncode != 0 and emulate.leftovers(run) == [], proc.stderr.read()[-2000:]
