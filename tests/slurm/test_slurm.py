"""lsgd on a real SLURM cluster (tests/slurm/conftest.py): 2 nodes x 2 tasks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))

from runner import LSGD, TINY, lsgd, metrics, run_dirs, stable, summary

REPO = Path(__file__).resolve().parents[2]


def test_srun_spreads_four_tasks_over_two_nodes(slurm_cluster):
    res = slurm_cluster.run(["srun", "-N2", "--ntasks-per-node=2", "bash", "-c", "echo $SLURM_PROCID $SLURM_NODEID $SLURM_LOCALID"])
    assert res.returncode == 0, res.stderr
    rows = sorted(tuple(map(int, line.split())) for line in res.stdout.splitlines())
    assert rows == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]


class LocalRuns:
    """``local_run(args)``: the run folder of ``lsgd train ARGS launcher.nproc_per_node=4`` on this
    machine, the reference a SLURM job's metrics must equal; made once per ``args`` for the module
    (a 4-worker run costs about 10 s on 2 cores; the sbatch test and the sweep share one).
    ``local_run.start(args)`` starts it in the background, beside the SLURM job a test submits next
    (which leaves the CPUs idle much of the time: submission, scheduling, polls); ``local_run(args)``
    waits for it."""

    def __init__(self, tmp_path_factory, pool: ThreadPoolExecutor):
        self.tmp_path_factory, self.pool = tmp_path_factory, pool
        self.made: dict[tuple[str, ...], tuple[Path, Future]] = {}

    def start(self, args: list[str]) -> None:
        if tuple(args) not in self.made:
            folder = self.tmp_path_factory.mktemp("local")
            run = self.pool.submit(lsgd, ["train", *args, "launcher.nproc_per_node=4", f"results_dir={folder}/r"], folder)
            self.made[tuple(args)] = folder, run

    def __call__(self, args: list[str]) -> Path:
        self.start(args)
        folder, run = self.made[tuple(args)]
        res = run.result()
        assert res.returncode == 0, res.stderr[-3000:]
        (run_dir,) = run_dirs(folder / "r")
        return run_dir


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    """:class:`LocalRuns` of the module (one at a time: 4 workers each)."""
    with ThreadPoolExecutor(1) as pool:
        yield LocalRuns(tmp_path_factory, pool)


#: a local SGD job of 6 steps at H = 3 (two averaging rounds): the sbatch job and one arm of the sweep
LOCAL_SGD = [*TINY, "max_steps=6", "algo=local_sgd"]


FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def sbatch(cluster, tmp_path: Path, options: list[str], overrides: list[str], timeout: float = 300) -> dict:
    """Submit scripts/slurm/train.sbatch with `overrides`, poll `scontrol` until the job ends
    (faster than `sbatch --wait`, which backs off to 30 s polls) and return its final state."""
    env = {**cluster.env, "LSGD": f"{sys.executable} -m lsgd.cli", "WANDB_MODE": "disabled"}
    res = cluster.run(["sbatch", "--parsable", *options, f"--output={tmp_path}/job.out",
                       str(REPO / "scripts" / "slurm" / "train.sbatch"), *overrides], env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().split(";")[0]

    def ended():
        state = job_state(cluster, job)
        return state if state.get("JobState") in FINAL_STATES else None

    return wait_for(ended, timeout, f"job {job} to end", poll=0.2)


def test_sbatch_script_trains_on_four_ranks_like_a_local_run(slurm_cluster, tmp_path, local_run):
    """scripts/slurm/train.sbatch: `srun lsgd train ...` on 2 nodes x 2 tasks joins one 4-rank gloo
    group (ranks from SLURM_PROCID, master = first node); its run folder records world_size 4 and
    its metrics equal those of the same config run locally with 4 workers."""
    args = [*LOCAL_SGD, "algo.local_steps=3"]
    local_run.start(args)
    state = sbatch(slurm_cluster, tmp_path, ["--nodes=2", "--ntasks-per-node=2"], [*args, f"results_dir={tmp_path}/slurm"])
    out = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert state["JobState"] == "COMPLETED", f"{state}\n{out[-4000:]}"
    (run,) = run_dirs(tmp_path / "slurm")
    ref = local_run(args)
    assert run.name.startswith("slurm-")
    assert yaml.safe_load((run / "config.yaml").read_text())["world_size"] == 4
    assert summary(run)["status"] == "completed"
    got, want = stable(metrics(run)), stable(metrics(ref))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g == w, {k: (g.get(k), w.get(k)) for k in set(g) | set(w) if g.get(k) != w.get(k)}
    assert not slurm_cluster.job_processes()


def test_submitit_sweep_runs_each_job_on_both_nodes(slurm_cluster, tmp_path, local_run):
    """`lsgd train -m hydra/launcher=submitit_slurm nodes=2 tasks_per_node=2`: a sweep of 2 jobs,
    each a 4-rank gloo job over both nodes writing one run folder with world_size 4, whose metrics
    equal the same job run locally with 4 workers."""
    for h in (1, 3):
        local_run.start([*LOCAL_SGD, f"algo.local_steps={h}"])
    res = lsgd(["train", "-m", "hydra/launcher=submitit_slurm", "hydra.launcher.nodes=2",
                "hydra.launcher.tasks_per_node=2", "hydra.launcher.mem_gb=1", "hydra.launcher.timeout_min=10",
                f"hydra.launcher.submitit_folder={tmp_path}/submitit/%j", *LOCAL_SGD, "algo.local_steps=1,3",
                f"results_dir={tmp_path}/slurm"], tmp_path, timeout=300, env=slurm_cluster.env)
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-5000:]}"
    runs = {yaml.safe_load((r / "config.yaml").read_text())["algo"]["local_steps"]: r for r in run_dirs(tmp_path / "slurm")}
    assert sorted(runs) == [1, 3]
    for h, run in runs.items():
        assert yaml.safe_load((run / "config.yaml").read_text())["world_size"] == 4
        assert summary(run)["status"] == "completed"
        ref = local_run([*LOCAL_SGD, f"algo.local_steps={h}"])
        assert stable(metrics(run)) == stable(metrics(ref))
    assert not slurm_cluster.job_processes()


def job_state(cluster, job_id: str) -> dict:
    """``scontrol show job`` as a dict (JobState, Restarts, ExitCode, ...); {} once the job is gone."""
    out = cluster.run(["scontrol", "-o", "show", "job", job_id], timeout=30).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def wait_for(predicate, timeout: float, what: str, poll: float = 0.05, diagnose=None):
    """Poll ``predicate`` until it returns a true value (returned); on timeout raise an
    AssertionError naming ``what``, with ``diagnose()``'s text (cluster and run state) appended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}" + (f"\n{diagnose()}" if diagnose else ""))


