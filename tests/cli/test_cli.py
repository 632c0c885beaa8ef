"""The real `lsgd` command on tiny configs: runs, sweeps, resume, determinism, failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import platform
import socket
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import yaml
from crash_resume import CHECKPOINT, CRASH_RANK, CRASH_STEP
from runner import (
    LSGD,
    TINY,
    lsgd,
    lsgd_forked,
    metrics,
    run_dirs,
    session_processes,
    stable,
    start_tasks,
    summary,
)

import lsgd as lsgd_pkg
from lsgd.training import provenance


def _ok(res):
    assert res.returncode == 0, f"exit {res.returncode}\nSTDOUT\n{res.stdout[-3000:]}\nSTDERR\n{res.stderr[-6000:]}"


def test_help_lists_subcommands(tmp_path):
    res = lsgd(["--help"], tmp_path)
    _ok(res)
    for cmd in ("train", "plot", "report"):
        assert cmd in res.stdout


#: a tiny DDP run on 2 workers (20 steps, a record every 2)
TINY_DDP = [*TINY, "algo=ddp", "log_every=2"]


@pytest.fixture(scope="module")
def tiny_ddp(tmp_path_factory) -> Path:
    """:data:`TINY_DDP`'s run folder: the folder test_tiny_run_two_workers_writes_one_run_folder checks,
    and the first of the two runs test_same_seed_twice_gives_identical_metrics compares."""
    tmp = tmp_path_factory.mktemp("tiny")
    _ok(lsgd(["train", *TINY_DDP, f"results_dir={tmp}/r"], tmp))
    (run,) = run_dirs(tmp / "r")
    return run


def test_tiny_run_two_workers_writes_one_run_folder(tiny_ddp):
    run = tiny_ddp
    assert run.parent.name == "debug"
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["world_size"] == 2 and cfg["algo"]["name"] == "ddp" and cfg["run_id"] == run.name
    recs = metrics(run)
    s = summary(run)
    assert s["status"] == "completed" and s["steps"] == 20
    assert recs[-1]["step"] == 20 and "test_acc" in recs[-1]
    # DDP all-reduces at every step (local SGD's rounds every H steps: test_sweep_of_jobs_and_report)
    assert recs[-1]["comm_rounds"] == 20 == s["comm_rounds"]
    log = (run / "train.log").read_text()
    assert "[rank 0]" in log and "[rank 1]" in log
    assert (run / "checkpoints" / "last.json").exists()
    # what produced it: the values of this process (the same interpreter and checkout)
    env = json.loads((run / "environment.json").read_text())
    assert env["session"] == "start" and "resumed" not in env
    assert env["torch"]["version"] == torch.__version__
    assert env["torch"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["python"]["version"] == platform.python_version() and env["hostname"] == socket.gethostname()
    pkg = Path(lsgd_pkg.__file__).resolve().parent
    assert env["lsgd"]["version"] == lsgd_pkg.__version__ and env["lsgd"]["path"] == str(pkg)
    assert env["cpu"]["model"] == provenance.cpu_model() and env["cpu"]["count"] == os.cpu_count()
    assert env["packages"]["numpy"] == np.__version__
    assert env["distributed"] == {"device": "cpu", "backend": "gloo", "world_size": 2, "launch": "local", "nodes": 1}
    assert env["threads"] >= 1  # rank 0's
    git = provenance.git_info(pkg)  # (the commit only: the tree may change while the test runs)
    assert env["lsgd"].get("commit") == (git or {}).get("commit") and isinstance(env["lsgd"].get("dirty", False), bool)


def test_swarm_run_records_its_topology_and_the_nodes_own_accuracy(tmp_path):
    res = lsgd(["train", *TINY, "algo=swarm_sgd", "algo.topology=ring", "algo.local_steps=2", "eval_workers=true",
                "launcher.nproc_per_node=4", "max_steps=8", f"results_dir={tmp_path}/r"], tmp_path)
    _ok(res)
    (run,) = run_dirs(tmp_path / "r")
    topo = yaml.safe_load((run / "config.yaml").read_text())["topology"]
    # ring of 4, weights 1/3: eigenvalues (1 + 2 cos(2 pi k / 4)) / 3 = 1, 1/3, -1/3, 1/3 -> gap 2/3
    assert topo["name"] == "ring" and topo["nodes"] == 4
    assert topo["spectral_gap"] == pytest.approx(2 / 3, abs=1e-12)
    last = metrics(run)[-1]
    assert last["step"] == 8 and last["test_acc_workers_min"] <= last["test_acc_workers_mean"]
    assert last["consensus_distance"] > 0
    assert last["comm_rounds"] == 4  # 8 steps of H = 2; a maximal matching of a 4-cycle is perfect


#: the arms of the study sweep (variant: algo): the dense baseline, local SGD and two compressions
STUDY = {"dense": "ddp", "local_sgd_h4": "local_sgd", "topk_10x": "compressed", "gravac_eps0.7": "gravac"}


@pytest.fixture(scope="module")
def study_sweep(tmp_path_factory):
    """One `lsgd train -m` over :data:`STUDY`'s arms, its `lsgd report` and (at the same time: both
    only read the sweep) its `lsgd plot`, read by the two sweep tests below (before, each ran a sweep
    and a report of its own, of 2 and 3 jobs, the dense one in both): (tmp folder, the sweep's
    process, run folder by algo, the report's process, the plot's process)."""
    tmp = tmp_path_factory.mktemp("study")
    res = lsgd(["train", "-m", *TINY, f"variant={','.join(STUDY)}", f"results_dir={tmp}/r"], tmp, timeout=500)
    _ok(res)
    runs = {yaml.safe_load((r / "config.yaml").read_text())["algo"]["name"]: r for r in run_dirs(tmp / "r")}
    with ThreadPoolExecutor(1) as pool:
        plot = pool.submit(lsgd, ["plot", str(tmp / "r" / "debug"), "--out", str(tmp / "plots")], tmp)
        rep = lsgd(["report", str(tmp / "r" / "debug"), "--out", str(tmp / "rep")], tmp)
        return tmp, res, runs, rep, plot.result()


def test_sweep_of_jobs_and_report(study_sweep):
    tmp, res, runs, rep, plot = study_sweep
    assert len(runs) == len(STUDY) and sorted(runs) == sorted(STUDY.values())
    # each job says where it runs, as [k/N] and its overrides (issue 24)
    starts = [ln for ln in res.stderr.splitlines() if ln.startswith("lsgd: [") and ": run folder " in ln]
    assert [ln.split("]")[0] for ln in starts] == [f"lsgd: [{k}/{len(STUDY)}" for k in range(1, len(STUDY) + 1)]
    assert all(f"variant={v}" in ln for v, ln in zip(STUDY, starts))
    by_algo = {algo: summary(r) for algo, r in runs.items()}
    # local SGD with H=4 averages the model at 5 of the 20 steps at which DDP all-reduces gradients
    assert by_algo["local_sgd"]["comm_rounds"] * 4 == by_algo["ddp"]["comm_rounds"] == 20
    assert by_algo["local_sgd"]["comm_bytes"] < by_algo["ddp"]["comm_bytes"] / 3
    _ok(rep)
    report = tmp / "rep" / "report.md"
    assert report.stat().st_size > 0 and "local_sgd" in report.read_text()
    # every run's environment, one row (same torch, commit and machine)
    text = report.read_text()
    assert f"Environment: torch {torch.__version__}, " in text and f"(all {len(STUDY)} runs)." in text
    assert "### Environment" in text and "differ in their environment" not in text
    pngs = list((tmp / "rep").rglob("*.png"))
    svgs = list((tmp / "rep").rglob("*.svg"))
    assert pngs and svgs and all(p.stat().st_size > 0 for p in pngs + svgs)
    _ok(plot)
    assert list((tmp / "plots").glob("*.png"))


def test_resume_after_crash_matches_uninterrupted_run(gravac_crash):
    """A rank raises at step 13 (conftest.gravac_crash: checkpoints every 5 steps): the run ends
    failed, naming the failure; ``resume=true`` finds the run folder and finishes it with the
    uninterrupted run's metrics; environment.json keeps the first session's record and appends the
    resuming session's. (The exactness of each algorithm's resume is test_measurement.py's, for
    every algorithm; here the CLI's resume path.)"""
    r = gravac_crash
    assert r.crashed.returncode != 0
    assert r.crashed_summary["status"] == "failed"
    assert f"inject_failure: rank {CRASH_RANK} fails at step {CRASH_STEP}" in r.crashed_summary["error"]
    assert max(r.crashed_steps) > CHECKPOINT  # it recorded past the checkpoint the resume starts from
    _ok(r.resumed)
    assert run_dirs(r.run.parent.parent) == [r.run]  # resumed in place, no new folder
    assert summary(r.run)["status"] == "completed"
    assert metrics(r.run) == metrics(r.plain)
    # the first session's record is kept; the resuming session's is appended
    first = r.first_environment
    env = json.loads((r.run / "environment.json").read_text())
    (resumed,) = env.pop("resumed")
    assert env == first and resumed["session"] == "resume" and resumed["torch"] == first["torch"]
    assert resumed["started_at"] >= first["started_at"] and resumed["threads"] >= 1


