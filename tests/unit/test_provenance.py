"""lsgd.training.provenance: the commit / dirty detection on real git repositories made here, the record of
this process, environment.json across a resume, and the per-node entries of a multi-node run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

import lsgd
from lsgd.training import provenance
from lsgd.core.run_files import ENVIRONMENT_FILE


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A git repository with one commit: pkg/__init__.py, pkg/mod.py; results/ neither tracked nor ignored."""
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "mod.py").write_text("X = 1\n")
    (root / "README").write_text("readme\n")
    git(root, "init", "-q")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    return root


def test_clean_checkout_gives_its_commit(repo):
    info = provenance.git_info(repo / "pkg")
    head = git(repo, "rev-parse", "HEAD")
    assert info["commit"] == head and len(head) == 40
    assert head.startswith(info["commit_short"]) and len(info["commit_short"]) >= 7
    assert info["dirty"] is False and "dirty_files" not in info and "diff_sha256" not in info


def test_a_modified_file_makes_the_tree_dirty_and_the_diff_hash_tells_changes_apart(repo):
    (repo / "pkg" / "mod.py").write_text("X = 2\n")
    a = provenance.git_info(repo / "pkg")
    assert a["dirty"] is True and a["commit"] == git(repo, "rev-parse", "HEAD")
    assert any(line.endswith("pkg/mod.py") for line in a["dirty_files"])
    (repo / "pkg" / "mod.py").write_text("X = 3\n")
    b = provenance.git_info(repo / "pkg")
    assert b["dirty"] is True and a["diff_sha256"] != b["diff_sha256"]
    (repo / "pkg" / "mod.py").write_text("X = 2\n")
    assert provenance.git_info(repo / "pkg")["diff_sha256"] == a["diff_sha256"]  # same change, same hash
    (repo / "pkg" / "mod.py").write_text("X = 1\n")
    assert provenance.git_info(repo / "pkg")["dirty"] is False  # back to HEAD


def test_a_change_elsewhere_in_the_checkout_counts_but_untracked_results_do_not(repo):
    (repo / "results" / "exp" / "run1").mkdir(parents=True)
    (repo / "results" / "exp" / "run1" / "metrics.jsonl").write_text("{}\n")
    assert provenance.git_info(repo / "pkg")["dirty"] is False  # earlier runs' folders: not dirty
    (repo / "pkg" / "new_algo.py").write_text("")
    info = provenance.git_info(repo / "pkg")
    assert info["dirty"] is True and info["dirty_files"] == ["?? pkg/new_algo.py"]
    (repo / "pkg" / "new_algo.py").unlink()
    (repo / "README").write_text("changed\n")  # a tracked file outside the package
    assert provenance.git_info(repo / "pkg")["dirty"] is True


def test_no_commit_and_no_error_outside_a_checkout(tmp_path, repo, monkeypatch):
    plain = tmp_path / "plain"
    plain.mkdir()
    assert provenance.git_info(plain) is None
    assert provenance.git_info(tmp_path / "missing") is None
    # a package folder inside a repository that does not track it (a venv inside a project)
    (repo / "venv" / "site" / "pkg").mkdir(parents=True)
    assert provenance.git_info(repo / "venv" / "site" / "pkg") is None
    # no git at all
    monkeypatch.setenv("PATH", str(plain))
    assert provenance.git_info(repo / "pkg") is None


