"""An emulated cluster on one machine: every node's workers in a network namespace behind a capped link.

``launcher.emulate=true`` (or the ``launcher=emulated`` preset) makes lsgd's local launch
(:func:`lsgd.launch.spawn.spawn_local`) build, for one run:

* a Linux bridge ``lsgd<id>br`` in the host's namespace, holding the first address of a private
  /24 (``MASTER_ADDR``: torch elastic's rendezvous store listens on every address of the host, so
  the workers reach it through the bridge);
* per node ``k`` (``cluster.gpus_per_node`` workers each; rank ``r`` on node ``r // gpus_per_node``
  as in :func:`lsgd.compute.workers.node_of`): a namespace ``lsgd-<id>-<k>`` and a veth pair,
  ``lsgd<id>w<k>`` inside the namespace (the worker's NIC, address ``.k+2``) and ``lsgd<id>h<k>`` on
  the bridge;
* a ``tbf`` qdisc at ``network.bandwidth_gbps`` on both ends of every veth: the worker-side end
  shapes the node's egress, the bridge-side end the node's ingress (the bridge sends towards the
  node through it). Shaping the bridge-side end instead of redirecting ingress to an ``ifb`` device
  needs no ``ifb`` module nor ``mirred`` action and puts the same qdisc kind on both directions: a
  switch with a capped port per node. Traffic between two nodes thus crosses the sender's egress
  cap and the receiver's ingress cap; traffic inside a node (same address) never leaves the
  namespace and is unshaped (the intra-node tier);
* ``network.latency_us`` (one way, node to node) as ``netem`` delay of half of it on each of the
  two hops, under the ``tbf``, where the kernel has ``sch_netem``; where it does not, one warning
  says that latency is the host's (veth + bridge, tens of microseconds).

Each worker process enters its node's namespace itself (:func:`worker_entry`, started by torch
elastic in place of :func:`lsgd.training.trainer.worker_main`): ``setns(2)`` on ``/run/netns/<name>``
through ``os.setns`` (Python >= 3.12) or libc's ``setns`` via ctypes (Python 3.11), before it opens
any socket, then ``GLOO_SOCKET_IFNAME`` = its veth and ``MASTER_ADDR`` = the bridge address.
``setns`` moves the calling thread; gloo's and the store's sockets are opened by that thread or by
threads it starts afterwards, which inherit the namespace. (``ip netns exec`` would need a command
line per rank instead of torch elastic's picklable entry point.)

Safety: every object carries the run's 6-hex id; the namespaces have no default route and there is
no NAT, so traffic stays between the namespaces and the bridge address; the /24 is chosen so that it
overlaps no route and no address of the host (checked at start). :func:`cluster` removes
everything when the launch ends, fails, is interrupted (Ctrl-C, SIGTERM) or loses a worker
(SIGKILL). A state file ``/run/lsgd-emulate/<id>.json`` names the launcher's process, so
``lsgd emulate --cleanup`` removes the objects of launchers that are gone (killed with SIGKILL) and
leaves those of live runs alone.

Facts measured on this machine kind: ``/work/shared/emulation.md``. Tools: iproute2's ``ip`` and
``tc`` (Debian package ``iproute2``).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import ipaddress
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from lsgd.clock.network import MTU, WIRE_FACTOR  # the emulated link's framing (the clock prices it)
from lsgd.core.errors import ConfigError

log = logging.getLogger("lsgd")

#: every object lsgd creates starts with this (namespaces ``lsgd-<id>-<k>``, links ``lsgd<id>...``)
PREFIX = "lsgd"
#: where each run's state file lives (tmpfs: gone after a reboot, as the objects are)
STATE_DIR = Path("/run/lsgd-emulate")
#: Linux's limit on interface names (IFNAMSIZ - 1)
IFNAME_MAX = 15
#: candidate /24 subnets: 10.200.0.0/24 ... 10.254.255.0/24 (RFC 1918), the first free one from a
#: start derived from the run id
_CANDIDATES = [ipaddress.ip_network(f"10.{a}.{b}.0/24") for a in range(200, 255) for b in range(256)]
CLONE_NEWNET = 0x40000000
#: TCP congestion control inside the namespaces. Reno is built into every kernel and allowed in every
#: namespace. This host's default, BBR, used a 50 Mbit/s link only ~88% in a 2-rank all-reduce (both
#: directions busy: +10-14% time vs the cap, 3 runs) against +2% with reno: BBR keeps its window near
#: twice the bandwidth x minimum-RTT product, which at 50 Mbit/s is a few frames, while the ACKs wait
#: behind the reverse direction's frames (0.24 ms each at 50 Mbit/s). Cubic (Linux's usual default)
#: is not in this host's tcp_allowed_congestion_control, so a namespace may not select it.
TCP_CONGESTION_CONTROL = "reno"
#: the longest a frame may wait in a tbf queue (tbf's ``latency``; its byte limit follows from the
#: rate), by default (``launcher.queue_ms``): 5 ms. With 50 ms a 2-rank all-reduce at 200 Mbit/s ran 4-11% over the cap's time (a
#: standing queue that the ring's segment exchanges wait behind), with 20 ms 2-3%. With 20 ms, paired
#: exchanges (both directions of a TCP connection busy: each direction's ACKs wait behind the other
#: direction's data in the acknowledging node's egress queue) between changing partners (4 nodes, SwarmSGD's pairs, 0.86 MB each
#: way at 50 Mbit/s) often left one direction of a connection slow for the rest of the run (its Reno
#: window halved by the queue's drops, below the 20 ms round trip's bandwidth-delay product): in 7
#: of 8 runs one node's messages took 173-201 ms (median) instead of the cap's 143 ms, and those runs
#: missed the clock by 12-24%; with 5 ms, 5 of 5 runs had no slow node (every node 142-145 ms) and
#: missed by 0.9-4.3%.
#: 2-rank 16 MiB calibration with 5 ms: point to point -0.3..-0.1%, all-reduce +1.1..+1.6% at
#: 50 Mbit/s, +6.5..+7.8% at 200, +0.2..+0.3% at 1000 (20 ms, same session: +6.2%, +2.4%, -0.1%)
TBF_QUEUE_MS = 5


@dataclass(frozen=True)
class Plan:
    """What a worker needs to find its node: the run id, the node layout and the addresses.

    Attributes:
        run: 6 hex digits naming every object of the run.
        nodes: number of namespaces (``ceil(workers / gpus_per_node)``).
        gpus_per_node: workers per namespace.
        subnet: the private /24 (``10.x.y.0/24``).
        master_addr: the bridge's address (the subnet's first host).
        rate_bit: the cap of each direction of each node link, bit/s.
        latency_us: one-way added delay between two nodes (0 where netem is missing or not asked).
        queue_ms: the longest a frame may wait in a link's tbf queue, ms (``launcher.queue_ms``).
    """

    run: str
    nodes: int
    gpus_per_node: int
    subnet: str
    master_addr: str
    rate_bit: int
    latency_us: float = 0.0
    queue_ms: float = TBF_QUEUE_MS

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.run}br"

    def netns(self, node: int) -> str:
        return f"{PREFIX}-{self.run}-{node}"

    def worker_if(self, node: int) -> str:
        """The worker-side veth (inside the namespace; ``GLOO_SOCKET_IFNAME``)."""
        return f"{PREFIX}{self.run}w{node}"

    def host_if(self, node: int) -> str:
        """The bridge-side veth (host namespace)."""
        return f"{PREFIX}{self.run}h{node}"

    def address(self, node: int) -> str:
        return str(ipaddress.ip_network(self.subnet)[node + 2])

    def node_of(self, local_rank: int) -> int:
        return local_rank // self.gpus_per_node


def new_run_id() -> str:
    """6 random hex digits (interface names stay within 15 characters for up to 999 nodes)."""
    return uuid.uuid4().hex[:6]


# --------------------------------------------------------------------------------------------
# iproute2
# --------------------------------------------------------------------------------------------
def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run one ``ip``/``tc`` command. Raises RuntimeError with the command and its stderr."""
    out = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {out.stderr.strip() or out.stdout.strip()}")
    return out


