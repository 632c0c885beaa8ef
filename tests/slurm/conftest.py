"""A real SLURM cluster on this machine for the tests in this folder: munged, slurmctld and two
slurmd "nodes" (node1, node2) on localhost, every file under one temporary folder.

Facts from ../shared/slurm.md (found by running it on a machine like CI's): the daemons run in
the foreground as children of this fixture, so it stops exactly the processes it started; munged
needs ``--force`` and a 0755 folder for its socket; the node names must resolve (a line in
/etc/hosts, removed at the end); ``SlurmdParameters=config_overrides`` lets a node declare more
CPUs than the host has; ``batch_sched_delay=0`` avoids a 3 s delay per job. Accounting is off, so
tests of failing jobs put timeouts around them.

The fixture installs slurm-wlm and munge with apt-get when they are missing. Where that cannot
work (not root, or no apt-get) it fails with the reason: only tests that need CUDA may skip.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
NODES = ("node1", "node2")
CPUS_PER_NODE = 4
HOSTS_LINE = "127.0.0.1 " + " ".join(NODES) + "  # lsgd-test-slurm"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _unavailable(reason: str) -> None:
    pytest.fail(f"a real SLURM cluster is required for these tests: {reason}")


def _ensure_packages() -> None:
    if all(shutil.which(b) for b in ("slurmctld", "slurmd", "sbatch", "munged")):
        return
    if os.geteuid() != 0:
        _unavailable("SLURM is not installed and installing it needs root")
    if not shutil.which("apt-get"):
        _unavailable("SLURM is not installed and apt-get is not available")
    cmd = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(cmd, env=env, capture_output=True, check=False).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, check=False)
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            _unavailable(f"apt-get install {' '.join(PACKAGES)} failed: {res.stderr[-500:]}")


@dataclass
class SlurmCluster:
    """The running cluster: ``env`` (SLURM_CONF set) for client commands and jobs."""

    base: Path
    env: dict
    procs: list[subprocess.Popen] = field(default_factory=list)

    def run(self, args: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
        """A client command (sbatch, srun, sinfo, ...) against this cluster."""
        return subprocess.run(args, env=kw.pop("env", self.env), capture_output=True, text=True,
                              timeout=timeout, check=False, **kw)

    def job_processes(self) -> list[int]:
        """PIDs of processes started by this cluster's jobs (their environment names its SLURM_CONF)."""
        conf = self.env["SLURM_CONF"].encode()
        out = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) in {p.pid for p in self.procs}:
                continue
            try:
                environ = (d / "environ").read_bytes()
                state = (d / "stat").read_text().split(")")[-1].split()[0]
            except OSError:
                continue
            if b"SLURM_CONF=" + conf in environ and b"SLURM_JOB_ID=" in environ and state != "Z":
                out.append(int(d.name))
        return out


def _write_conf(base: Path, ctl_port: int, node_ports: dict[str, int]) -> Path:
    nodes = "\n".join(
        f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={p} CPUs={CPUS_PER_NODE} RealMemory=16384"
        for n, p in node_ports.items()
    )
    conf = base / "slurm.conf"
    conf.write_text(f"""ClusterName=lsgdtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctl_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={base}/munge/munge.sock
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool/%n
SlurmdPidFile={base}/run/slurmd-%n.pid
SlurmdLogFile={base}/log/slurmd-%n.log
SlurmctldPidFile={base}/run/slurmctld.pid
SlurmctldLogFile={base}/log/slurmctld.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=batch_sched_delay=0
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=2
InactiveLimit=0
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
    return conf


def _wait(predicate, timeout: float, what: str, cluster: SlurmCluster) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        for p in cluster.procs:
            if p.poll() is not None:
                logs = "\n".join(f.read_text()[-1500:] for f in (cluster.base / "log").glob("*.log"))
                raise RuntimeError(f"SLURM daemon {p.args} exited with {p.returncode} while waiting for {what}\n{logs}")
        time.sleep(0.1)
    logs = "\n".join(f.read_text()[-1500:] for f in (cluster.base / "log").glob("*.log"))
    raise TimeoutError(f"SLURM cluster: {what} not reached in {timeout} s\n{logs}")


def _stop(cluster: SlurmCluster) -> None:
    for pid in cluster.job_processes():  # leftovers of jobs (pitfall 9)
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for p in reversed(cluster.procs):
        if p.poll() is None:
            p.terminate()
    for p in reversed(cluster.procs):
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def _hosts(add: bool) -> None:
    hosts = Path("/etc/hosts")
    lines = [line for line in hosts.read_text().splitlines() if not line.endswith("# lsgd-test-slurm")]
    if add:
        lines.append(HOSTS_LINE)
    hosts.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="session")
def slurm_cluster():
    """A running 2-node SLURM cluster (``SlurmCluster``); stopped, with its files, at the end."""
    if os.geteuid() != 0:
        _unavailable("a local SLURM cluster needs root (SlurmUser=root, munged, /etc/hosts)")
    _ensure_packages()
    base = Path(tempfile.mkdtemp(prefix="lsgd-slurm-"))
    for sub in ("munge", "state", "spool", "run", "log"):
        (base / sub).mkdir()
    for d in (base, base / "munge"):
        d.chmod(0o755)
    key = base / "munge" / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    ctl_port = _free_port()
    conf = _write_conf(base, ctl_port, {n: _free_port() for n in NODES})
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for k in [k for k in env if k.startswith(("SLURM_", "SBATCH_", "SRUN_")) and k != "SLURM_CONF"]:
        del env[k]
    cluster = SlurmCluster(base, env)
    _hosts(True)
    try:
        cluster.procs.append(subprocess.Popen(
            ["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={base}/munge/munge.sock",
             f"--pid-file={base}/run/munged.pid", f"--log-file={base}/log/munged.log",
             f"--seed-file={base}/munge/munge.seed"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait(lambda: (base / "munge" / "munge.sock").exists(), 20, "munged's socket", cluster)
        cluster.procs.append(subprocess.Popen(["slurmctld", "-D", "-i"], env=env,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for n in NODES:
            cluster.procs.append(subprocess.Popen(["slurmd", "-D", "-N", n], env=env,
                                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        def idle() -> bool:
            try:
                out = cluster.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10).stdout.split()
            except subprocess.TimeoutExpired:  # a hung probe (pitfall 7)
                return False
            states = dict(zip(out[::2], out[1::2]))
            return all(states.get(n) == "idle" for n in NODES)

        _wait(idle, 60, "both nodes idle", cluster)
        yield cluster
    finally:
        _stop(cluster)
        _hosts(False)
        shutil.rmtree(base, ignore_errors=True)
