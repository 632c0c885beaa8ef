"""``launcher=inprocess`` from the command line (issue 38): the workers of a run as logical workers
of one in-process cluster. The same run as processes gives the same records (bytes, rounds and
modeled time exactly; float32 losses to the rounding of a sum in another order); a worker that
fails stops the run with its rank named and only its own failure record; ``resume=true`` continues
a crashed run to the uninterrupted run's records exactly; Ctrl-C stops at one step with a
checkpoint (exit 130, one line); a sweep and its report work; what has no in-process meaning is a
ConfigError naming the key, before anything runs."""

from __future__ import annotations

import json
import re
import signal

import pytest
from runner import TINY, lsgd, metrics, run_dirs, summary
from test_interrupts import ENDLESS, no_process_left, start, stop_mid_run

INPROCESS = ["launcher=inprocess", "launcher.nproc_per_node=4"]
RUN = [*TINY, "algo=local_sgd", "algo.local_steps=4", "checkpoint_every=5", "eval_every=5", "log_every=2",
       "launcher.nproc_per_node=4", "seed=3"]
CRASH_STEP, CRASH_RANK = 13, 2
EXACT = ("step", "samples", "comm_bytes", "wire_bytes", "comm_rounds")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inprocess_cli")
    out = {}
    out["plain"] = lsgd(["train", *RUN, *INPROCESS, f"results_dir={tmp}/plain"], tmp)
    out["processes"] = lsgd(["train", *RUN, f"results_dir={tmp}/processes"], tmp)
    out["crashed"] = lsgd(["train", *RUN, *INPROCESS, f"results_dir={tmp}/crash", f"inject_failure.step={CRASH_STEP}",
                           f"inject_failure.rank={CRASH_RANK}"], tmp)
    out["resumed"] = lsgd(["train", *RUN, *INPROCESS, f"results_dir={tmp}/crash", "resume=true"], tmp)
    out["tmp"] = tmp
    return out


def test_an_in_process_run_records_what_the_processes_record(runs):
    assert runs["plain"].returncode == 0, runs["plain"].stderr[-3000:]
    assert runs["processes"].returncode == 0, runs["processes"].stderr[-3000:]
    (plain,) = run_dirs(runs["tmp"] / "plain")
    (procs,) = run_dirs(runs["tmp"] / "processes")
    a, b = metrics(plain), metrics(procs)
    assert [r["step"] for r in a] == [r["step"] for r in b] and len(a) >= 10
    for ra, rb in zip(a, b):
        assert set(ra) == set(rb)
        for key, value in ra.items():
            if key in EXACT or key.startswith("modeled_"):
                assert value == rb[key], (ra["step"], key)
            elif isinstance(value, float):
                assert value == pytest.approx(rb[key], rel=1e-4, abs=1e-6), (ra["step"], key)
    assert summary(plain)["status"] == "completed"
    assert "inprocess: true" in (plain / "config.yaml").read_text()


def test_a_failing_worker_names_its_rank_and_resume_continues_to_identical_records(runs):
    crashed = runs["crashed"]
    assert crashed.returncode != 0
    assert re.search(rf"rank {CRASH_RANK} \(.*\) failed first", crashed.stderr) and f"rank {CRASH_RANK} fails at step" in crashed.stderr, crashed.stderr[-3000:]
    (run,) = run_dirs(runs["tmp"] / "crash")
    failures = sorted(p.name for p in (run / "failures").iterdir())
    assert failures == [f"rank{CRASH_RANK}.json"], failures  # the workers it stopped record nothing
    assert runs["resumed"].returncode == 0, runs["resumed"].stderr[-3000:]
    (plain,) = run_dirs(runs["tmp"] / "plain")
    assert metrics(run) == metrics(plain)  # bit for bit: one process, one order
    assert summary(run)["status"] == "completed"


def test_ctrl_c_stops_the_in_process_workers_at_one_step(tmp_path):
    proc = start([*ENDLESS, *INPROCESS, f"results_dir={tmp_path}/r"], tmp_path)
    err, _ = stop_mid_run(proc, tmp_path / "r", signal.SIGINT, group=True)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    (run,) = run_dirs(tmp_path / "r")
    s = summary(run)
    assert s["status"] == "interrupted" and s["signal"] == "SIGINT" and s["steps"] > 0
    assert json.loads((run / "checkpoints" / "last.json").read_text())["step"] == s["steps"]
    lines = err.splitlines()
    last_step = max(i for i, line in enumerate(lines) if re.search(r"INFO step \d+/", line))
    assert lines[last_step + 1:] == [f"lsgd: interrupted (SIGINT) at step {s['steps']}, checkpoint saved; "
                                     f"resume: lsgd train resume={run}"], lines[last_step + 1:]
    assert no_process_left(proc.pid)


def test_a_sweep_in_process_and_its_report(tmp_path):
    res = lsgd(["train", "-m", *TINY, *INPROCESS, "algo=ddp,local_sgd", f"results_dir={tmp_path}/s"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    runs = run_dirs(tmp_path / "s")
    assert len(runs) == 2 and all(summary(r)["status"] == "completed" for r in runs)
    rep = lsgd(["report", str(tmp_path / "s"), "--out", str(tmp_path / "report")], tmp_path)
    assert rep.returncode == 0, rep.stderr[-3000:]
    text = (tmp_path / "report" / "report.md").read_text()
    assert "DDP" in text and "local SGD" in text


@pytest.mark.parametrize("override, key", [
    ("cluster.compute=measured", "cluster.compute"),
    ("launcher.emulate=true", "launcher.emulate"),
])
def test_what_has_no_in_process_meaning_is_refused_naming_the_key(tmp_path, override, key):
    res = lsgd(["train", *TINY, *INPROCESS, override, f"results_dir={tmp_path}/x"], tmp_path)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "invalid configuration" in res.stderr and key in res.stderr, res.stderr[-3000:]
    assert not run_dirs(tmp_path / "x") if (tmp_path / "x").exists() else True