def host_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 route destination (all tables, default excluded) and address prefix of the host."""
    nets = []
    routes = _run("ip", "-4", "route", "show", "table", "all").stdout
    for line in routes.splitlines():
        words = line.split()
        if not words:
            continue
        dest = words[1] if words[0] in ("local", "broadcast", "unicast", "anycast", "multicast", "blackhole",
                                       "unreachable", "prohibit", "throw", "nat") else words[0]
        if dest == "default":
            continue
        with contextlib.suppress(ValueError):
            nets.append(ipaddress.ip_network(dest, strict=False))
    for m in re.finditer(r"inet (\d+\.\d+\.\d+\.\d+/\d+)", _run("ip", "-4", "-o", "addr").stdout):
        nets.append(ipaddress.ip_network(m.group(1), strict=False))
    return nets


def pick_subnet(run: str, taken: list[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """The first candidate /24 (10.200.0.0/24 .. 10.254.255.0/24, starting at one derived from
    ``run``) that overlaps none of ``taken``.

    Raises:
        ConfigError: every candidate overlaps a host route (none is free).
    """
    start = int(hashlib.sha256(run.encode()).hexdigest(), 16) % len(_CANDIDATES)
    for i in range(len(_CANDIDATES)):
        net = _CANDIDATES[(start + i) % len(_CANDIDATES)]
        if not any(net.overlaps(t) for t in taken):
            return net
    raise ConfigError("launcher.emulate: every subnet 10.200-254.x.0/24 overlaps a route of this host")


def tbf_args(rate_bit: int, queue_ms: float = TBF_QUEUE_MS) -> list[str]:
    """``tc`` arguments of the token bucket for a ``rate_bit`` cap: a bucket of 1 ms at the rate (at
    least 32 KiB, a few frames), a queue of at most ``queue_ms`` milliseconds (default
    :data:`TBF_QUEUE_MS`)."""
    burst = max(32 * 1024, rate_bit // 8 // 1000)
    return ["tbf", "rate", f"{rate_bit}bit", "burst", str(burst), "latency", f"{queue_ms:g}ms"]


def queue_ms_of(cfg: dict) -> float:
    """``launcher.queue_ms`` of ``cfg`` (ms; :data:`TBF_QUEUE_MS` when absent).

    Raises:
        ConfigError: not a number in (0, 1000].
    """
    value = (cfg.get("launcher") or {}).get("queue_ms", TBF_QUEUE_MS)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1000:
        raise ConfigError(f"launcher.queue_ms={value!r} is not allowed; allowed: a number of milliseconds "
                          f"in (0, 1000] (default {TBF_QUEUE_MS})")
    return float(value)


def _state_path(run: str) -> Path:
    return STATE_DIR / f"{run}.json"


def _proc_start(pid: int) -> str | None:
    """Start time of ``pid`` (field 22 of /proc/<pid>/stat), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def netem_available() -> bool:
    """Whether this kernel has the netem qdisc (probed on a throwaway dummy-free namespace's lo)."""
    probe = f"{PREFIX}-{new_run_id()}-probe"
    try:
        _run("ip", "netns", "add", probe)
        return _run("tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms",
                    check=False).returncode == 0
    except RuntimeError:
        return False
    finally:
        _run("ip", "netns", "del", probe, check=False)


