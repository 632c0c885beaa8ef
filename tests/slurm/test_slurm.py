"""lsgd on a real SLURM cluster (tests/slurm/conftest.py): 2 nodes x 2 tasks."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))

from runner import TIME_KEYS, TINY, lsgd, metrics, run_dirs, summary

REPO = Path(__file__).resolve().parents[2]


def test_srun_spreads_four_tasks_over_two_nodes(slurm_cluster):
    res = slurm_cluster.run(["srun", "-N2", "--ntasks-per-node=2", "bash", "-c", "echo $SLURM_PROCID $SLURM_NODEID $SLURM_LOCALID"])
    assert res.returncode == 0, res.stderr
    rows = sorted(tuple(map(int, line.split())) for line in res.stdout.splitlines())
    assert rows == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]


def stable(recs: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in recs]


def test_sbatch_script_trains_on_four_ranks_like_a_local_run(slurm_cluster, tmp_path):
    """scripts/slurm/train.sbatch: `srun lsgd train ...` on 2 nodes x 2 tasks joins one 4-rank gloo
    group (ranks from SLURM_PROCID, master = first node); its run folder records world_size 4 and
    its metrics equal those of the same config run locally with 4 workers."""
    args = [*TINY, "max_steps=8", "algo=local_sgd", "algo.local_steps=2"]
    local = lsgd(["train", *args, "launcher.nproc_per_node=4", f"results_dir={tmp_path}/local"], tmp_path)
    assert local.returncode == 0, local.stderr[-3000:]
    env = {**slurm_cluster.env, "LSGD": f"{sys.executable} -m lsgd.cli", "WANDB_MODE": "disabled"}
    res = slurm_cluster.run(["sbatch", "--wait", "--nodes=2", "--ntasks-per-node=2", f"--output={tmp_path}/job.out",
                             str(REPO / "scripts" / "slurm" / "train.sbatch"), *args, f"results_dir={tmp_path}/slurm"],
                            timeout=300, env=env, cwd=tmp_path)
    out = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}\n{out[-4000:]}"
    (run,) = run_dirs(tmp_path / "slurm")
    (ref,) = run_dirs(tmp_path / "local")
    assert run.name.startswith("slurm-")
    assert yaml.safe_load((run / "config.yaml").read_text())["world_size"] == 4
    assert summary(run)["status"] == "completed"
    got, want = stable(metrics(run)), stable(metrics(ref))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g == w, {k: (g.get(k), w.get(k)) for k in set(g) | set(w) if g.get(k) != w.get(k)}
    assert not slurm_cluster.job_processes()


def test_submitit_sweep_runs_each_job_on_both_nodes(slurm_cluster, tmp_path):
    """`lsgd train -m hydra/launcher=submitit_slurm nodes=2 tasks_per_node=2`: a sweep of 2 jobs,
    each a 4-rank gloo job over both nodes writing one run folder with world_size 4, whose metrics
    equal the same job run locally with 4 workers."""
    args = [*TINY, "max_steps=6", "algo=local_sgd"]
    res = lsgd(["train", "-m", "hydra/launcher=submitit_slurm", "hydra.launcher.nodes=2",
                "hydra.launcher.tasks_per_node=2", "hydra.launcher.mem_gb=1", "hydra.launcher.timeout_min=10",
                f"hydra.launcher.submitit_folder={tmp_path}/submitit/%j", *args, "algo.local_steps=1,3",
                f"results_dir={tmp_path}/slurm"], tmp_path, timeout=300, env=slurm_cluster.env)
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-5000:]}"
    runs = {yaml.safe_load((r / "config.yaml").read_text())["algo"]["local_steps"]: r for r in run_dirs(tmp_path / "slurm")}
    assert sorted(runs) == [1, 3]
    for h, run in runs.items():
        assert yaml.safe_load((run / "config.yaml").read_text())["world_size"] == 4
        assert summary(run)["status"] == "completed"
        local = lsgd(["train", *args, f"algo.local_steps={h}", "launcher.nproc_per_node=4",
                      f"results_dir={tmp_path}/local{h}"], tmp_path)
        assert local.returncode == 0, local.stderr[-3000:]
        (ref,) = run_dirs(tmp_path / f"local{h}")
        assert stable(metrics(run)) == stable(metrics(ref))
    assert not slurm_cluster.job_processes()
