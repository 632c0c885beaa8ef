"""``lsgd train launcher=emulated`` (lsgd.launch.emulate, issue 23) end to end: a run on capped links, and
no namespace, veth, bridge or qdisc left after a normal run, a worker killed with SIGKILL, or Ctrl-C
(SIGINT to the launcher).

Needs root and the kernel's namespaces, veth, bridge and tbf (CI runs as root): without them these
tests FAIL with the reason (tests/conftest.py: only CUDA tests may skip).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from runner import LSGD, TINY, lsgd, metrics, run_dirs, session_processes, summary

from lsgd.launch import emulate

EMULATED = ["launcher=emulated", "launcher.nproc_per_node=2"]


@pytest.fixture
def root():
    """The emulated cluster needs root; the tests fail (not skip) without it."""
    if os.geteuid() != 0:
        pytest.fail("the emulated cluster needs root (network namespaces, veth, tc); CI runs as root")


def _run_id(run: Path) -> str:
    """The emulated cluster's run id (6 hex digits naming every namespace, link and qdisc it built),
    from the run folder's environment.json (written once the cluster is built, before the workers
    start)."""
    rid = json.loads((run / "environment.json").read_text())["emulation"]["run"]
    assert re.fullmatch(r"[0-9a-f]{6}", rid), rid
    return rid


def _left(rid: str) -> list[str]:
    """This run's namespaces and host links still present, and the qdiscs of its links on the host
    (a veth removed takes its qdiscs along). Only this run's: another emulated run may be live beside
    the test, and its objects are not the test's to judge."""
    out = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True, check=True).stdout
    qdiscs = [line for line in out.splitlines() if re.search(rf" dev {emulate.PREFIX}{rid}(br|h\d+|w\d+) ", line + " ")]
    return emulate.leftovers(rid) + qdiscs


def test_an_emulated_run_is_bound_by_the_cap_and_leaves_nothing(tmp_path, root):
    """ddp on 3 workers (3 nodes: more than a pair) at 20 Mbit/s: the run completes, its wall time
    is at least the wire bytes at the cap (n * 8 * 1514/1448 / cap; DDP overlaps the all-reduce with
    backward, so no more can be said), the missing netem is said once, environment.json records the
    emulation, and nothing is left."""
    cap = 0.02
    res = lsgd(["train", *TINY, *EMULATED, "launcher.nproc_per_node=3", "algo=ddp", "max_steps=6",
                f"network.bandwidth_gbps={cap}",
                f"results_dir={tmp_path}/r"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = run_dirs(tmp_path / "r")
    assert summary(run)["status"] == "completed"
    last = metrics(run, drop_time=False)[-1]
    at_cap = last["wire_bytes"] * 8 * 1514 / 1448 / (cap * 1e9)
    assert at_cap > 0.5 and last["wall_time_s"] >= 0.95 * at_cap, (last["wall_time_s"], at_cap)
    warned = res.stderr.count("is not emulated: this kernel has no netem")
    netem = emulate.netem_available()
    assert warned == (0 if netem else 1), res.stderr[-3000:]
    # environment.json records the emulation; the clock priced the frames (network.wire_overhead)
    emu = json.loads((run / "environment.json").read_text())["emulation"]
    assert emu["cap_bit_s"] == {"egress": 20_000_000, "ingress": 20_000_000} and emu["nodes"] == 3
    assert emu["frame_wire_factor"] == emu["clock_wire_overhead"] == pytest.approx(1514 / 1448, rel=1e-15)
    assert emu["tcp_congestion_control"] == "reno" and emu["netem"] is netem
    assert emu["latency_us"]["emulated"] == (emu["latency_us"]["configured"] if netem else 0.0)
    assert _left(emu["run"]) == []


def _start_slow_run(tmp_path: Path) -> tuple[subprocess.Popen, str, list[str]]:
    """An emulated run at 5 Mbit/s long enough to interrupt; returns it once both workers sit in
    their namespaces and training has logged a step, with its run id and namespaces (read from its
    own run folder, so another emulated run live beside it is never taken for it)."""
    args = ["train", *TINY, *EMULATED, "algo=ddp", "max_steps=400", "log_every=1", "network.bandwidth_gbps=0.005",
            f"results_dir={tmp_path}/r"]
    proc = subprocess.Popen(LSGD + args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=dict(os.environ, WANDB_MODE="disabled"))
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        logged = [p for p in (tmp_path / "r").rglob("metrics.jsonl") if p.stat().st_size > 0]
        if not logged:
            time.sleep(0.3)
            continue
        rid = _run_id(logged[0].parent)
        spaces = [n for n in emulate.leftovers(rid) if n.startswith(f"{emulate.PREFIX}-")]
        pids = [p for n in spaces for p in subprocess.run(["ip", "netns", "pids", n], capture_output=True,
                                                         text=True).stdout.split()]
        if len(spaces) == 2 and len(pids) >= 2:
            return proc, rid, sorted(spaces)
        time.sleep(0.3)
    proc.kill()
    raise AssertionError(f"the emulated run did not start: {proc.communicate()[0][-3000:]}")


def _finish(proc: subprocess.Popen) -> str:
    """The launcher's output once it and every process of its session (workers, multiprocessing's
    resource tracker, which outlives the launcher by a moment) are gone."""
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"the launcher did not stop: {proc.communicate()[0][-3000:]}") from None
    deadline = time.monotonic() + 15
    while session_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return out


def test_a_worker_killed_with_sigkill_leaves_nothing(tmp_path, root):
    proc, rid, spaces = _start_slow_run(tmp_path)
    victim = int(subprocess.run(["ip", "netns", "pids", spaces[-1]], capture_output=True, text=True).stdout.split()[0])
    os.kill(victim, signal.SIGKILL)
    out = _finish(proc)
    assert proc.returncode != 0, out[-3000:]
    assert _left(rid) == [], out[-3000:]
    assert session_processes(proc.pid) == []
    (run,) = run_dirs(tmp_path / "r")
    assert json.loads((run / "summary.json").read_text())["status"] == "failed"


def test_ctrl_c_to_the_launcher_leaves_nothing(tmp_path, root):
    proc, rid, _ = _start_slow_run(tmp_path)
    os.kill(proc.pid, signal.SIGINT)
    out = _finish(proc)
    assert proc.returncode != 0, out[-3000:]
    assert _left(rid) == [], out[-3000:]
    assert session_processes(proc.pid) == []