# --------------------------------------------------------------------------------------------
# checks before anything starts
# --------------------------------------------------------------------------------------------
def preflight(cfg: dict, joined: bool = False) -> None:
    """Check that ``launcher.emulate=true`` can run here, before any worker or folder exists.

    Checks: a local launch (not joined to torchrun/srun), the gloo backend, a positive
    ``network.bandwidth_gbps``, root, iproute2's ``ip`` and ``tc``, and the kernel's network
    namespaces, veth, bridge and tbf (created and removed once under a throwaway id).

    Raises:
        ConfigError: naming what is missing.
    """
    from lsgd.core.devices import resolve_backend

    if not isinstance(cfg["launcher"].get("emulate"), bool):
        raise ConfigError(f"launcher.emulate={cfg['launcher'].get('emulate')!r} is not allowed; allowed: true, false")
    if joined:
        raise ConfigError("launcher.emulate=true works with lsgd's own local launch only, not inside a "
                          "torchrun/srun launch; set launcher.emulate=false or launcher.join=never")
    if resolve_backend(cfg) != "gloo":
        raise ConfigError(f"launcher.emulate=true needs launcher.backend=gloo (TCP sockets on the emulated "
                          f"links); got {resolve_backend(cfg)!r}")
    queue_ms_of(cfg)
    bw = float(cfg.get("network", {}).get("bandwidth_gbps") or 0)
    if bw <= 0:
        raise ConfigError(f"launcher.emulate=true needs network.bandwidth_gbps > 0; got {bw}")
    if os.geteuid() != 0:
        raise ConfigError("launcher.emulate=true needs root (network namespaces, veth pairs and tc qdiscs); "
                          "run as root or set launcher.emulate=false")
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        raise ConfigError(f"launcher.emulate=true needs iproute2's {' and '.join(missing)} on PATH "
                          "(Debian package iproute2; `make install` installs it as root)")
    probe = Plan(run=new_run_id(), nodes=1, gpus_per_node=1, subnet="0.0.0.0/32", master_addr="", rate_bit=10**8)
    steps = [
        ("network namespaces", ["ip", "netns", "add", probe.netns(0)]),
        ("bridge (kernel module bridge)", ["ip", "link", "add", probe.bridge, "type", "bridge"]),
        ("veth pairs (kernel module veth)", ["ip", "link", "add", probe.host_if(0), "type", "veth",
                                             "peer", "name", probe.worker_if(0)]),
        ("the tbf qdisc (kernel module sch_tbf)", ["tc", "qdisc", "add", "dev", probe.host_if(0), "root",
                                                   *tbf_args(probe.rate_bit)]),
    ]
    try:
        for what, cmd in steps:
            out = _run(*cmd, check=False)
            if out.returncode != 0:
                raise ConfigError(f"launcher.emulate=true: this machine cannot create {what}: "
                                  f"`{' '.join(cmd)}`: {out.stderr.strip()}")
    finally:
        _teardown(probe.run)