def test_same_seed_twice_gives_identical_metrics(tmp_path, tiny_ddp):
    """Same config twice (the first: the tiny_ddp fixture's run), the second beside a CPU hog:
    identical metrics, the cluster clock's modeled times included (cluster.compute=profile does not
    depend on this machine's load)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        _ok(lsgd(["train", *TINY_DDP, f"results_dir={tmp_path}/b"], tmp_path))
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    a, (b,) = tiny_ddp, run_dirs(tmp_path / "b")
    assert metrics(a) == metrics(b) and len(metrics(a)) >= 10
    assert metrics(a)[-1]["modeled_time_s"] > 0
    # the measured compute did change under load; the modeled time did not
    assert summary(a)["modeled_time_s"] == summary(b)["modeled_time_s"]


def test_crashing_worker_stops_the_job_with_no_orphans(tmp_path):
    t0 = time.monotonic()
    res = lsgd(["train", *TINY, "algo=local_sgd", "inject_failure.step=3", "inject_failure.rank=1",
                "launcher.timeout_s=600", f"results_dir={tmp_path}/r"], tmp_path)
    assert res.returncode != 0
    assert time.monotonic() - t0 < 120
    assert "inject_failure: rank 1 fails at step 3" in res.stdout + res.stderr  # the failing rank's traceback
    # gone within seconds (multiprocessing's resource tracker outlives the launcher by a moment); a
    # worker left waiting on its peer would stay for launcher.timeout_s
    deadline = time.monotonic() + 10
    while session_processes(res.session) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert session_processes(res.session) == []


def test_diverged_run_ends_cleanly(tmp_path):
    res = lsgd(["train", *TINY, "algo=ddp", "optim.lr=1e12", "optim.momentum=0.0", "log_every=1",
                f"results_dir={tmp_path}/r"], tmp_path)
    _ok(res)
    (run,) = run_dirs(tmp_path / "r")
    assert summary(run)["status"] == "diverged"


#: (overrides, what the error names) of configs `lsgd train` must reject before any worker starts
BAD_CONFIGS = [
    (["algo=local_sgd", "algo.local_steps=0"], "algo.local_steps"),
    (["batch_size=0"], "batch_size"),
    (["model=cnn", "dataset=c4"], "model"),
    (["algo=nonexistent"], "ddp"),  # Hydra lists the available options
    (["algo=slowmo", "algo.buffer_policy=keep"], "maintain"),
    (["dataset=cifar10", "dataset.root=/nonexistent/lsgd", "dataset.download=false"], "dataset.root"),
    # unknown keys, with or without Hydra's +: a did-you-mean, not a silent default (issue 24)
    (["algo=local_sgd", "+algo.local_step=4"], "unknown config key 'algo.local_step'; did you mean algo.local_steps?"),
    (["algo=local_sgd", "algo.local_step=4"], "unknown config key 'algo.local_step'; did you mean algo.local_steps?"),
    (["+foo=1"], "unknown config key 'foo'"),
    (["-m", "algo=ddp,local_sgd", "optim.lrr=0.1"], "unknown config key 'optim.lrr'; did you mean optim.lr?"),
    # debug=default adapts the workers to a ring, but not when the command line sets them (issue 42)
    (["algo=dpsgd", "launcher.nproc_per_node=2"], "algo.topology=ring needs at least 3 nodes"),
]


@pytest.fixture(scope="module")
def rejected(tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """`lsgd train debug=default OVERRIDES results_dir=<cwd>/r` of every :data:`BAD_CONFIGS` entry, each in
    a folder of its own (runner.lsgd_forked: forked from one process that has imported lsgd):
    ``" ".join(OVERRIDES)`` -> (cwd, the result)."""
    jobs = {}
    for i, (override, _) in enumerate(BAD_CONFIGS):
        cwd = tmp_path_factory.mktemp(f"rejected{i}")
        jobs[str(i)] = (["train", "debug=default", *override, f"results_dir={cwd}/r"], cwd)
    results = lsgd_forked(jobs, timeout=300)
    return {" ".join(o): (jobs[str(i)][1], results[str(i)]) for i, (o, _) in enumerate(BAD_CONFIGS)}


@pytest.mark.parametrize("override, expected", BAD_CONFIGS)
def test_bad_config_fails_before_any_worker(rejected, override, expected):
    cwd, res = rejected[" ".join(override)]
    assert res.returncode != 0
    assert expected in res.stdout + res.stderr
    assert not list((cwd / "r").rglob("train.log"))  # no worker started


def test_external_torchrun_joins_instead_of_spawning(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "lsgd.cli",
           "train", *TINY, "algo=local_sgd", "launcher.nproc_per_node=4", f"results_dir={tmp_path}/r"]
    res = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    _ok(res)
    (run,) = run_dirs(tmp_path / "r")
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["world_size"] == 2  # the torchrun world, not launcher.nproc_per_node
    assert summary(run)["world_size"] == 2 and summary(run)["status"] == "completed"
    log = (run / "train.log").read_text()
    assert "[rank 0]" in log and "[rank 1]" in log
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # no stray per-rank output folders


#: experiment=local_vs_minibatch on synthetic data, 2 workers, K=4, b=8, R=6, seed 3, logged to W&B
#: (offline) too: :func:`local_vs_minibatch`'s sweep
LVM_K, LVM_B, LVM_R, LVM_WORKERS = 4, 8, 6, 2


@pytest.fixture(scope="module")
def local_vs_minibatch(tmp_path_factory):
    """experiment=local_vs_minibatch's three arms in one real `lsgd train -m` (:data:`LVM_K` ...), with
    logger=wandb (offline): (tmp folder, run folder by study arm). Read by the study's test and the
    W&B test (before, that one trained an arm of its own)."""
    tmp = tmp_path_factory.mktemp("lvm")
    study = [f"study.local_steps={LVM_K}", f"study.local_batch={LVM_B}", f"study.rounds={LVM_R}",
             "study.eval_rounds=3", "study.log_rounds=1"]
    res = lsgd(["train", "-m", "experiment=local_vs_minibatch", "variant=minibatch_kb,local_sgd_k,minibatch_b",
                *study, "dataset=synthetic", "dataset.num_train=512", "dataset.num_test=256", "device=cpu",
                f"launcher.nproc_per_node={LVM_WORKERS}", "launcher.timeout_s=30", "logger=wandb", "seed=3",
                f"results_dir={tmp}/r"], tmp, timeout=400, env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    _ok(res)
    return tmp, {yaml.safe_load((d / "config.yaml").read_text())["study"]["arm"]: d for d in run_dirs(tmp / "r")}


def test_wandb_offline_logs_rank0_only_tagged_with_algo_and_variant(local_vs_minibatch):
    """logger=wandb (offline) on a study arm, `experiment=local_vs_minibatch variant=local_sgd_k`
    (2 workers, synthetic data, 6 rounds of K=4: the local_vs_minibatch fixture's sweep): one W&B run
    for the job (rank 0 only), whose run record (read back from its .wandb file) is tagged
    ``algo:local_sgd`` and ``variant:local_sgd_k``, grouped by the experiment and named by the arm
    label and seed."""
    from wandb_history import run_records

    from lsgd.training.loggers import run_label

    run = local_vs_minibatch[1]["local_sgd_k"]
    offline = list((run / "wandb").glob("offline-run-*"))
    assert len(offline) == 1  # one W&B run for the job, from rank 0
    assert summary(run)["status"] == "completed"
    (wandb_file,) = offline[0].glob("run-*.wandb")
    runs = run_records(wandb_file)
    assert runs and sorted(runs[0].tags) == ["algo:local_sgd", "variant:local_sgd_k"]
    assert runs[0].run_group == "local_vs_minibatch"
    label = run_label(yaml.safe_load((run / "config.yaml").read_text()))
    assert runs[0].display_name == label and label.endswith(", seed 3") and f"H={LVM_K}" in label, label


def test_srun_style_tasks_join_one_group_and_one_folder(tmp_path):
    """Two tasks started as srun would start them (SLURM_* variables, no torchrun) form one job."""
    procs = start_tasks(["train", *TINY, "algo=slowmo", f"results_dir={tmp_path}/r"], tmp_path)
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-4000:]
    (run,) = run_dirs(tmp_path / "r")
    assert run.name == "slurm-4242"
    assert summary(run)["world_size"] == 2 and summary(run)["status"] == "completed"
    env = json.loads((run / "environment.json").read_text())  # rank 0 of a joined launch writes it
    assert env["distributed"] == {"device": "cpu", "backend": "gloo", "world_size": 2, "launch": "slurm", "nodes": 1,
                                  "slurm_job_id": "4242"}  # fmt: skip
    assert env["torch"]["version"] == torch.__version__ and env["threads"] >= 1 and "nodes" not in env
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


#: a local SGD run long enough to stop mid-run (80 steps, a record every step, a checkpoint every
#: 10): the killed run and the signalled joined launch below both run it. Each stops within a few
#: steps of step 10 (the killed run: its first checkpoint; the signalled one: 3 records, then at most
#: the stop agreement's lag), 70 steps (over a second) before the end.
LONG = [*TINY, "epochs=40", "max_steps=80", "log_every=1", "checkpoint_every=10", "algo=local_sgd",
        "algo.local_steps=3", "launcher.preemption=checkpoint"]


@pytest.fixture(scope="module")
def long_reference(tmp_path_factory) -> Path:
    """:data:`LONG` run uninterrupted on 2 local workers: the run folder the two stopped-and-resumed
    runs below must equal (before, each test ran its own reference of about the same config)."""
    tmp = tmp_path_factory.mktemp("long")
    _ok(lsgd(["train", *LONG, "launcher.nproc_per_node=2", f"results_dir={tmp}/a"], tmp, timeout=300))
    (run,) = run_dirs(tmp / "a")
    return run


def test_killed_run_resumes_to_the_same_metrics(tmp_path, long_reference):
    """SIGKILL the whole job once a checkpoint exists, resume, compare with an uninterrupted run."""
    import os
    import signal

    e = dict(os.environ, WANDB_MODE="disabled")
    proc = subprocess.Popen(LSGD + ["train", *LONG, f"results_dir={tmp_path}/b"], cwd=tmp_path, env=e,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list((tmp_path / "b").rglob("last.json")):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    (run_b,) = run_dirs(tmp_path / "b")
    assert not (run_b / "summary.json").exists()  # killed before the end
    # a change that would alter training is refused before anything starts (issue 24)
    bad = lsgd(["train", f"resume={run_b}", "algo=local_sgd", "algo.local_steps=4"], tmp_path)
    assert bad.returncode == 2 and "resume: algo.local_steps cannot change" in bad.stderr and "(saved 3, given 4)" in bad.stderr
    assert not (run_b / "summary.json").exists()
    # the README's form: the run folder alone; the run's own config.yaml (2 workers, not the
    # default 4, and its data set, model and algorithm) comes back
    _ok(lsgd(["train", f"resume={run_b}"], tmp_path, timeout=300))
    assert metrics(run_b) == metrics(long_reference)
    assert summary(run_b)["status"] == "completed" and summary(run_b)["world_size"] == 2


def test_gravac_writes_per_step_rows_and_resumes_exactly(gravac_crash):
    """GraVAC writes one compression row per step beside the regular records (conftest.gravac_crash,
    records every 2 steps); a crash at step 13 and a resume reproduce the same records and rows."""
    recs = metrics(gravac_crash.plain)
    rows = [r for r in recs if r.get("kind") == "compression"]
    regular = [r for r in recs if "kind" not in r]
    assert [r["step"] for r in rows] == list(range(1, 21))
    assert all(r["sent"] in ("candidate", "min", "dense") and 0 < r["gain"] <= 1 for r in rows)
    assert "kind" not in recs[-1] and recs[-1]["step"] == 20 and "cf" in regular[-1]
    _ok(gravac_crash.resumed)
    assert metrics(gravac_crash.run) == recs


def test_compression_study_sweep_and_report(study_sweep):
    tmp, _, runs, rep, _ = study_sweep
    assert {"compressed", "ddp", "gravac"} <= set(runs)
    dense, topk = summary(runs["ddp"])["comm_bytes"], summary(runs["compressed"])["comm_bytes"]
    assert 3 < dense / topk < 6  # CF 10 with int32 indices: about 5x fewer bytes (buffers broadcast dense)
    _ok(rep)
    text = (tmp / "rep" / "report.md").read_text()
    assert "gravac" in text and "dense" in text.lower()
    assert list((tmp / "rep").rglob("*compression*.png"))


def test_local_vs_minibatch_sweep_equal_rounds_and_samples(local_vs_minibatch, tmp_path):
    """experiment=local_vs_minibatch's three arms in one real `lsgd train -m` (synthetic data, 2
    workers, K=4, b=8, R=6: the local_vs_minibatch fixture's sweep): minibatch_kb and local_sgd_k
    record the same comm_rounds and samples at every round and are evaluated at the same rounds;
    minibatch_b the same rounds with K times fewer samples; `lsgd report`'s detailed table has a
    study.arm column with those rounds and samples."""
    k, b, r, workers = LVM_K, LVM_B, LVM_R, LVM_WORKERS
    sweep, runs = local_vs_minibatch
    assert sorted(runs) == ["local_sgd_k", "minibatch_b", "minibatch_kb"]
    recs = {arm: metrics(d) for arm, d in runs.items()}
    sums = {arm: summary(d) for arm, d in runs.items()}
    for arm in runs:
        assert sums[arm]["status"] == "completed" and sums[arm]["comm_rounds"] == r
        assert [x["comm_rounds"] for x in recs[arm]] == list(range(1, r + 1))  # one record per round
        assert [x["comm_rounds"] for x in recs[arm] if "test_acc" in x] == [3, 6]
    assert [x["step"] for x in recs["local_sgd_k"]] == [k * i for i in range(1, r + 1)]
    assert [x["step"] for x in recs["minibatch_kb"]] == list(range(1, r + 1))
    per_round = k * b * workers
    assert [x["samples"] for x in recs["minibatch_kb"]] == [x["samples"] for x in recs["local_sgd_k"]] \
        == [per_round * i for i in range(1, r + 1)]
    assert [x["samples"] * k for x in recs["minibatch_b"]] == [x["samples"] for x in recs["minibatch_kb"]]
    assert sums["minibatch_kb"]["samples"] == sums["local_sgd_k"]["samples"] == r * per_round
    # the same bytes per round: a gradient all-reduce and a model average are both 7850 floats of logreg
    assert sums["minibatch_kb"]["comm_bytes"] == sums["local_sgd_k"]["comm_bytes"] == sums["minibatch_b"]["comm_bytes"]
    rep = lsgd(["report", str(sweep / "r" / "local_vs_minibatch"), "--out", str(tmp_path / "rep")], tmp_path)
    _ok(rep)
    text = (tmp_path / "rep" / "report.md").read_text()
    # the detailed table (since issue 14 the first table is the compact main table, without config keys)
    details = text[text.index("### Details"):]
    details_table = details[details.index("\n|") + 1 :].split("\n\n")[0]
    lines = details_table.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        row = dict(zip(header, (c.strip() for c in line.strip("|").split("|"))))
        rows[row["study.arm"]] = row
    assert sorted(rows) == sorted(runs)
    assert {row["comm rounds"] for row in rows.values()} == {str(r)}
    assert rows["minibatch_kb"]["samples"] == rows["local_sgd_k"]["samples"] == str(r * per_round)
    assert rows["minibatch_b"]["samples"] == str(r * per_round // k)
    assert all(row["final train loss"] != "n/a" and row["final test loss"] != "n/a" for row in rows.values())


def test_invalid_sweep_arm_is_recorded_failed_and_the_sweep_goes_on(tmp_path):
    """A config error in one job of a -m sweep no longer aborts the others: the invalid arm gets
    a failed summary naming the key, the valid arm runs, and lsgd exits 2 at the end."""
    res = lsgd(["train", "-m", *TINY, "algo=local_sgd", "algo.local_steps=0,2", "max_steps=4",
                f"results_dir={tmp_path}/r"], tmp_path)
    assert res.returncode == 2, res.stderr[-3000:]
    runs = {yaml.safe_load((r / "config.yaml").read_text())["algo"]["local_steps"]: r for r in run_dirs(tmp_path / "r")}
    assert sorted(runs) == [0, 2]
    bad, good = summary(runs[0]), summary(runs[2])
    assert bad["status"] == "failed" and "algo.local_steps" in bad["error"]
    assert good["status"] == "completed"


def test_torchrun_sweep_leaves_no_stray_folders(tmp_path):
    """`lsgd train -m` under torchrun: every rank runs the sweep, but only rank 0's folders exist
    (one run folder per arm, both with world_size 2) and no per-rank scratch folder is left."""
    import tempfile

    scratch_before = set(Path(tempfile.gettempdir()).glob("lsgd-rank*-sweep-*"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "lsgd.cli",
           "train", "-m", *TINY, "max_steps=4", "algo=local_sgd", "algo.local_steps=1,2", f"results_dir={tmp_path}/r"]
    res = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=240, check=False,
                         env={**os.environ, "WANDB_MODE": "disabled"})
    _ok(res)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]
    runs = run_dirs(tmp_path / "r")
    assert sorted(yaml.safe_load((r / "config.yaml").read_text())["algo"]["local_steps"] for r in runs) == [1, 2]
    assert all(summary(r)["world_size"] == 2 and summary(r)["status"] == "completed" for r in runs)
    assert sorted(p.name for p in (tmp_path / "r" / "debug").iterdir() if p.is_dir()) == sorted(r.name for r in runs)
    assert set(Path(tempfile.gettempdir()).glob("lsgd-rank*-sweep-*")) == scratch_before


def test_a_rank_that_cannot_see_the_run_folder_fails_clearly(tmp_path):
    """Two srun-style tasks; rank 1 runs in its own mount namespace with an empty tmpfs over
    results_dir (a node without the shared filesystem). Both ranks fail with one message naming
    rank 1 and the shared-filesystem requirement; rank 0's summary.json records it."""
    if subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False).returncode != 0:
        pytest.fail("unshare -m (root) is needed for this test")
    results = tmp_path / "r"
    results.mkdir()

    def private_mount(rank, cmd):  # rank 1 sees an empty tmpfs where results_dir is
        return ["unshare", "-m", "sh", "-c", f'mount -t tmpfs none "{results}" && exec "$0" "$@"', *cmd] if rank else cmd

    procs = start_tasks(["train", *TINY, "algo=ddp", f"results_dir={results}"], tmp_path, wrap=private_mount)
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode != 0
        assert "rank(s) [1] cannot see the run folder" in err and "filesystem every node shares" in err, err[-3000:]
    (run,) = run_dirs(results)
    s = summary(run)
    assert s["status"] == "failed" and "rank(s) [1] cannot see the run folder" in s["error"]
    assert not (run / "train.log").exists() or "[rank 1]" not in (run / "train.log").read_text()


