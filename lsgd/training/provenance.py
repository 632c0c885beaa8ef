"""What produced a run: the code, the software and the machine, recorded in ``environment.json``.

Numerics differ in the last bits between torch versions, between CPUs (AVX2 vs AVX512 kernels)
and between GPUs, and a run's results follow from the code that made them. So every run folder
records, next to its config, what produced it (docs/results.md, ``environment.json``):

* lsgd: its version, the folder it was imported from and, where that folder is a git checkout,
  the commit, the short commit and whether the tree was dirty (with the changed paths and a hash of
  ``git diff HEAD``, so two dirty runs of one commit can be told apart);
* python (version, implementation, executable), the OS (``platform``), the host name;
* torch: version, its CUDA / cuDNN / HIP versions where present and the CPU capability its kernels
  dispatch to (``torch.backends.cpu.get_cpu_capability()``: ``AVX2``, ``AVX512``, ...);
* the CPU model and core count, the GPUs CUDA can see;
* the launch: device, process group backend (gloo / nccl), world size, nodes, launch kind;
* the versions of the other packages results depend on (numpy, torchvision, hydra-core, ...);
* the environment variables that change numerics or threads (``ATEN_CPU_CAPABILITY``,
  ``OMP_NUM_THREADS``, ``CUBLAS_WORKSPACE_CONFIG``, ...) where set.

The process that creates the run folder writes it (:func:`lsgd.launch.launcher.run`); rank 0 of the
workers then adds its torch thread count and, in a launch over several nodes, one entry per node
(:func:`record_workers`: the CPU / GPU of every node, gathered once at start). A resumed run keeps
the first session's record and appends the resuming session's to ``resumed``, so a run continued
under another torch or commit shows it.

Collecting never raises: a fact that cannot be read is left out.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

from lsgd.core.files import write_atomic
from lsgd.core.run_files import ENVIRONMENT_FILE

log = logging.getLogger("lsgd")

#: packages whose versions are recorded (where installed); torch has its own entry
PACKAGES = (
    "torchvision", "numpy", "scipy", "pandas", "hydra-core", "omegaconf", "submitit",
    "hydra-submitit-launcher", "datasets", "tokenizers", "transformers", "timm", "networkx",
    "sacrebleu", "matplotlib", "wandb",
)  # fmt: skip

#: environment variables that change numerics or threading (recorded where set)
NUMERIC_ENV_VARS = (
    "ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG",
    "NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "CUDA_VISIBLE_DEVICES",
)  # fmt: skip

#: seconds a git command may take before it is given up (a hung network filesystem)
GIT_TIMEOUT_S = 10.0

#: at most this many changed paths are listed for a dirty tree
MAX_DIRTY_FILES = 50


def _git(args: list[str], cwd: Path) -> str | None:
    """Output of ``git -C cwd ARGS`` (stripped), or None when git is missing, fails or times out.
    ``GIT_OPTIONAL_LOCKS=0``: ``git status`` does not take the index lock from a concurrent git."""
    try:
        out = subprocess.run(
            ["git", "-C", str(cwd), *args], capture_output=True, timeout=GIT_TIMEOUT_S, check=False,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"},
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.decode("utf-8", "replace").rstrip()


def git_info(path: Path | str) -> dict | None:
    """The git checkout that holds ``path`` (a folder whose files git tracks): ``commit`` (full
    hash of HEAD), ``commit_short``, ``branch`` (None on a detached HEAD), ``dirty``,
    ``dirty_files`` (the first MAX_DIRTY_FILES changed paths as ``git status --porcelain`` lines)
    and ``diff_sha256`` (of ``git diff HEAD``, when dirty: two dirty runs of one commit with the
    same hash ran the same tracked code).

    Dirty: a tracked file anywhere in the checkout differs from HEAD (staged or not), or a file
    that is neither tracked nor ignored lies below ``path`` (a new module). Untracked files
    elsewhere do not count: the run folders under ``results/`` that earlier runs wrote would make
    every later run dirty.

    None when ``path`` is not inside a git work tree, when git does not track it (an installed
    package in a venv that happens to sit inside some repository), or when git is missing or fails.
    """
    path = Path(path)
    if not path.is_dir():
        return None
    commit = _git(["rev-parse", "HEAD"], path)
    if not commit:
        return None
    # tracked here? (`ls-files` of the folder itself lists the tracked files below it)
    if not _git(["ls-files", "--", "."], path):
        return None
    tracked = _git(["status", "--porcelain", "--untracked-files=no"], path)
    untracked = _git(["status", "--porcelain", "--untracked-files=all", "--", "."], path)
    if tracked is None or untracked is None:
        return None
    status = "\n".join([tracked, *(line for line in untracked.splitlines() if line.startswith("??"))])
    short = _git(["rev-parse", "--short", "HEAD"], path) or commit[:7]
    branch = _git(["symbolic-ref", "--short", "-q", "HEAD"], path) or None
    changed = [line for line in status.splitlines() if line.strip()]
    out = {"commit": commit, "commit_short": short, "branch": branch, "dirty": bool(changed)}
    if changed:
        out["dirty_files"] = changed[:MAX_DIRTY_FILES]
        try:
            diff = subprocess.run(["git", "-C", str(path), "diff", "HEAD", "--binary"], capture_output=True,
                                  timeout=GIT_TIMEOUT_S, check=False, env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
            if diff.returncode == 0:
                out["diff_sha256"] = hashlib.sha256(diff.stdout).hexdigest()
        except (OSError, subprocess.SubprocessError):
            pass
    return out


def lsgd_info() -> dict:
    """``version`` (the installed distribution's, else ``lsgd.__version__``), ``path`` (the
    imported package's folder) and, where that is a git checkout, :func:`git_info`'s keys."""
    import lsgd

    try:
        version = importlib.metadata.version("lsgd")
    except importlib.metadata.PackageNotFoundError:
        version = getattr(lsgd, "__version__", None)
    pkg = Path(lsgd.__file__).resolve().parent
    out = {"version": version, "path": str(pkg)}
    out.update(git_info(pkg) or {})
    return out


def cpu_model() -> str | None:
    """The CPU's model name: /proc/cpuinfo's ``model name`` (Linux x86), its ``Hardware`` /
    ``CPU part`` lines elsewhere, macOS's ``machdep.cpu.brand_string``, else ``platform.processor()``."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields and value.strip():
            fields[key.strip()] = value.strip()
    for key in ("model name", "Model", "Hardware", "cpu model"):
        if key in fields:
            return fields[key]
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                 timeout=5, check=False)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or None