def test_the_record_of_this_process(monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    rec = provenance.collect({"backend": "gloo", "world_size": 3})
    assert {"started_at", "lsgd", "python", "platform", "hostname", "torch", "cpu", "gpus", "distributed", "packages",
            "env"} <= set(rec)  # fmt: skip
    assert rec["torch"]["version"] == torch.__version__
    assert rec["torch"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert rec["torch"]["cuda"] == torch.version.cuda
    assert rec["lsgd"]["version"] == lsgd.__version__ and rec["lsgd"]["path"] == str(Path(lsgd.__file__).resolve().parent)
    # where the imported lsgd is a git checkout (an editable install of the repository), its HEAD
    pkg = Path(lsgd.__file__).resolve().parent
    head = subprocess.run(["git", "-C", str(pkg), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    tracked = subprocess.run(["git", "-C", str(pkg), "ls-files", "__init__.py"], capture_output=True, text=True, check=False)
    if head.returncode == 0 and tracked.stdout.strip():
        assert rec["lsgd"]["commit"] == head.stdout.strip()
    else:
        assert "commit" not in rec["lsgd"]
    assert rec["packages"]["numpy"] == np.__version__ and "torch" not in rec["packages"]
    assert rec["env"] == {"ATEN_CPU_CAPABILITY": "default"}  # set ones only
    assert rec["cpu"]["count"] >= 1 and rec["cpu"]["model"]
    assert rec["distributed"] == {"backend": "gloo", "world_size": 3}
    assert rec["gpus"] == [] if not torch.cuda.is_available() else len(rec["gpus"]) == torch.cuda.device_count()
    json.dumps(rec)  # plain JSON


def test_cpu_model_is_the_model_name_of_proc_cpuinfo():
    cpuinfo = Path("/proc/cpuinfo")
    lines = [ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("model name")] if cpuinfo.exists() else []
    if lines:  # x86 Linux
        assert provenance.cpu_model() == lines[0].split(":", 1)[1].strip()
    else:
        assert provenance.cpu_model() is None or isinstance(provenance.cpu_model(), str)


def test_a_resumed_run_keeps_the_first_record_and_appends_its_own(tmp_path):
    first = provenance.write_environment(tmp_path, {"torch": {"version": "2.4.1"}}, resume=False)
    assert first == {"session": "start", "torch": {"version": "2.4.1"}}
    provenance.write_environment(tmp_path, {"torch": {"version": "2.5.0"}}, resume=True)
    data = provenance.write_environment(tmp_path, {"torch": {"version": "2.5.1"}}, resume=True)
    assert data == json.loads((tmp_path / ENVIRONMENT_FILE).read_text())
    assert data["session"] == "start" and data["torch"]["version"] == "2.4.1"
    assert [(s["session"], s["torch"]["version"]) for s in data["resumed"]] == [("resume", "2.5.0"), ("resume", "2.5.1")]
    assert provenance.current_session(data)["torch"]["version"] == "2.5.1"
    # a fresh start in the folder replaces the file
    assert provenance.write_environment(tmp_path, {"torch": {"version": "2.6"}}, resume=False) == {
        "session": "start", "torch": {"version": "2.6"}}
    # resuming a folder made before lsgd wrote the file: the resuming session, marked as such
    other = tmp_path / "old"
    other.mkdir()
    assert provenance.write_environment(other, {"x": 1}, resume=True) == {"session": "resume", "x": 1}


def test_rank_0_adds_its_threads_and_the_nodes_of_a_multi_node_run(tmp_path):
    provenance.write_environment(tmp_path, {"a": 1}, resume=False)
    provenance.write_environment(tmp_path, {"a": 2}, resume=True)
    provenance.record_workers(tmp_path, rank=0, world_size=1, local_world_size=1)  # one node: no collective
    data = provenance.read_environment(tmp_path)
    assert "threads" not in data and data["resumed"][0]["threads"] == torch.get_num_threads()
    assert "nodes" not in data["resumed"][0]
    provenance.record_workers(tmp_path, rank=1, world_size=1, local_world_size=1)  # other ranks write nothing
    assert provenance.read_environment(tmp_path) == data
    # the gather of a multi-node run, on a one-process gloo group (local_world_size 0 < world_size 1)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        provenance.record_workers(tmp_path, rank=0, world_size=1, local_world_size=0)
    finally:
        dist.destroy_process_group()
    nodes = provenance.read_environment(tmp_path)["resumed"][0]["nodes"]
    ((host, node),) = nodes.items()
    assert host == provenance.socket.gethostname() and node["ranks"] == [0]
    assert node["torch"] == torch.__version__ and node["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    # one entry per host, ranks in order
    merged = provenance.merge_nodes([("a", {"cpu": "X"}), ("b", {"cpu": "Y"}), ("a", {"cpu": "X"})])
    assert merged == {"a": {"cpu": "X", "ranks": [0, 2]}, "b": {"cpu": "Y", "ranks": [1]}}