def test_a_signal_to_one_rank_stops_every_rank_at_one_checkpoint_and_resume_is_exact(tmp_path, long_reference):
    """launcher.preemption=checkpoint in a joined 2-task launch: SIGTERM reaches rank 1 only; both
    ranks agree, checkpoint at the same step and exit 143 with status preempted; `resume=<run>`
    then finishes with metrics equal to an uninterrupted run's."""
    import signal

    def start(extra):
        return start_tasks(["train", *LONG, *extra, f"results_dir={tmp_path}/b"], tmp_path, style="torchrun")

    procs = start([])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        files = list((tmp_path / "b").rglob("metrics.jsonl"))
        if files and len(files[0].read_text().splitlines()) >= 3:
            break
        time.sleep(0.02)
    procs[1].send_signal(signal.SIGTERM)
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [143, 143], [e[-2000:] for _, e in outs]
    (run,) = run_dirs(tmp_path / "b")
    s = summary(run)
    assert s["status"] == "preempted" and 0 < s["steps"] < 80
    log = (run / "train.log").read_text()
    assert log.count(f"preempted at step {s['steps']}:") == 2  # both ranks, the same step
    assert json.loads((run / "checkpoints" / "last.json").read_text())["step"] == s["steps"]
    procs = start([f"resume={run}"])
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in outs]
    assert summary(run)["status"] == "completed"
    assert stable(metrics(run)) == stable(metrics(long_reference))


