"""Rank detection, run ids and config validation (no processes)."""

from __future__ import annotations

import pytest

from lsgd.cli import run_id
from lsgd.launch import detect_launch_env, first_host, slurm_master_port


@pytest.mark.parametrize(
    "nodelist, host",
    [
        ("node01", "node01"),
        ("node[01-04,07]", "node01"),
        ("gpu3,gpu5", "gpu3"),
        ("gpu[7,2-3],cpu1", "gpu7"),
        ("rack[2-3]-n[10-12]", "rack2-n10"),
    ],
)
def test_first_host(nodelist, host):
    assert first_host(nodelist) == host


def test_torchrun_env_detected():
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h0", "MASTER_PORT": "29500"}
    e = detect_launch_env(env)
    assert (e.rank, e.world_size, e.local_rank, e.local_world_size, e.master_addr, e.master_port, e.source) == (
        3, 8, 1, 2, "h0", 29500, "torchrun")


def test_slurm_srun_env_detected():
    env = {
        "SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0",
        "SLURM_JOB_NODELIST": "gpu[12-13]", "SLURM_TASKS_PER_NODE": "8(x2)", "SLURM_JOB_ID": "123456",
    }
    e = detect_launch_env(env)
    assert (e.rank, e.world_size, e.local_rank, e.local_world_size, e.master_addr, e.source) == (5, 16, 1, 8, "gpu12", "slurm")
    assert e.master_port == slurm_master_port("123456") == 15000 + 123456 % 20000
    out = {}
    e.export(out)
    assert out["RANK"] == "5" and out["MASTER_ADDR"] == "gpu12" and out["WORLD_SIZE"] == "16"


def test_no_launch_env_and_batch_script_not_detected():
    assert detect_launch_env({}) is None
    # an sbatch script (no step id) must spawn, not wait for peers
    assert detect_launch_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "1"}) is None


def test_bad_rank_rejected():
    with pytest.raises(ValueError, match="rank 4"):
        detect_launch_env({"RANK": "4", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"})


def test_run_ids_do_not_collide_in_the_same_second(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    ids = {run_id() for _ in range(2000)}
    assert len(ids) == 2000


def test_slurm_run_id_shared_by_tasks(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    assert run_id() == run_id() == "slurm-777"