def cpu_info() -> dict:
    """``model`` (:func:`cpu_model`), ``count`` (logical CPUs of the machine) and ``available``
    (those this process may run on)."""
    out = {"model": cpu_model(), "count": os.cpu_count()}
    try:
        out["available"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    return out


def torch_info() -> dict:
    """torch's ``version``, ``git_version``, ``debug``, ``cuda`` / ``hip`` / ``cudnn`` versions
    (None where absent), ``cpu_capability`` and ``mkldnn`` (oneDNN available)."""
    import torch

    out: dict = {"version": torch.__version__}
    for key, get in (
        ("git_version", lambda: torch.version.git_version),
        ("debug", lambda: bool(torch.version.debug)),
        ("cuda", lambda: torch.version.cuda),
        ("hip", lambda: getattr(torch.version, "hip", None)),
        ("cudnn", lambda: torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None),
        ("cpu_capability", lambda: torch.backends.cpu.get_cpu_capability()),
        ("mkldnn", lambda: bool(torch.backends.mkldnn.is_available())),
    ):
        try:
            out[key] = get()
        except Exception:  # noqa: BLE001 (a fact this torch build cannot give: leave it out)
            pass
    return out


def gpu_info() -> list[dict]:
    """One entry per GPU CUDA can see (``name``, ``memory_gib``, ``capability``); [] without CUDA."""
    try:
        import torch

        if not torch.cuda.is_available():
            return []
        gpus = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append({"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                         "capability": f"{p.major}.{p.minor}"})  # fmt: skip
        return gpus
    except Exception:  # noqa: BLE001 (a broken driver: no GPUs recorded, the run goes on)
        return []


def package_versions(names=PACKAGES) -> dict[str, str]:
    """``{distribution: version}`` of those of ``names`` that are installed."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def node_info() -> dict:
    """This machine as one entry of a multi-node run's ``nodes``: ``cpu`` model, ``cpu_count``,
    ``cpu_capability``, ``gpus`` (names) and ``torch`` version."""
    t = torch_info()
    return {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "cpu_capability": t.get("cpu_capability"),
            "gpus": [g["name"] for g in gpu_info()], "torch": t.get("version")}  # fmt: skip


def collect(distributed: dict | None = None, network: dict | None = None) -> dict:
    """This process's record (one session of ``environment.json``; docs/results.md).

    ``distributed``: the launch's facts (device, backend, world size, ...) as the caller knows them;
    ``network``: the clock's per-message overhead and this host's measurement of it
    (:func:`network_facts`), recorded under ``network`` where given.
    """
    out = {
        "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "lsgd": lsgd_info(),
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation(),
                   "executable": sys.executable},
        "platform": {"system": platform.system(), "release": platform.release(), "machine": platform.machine(),
                     "platform": platform.platform()},
        "hostname": socket.gethostname(),
        "torch": torch_info(),
        "cpu": cpu_info(),
        "gpus": gpu_info(),
        "distributed": dict(distributed or {}),
        "packages": package_versions(),
        "env": {k: os.environ[k] for k in NUMERIC_ENV_VARS if k in os.environ},
    }  # fmt: skip
    if network is not None:
        out["network"] = dict(network)
    return out


#: the figures of this host's network calibration (``lsgd calibrate --network``) a run records
NETWORK_CALIBRATION_KEYS = ("overhead_us", "overhead_us_p90", "overhead_us_mean", "nproc", "pingpong_overhead_us",
                            "repeats", "loadavg", "measured_at", "hostname")


def network_facts(cfg: dict) -> dict:
    """The ``network`` entry of a run's record: ``overhead_us``, the per-message overhead (LogGP's
    o, us) the clock uses (``network.overhead_us`` as validation resolved it: ``measured`` is the
    calibration's median by then), and ``calibration``: this host's ``lsgd calibrate --network``
    figures (:data:`NETWORK_CALIBRATION_KEYS` and the file's ``path``), or None where the host has
    none. Never raises (an unreadable file: ``calibration`` None)."""
    out: dict = {"overhead_us": ((cfg.get("network") or {}).get("overhead_us"))}
    try:
        from lsgd.comm.calibration import network_profile_path, read_network_profile

        record = read_network_profile()
        out["calibration"] = None if record is None else {
            **{k: record[k] for k in NETWORK_CALIBRATION_KEYS if k in record}, "path": str(network_profile_path())}
    except Exception:  # noqa: BLE001 (a record never fails the run)
        out["calibration"] = None
    return out


def launch_facts(cfg: dict, launch_env=None) -> dict:
    """The ``distributed`` entry of a run's record: ``device``, ``backend`` (as the config resolves
    them), ``world_size``, ``nodes``, ``launch`` (``local``, ``torchrun`` or ``slurm``) and
    ``slurm_job_id`` where set. ``launch_env``: :class:`lsgd.launch.environment.LaunchEnv` of a joined launch."""
    from lsgd.core.devices import resolve_backend, resolve_device

    out: dict = {}
    for key, get in (("device", lambda: resolve_device(cfg)), ("backend", lambda: resolve_backend(cfg))):
        try:
            out[key] = get()
        except Exception:  # noqa: BLE001 (validated before; never fail the run for a record)
            pass
    if launch_env is not None:
        out.update(world_size=launch_env.world_size, launch=launch_env.source,
                   nodes=max(1, launch_env.world_size // max(1, launch_env.local_world_size)))  # fmt: skip
    else:
        try:
            out["world_size"] = int(cfg["launcher"]["nproc_per_node"])
        except (KeyError, TypeError, ValueError):
            pass
        out.update(launch="local", nodes=1)
    if os.environ.get("SLURM_JOB_ID"):
        out["slurm_job_id"] = os.environ["SLURM_JOB_ID"]
    return out


def read_environment(run_dir: Path | str) -> dict | None:
    """The run folder's ``environment.json``, or None when it has none (or an unreadable one)."""
    path = Path(run_dir) / ENVIRONMENT_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_environment(run_dir: Path | str, record: dict, resume: bool) -> dict:
    """Write ``record`` as the run folder's ``environment.json`` (atomically) and return the file's
    content. A fresh run (``resume`` False) replaces any file there; a resumed run keeps the record
    there and appends its own to its ``resumed`` list (a folder without one, from before lsgd
    recorded it, gets ``record`` with ``"session": "resume"`` at the top)."""
    record = {"session": "resume" if resume else "start", **record}
    existing = read_environment(run_dir) if resume else None
    if existing is None:
        data = record
    else:
        data = existing
        data["resumed"] = [*data.get("resumed", []), record]
    write_atomic(Path(run_dir) / ENVIRONMENT_FILE, json.dumps(data, indent=2, default=str) + "\n")
    return data


def current_session(data: dict) -> dict:
    """The last session of an ``environment.json`` content (the last ``resumed`` entry, else the top)."""
    return data["resumed"][-1] if data.get("resumed") else data


def record_workers(run_dir: Path | str, rank: int, world_size: int, local_world_size: int) -> None:
    """Called by every rank once the process group is up: rank 0 adds ``threads`` (its torch
    intra-op threads) to the current session of ``environment.json`` and, when the ranks span
    several nodes (``local_world_size`` < ``world_size``), ``nodes``: ``{hostname: node_info() +
    ranks}`` from one ``all_gather_object`` over all ranks (every rank calls it then; the condition
    is the same on every rank). A single-node run makes no collective."""
    import torch
    import torch.distributed as dist

    nodes = None
    if world_size > local_world_size and dist.is_initialized():
        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, (socket.gethostname(), node_info()))
        nodes = merge_nodes(gathered)
    if rank != 0:
        return
    try:
        data = read_environment(run_dir)
        if data is None:
            return
        session = current_session(data)
        session["threads"] = torch.get_num_threads()
        if nodes is not None:
            session["nodes"] = nodes
        write_atomic(Path(run_dir) / ENVIRONMENT_FILE, json.dumps(data, indent=2, default=str) + "\n")
    except OSError as exc:
        log.warning("could not update %s: %s", ENVIRONMENT_FILE, exc)


def merge_nodes(gathered: list[tuple[str, dict]]) -> dict[str, dict]:
    """``{hostname: {**node_info, "ranks": [ranks on that host]}}`` from one ``(hostname,
    node_info)`` per rank (in rank order), hosts in order of their first rank."""
    nodes: dict[str, dict] = {}
    for r, (host, info) in enumerate(gathered):
        nodes.setdefault(host, {**info, "ranks": []})["ranks"].append(r)
    return nodes
