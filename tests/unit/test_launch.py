"""Rank detection, run ids and config validation (no processes)."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from lsgd.cli import run_id
from lsgd.core.devices import cuda_device_index
from lsgd.core.errors import ConfigError
from lsgd.launch.environment import detect_launch_env, first_host, slurm_master_port
from lsgd.launch.resume import find_resume_dir
from lsgd.training.preemption import PreemptionWatch, resolve_mode


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


def test_submitit_task_placed_through_its_job_environment(monkeypatch):
    """A task of Hydra's submitit launcher: rank, world, local rank and first host come from
    submitit.JobEnvironment (first host of the bracketed node list, ranks from SLURM_*)."""
    for k, v in {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "77", "SLURM_PROCID": "3", "SLURM_NTASKS": "4",
                 "SLURM_LOCALID": "1", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1", "SLURM_STEP_ID": "0",
                 "SLURM_JOB_NODELIST": "gpu[07-08]"}.items():
        monkeypatch.setenv(k, v)
    for k in ("RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_ARRAY_JOB_ID"):
        monkeypatch.delenv(k, raising=False)
    e = detect_launch_env(os.environ)
    assert (e.rank, e.world_size, e.local_rank, e.local_world_size, e.master_addr, e.source) == (3, 4, 1, 2, "gpu07", "slurm")
    assert e.master_port == 15000 + 77


@pytest.mark.parametrize("local_rank, local_world, gpus, device", [(3, 8, 8, 3), (3, 4, 8, 3), (3, 8, 1, 0), (0, 1, 1, 0)])
def test_cuda_device_of_a_worker(local_rank, local_world, gpus, device):
    # 8 tasks sharing 8 GPUs: the local rank; srun --gpus-per-task=1 (one visible GPU each): device 0
    assert cuda_device_index(local_rank, local_world, gpus) == device


def test_cuda_device_rejects_fewer_gpus_than_tasks():
    with pytest.raises(ConfigError, match=r"4 workers on this node but 2 visible GPUs.*--gpus-per-task=1"):
        cuda_device_index(1, 4, 2)


def test_preemption_modes(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert resolve_mode("auto", "slurm") == "requeue"
    assert resolve_mode("auto", "torchrun") == "off" and resolve_mode("auto", None) == "off"
    assert resolve_mode("checkpoint", None) == "checkpoint"
    with pytest.raises(ValueError, match="allowed: auto, requeue, checkpoint, off"):
        resolve_mode("sometimes", None)
    with pytest.raises(ValueError, match="needs a SLURM job"):
        resolve_mode("requeue", None)


def test_preemption_watch_notes_the_signal_and_restores_handlers():
    before = signal.getsignal(signal.SIGUSR1)
    with PreemptionWatch("checkpoint") as watch:
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.01)
        assert watch.signal == signal.SIGUSR1
    assert signal.getsignal(signal.SIGUSR1) is before
    with PreemptionWatch("off") as off:  # off: handlers untouched
        assert signal.getsignal(signal.SIGUSR1) is before and not off.enabled


def test_resume_true_finds_this_jobs_own_folder(tmp_path):
    """A requeued job's own (Hydra) folder holds the checkpoint: resume=true must pick it."""
    run = tmp_path / "exp" / "slurm-9"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.json").write_text("{}")
    assert find_resume_dir({"resume": True, "results_dir": str(tmp_path), "experiment_name": "exp"}, run) == run


class _OneRank:
    """A communicator of one rank: the all-reduce leaves the tensor as it is; ``issued`` counts the
    agreements in flight (issued, not yet waited)."""

    def __init__(self):
        self.issued = 0

    def board(self):
        return None  # no shared-memory board: the agreement's own all-reduce

    def all_reduce(self, tensor, op=None, count=True, async_op=False):
        assert count is False  # the agreement is never counted as training traffic
        assert async_op  # never waited for at the step that issues it
        self.issued += 1
        comm = self

        class Handle:
            def wait(self):
                comm.issued -= 1
                return tensor

        return Handle()


def test_interrupts_are_noted_not_raised_and_agree_on_their_kind():
    """SIGINT inside the watch sets the flag (no KeyboardInterrupt) and agrees as an interrupt;
    SIGTERM is a preemption under launcher.preemption=checkpoint, an interrupt under off; the main
    process's StopFlag counts as a signal received; handlers come back afterwards."""
    from lsgd.training.preemption import Interrupted, Preempted, StopFlag

    before = signal.getsignal(signal.SIGINT)
    comm = _OneRank()
    with PreemptionWatch("off", interrupts=True) as watch:
        assert watch.agreed(comm, torch.device("cpu")) is None and comm.issued == 1
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        # the agreement in flight was issued before the signal: it reads no stop, and issues the next
        assert watch.agreed(comm, torch.device("cpu")) is None and comm.issued == 1
        stop = watch.agreed(comm, torch.device("cpu"))  # one step later every rank reads the stop
        assert type(stop) is Interrupted and stop.signum == signal.SIGINT and comm.issued == 0
        watch.drain()
        assert comm.issued == 0
    assert signal.getsignal(signal.SIGINT) is before
    flag = StopFlag()
    flag.set(signal.SIGTERM)
    flag.set(signal.SIGINT)  # the first signal stands
    assert flag.signum == signal.SIGTERM
    for mode, kind in (("checkpoint", Preempted), ("off", Interrupted)):
        with PreemptionWatch(mode, interrupts=True, stop=flag) as watch:
            comm = _OneRank()
            assert watch.agreed(comm, torch.device("cpu")) is None  # issued; read at the next step
            stop = watch.agreed(comm, torch.device("cpu"))
            assert type(stop) is kind and stop.signum == signal.SIGTERM and str(kind(7, 15)).startswith(
                f"{kind.status} at step 7: checkpoint written")