# --------------------------------------------------------------------------------------------
# build and remove
# --------------------------------------------------------------------------------------------
def _setup(plan: Plan, netem: bool) -> None:
    _run("ip", "link", "add", plan.bridge, "type", "bridge")
    _run("ip", "addr", "add", f"{plan.master_addr}/{ipaddress.ip_network(plan.subnet).prefixlen}", "dev", plan.bridge)
    _run("ip", "link", "set", plan.bridge, "up")
    prefix = ipaddress.ip_network(plan.subnet).prefixlen
    tbf = tbf_args(plan.rate_bit, plan.queue_ms)
    for k in range(plan.nodes):
        ns, w, h = plan.netns(k), plan.worker_if(k), plan.host_if(k)
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", h, "type", "veth", "peer", "name", w)
        _run("ip", "link", "set", w, "netns", ns)
        _run("ip", "link", "set", h, "master", plan.bridge)
        _run("ip", "-n", ns, "addr", "add", f"{plan.address(k)}/{prefix}", "dev", w)
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        _run("ip", "-n", ns, "link", "set", w, "up")
        _run("ip", "link", "set", h, "up")
        # egress of the node (worker side) and its ingress (bridge side, towards the node)
        for dev, netns in ((w, ["-n", ns]), (h, [])):
            _run("tc", *netns, "qdisc", "add", "dev", dev, "root", "handle", "1:", *tbf)
            if netem:
                _run("tc", *netns, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "netem",
                     "delay", f"{plan.latency_us / 2:g}us")


