"""lsgd.launch.emulate without building a cluster: names, subnets, tbf arguments, the checks before a run."""

from __future__ import annotations

import ipaddress
import json
import subprocess

import pytest

from lsgd.launch import emulate
from lsgd.core.errors import ConfigError


def _plan(**kw):
    base = dict(run="abcdef", nodes=999, gpus_per_node=2, subnet="10.200.0.0/24", master_addr="10.200.0.1",
                rate_bit=10**8)
    return emulate.Plan(**{**base, **kw})


def test_names_fit_linux_interface_names_and_carry_the_run_id():
    plan = _plan()
    for node in (0, 998):
        for name in (plan.bridge, plan.worker_if(node), plan.host_if(node)):
            assert len(name) <= 15 and "abcdef" in name and name.startswith("lsgd")
        assert plan.netns(node) == f"lsgd-abcdef-{node}"
    # rank r on node r // gpus_per_node (lsgd.compute.workers.node_of)
    assert [plan.node_of(r) for r in range(5)] == [0, 0, 1, 1, 2]
    assert plan.address(0) == "10.200.0.2" and plan.address(3) == "10.200.0.5"
    assert len(emulate.new_run_id()) == 6


def test_wire_factor_is_a_full_frame_per_tcp_segment():
    # MTU 1500: 1500 - 20 (IP) - 20 (TCP) - 12 (timestamps) = 1448 payload bytes in 1514 (+ Ethernet)
    assert emulate.WIRE_FACTOR == pytest.approx(1514 / 1448)


def test_tbf_bucket_is_one_millisecond_at_least_32_kib():
    args = emulate.tbf_args(10**9)
    assert args[:3] == ["tbf", "rate", "1000000000bit"]
    assert int(args[args.index("burst") + 1]) == 10**9 // 8 // 1000
    assert int(emulate.tbf_args(50 * 10**6)[4]) == 32 * 1024


def test_subnet_avoids_every_taken_network():
    taken = [ipaddress.ip_network("10.0.0.0/9"), ipaddress.ip_network("10.128.0.0/10")]
    for run in ("000000", "abcdef", "ffffff"):
        net = emulate.pick_subnet(run, taken)
        assert net.prefixlen == 24 and not any(net.overlaps(t) for t in taken)
        assert net.subnet_of(ipaddress.ip_network("10.0.0.0/8"))  # RFC 1918
    only = ipaddress.ip_network("10.254.255.0/24")
    everything_else = list(ipaddress.ip_network("10.0.0.0/8").address_exclude(only))  # 16 networks
    assert emulate.pick_subnet("abcdef", everything_else) == only
    with pytest.raises(ConfigError, match="overlaps a route"):
        emulate.pick_subnet("abcdef", [ipaddress.ip_network("10.0.0.0/8")])


def test_the_chosen_subnet_overlaps_no_route_of_this_host():
    """Against iproute2's JSON output (an independent parse of the routing tables)."""
    routes = json.loads(subprocess.run(["ip", "-j", "-4", "route", "show", "table", "all"], capture_output=True,
                                       text=True, check=True).stdout)
    dests = [ipaddress.ip_network(r["dst"], strict=False) for r in routes if r["dst"] != "default"]
    assert dests, "no route parsed"
    net = emulate.pick_subnet(emulate.new_run_id(), emulate.host_networks())
    assert not any(net.overlaps(d) for d in dests), (net, dests)


def _cfg(**launcher):
    return {"launcher": {"emulate": True, "backend": "gloo", **launcher}, "device": "cpu",
            "network": {"bandwidth_gbps": 0.1}}


@pytest.mark.parametrize("cfg, message", [
    (_cfg(emulate="yes"), "launcher.emulate='yes' is not allowed; allowed: true, false"),
    (_cfg(backend="nccl"), "needs launcher.backend=gloo"),
    ({**_cfg(), "network": {"bandwidth_gbps": 0}}, "network.bandwidth_gbps > 0"),
])
def test_bad_configs_are_refused_before_anything_starts(cfg, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        emulate.preflight(cfg)


def test_a_joined_launch_is_refused():
    with pytest.raises(ConfigError, match="local launch only"):
        emulate.preflight(_cfg(), joined=True)


def test_missing_root_or_tools_are_named(monkeypatch):
    monkeypatch.setattr(emulate.os, "geteuid", lambda: 1000)
    with pytest.raises(ConfigError, match="needs root"):
        emulate.preflight(_cfg())
    monkeypatch.setattr(emulate.os, "geteuid", lambda: 0)
    monkeypatch.setattr(emulate.shutil, "which", lambda tool: None if tool == "tc" else "/usr/sbin/ip")
    with pytest.raises(ConfigError, match="iproute2's tc"):
        emulate.preflight(_cfg())


def test_a_missing_kernel_feature_is_named(monkeypatch):
    """A failing step (here: tc's tbf, as on a kernel without sch_tbf) is a ConfigError naming it,
    and the probe's objects are removed."""
    real = emulate._run
    monkeypatch.setattr(emulate.os, "geteuid", lambda: 0)
    monkeypatch.setattr(emulate.shutil, "which", lambda tool: "/usr/sbin/" + tool)
    calls = []

    def fake(*cmd, check=True):
        calls.append(cmd)
        if cmd[0] == "tc":
            return subprocess.CompletedProcess(cmd, 2, "", "Error: Specified qdisc kind is unknown.")
        if cmd[:2] == ("ip", "netns") and cmd[2] == "add" or cmd[:3] == ("ip", "link", "add"):
            return subprocess.CompletedProcess(cmd, 0, "", "")
        return real(*cmd, check=check)

    monkeypatch.setattr(emulate, "_run", fake)
    with pytest.raises(ConfigError, match=r"cannot create the tbf qdisc \(kernel module sch_tbf\).*unknown"):
        emulate.preflight(_cfg())


def test_queue_is_launcher_queue_ms_and_bad_values_are_refused():
    assert emulate.tbf_args(10**8)[-2:] == ["latency", f"{emulate.TBF_QUEUE_MS:g}ms"]
    assert emulate.tbf_args(10**8, 20)[-2:] == ["latency", "20ms"]
    assert emulate.queue_ms_of({"launcher": {}}) == emulate.TBF_QUEUE_MS
    assert emulate.queue_ms_of({"launcher": {"queue_ms": 2.5}}) == 2.5
    for bad in (0, -1, True, "5", 5000):
        with pytest.raises(ConfigError, match=r"launcher\.queue_ms"):
            emulate.queue_ms_of({"launcher": {"queue_ms": bad}})