def diagnosis(cluster, job: str, folders: list[Path]) -> str:
    """What a failed wait needs to be understood from CI's log alone: the tails of the daemons'
    logs and of the logs under ``folders``, then (last, nearest the end of CI's output) the job's
    and the nodes' state."""
    logs = sorted((cluster.base / "log").glob("slurm*.log"))
    for folder in folders:
        logs += sorted(f for f in Path(folder).rglob("*") if f.is_file() and f.suffix in (".log", ".err", ".out"))
    parts = [f"--- {f} (tail)\n{f.read_text(errors='replace')[-1200:]}" for f in logs]
    parts += [f"job: {cluster.run(['scontrol', '-o', 'show', 'job', job], timeout=30).stdout.strip()}",
              f"nodes: {cluster.run(['sinfo', '-N', '-h', '-o', '%N %T %E'], timeout=30).stdout.strip()}",
              f"job processes left: {cluster.job_processes()}"]
    return "\n".join(parts)


def start_requeued_job_now(cluster, job: str, pending_since: list[float]) -> None:
    """An admin's "start now" for a requeued job, which SLURM holds for ~2 minutes (BeginTime).

    Only from the second after the requeue was first seen: nodes revoke the job's old credential
    at the requeue and reject any credential created in the same second (``ctime <= revoked``,
    1 s resolution), so a restart within that second fails to launch and the job ends FAILED
    (SLURM's own delay exists to avoid this). ``pending_since``: [] on the first call."""
    if not pending_since:
        pending_since.append(time.time())
    if time.time() >= int(pending_since[0]) + 1.05:
        cluster.run(["scontrol", "update", f"jobid={job}", "StartTime=now"])


