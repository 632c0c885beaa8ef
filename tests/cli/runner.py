"""Helpers to run the real `lsgd` command in a subprocess and read its run folders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

LSGD = [sys.executable, "-m", "lsgd.cli"]
# measured on this machine: differ run to run (the cluster clock's modeled_* keys must not)
TIME_KEYS = {"wall_time_s", "compute_time_s", "compute_time_s_max", "comm_time_s", "samples_per_s"}
TINY = [
    "debug=default",
    "dataset.num_train=512",
    "dataset.num_test=256",
    "epochs=2",
    "launcher.timeout_s=30",
]


def lsgd(args, cwd: Path, timeout: float = 240, env=None) -> subprocess.CompletedProcess:
    """Run `lsgd ARGS` in its own session (so leftover processes can be found) and wait."""
    e = dict(os.environ)
    e.setdefault("WANDB_MODE", "disabled")
    e.update(env or {})
    proc, out, err = _session(LSGD + list(args), cwd, e, timeout, f"lsgd {args}")
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    result.session = proc.pid
    return result


def _session(cmd: list[str], cwd, env: dict, timeout: float, what: str) -> tuple[subprocess.Popen, str, str]:
    """Run ``cmd`` in a session of its own to the end: (process, stdout, stderr); past ``timeout``
    seconds the whole session is killed and an AssertionError names ``what``."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        raise AssertionError(f"{what} timed out\n{out}\n{err}")
    return proc, out, err


#: the body of :func:`lsgd_forked`: imports what `lsgd train` imports before its workers start
#: (torch, lsgd, Hydra and its plugins), then runs each command in a child forked from it (all at once) as
#: `python -m lsgd.cli` runs it (lsgd.cli.main; the exit code of SystemExit, or 1 with the traceback
#: of another exception)
_FORKED = r"""
import importlib, json, os, sys, traceback
for name in ("lsgd.cli", "lsgd.launch.launcher", "lsgd.launch.emulate", "lsgd.training.trainer", "lsgd.config.schemas",
             "torch.distributed.launcher.api", "hydra._internal.hydra", "hydra._internal.utils"):
    importlib.import_module(name)
from hydra.core.plugins import Plugins
import lsgd.cli
Plugins.instance()  # finds Hydra's plugins (importing hydra_plugins.*) once
children = {}
for key, (args, cwd) in json.loads(sys.argv[1]).items():
    files = [os.path.join(cwd, f".lsgd-{key}.{name}") for name in ("out", "err")]
    pid = os.fork()
    if pid:
        children[key] = (pid, files)
    else:
        try:
            os.chdir(cwd)
            for fd, path in zip((1, 2), files):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            sys.argv = ["lsgd", *args]
            code = lsgd.cli.main(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) or exc.code is None else 1
            if not isinstance(exc.code, int) and exc.code is not None:
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or 0)
out = {}
for key, (pid, files) in children.items():
    _, status = os.waitpid(pid, 0)
    out[key] = [os.waitstatus_to_exitcode(status), *(open(f).read() for f in files)]
print(json.dumps(out))
"""


def lsgd_forked(jobs: dict[str, tuple[list[str], Path]], timeout: float = 240) -> dict[str, subprocess.CompletedProcess]:
    """``{key: (ARGS, cwd)}`` -> ``{key: the result of `lsgd ARGS` run in cwd}``, for commands that end
    before any worker starts (a rejected config): each runs in a process forked from one that has
    imported torch, Hydra and lsgd once (as the gloo tests' ranks are forked from a preloaded
    forkserver), ~0.1 s each instead of ~2 s of imports per `lsgd` process on 2 cores."""
    e = dict(os.environ)
    e.setdefault("WANDB_MODE", "disabled")
    payload = json.dumps({k: [list(args), str(cwd)] for k, (args, cwd) in jobs.items()})
    proc, out, err = _session([sys.executable, "-c", _FORKED, payload], None, e, timeout, f"lsgd {jobs}")
    assert proc.returncode == 0, err[-3000:]
    return {k: subprocess.CompletedProcess(["lsgd", *jobs[k][0]], rc, o, e)
            for k, (rc, o, e) in json.loads(out).items()}


def session_processes(sid: int) -> list[int]:
    """PIDs of live processes whose session id is ``sid`` (Linux /proc)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # fields: state ppid pgrp session ...
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(d.name))
    return pids


def run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in Path(root).rglob("config.yaml") if p.parent.name != ".hydra")


def metrics(run_dir: Path, drop_time: bool = True) -> list[dict]:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    if drop_time:
        recs = [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in recs]
    return recs


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def stable(recs: list[dict]) -> list[dict]:
    """Records without the measured timing keys (TIME_KEYS differ run to run)."""
    return [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in recs]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_tasks(args, cwd: Path, n: int = 2, style: str = "slurm", wrap=None) -> list[subprocess.Popen]:
    """Start ``n`` ``lsgd ARGS`` processes as an external launcher starts its tasks on one node:
    ``style`` 'slurm' (the SLURM_* variables srun sets, job id 4242) or 'torchrun' (RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_*). ``wrap(rank, cmd)`` may return another command line for a rank."""
    port = free_port()
    procs = []
    for rank in range(n):
        if style == "slurm":
            env = dict(os.environ, SLURM_PROCID=str(rank), SLURM_NTASKS=str(n), SLURM_LOCALID=str(rank),
                       SLURM_STEP_ID="0", SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="localhost",
                       SLURM_TASKS_PER_NODE=str(n), MASTER_PORT=str(port))
        else:
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(n),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env.setdefault("WANDB_MODE", "disabled")
        cmd = LSGD + list(args)
        procs.append(subprocess.Popen(wrap(rank, cmd) if wrap else cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return procs