# ---------------------------------------------------------------- finding your way (issue 24)
def test_version_names_the_package_version_and_the_checkout_commit(tmp_path):
    res = lsgd(["--version"], tmp_path)
    _ok(res)
    head = subprocess.run(["git", "-C", str(Path(lsgd_pkg.__file__).parent), "rev-parse", "--short=7", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert res.stdout.startswith("lsgd 0.1.0 (commit ") and head in res.stdout, res.stdout


def test_list_prints_every_option_with_its_one_line_description(tmp_path):
    res = lsgd(["list", "algorithms", "models"], tmp_path)
    _ok(res)
    lines = [ln.split() for ln in res.stdout.splitlines() if ln.startswith("  ")]
    names = {words[0] for words in lines}
    conf = Path(lsgd_pkg.__file__).parents[1] / "conf"
    assert names == {p.stem for d in ("algo", "model") for p in (conf / d).glob("*.yaml")}
    text = {words[0]: " ".join(words[1:]) for words in lines}
    # an algorithm: its registry entry (the class docstring's summary, its paper's section of the docs)
    assert text["local_sgd"] == "Local SGD: H local steps, then exact parameter averaging. [docs/papers.md#local-sgd]"
    assert text["swarm_sgd"].startswith("SwarmSGD: ") and text["swarm_sgd"].endswith("[docs/papers.md#swarmsgd]")
    # a model: the first sentence of its YAML header ("al." ends no sentence)
    assert text["resnet20"] == "CIFAR ResNet-20 (He et al. 2016, sec. 4.2)."
    bad = lsgd(["list", "algos"], tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "allowed: algorithms" in bad.stderr


def test_shell_completion_of_train_overrides(tmp_path):
    """Hydra's bash completion script (`lsgd train -sc install=bash`) registers for `lsgd` and calls
    `lsgd -sc query=bash` with the typed line: `lsgd train algo=lo<TAB>` completes to local_sgd."""
    script = lsgd(["train", "-sc", "install=bash"], tmp_path)
    _ok(script)
    assert script.stdout.rstrip().endswith("hydra_bash_completion lsgd")
    (tmp_path / "complete.sh").write_text(script.stdout)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    probe = ('source complete.sh; COMP_LINE="lsgd train algo=lo"; COMP_POINT=${#COMP_LINE}; '
             'COMP_CWORD=2; hydra_bash_completion; printf "%s\\n" "${COMPREPLY[@]}"')
    res = subprocess.run(["bash", "-c", probe], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert "algo=local_sgd" in res.stdout.split(), (res.stdout, res.stderr)


def test_user_mistakes_get_one_line_errors(tmp_path, monkeypatch, capsys):
    res = lsgd(["report", str(tmp_path / "nonexistent")], tmp_path)
    assert res.returncode == 2 and res.stderr.strip() == f"lsgd report: no such folder: {tmp_path / 'nonexistent'}"
    empty = tmp_path / "empty"
    empty.mkdir()
    res = lsgd(["report", str(empty)], tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    from lsgd import cli

    assert cli.main(["data", "cifar11"]) == 2
    assert "unknown dataset 'cifar11'; allowed: c4, cifar10" in capsys.readouterr().err

    def offline(cfg):
        raise OSError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr("lsgd.data.prepare", offline)
    assert cli.main(["data", "cifar10"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "lsgd data: cifar10 could not be prepared: [Errno -3] Temporary failure in name resolution"


@pytest.fixture(scope="module")
def terminal_run(tmp_path_factory) -> tuple[Path, bytes, str]:
    """DiLoCo with H = 9 over 8 steps (a record every 2) with a terminal on stdout: (run folder, what
    the terminal got, stderr). Read by the two tests below (before, each ran one of its own)."""
    import pty

    tmp = tmp_path_factory.mktemp("terminal")
    args = [*TINY, "algo=diloco", "algo.local_steps=9", "max_steps=8", "log_every=2", f"results_dir={tmp}/r"]
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen([*LSGD, "train", *args], cwd=tmp, stdout=follower, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, WANDB_MODE="disabled"))
        os.close(follower)
        follower = None
        chunks = []
        while True:  # drain the terminal so the progress bar never blocks
            try:
                data = os.read(leader, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        assert proc.wait(timeout=240) == 0, proc.stderr.read()
        err = proc.stderr.read()
    finally:
        os.close(leader)
        if follower is not None:
            os.close(follower)
    (run,) = run_dirs(tmp / "r")
    return run, b"".join(chunks), err


def test_train_log_keeps_the_step_lines_when_the_console_is_a_terminal(terminal_run):
    """With a terminal on stdout the console shows a progress bar instead of the step lines; the
    run's train.log still gets every one of them (issue 24)."""
    run, terminal, _ = terminal_run
    steps = [line.split("step ")[1].split()[0] for line in (run / "train.log").read_text().splitlines()
             if "] " in line and " step " in line and "samples/s" in line]
    assert steps == ["2/8", "4/8", "6/8", "8/8"], (run / "train.log").read_text()
    assert b"step 2/8" not in terminal  # the console had the progress bar, not the lines


def test_a_run_names_its_folder_and_warns_when_nothing_will_be_communicated(terminal_run):
    """The run folder at the start and the end (with the status), and a warning when H exceeds the
    run: DiLoCo with H = 9 over 8 steps never synchronizes (issue 24)."""
    run, _, err = terminal_run
    assert f"lsgd: run folder {run}" in err and f"lsgd: completed: {run}" in err
    assert "algo.local_steps=9 is more than the run's 8 steps: the workers never synchronize" in err
    assert summary(run)["comm_rounds"] == 0


def test_a_run_rejected_before_it_starts_leaves_no_folder(rejected):
    """A config error ends the run before anything starts: no run folder is left for the report
    to list as running (Hydra's own .hydra folder included) (issue 24). (`lsgd train debug=default
    batch_size=0`, the run of test_bad_config_fails_before_any_worker's batch_size case.)"""
    cwd, res = rejected["batch_size=0"]
    assert res.returncode == 2 and "batch_size must be an integer >= 1" in res.stderr
    assert not (cwd / "r" / "debug").exists()


# --------------------------------------------------------------------------------------------
# issue 42
# --------------------------------------------------------------------------------------------
#: the debug run of every algorithm: a few steps, one evaluation, on the in-process cluster (the
#: same run(), adaptation and validation as worker processes; only the start differs)
DEBUG_EVERY = ["launcher=inprocess", "max_steps=4", "eval_every=4", "checkpoint_every=0", "log_every=2",
               "dataset.num_test=128"]


@pytest.fixture(scope="module")
def debug_every_algorithm(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict[str, Path]]:
    """`lsgd train -m debug=default algo=<every registered algorithm>` (one sweep: one start-up for
    all of them, ~35 s on 2 cores): (the result, {algo: its run folder})."""
    from lsgd.algorithms import ALGORITHMS

    tmp = tmp_path_factory.mktemp("debug_every")
    res = lsgd(["train", "-m", "debug=default", f"algo={','.join(ALGORITHMS.names())}", *DEBUG_EVERY,
                f"results_dir={tmp}/r"], tmp, timeout=600)
    runs = {yaml.safe_load((run / "config.yaml").read_text())["algo"]["name"]: run for run in run_dirs(tmp / "r")}
    return res, runs


def _algorithms() -> list[str]:
    from lsgd.algorithms import ALGORITHMS

    return ALGORITHMS.names()


@pytest.mark.slow
@pytest.mark.parametrize("algo", _algorithms())
def test_debug_default_runs_every_registered_algorithm(debug_every_algorithm, algo):
    """README's `lsgd train debug=default algo=...` trains every method: 2 workers, or the fewest
    ranks the method takes (a ring's 3 nodes, a server's rank on top), said in one line on stdout."""
    from lsgd.algorithms import ALGORITHMS

    res, runs = debug_every_algorithm
    assert algo in runs, f"no run of {algo}\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}"
    run = runs[algo]
    assert summary(run)["status"] == "completed", (run / "summary.json").read_text()
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    world = cfg["world_size"]
    assert ALGORITHMS[algo].roles(world).count("worker") >= 2
    lines = [line for line in res.stdout.splitlines() if f"debug=default: algo={algo}: running" in line]
    if world == 2:
        assert not lines
    else:
        assert len(lines) == 1 and f"(launcher.nproc_per_node={world}), not 2: " in lines[0], lines
    if algo == "dpsgd":  # the README's example
        assert world == 3 and "algo.topology=ring needs at least 3 nodes" in lines[0]


@pytest.fixture(scope="module")
def rejected_options(tmp_path_factory) -> tuple[dict, dict, dict[str, subprocess.CompletedProcess]]:
    """`lsgd train GROUP=TYPO` for every config group under conf/ (a typo of its longest option: its
    middle letter dropped), and a sweep with one: ({key: (group, option, typo)}, {key: (args, cwd)},
    {key: result})."""
    import importlib.resources

    root = importlib.resources.files("lsgd.conf")
    groups = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name not in ("hydra", "__pycache__"))
    assert {"algo", "model", "dataset", "optim", "schedule", "launcher", "network", "experiment", "variant", "debug",
            "logger"} <= set(groups), groups
    cases, jobs = {}, {}
    for group in groups:
        option = max(sorted(p.name[:-5] for p in (root / group).iterdir() if p.name.endswith(".yaml")), key=len)
        typo = option[: len(option) // 2] + option[len(option) // 2 + 1:]
        cases[group] = (group, option, typo)
        cwd = tmp_path_factory.mktemp(f"option_{group}")
        jobs[group] = (["train", f"{group}={typo}", f"results_dir={cwd}/r"], cwd)
    cwd = tmp_path_factory.mktemp("option_sweep")
    cases["sweep"] = ("algo", "swarm_sgd", "swarmsgd")
    jobs["sweep"] = (["train", "-m", "debug=default", "algo=ddp,swarmsgd", f"results_dir={cwd}/r"], cwd)
    return cases, jobs, lsgd_forked(jobs, timeout=300)


@pytest.mark.parametrize("key", ["algo", "model", "dataset", "optim", "schedule", "launcher", "network", "experiment",
                                 "variant", "debug", "logger", "sweep"])
def test_an_unknown_group_option_is_one_line_naming_the_closest(rejected_options, key):
    """`lsgd train algo=swarmsgd` (and every group, and a sweep): lsgd's one-line error with the
    closest options, exit 2, before anything starts; not Hydra's message with its search path."""
    cases, jobs, results = rejected_options
    group, option, typo = cases[key]
    res = results[key]
    assert res.returncode == 2, (res.stdout, res.stderr)
    line = f"lsgd: invalid configuration: unknown {group}={typo}; did you mean "
    assert res.stderr.startswith(line) and option in res.stderr.split("?")[0], res.stderr
    assert "(options: " in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (jobs[key][1] / "r").exists()  # no run folder, no sweep folder


def test_an_async_bundle_takes_its_workers_from_study_workers(tmp_path):
    """`lsgd train experiment=async_text launcher.nproc_per_node=8` names study.workers (not
    cluster.speeds' 5 values), alone and as a sweep's arm; exit 2, before any worker starts."""
    jobs = {"run": (["train", "experiment=async_text", "launcher.nproc_per_node=8", f"results_dir={tmp_path}/a"],
                    tmp_path),
            "sweep": (["train", "-m", "experiment=async_text", "launcher.nproc_per_node=8",
                       f"results_dir={tmp_path}/b"], tmp_path)}
    results = lsgd_forked(jobs, timeout=300)
    message = ("launcher.nproc_per_node=8 disagrees with experiment=async_text, which sets the ranks from its study "
               "keys (study.workers=4, study.servers=1: 5 ranks); set study.workers (and study.servers) instead of "
               "launcher.nproc_per_node")
    for key, res in results.items():
        assert res.returncode == 2, (key, res.stdout, res.stderr)
        assert message in res.stderr and "cluster.speeds" not in res.stderr, (key, res.stderr)
    assert not list(tmp_path.rglob("train.log"))


def test_debug_default_with_an_experiment_whose_keys_do_not_fit_says_what_to_type(tmp_path):
    """`lsgd train debug=default experiment=async_text`: debug=default's synthetic data set cannot take
    the experiment's sequence keys; the one-line error says so and gives the short run of the
    experiment itself to type instead (exit 2, no run folder)."""
    res = lsgd(["train", "debug=default", "experiment=async_text", f"results_dir={tmp_path}/r"], tmp_path, timeout=300)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "debug=default replaces experiment=async_text's data set and model" in res.stderr, res.stderr
    assert "lsgd train experiment=async_text max_steps=20" in res.stderr, res.stderr
    assert not list(tmp_path.rglob("train.log"))