def set_rate(plan: Plan, rate_bit: int) -> Plan:
    """Change the cap of every node link of a running cluster to ``rate_bit`` (both directions;
    ``tc qdisc change`` of the tbf, nothing rebuilt). Returns the plan with the new rate.

    Raises:
        RuntimeError: a ``tc`` command failed.
    """
    for k in range(plan.nodes):
        for dev, netns in ((plan.worker_if(k), ["-n", plan.netns(k)]), (plan.host_if(k), [])):
            _run("tc", *netns, "qdisc", "change", "dev", dev, "root", "handle", "1:", *tbf_args(rate_bit, plan.queue_ms))
    return Plan(**{**asdict(plan), "rate_bit": int(rate_bit)})


def _teardown(run: str) -> list[str]:
    """Remove every namespace and link of ``run`` (and its state file); returns what was removed.
    Deleting a bridge-side veth deletes its peer; a namespace's own veth goes with the namespace."""
    removed = []
    for name in _links(run):
        if _run("ip", "link", "del", name, check=False).returncode == 0:
            removed.append(name)
    for name in _namespaces(run):
        if _run("ip", "netns", "del", name, check=False).returncode == 0:
            removed.append(name)
    with contextlib.suppress(FileNotFoundError):
        _state_path(run).unlink()
    return removed


def _namespaces(run: str | None = None) -> list[str]:
    """lsgd's namespaces (of ``run``, or of every run)."""
    names = [line.split()[0] for line in _run("ip", "netns", "list", check=False).stdout.splitlines() if line.strip()]
    pat = re.compile(rf"^{PREFIX}-{run or '[0-9a-f]{6}'}-(\d+|probe)$")
    return [n for n in names if pat.match(n)]


def _links(run: str | None = None) -> list[str]:
    """lsgd's links in the host namespace: bridge-side veths first, then bridges."""
    out = _run("ip", "-o", "link", "show", check=False).stdout
    names = [m.group(1) for m in re.finditer(r"^\d+:\s+([^:@\s]+)", out, re.M)]
    pat = re.compile(rf"^{PREFIX}({run or '[0-9a-f]{6}'})(br|h\d+|w\d+)$")
    found = [n for n in names if pat.match(n)]
    return sorted(found, key=lambda n: n.endswith("br"))


def leftovers(run: str | None = None) -> list[str]:
    """Names of lsgd's namespaces and host links still present (of ``run``, or all)."""
    return _namespaces(run) + _links(run)


def _run_ids() -> set[str]:
    ids = {re.match(rf"^{PREFIX}-([0-9a-f]{{6}})-", n).group(1) for n in _namespaces()}
    ids |= {re.match(rf"^{PREFIX}([0-9a-f]{{6}})", n).group(1) for n in _links()}
    ids |= {p.stem for p in STATE_DIR.glob("*.json")} if STATE_DIR.is_dir() else set()
    return ids


def _alive(run: str) -> bool:
    """Whether the launcher that owns ``run`` (its state file) still runs."""
    try:
        state = json.loads(_state_path(run).read_text())
    except (OSError, ValueError):
        return False
    return _proc_start(int(state["pid"])) == state.get("start")


def cleanup(all_runs: bool = False) -> list[str]:
    """Remove the objects of runs whose launcher is gone (``all_runs``: of every run, live or not).
    Returns the names removed. Needs root."""
    removed = []
    for run in sorted(_run_ids()):
        if all_runs or not _alive(run):
            removed += _teardown(run)
    return removed