def test_preset_job_is_preempted_requeued_and_resumes_to_identical_metrics(slurm_cluster, tmp_path, local_run):
    """The `hydra/launcher=slurm` preset (with overrides for this CPU cluster) runs a 4-rank job
    over both nodes. Mid-run the job gets SIGTERM (`scancel --signal=TERM`, as preemption sends):
    every rank checkpoints at the same step, summary.json says `preempted`, rank 0 requeues the
    job, the requeued job (same id, same folder) resumes itself, and its metrics equal an
    uninterrupted local 4-worker run. Submitit sees one result: the resumed attempt's."""
    # 100 steps: the SIGTERM lands some 20 steps after the third record (scancel through the daemons)
    args = [*TINY, "epochs=40", "max_steps=100", "log_every=1", "algo=local_sgd", "algo.local_steps=2"]
    local_run.start(args)
    proc = subprocess.Popen(
        [*LSGD, "train", "-m", "hydra/launcher=slurm", "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=2",
         "hydra.launcher.gpus_per_node=null", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1",
         "hydra.launcher.timeout_min=10", f"hydra.launcher.submitit_folder={tmp_path}/submitit/%j", *args,
         f"results_dir={tmp_path}/slurm"],
        cwd=tmp_path, env={**slurm_cluster.env, "WANDB_MODE": "disabled"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        def started():
            files = list((tmp_path / "slurm").glob("*/slurm-*/metrics.jsonl"))
            return files[0] if files and len(files[0].read_text().splitlines()) >= 3 else None

        metrics_file = wait_for(started, 180, "the job's first records")
        run = metrics_file.parent
        job = run.name.removeprefix("slurm-")
        assert slurm_cluster.run(["scancel", "--signal=TERM", job]).returncode == 0

        def explain():
            return diagnosis(slurm_cluster, job, [tmp_path / "submitit", run])

        pending_since = []

        def requeued_and_ended():
            state = job_state(slurm_cluster, job)
            if state.get("JobState") == "PENDING" and state.get("Restarts") == "1":
                start_requeued_job_now(slurm_cluster, job, pending_since)
            return state if state.get("JobState") in FINAL_STATES else None

        state = wait_for(requeued_and_ended, 300, "the requeued job to end", poll=0.5, diagnose=explain)
        assert state["JobState"] == "COMPLETED" and state.get("Restarts") == "1", explain()
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    assert proc.returncode == 0, f"{out[-2000:]}\n{err[-4000:]}"
    log = (run / "train.log").read_text()
    preempted_at = {int(line.rsplit("preempted at step ", 1)[1].split(":")[0]) for line in log.splitlines()
                    if "preempted at step" in line}
    assert len(preempted_at) == 1 and log.count("preempted at step") == 4  # all 4 ranks, one step
    (step,) = preempted_at
    assert 0 < step < 100
    assert log.count(f"resumed from step_{step:08d} at step {step}") == 4
    assert summary(run)["status"] == "completed" and summary(run)["steps"] == 100
    assert yaml.safe_load((run / "config.yaml").read_text())["world_size"] == 4
    assert stable(metrics(run)) == stable(metrics(local_run(args)))
    assert not slurm_cluster.job_processes()


def test_a_failing_rank_fails_the_job_and_the_summary_names_it(slurm_cluster, tmp_path):
    """Rank 2 (on node2) raises at step 3 of a 2-node sbatch job: the job ends FAILED with a
    non-zero exit code, summary.json says `failed` and names rank 2 on node2 as the first failure
    (not rank 0, whose own error is the lost connection), and no process is left on either node."""
    args = [*TINY, "max_steps=8", "algo=local_sgd", "inject_failure.step=3", "inject_failure.rank=2"]
    state = sbatch(slurm_cluster, tmp_path, ["--nodes=2", "--ntasks-per-node=2"], [*args, f"results_dir={tmp_path}/slurm"])
    assert state["JobState"] == "FAILED" and state["ExitCode"] != "0:0", state
    (run,) = run_dirs(tmp_path / "slurm")
    s = summary(run)
    assert s["status"] == "failed"
    assert s["failed_rank"] == 2, s
    assert s["error"].startswith("rank 2 (node2): RuntimeError('inject_failure: rank 2 fails at step 3')"), s["error"]
    assert 2 in s["failed_ranks"] and s["world_size"] == 4 and s["steps"] >= 3  # rank 0's figures are kept
    assert "inject_failure" in (run / "failures" / "rank2.json").read_text()
    wait_for(lambda: not slurm_cluster.job_processes(), 30, "no job process left")


def test_single_task_srun_starts_the_configured_local_workers(slurm_cluster, tmp_path):
    """`srun --ntasks=1 lsgd train launcher.nproc_per_node=2`: one task has no group to join, so
    lsgd starts 2 local workers (before, it silently trained one)."""
    res = slurm_cluster.run(["srun", "-N1", "--ntasks=1", "--cpus-per-task=2", *LSGD, "train", *TINY, "max_steps=4",
                             "algo=ddp", "launcher.nproc_per_node=2", f"results_dir={tmp_path}/r"],
                            timeout=240, env={**slurm_cluster.env, "WANDB_MODE": "disabled"}, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = run_dirs(tmp_path / "r")
    assert yaml.safe_load((run / "config.yaml").read_text())["world_size"] == 2
    assert summary(run)["num_workers"] == 2 and summary(run)["status"] == "completed"
    assert "[rank 1]" in (run / "train.log").read_text()