@contextlib.contextmanager
def _signals_blocked():
    """SIGINT/SIGTERM/SIGHUP wait while the teardown runs (a second Ctrl-C must not stop it halfway)."""
    sigs = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def _signals_raise():
    """SIGTERM and SIGHUP with their default action (death without a ``finally``) raise SystemExit
    (128 + signal) instead while the cluster exists, so its teardown runs; handlers that others set
    (torch elastic's agent sets its own while it runs) are left alone. Main thread only."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    old = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_DFL:
            old[sig] = signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


_warned_latency = False


def describe(plan: Plan, cfg: dict, netem: bool) -> dict:
    """What a run's ``environment.json`` records of its emulated cluster (the ``emulation`` entry of
    its session): the run id, nodes and workers per node, the subnet, the cap of each direction of
    each node link (bit/s) and the tbf's bucket and queue, the frame factor of the link
    (:data:`WIRE_FACTOR`) beside the clock's ``network.wire_overhead``, the TCP congestion control
    inside the namespaces, whether the kernel has netem, and the latency asked for and emulated (us)."""
    tbf = tbf_args(plan.rate_bit, plan.queue_ms)
    return {
        "run": plan.run, "nodes": plan.nodes, "gpus_per_node": plan.gpus_per_node, "subnet": plan.subnet,
        "qdisc": "tbf", "cap_bit_s": {"egress": plan.rate_bit, "ingress": plan.rate_bit},
        "tbf_burst_bytes": int(tbf[tbf.index("burst") + 1]), "tbf_queue_ms": plan.queue_ms,
        "mtu": MTU, "frame_wire_factor": WIRE_FACTOR,
        "clock_wire_overhead": (cfg.get("network") or {}).get("wire_overhead"),
        "tcp_congestion_control": TCP_CONGESTION_CONTROL, "netem": bool(netem),
        "latency_us": {"configured": float((cfg.get("network") or {}).get("latency_us") or 0),
                       "emulated": plan.latency_us},
    }  # fmt: skip


def _record(run_dir: str | Path | None, description: dict) -> None:
    """Add ``description`` as ``emulation`` to the current session of the run's ``environment.json``
    (written by the launch before the cluster is built); nothing when there is no run folder or file."""
    if run_dir is None:
        return
    from lsgd.core.files import write_atomic
    from lsgd.core.run_files import ENVIRONMENT_FILE
    from lsgd.training import provenance

    data = provenance.read_environment(run_dir)
    if data is None:
        return
    provenance.current_session(data)["emulation"] = description
    write_atomic(Path(run_dir) / ENVIRONMENT_FILE, json.dumps(data, indent=2, default=str) + "\n")


@contextlib.contextmanager
def cluster(cfg: dict, nproc: int, run_dir: str | Path | None = None) -> Iterator[Plan]:
    """Build the emulated cluster for ``nproc`` local workers of ``cfg`` and remove it on the way out
    (normal end, exception, Ctrl-C / SIGTERM turned into exceptions by torch elastic, a worker's
    SIGKILL reported by the agent). With ``run_dir``, its ``environment.json`` gets the cluster's
    description (:func:`describe`).

    Yields the :class:`Plan` the workers read.

    Raises:
        ConfigError: the setup failed (everything built so far is removed first).
    """
    global _warned_latency
    gpn = max(1, int((cfg.get("cluster") or {}).get("gpus_per_node") or 1))
    nodes = -(-nproc // gpn)
    if nodes > 999:
        raise ConfigError(f"launcher.emulate=true supports up to 999 nodes; got {nodes}")
    net = cfg["network"]
    latency = float(net.get("latency_us") or 0)
    have_netem = netem_available()
    netem = latency > 0 and have_netem
    if latency > 0 and not netem and not _warned_latency:
        _warned_latency = True
        log.warning("launcher.emulate: network.latency_us=%g is not emulated: this kernel has no netem qdisc "
                    "(sch_netem); latency is the host's (veth + bridge, tens of microseconds)", latency)
    run = new_run_id()
    subnet = pick_subnet(run, host_networks())
    plan = Plan(run=run, nodes=nodes, gpus_per_node=gpn, subnet=str(subnet), master_addr=str(subnet[1]),
                rate_bit=int(round(float(net["bandwidth_gbps"]) * 1e9)), latency_us=latency if netem else 0.0,
                queue_ms=queue_ms_of(cfg))
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    _state_path(run).write_text(json.dumps({"pid": os.getpid(), "start": _proc_start(os.getpid()), **asdict(plan)}))
    with contextlib.ExitStack() as stack:
        stack.callback(_teardown_quietly, run)  # runs last, after the signal handlers are restored
        stack.enter_context(_signals_raise())
        try:
            _setup(plan, netem)
        except RuntimeError as exc:
            raise ConfigError(f"launcher.emulate=true: building the emulated cluster failed: {exc}") from None
        log.info("emulated cluster %s: %d node(s) x %d worker(s) on %s, %g Mbit/s per direction per node%s",
                 run, nodes, gpn, subnet, plan.rate_bit / 1e6,
                 f", {latency:g} us one way" if netem else "")
        _record(run_dir, describe(plan, cfg, have_netem))
        yield plan


def _teardown_quietly(run: str) -> None:
    with _signals_blocked():
        _teardown(run)


def enter_netns(name: str) -> None:
    """Move the calling thread into network namespace ``name`` (``/run/netns/<name>``, made by
    ``ip netns add``): ``os.setns`` on Python >= 3.12, libc ``setns(2)`` through ctypes before.

    Raises:
        OSError: the namespace does not exist or setns failed (not root).
    """
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if hasattr(os, "setns"):
            os.setns(fd, CLONE_NEWNET)
        else:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns({name}): {os.strerror(err)}")
    finally:
        os.close(fd)


def enter_node(plan: Plan, local_rank: int) -> int:
    """Put this worker process on its node: enter the namespace, select its TCP congestion control
    (:data:`TCP_CONGESTION_CONTROL`), bind gloo to the node's veth
    (``GLOO_SOCKET_IFNAME``) and point ``MASTER_ADDR`` at the bridge. Returns the node index."""
    node = plan.node_of(local_rank)
    enter_netns(plan.netns(node))
    # the namespace's own sysctl (this thread is in it now): reno, see TCP_CONGESTION_CONTROL
    Path("/proc/sys/net/ipv4/tcp_congestion_control").write_text(TCP_CONGESTION_CONTROL)
    os.environ["GLOO_SOCKET_IFNAME"] = plan.worker_if(node)
    os.environ["MASTER_ADDR"] = plan.master_addr
    return node


def worker_entry(cfg: dict, run_dir: str | None, *args):
    """torch elastic's entry point for an emulated worker: :func:`enter_node`, then
    :func:`lsgd.training.trainer.worker_main` with the same arguments (``cfg["_emulate"]`` holds the
    :class:`Plan`)."""
    cfg = dict(cfg)
    plan = Plan(**cfg.pop("_emulate"))
    enter_node(plan, int(os.environ.get("LOCAL_RANK", "0")))
    from lsgd.training.trainer import worker_main

    return worker_main(cfg, run_dir, *args)


@contextlib.contextmanager
def launch(cfg: dict, nproc: int, entry, run_dir: str | Path | None = None):
    """What :func:`lsgd.launch.spawn.spawn_local` starts: ``(entry, cfg)`` unchanged without
    ``launcher.emulate``, else ``(worker_entry, cfg + plan)`` inside :func:`cluster` (which records
    the cluster in ``run_dir``'s ``environment.json``)."""
    if not cfg["launcher"].get("emulate"):
        yield entry, cfg
        return
    with cluster(cfg, nproc, run_dir) as plan:
        yield worker_entry, dict(cfg, _emulate=asdict(plan))


def main(argv: list[str]) -> int:
    """``lsgd emulate --cleanup [--all]``: remove leftovers of launchers that are gone (``--all``:
    of every emulated launch, running or not); ``lsgd emulate --list``: print what exists."""
    import argparse

    parser = argparse.ArgumentParser(prog="lsgd emulate", description=main.__doc__)
    parser.add_argument("--cleanup", action="store_true", help="remove what killed launchers left")
    parser.add_argument("--all", action="store_true", help="with --cleanup: also the objects of running launches")
    parser.add_argument("--list", action="store_true", help="print lsgd's namespaces and links")
    args = parser.parse_args(argv)
    if not (args.cleanup or args.list):
        parser.print_usage()
        return 2
    if args.cleanup and os.geteuid() != 0:
        print("lsgd emulate --cleanup needs root", file=sys.stderr)
        return 1
    if args.list:
        for name in leftovers():
            print(name)
        return 0
    removed = cleanup(all_runs=args.all)
    kept = leftovers()
    print(f"removed {len(removed)} object(s)" + (f": {', '.join(removed)}" if removed else "")
          + (f"; kept {len(kept)} of running launches (--all removes them)" if kept else ""))
    return 0
